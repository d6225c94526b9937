"""A job runs what it looked up, on a real Slurm + Pyxis + Enroot node.

Pyxis keeps a named container after the job (container_scope=global, its default) and starts it
again for the same --container-name whatever --container-image says. The first test shows it: the
fixed name the example job used to give starts the previous build after a new one is published.
The second runs the example job's own lines (its key, its image by that key, its container named by
the key) and reads the new build's file; the third removes the old build's container.

Skipped, with the reason, where this machine has no Slurm controller answering, no `srun`, no
`enroot`, or no spank_pyxis.so in plugstack.conf: CI machines need not run Slurm. A node here is
Debian's slurm-wlm and munge with Enroot and Pyxis built from their sources (docs/guides/slurm-pyxis.md
says what a node needs); Enroot's NVIDIA hook disabled, there being no GPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import FilesystemTier
from tests.kits.storekit import REPO, cache_dir, key_for, record_for
from tests.scenarios.test_example_job import job_head

NAME = "ngc-efa:user"


def _missing() -> str | None:
    for tool in ("srun", "scontrol", "enroot", "mksquashfs"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH"
    plugstack = Path("/etc/slurm/plugstack.conf")
    text = ""
    if plugstack.is_file():
        text = plugstack.read_text()
        for extra in Path("/etc/slurm/plugstack.conf.d").glob("*.conf"):
            text += extra.read_text()
    if "spank_pyxis.so" not in text:
        return "Pyxis's spank_pyxis.so is not in /etc/slurm/plugstack.conf(.d)"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    if "is UP" not in ping.stdout:
        return "no Slurm controller answers scontrol ping"
    return None


MISSING = _missing()
pytestmark = [pytest.mark.skipif(MISSING is not None, reason=f"real Slurm + Pyxis + Enroot: {MISSING}"),
              pytest.mark.slow, pytest.mark.timeout(600)]


def _build(tmp_path: Path, version: str) -> Path:
    """A tiny image: busybox, and /workspace/app/version naming its build."""
    root = tmp_path / f"rootfs-{version}"
    for part in ("bin", "workspace/app", "etc", "tmp", "dev", "proc", "sys", "root"):
        (root / part).mkdir(parents=True, exist_ok=True)
    shutil.copy("/bin/busybox", root / "bin" / "busybox")
    for tool in ("sh", "cat"):
        (root / "bin" / tool).symlink_to("busybox")
    (root / "workspace" / "app" / "version").write_text(f"{version}\n")
    out = tmp_path / f"{version}.sqsh"
    subprocess.run(["mksquashfs", str(root), str(out), "-noappend", "-all-root", "-comp", "lzo", "-noD", "-quiet",
                    "-no-progress"], check=True, capture_output=True)
    return out


def _publish(store: Path, tmp_path: Path, version: str) -> str:
    """A new build of NAME in the store, as make publishes one: its key, its name's newest entry."""
    key = key_for(f"{version} {uuid.uuid4()}")
    sqsh = _build(tmp_path, version)
    Store([FilesystemTier(store, "shared")], show_progress=False).publish(key, sqsh, record_for(key, NAME, sqsh))
    return key


def _job(store: Path, node: Path, body: str) -> subprocess.CompletedProcess[str]:
    """`body` run by bash as a batch script runs, `efabuild` this checkout's CLI, srun the real one."""
    script = (f'set -euo pipefail\nefabuild() {{ "{sys.executable}" -m efabuild "$@"; }}\n'
              f'STORE="{store}"\n{body}\n')
    env = {**os.environ, "PYTHONPATH": str(REPO), "EFABUILD_VERIFY_CACHE": str(cache_dir(node / "verified")),
           "EFABUILD_PYXIS_CONFIG": ""}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=node, timeout=300)


@pytest.fixture
def containers():
    """The names of the Enroot containers a test makes, removed after it."""
    made: list[str] = []
    yield made
    for name in made:
        subprocess.run(["enroot", "remove", "--force", "--", f"pyxis_{name}"], capture_output=True, timeout=120)


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, Path]:
    store, here = tmp_path / "fsx", tmp_path / "node"
    here.mkdir()
    return store, here


def test_a_fixed_container_name_starts_the_previous_build(node, tmp_path, containers):
    """The bug the example job had: --container-name=train for `efabuild lookup NAME`."""
    store, here = node
    name = f"train-fixed-{uuid.uuid4().hex[:8]}"
    containers.append(name)
    old_form = (f'srun --container-image="$(efabuild lookup --store "$STORE" {NAME})" --container-name={name} '
                f"cat /workspace/app/version")
    _publish(store, tmp_path, "v1")
    first = _job(store, here, old_form)
    assert (first.returncode, first.stdout) == (0, "v1\n"), first.stderr
    _publish(store, tmp_path, "v2")
    second = _job(store, here, old_form)
    # the job looked up v2 and ran v1: Pyxis reused the container of that name
    assert (second.returncode, second.stdout) == (0, "v1\n"), second.stderr


def test_the_example_jobs_lines_run_the_build_they_looked_up(node, tmp_path, containers):
    store, here = node
    body = (f'{job_head().replace("--require-signature ", "")}\n'
            'srun --container-image="$IMAGE" --container-name="$NAME" cat /workspace/app/version\n'
            'echo "$NAME"')
    old = _publish(store, tmp_path, "v1")
    containers.append(f"train-{old[:12]}")
    first = _job(store, here, body)
    assert first.stdout == f"v1\ntrain-{old[:12]}\n", first.stderr
    new = _publish(store, tmp_path, "v2")
    containers.append(f"train-{new[:12]}")
    second = _job(store, here, body)
    assert second.stdout == f"v2\ntrain-{new[:12]}\n", second.stderr
    # the same build again reuses its container: no second unpack, the same image
    again = _job(store, here, body)
    assert again.stdout == second.stdout
    # the job's last step removes the earlier build's container and keeps this one
    listed = subprocess.run(["enroot", "list"], capture_output=True, text=True, timeout=60).stdout.split()
    assert {f"pyxis_train-{old[:12]}", f"pyxis_train-{new[:12]}"} <= set(listed)
    pruned = _job(store, here, f'srun --ntasks-per-node=1 {sys.executable} -m efabuild prune-containers train '
                              f'--keep {new}')
    assert pruned.returncode == 0 and f"removed pyxis_train-{old[:12]}" in pruned.stdout, pruned.stderr
    listed = subprocess.run(["enroot", "list"], capture_output=True, text=True, timeout=60).stdout.split()
    assert f"pyxis_train-{old[:12]}" not in listed and f"pyxis_train-{new[:12]}" in listed
