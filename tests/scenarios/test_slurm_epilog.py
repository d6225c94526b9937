"""The Slurm epilog docs/guides/slurm-pyxis.md gives, run as slurmd runs it (root, the job's user in
$SLURM_JOB_USER), over real Enroot containers named as Pyxis names them: the job user's
containers of a name's earlier builds go, the newest build's and other names' stay, and a store it
cannot read removes nothing and still exits 0 (a failing epilog drains the node).

Slurm itself is not needed: the epilog is a shell script. Skipped, with the reason, where this
machine has no `enroot`, `mksquashfs` or `runuser`, or the test does not run as root.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import FilesystemTier
from tests.kits.storekit import REPO, key_for, record_for

GUIDE = REPO / "docs" / "guides" / "slurm-pyxis.md"


def _missing() -> str | None:
    for tool in ("enroot", "mksquashfs", "runuser"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH"
    return None if os.geteuid() == 0 else "an epilog runs as root"


MISSING = _missing()
pytestmark = [pytest.mark.skipif(MISSING is not None, reason=f"real Enroot: {MISSING}"), pytest.mark.slow,
              pytest.mark.timeout(300)]


def guide_epilog() -> str:
    """The guide's epilog: its sh block that runs as $SLURM_JOB_USER."""
    blocks = [body for body in re.findall(r"^```sh\n(.*?)^```", GUIDE.read_text(), flags=re.S | re.M)
              if "SLURM_JOB_USER" in body]
    assert len(blocks) == 1, "the guide gives one epilog"
    return blocks[0]


def _epilog_here(store: Path, bin_dir: Path) -> str:
    """The guide's epilog with this test's store and this checkout's efabuild in place of the site's."""
    text = guide_epilog()
    assert re.search(r"^STORE=/fsx/efabuild$", text, flags=re.M) and re.search(r"^TOOLS=/", text, flags=re.M)
    text = re.sub(r"^STORE=.*$", f"STORE={store}", text, flags=re.M)
    return re.sub(r"^TOOLS=", f"TOOLS={bin_dir}:", text, flags=re.M)  # ahead of the site's directories


def _sqsh(tmp_path: Path, version: str) -> Path:
    root = tmp_path / f"rootfs-{version}"
    (root / "workspace").mkdir(parents=True)
    (root / "workspace" / "version").write_text(f"{version}\n")
    out = tmp_path / f"{version}.sqsh"
    subprocess.run(["mksquashfs", str(root), str(out), "-noappend", "-all-root", "-comp", "lzo", "-noD", "-quiet",
                    "-no-progress"], check=True, capture_output=True, timeout=60)
    return out


@pytest.fixture
def node(tmp_path: Path) -> dict[str, str]:
    """An Enroot data directory of the test's own (the machine's containers are not touched), and
    an `efabuild` on a PATH of its own that runs this checkout."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "efabuild"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" -m efabuild "$@"\n')
    wrapper.chmod(0o755)
    data = tmp_path / "enroot-data"
    data.mkdir()
    return {"ENROOT_DATA_PATH": str(data), "BIN": str(bin_dir)}


def _create(env: dict[str, str], name: str, sqsh: Path) -> None:
    subprocess.run(["enroot", "create", "--name", name, str(sqsh)], check=True, capture_output=True,
                   env={**os.environ, "ENROOT_DATA_PATH": env["ENROOT_DATA_PATH"]}, timeout=120)


def _listed(env: dict[str, str]) -> set[str]:
    return set(os.listdir(env["ENROOT_DATA_PATH"]))


def _run_epilog(env: dict[str, str], script: str) -> subprocess.CompletedProcess[str]:
    # slurmd's environment for an epilog: the job's ids and user, no HOME, a short PATH
    slurm = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_JOB_ID": "41", "SLURM_JOB_UID": str(os.geteuid()),
             "SLURM_JOB_USER": pwd.getpwuid(os.geteuid()).pw_name, "ENROOT_DATA_PATH": env["ENROOT_DATA_PATH"]}
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=slurm, timeout=180)


def test_the_guides_epilog_removes_the_users_containers_of_earlier_builds(node, tmp_path):
    store = tmp_path / "fsx"
    tier = Store([FilesystemTier(store, "shared")], show_progress=False)
    old, new = key_for("epilog v1"), key_for("epilog v2")
    for key, version in ((old, "v1"), (new, "v2")):
        sqsh = _sqsh(tmp_path, version)
        tier.publish(key, sqsh, record_for(key, "ngc-efa:user", sqsh))
        _create(node, f"pyxis_train-{key[:12]}", sqsh)
    _create(node, f"pyxis_other-{old[:12]}", tmp_path / "v1.sqsh")  # another name's: not this epilog's
    done = _run_epilog(node, _epilog_here(store, Path(node["BIN"])))
    assert done.returncode == 0, done.stderr
    assert _listed(node) == {f"pyxis_train-{new[:12]}", f"pyxis_other-{old[:12]}"}
    assert done.stdout == f"removed pyxis_train-{old[:12]}\n"


def test_an_epilog_that_cannot_resolve_the_name_removes_nothing_and_exits_0(node, tmp_path):
    sqsh = _sqsh(tmp_path, "v1")
    _create(node, f"pyxis_train-{key_for('v1')[:12]}", sqsh)
    done = _run_epilog(node, _epilog_here(tmp_path / "no-store", Path(node["BIN"])))
    assert done.returncode == 0, done.stderr
    assert _listed(node) == {f"pyxis_train-{key_for('v1')[:12]}"}
    assert "efabuild: " in done.stderr  # lookup's one line says why

