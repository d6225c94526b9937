"""The Pyxis importer, called as Pyxis calls it: through the wrapper script, with Slurm's env.

Pyxis itself (a Slurm SPANK plugin) cannot run on this machine; the tests reproduce its calls as
documented: `get docker://efabuild://REF` (Pyxis prepends docker://), then `release` twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from efabuild.pyxis import parse_image_uri
from efabuild.errors import InputError
from efabuild.store.core import Store
from efabuild.store.fs import FilesystemTier
from tests.storekit import REPO, key_for, make_sqsh, record_for

IMPORTER = REPO / "scripts" / "efabuild-pyxis-importer"


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    store = Store([FilesystemTier(tmp_path / "fsx", "store")], show_progress=False)
    sqsh = make_sqsh(tmp_path, os.urandom(50_000))
    key = key_for("pyxis")
    store.publish(key, sqsh, record_for(key, "ngc-efa:user", sqsh))
    return tmp_path / "fsx"


@pytest.fixture
def job_env(tmp_path: Path) -> dict[str, str]:
    """The importer's environment in a job step: efabuild on PATH, Slurm and Pyxis variables."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "efabuild"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m efabuild "$@"\n')
    shim.chmod(0o755)
    runtime = tmp_path / "pyxis-runtime"
    runtime.mkdir()
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "PYXIS_RUNTIME_PATH": str(runtime),
        "PYXIS_VERSION": "0.24.0",
        "HOME": str(tmp_path),
    }


def importer(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(IMPORTER), *args], capture_output=True, text=True, env=env, cwd=cwd)


def test_get_prints_only_the_sqsh_path_and_release_is_idempotent(store_dir, job_env, tmp_path):
    env = {**job_env, "EFABUILD_STORE": str(store_dir)}
    expected = Store.at(store_dir).lookup("ngc-efa:user")
    for uri in ("docker://efabuild://ngc-efa:user", "efabuild://ngc-efa:user",
                f"docker://efabuild://{expected.stem[:8]}"):
        result = importer("get", uri, env=env, cwd=tmp_path)
        assert (result.returncode, result.stdout) == (0, f"{expected}\n"), result.stderr
    for _ in range(2):
        result = importer("release", env=env, cwd=tmp_path)
        assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert os.listdir(job_env["PYXIS_RUNTIME_PATH"]) == []


def test_failures_are_non_zero_with_a_message_on_stderr(store_dir, job_env, tmp_path):
    env = {**job_env, "EFABUILD_STORE": str(store_dir)}
    absent = importer("get", "docker://efabuild://ngc-efa:missing", env=env, cwd=tmp_path)
    assert absent.returncode == 1 and absent.stdout == ""
    assert absent.stderr.startswith("efabuild: no artifact named ngc-efa:missing")
    bare = importer("get", env=env, cwd=tmp_path)
    assert bare.returncode == 2 and "missing IMAGE_URI" in bare.stderr


def test_store_from_the_importer_config_file(store_dir, job_env, tmp_path):
    config = tmp_path / "pyxis.toml"
    config.write_text(f'store = "{store_dir}"\nverify = true\n')
    env = {**job_env, "EFABUILD_PYXIS_CONFIG": str(config)}
    result = importer("get", "docker://efabuild://ngc-efa:user", env=env, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith(str(store_dir))
    # verify = true: a damaged artifact is refused before Enroot unpacks it
    path = Path(result.stdout.strip())
    path.chmod(0o644)
    with open(path, "r+b") as handle:
        handle.seek(1000)
        handle.write(b"rot")
    result = importer("get", "docker://efabuild://ngc-efa:user", env=env, cwd=tmp_path)
    assert result.returncode == 1 and "corrupt artifact" in result.stderr and result.stdout == ""
    config.write_text('store = "/fsx"\nverfy = true\n')
    result = importer("get", "docker://efabuild://ngc-efa:user", env=env, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr == f"efabuild: {config}: unknown key 'verfy' (known: store, verify)\n"


ENROOT_STAND_IN = """#!/bin/sh
# Enroot is not packaged for Debian, so it cannot run here: this stand-in takes `enroot import
# --output FILE URI` like Enroot, says so on stderr (Enroot's progress goes there), writes FILE.
echo "[INFO] Querying registry for permission grant ($4)" >&2
[ "$4" = "docker://unknown/image:1" ] && { echo "[ERROR] URL https://unknown/ returned error code: 404" >&2; exit 1; }
printf 'squashfs of %s' "$4" > "$3"
"""


def test_other_images_are_imported_with_enroot_as_pyxis_would_and_released(store_dir, job_env, tmp_path):
    """With importer= set, Pyxis sends every image through it: non-efabuild ones must still run."""
    (tmp_path / "bin" / "enroot").write_text(ENROOT_STAND_IN)
    (tmp_path / "bin" / "enroot").chmod(0o755)
    env = {**job_env, "EFABUILD_STORE": str(store_dir), "SLURM_JOB_UID": "1000"}
    result = importer("get", "docker://ubuntu:24.04", env=env, cwd=tmp_path)
    staged = Path(job_env["PYXIS_RUNTIME_PATH"]) / "1000" / "4242.0.squashfs"
    assert (result.returncode, result.stdout) == (0, f"{staged}\n"), result.stderr
    assert "Querying registry" in result.stderr and staged.read_text() == "squashfs of docker://ubuntu:24.04"
    assert oct(staged.parent.stat().st_mode & 0o777) == "0o700"
    for _ in range(2):
        assert importer("release", env=env, cwd=tmp_path).returncode == 0
    assert not staged.exists()
    failed = importer("get", "docker://unknown/image:1", env=env, cwd=tmp_path)
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr.strip().endswith("efabuild: enroot import docker://unknown/image:1 failed (exit status 1)")


def test_image_uri_forms():
    assert parse_image_uri("docker://efabuild://ngc-efa:user") == "ngc-efa:user"
    assert parse_image_uri("efabuild://0123abcd") == "0123abcd"
    for bad in ("docker://ubuntu:24.04", "efabuild://", "dockerd://efabuild://x:y"):
        with pytest.raises(InputError):
            parse_image_uri(bad)
