"""The export's containers on a real engine: labelled so a leftover can be traced, streamed as a
tar, removed however the export ends."""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

from efabuild.engine import containers
from efabuild.engine.client import EngineError, connect
from efabuild.engine.containers import EXPORT_LABEL, OWNER_LABEL
from efabuild.engine.leftovers import dead_export_containers
from efabuild.settings import BuilderSettings
from efabuild.host.owner import Owner

pytestmark = pytest.mark.engine


def _labels(name: str) -> dict[str, str]:
    shown = subprocess.run(["docker", "container", "inspect", "--format",
                            f'{{{{index .Config.Labels "{EXPORT_LABEL}"}}}}\t{{{{index .Config.Labels "{OWNER_LABEL}"}}}}',
                            name], capture_output=True, text=True, check=True).stdout.strip()
    target, _, owner = shown.partition("\t")
    return {EXPORT_LABEL: target, OWNER_LABEL: owner}


def _exists(name: str) -> bool:
    return subprocess.run(["docker", "container", "inspect", name], capture_output=True).returncode == 0


def test_an_export_container_names_its_target_and_owner_streams_its_rootfs_and_goes(busybox_image, tmp_path):
    engine = connect(BuilderSettings())
    target = tmp_path / "store" / "x.sqsh"
    name = containers.create_for_export(engine, busybox_image, target)
    try:
        assert _labels(name) == {EXPORT_LABEL: str(target), OWNER_LABEL: Owner.current().token}
        # a live owner: never taken for a leftover
        assert name not in dead_export_containers(engine, [tmp_path / "store"])
        with tempfile.TemporaryFile() as errors:
            proc = containers.export_stream(engine, name, errors)
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                names = {member.name.rstrip("/") for member in tar}
            assert proc.wait() == 0
        assert "bin/busybox" in names and ".dockerenv" in names
    finally:
        containers.remove(engine, name)
    assert not _exists(name)
    containers.remove(engine, name)  # already gone: no error


def test_an_image_the_engine_lacks_is_one_line(image_names, tmp_path):
    engine = connect(BuilderSettings())
    with pytest.raises(EngineError) as caught:
        containers.create_for_export(engine, image_names("absent"), Path(tmp_path) / "x.sqsh")
    assert "\n" not in str(caught.value) and str(caught.value)
