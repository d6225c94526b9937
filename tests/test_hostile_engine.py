"""A shared engine: whoever can reach it can tag any image with efabuild's names. push must not send
an image under a layer's key unless efabuild built it for that key."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from efabuild.engine.client import connect
from efabuild.engine.registry import has
from efabuild.model import BuilderSettings, RegistrySettings
from tests.storekit import efabuild

pytestmark = pytest.mark.engine

GRAPH = """\
[layers.one]
base = "{base}"
dockerfile = '''
RUN echo {run} > /run-id
'''
artifact = true
ignore = [{{ rule = "EFA010", reason = "a local test image" }}]
"""


def test_push_refuses_an_image_another_tenant_tagged_with_a_layer_s_name(tmp_path, busybox_image, local_registry):
    root = tmp_path / "ws"
    (root / "graphs").mkdir(parents=True)
    (root / "BUILD.toml").write_text(f'[workspace]\ngraphs = ["graphs/*.toml"]\n[registry]\nurl = "{local_registry}"\n')
    (root / "graphs" / "g.toml").write_text(GRAPH.format(base=busybox_image, run=uuid.uuid4().hex))
    key = json.loads(efabuild("-C", str(root), "plan", "--json", check=True).stdout)["layers"][0]["key"]
    planted = f"efabuild/one:{key}"
    subprocess.run(["docker", "image", "tag", busybox_image, planted], check=True)  # not this layer's build
    try:
        refused = efabuild("-C", str(root), "push", "--json")
        assert refused.returncode == 1, refused.stderr
        [row] = json.loads(refused.stdout)["layers"]
        assert row["pushed"] is None and "org.efabuild.key" in row["problem"]
        assert refused.stderr.strip() == "efabuild: not pushed (an image not built for its key): g:one"
        engine = connect(BuilderSettings())
        assert not has(engine, planted, RegistrySettings(url=local_registry))
        # the layer made by efabuild under the same name is pushed
        subprocess.run(["docker", "image", "rm", planted], capture_output=True, check=True)
        efabuild("-C", str(root), "make", "--no-lint", check=True)
        done = json.loads(efabuild("-C", str(root), "push", "--json", check=True).stdout)["layers"]
        assert done[0]["pushed"].startswith(f"{local_registry}/efabuild/one@sha256:")
    finally:
        subprocess.run(["docker", "image", "rm", planted], capture_output=True)
