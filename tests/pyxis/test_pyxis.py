"""The Pyxis importer, called as Pyxis calls it: the package's console script, with Slurm's env.

Pyxis itself (a Slurm SPANK plugin) cannot run on this machine; the tests reproduce its calls as
documented: `get docker://efabuild://REF` (Pyxis prepends docker://), then `release` twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from efabuild.pyxis.importer import parse_image_uri
from efabuild.errors import InputError
from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import FilesystemTier
from tests.kits.storekit import cache_dir
from tests.kits.inprocess import run_efabuild
from tests.kits.storekit import REPO, key_for, make_sqsh, record_for



def console_script(name: str) -> list[str]:
    """The command pip's wrapper for the console script `name` runs (this tree is not installed
    here: the shared install must not be repointed), read from pyproject.toml's [project.scripts]."""
    with open(REPO / "pyproject.toml", "rb") as handle:
        target = tomllib.load(handle)["project"]["scripts"][name]
    module, function = target.split(":")
    return [sys.executable, "-c", f"import sys; from {module} import {function}; sys.exit({function}())"]


IMPORTER = console_script("efabuild-pyxis-importer")


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    store = Store([FilesystemTier(tmp_path / "fsx", "store")], show_progress=False)
    sqsh = make_sqsh(tmp_path, os.urandom(50_000))
    key = key_for("pyxis")
    store.publish(key, sqsh, record_for(key, "ngc-efa:user", sqsh))
    return tmp_path / "fsx"


@pytest.fixture
def job_env(tmp_path: Path) -> dict[str, str]:
    """The importer's environment in a job step: Slurm and Pyxis variables (bin/ on PATH for enroot)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
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
    """The console script's function called in this process (tests/kits/inprocess.py); the tests of the
    script as Pyxis starts it, in its own process, use IMPORTER."""
    from efabuild.cli import pyxis_importer_main

    return run_efabuild(args, env=env, cwd=cwd, entry=pyxis_importer_main)


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
    assert result.returncode == 2 and result.stderr == f"efabuild: {config}: unknown key 'verfy' (known: store, verify, require_signature, lazy, lazy_cache, lazy_cache_gib)\n"



def test_a_verifying_get_reads_a_copy_verified_before_and_unchanged_since_no_more(store_dir, job_env, tmp_path,
                                                                                  monkeypatch):
    """Slip: `verify = true` re-hashes the whole .sqsh on every step start (4.7 s for a 1.4 GB image,
    against 1.2 s for the whole start with squashfuse). A second start of the same unchanged copy
    must cost stats only; a copy changed since (same size, mtime put back: ctime still moves) is
    read again and refused."""
    import time

    from efabuild.signing import verifycache
    from efabuild.store import transfer

    hashed = []
    real_digest = transfer.file_digest
    # the check hashes the file it opened, through /proc/self/fd: the file's own path is its link's target
    monkeypatch.setattr(transfer, "file_digest",
                        lambda path: hashed.append(Path(os.path.realpath(path))) or real_digest(path))
    # the store's files are older than the racy window: the clock is moved on rather than waited for
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + verifycache.RACY_SECONDS + 0.1)
    config = tmp_path / "pyxis.toml"
    config.write_text(f'store = "{store_dir}"\nverify = true\n')
    cache = cache_dir(tmp_path / "verified")
    env = {**job_env, "EFABUILD_PYXIS_CONFIG": str(config), verifycache.CACHE_ENV: str(cache)}
    uri = "docker://efabuild://ngc-efa:user"

    first = importer("get", uri, env=env, cwd=tmp_path)
    sqsh = Path(first.stdout.strip())
    assert first.returncode == 0 and hashed == [sqsh], first.stderr
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    assert [oct(entry.stat().st_mode & 0o777) for entry in cache.iterdir()] == ["0o600"]
    second = importer("get", uri, env=env, cwd=tmp_path)
    assert (second.returncode, second.stdout) == (0, first.stdout) and hashed == [sqsh], second.stderr

    os.chown(cache, 65534, 65534)  # a cache directory someone else owns is neither believed nor written
    assert importer("get", uri, env=env, cwd=tmp_path).returncode == 0 and hashed == [sqsh] * 2
    os.chown(cache, os.geteuid(), os.getegid())

    before = sqsh.stat()
    sqsh.chmod(0o644)
    with open(sqsh, "r+b") as handle:  # changed in place by someone who can write the shared store
        handle.seek(1000)
        handle.write(b"rot")
    sqsh.chmod(before.st_mode & 0o777)
    os.utime(sqsh, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (sqsh.stat().st_size, sqsh.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    changed = importer("get", uri, env=env, cwd=tmp_path)
    assert changed.returncode == 1 and changed.stdout == "" and hashed == [sqsh] * 3
    assert "corrupt artifact: digest" in changed.stderr and changed.stderr.count("\n") == 1


def test_the_jobs_efabuild_store_comes_before_the_config_files_store(store_dir, job_env, tmp_path):
    """Slip: the config file's store is read first. A job that sets $EFABUILD_STORE (a test store,
    another cluster's) would silently start the node-wide store's artifact of the same name."""
    other = tmp_path / "other"
    node_wide = Store([FilesystemTier(other / "fsx", "store")], show_progress=False)
    sqsh = make_sqsh(other, os.urandom(50_000), "node-wide")
    key = key_for("node-wide")
    node_wide.publish(key, sqsh, record_for(key, "ngc-efa:user", sqsh))
    config = tmp_path / "pyxis.toml"
    config.write_text(f'store = "{other / "fsx"}"\n')
    env = {**job_env, "EFABUILD_PYXIS_CONFIG": str(config), "EFABUILD_STORE": str(store_dir)}
    result = importer("get", "docker://efabuild://ngc-efa:user", env=env, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, f"{Store.at(store_dir).lookup('ngc-efa:user')}\n"), result.stderr
    del env["EFABUILD_STORE"]
    result = importer("get", "docker://efabuild://ngc-efa:user", env=env, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, f"{node_wide.lookup('ngc-efa:user')}\n"), result.stderr


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


# --- hostile callers: the importer runs as the job's user with an environment that user chose ---

def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("variable, value", [
    ("SLURM_JOB_UID", "../outside"),
    ("SLURM_JOB_UID", "/abs"),
    ("SLURM_JOB_ID", "../../outside/4242"),
    ("SLURM_JOB_ID", "4242\n"),
    ("SLURM_STEP_ID", "0/../../../outside/4242.0"),
    ("SLURM_STEP_ID", "batch.squashfs"),
    ("PYXIS_RUNTIME_PATH", "relative/runtime"),
    ("PYXIS_RUNTIME_PATH", "{runtime}/../outside"),
])
def test_release_and_get_refuse_variables_that_leave_the_runtime_path(job_env, tmp_path, variable, value):
    """`SLURM_JOB_UID=../outside` used to make `release` delete a file outside the runtime path."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victims = [outside / "4242.0.squashfs", tmp_path / "outside.squashfs"]
    for victim in victims:
        victim.write_text("not yours")
    (tmp_path / "bin" / "enroot").write_text(ENROOT_STAND_IN)
    (tmp_path / "bin" / "enroot").chmod(0o755)
    env = {**job_env, "SLURM_JOB_UID": "1000", variable: value.format(runtime=job_env["PYXIS_RUNTIME_PATH"])}
    for args in (("release",), ("get", "docker://ubuntu:24.04")):
        result = importer(*args, env=env, cwd=tmp_path)
        assert (result.returncode, result.stdout) == (2, ""), (args, result.stderr)
        assert _one_line(result.stderr).startswith(f"efabuild: {variable}: must be")
    assert [victim.read_text() for victim in victims] == ["not yours"] * len(victims)


def test_a_user_directory_linked_out_of_the_runtime_path_is_refused(job_env, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "4242.0.squashfs"
    victim.write_text("not yours")
    (Path(job_env["PYXIS_RUNTIME_PATH"]) / "1000").symlink_to(outside)
    result = importer("release", env={**job_env, "SLURM_JOB_UID": "1000"}, cwd=tmp_path)
    assert result.returncode == 2 and "resolves outside" in _one_line(result.stderr)
    assert victim.read_text() == "not yours"


@pytest.mark.parametrize("step", ["batch", "extern", "interactive", "4294967291"])
def test_slurm_step_names_are_accepted(store_dir, job_env, tmp_path, step):
    (tmp_path / "bin" / "enroot").write_text(ENROOT_STAND_IN)
    (tmp_path / "bin" / "enroot").chmod(0o755)
    env = {**job_env, "SLURM_JOB_UID": "1000", "SLURM_STEP_ID": step}
    result = importer("get", "docker://ubuntu:24.04", env=env, cwd=tmp_path)
    staged = Path(job_env["PYXIS_RUNTIME_PATH"]) / "1000" / f"4242.{step}.squashfs"
    assert (result.returncode, result.stdout) == (0, f"{staged}\n"), result.stderr
    assert importer("release", env=env, cwd=tmp_path).returncode == 0 and not staged.exists()


@pytest.mark.parametrize("args", [
    ["--help"], ["-h"], ["get", "--help"], ["get", "-h"], ["release", "--help"], [], ["get"],
    ["get", "efabuild://a", "efabuild://b"], ["frobnicate"], ["release", "extra"], ["--version"],
])
def test_no_bad_call_prints_anything_pyxis_would_take_for_a_path(store_dir, job_env, tmp_path, args):
    """Pyxis starts the first stdout line as a .sqsh whenever the exit status is 0."""
    env = {**job_env, "EFABUILD_STORE": str(store_dir)}
    result = importer(*args, env=env, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, ""), result
    assert _one_line(result.stderr).startswith("efabuild: ")
    # the same through the main command, for a plugstack.conf that names a wrapper around it
    result = run_efabuild(["pyxis-importer", *args], env=env, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, ""), result
    if args in (["--help"], ["-h"]):  # a person asking gets the whole help, on stderr
        assert "usage: efabuild pyxis-importer" in result.stderr and "\nexamples:\n" in result.stderr


def test_no_shipped_importer_runs_a_program_named_by_the_environment(store_dir, job_env, tmp_path):
    """The importer runs for every job with the job's environment: EFABUILD or PATH must not pick
    the program that answers Pyxis (the old wrapper script exec'd ${EFABUILD:-efabuild})."""
    marker = tmp_path / "ran"
    planted = tmp_path / "bin" / "efabuild"
    planted.write_text(f"#!/bin/sh\ntouch {marker}\necho /tmp/planted.sqsh\n")
    planted.chmod(0o755)
    env = {**job_env, "EFABUILD_STORE": str(store_dir), "EFABUILD": str(planted)}
    importers = [IMPORTER] + [[str(path)] for path in (REPO / "scripts").glob("*importer*")]
    for command in importers:
        result = subprocess.run([*command, "get", "docker://efabuild://ngc-efa:user"],
                                capture_output=True, text=True, env=env, cwd=tmp_path)
        assert result.returncode == 0 and result.stdout.startswith(str(store_dir)), (command, result)
    assert not marker.exists()


def _fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize("kind, make, problem", [
    ("directory", lambda p: p.mkdir(), "not a regular file"),
    ("fifo", _fifo, "not a regular file"),
    ("binary", lambda p: p.write_bytes(b"\x7fELF\x02\x01\x01\x00" + os.urandom(2000)), "not UTF-8 text"),
    ("nested", lambda p: p.write_text("store = " + "[" * 5000 + "]" * 5000 + "\n"), "nested 5000 deep"),
    ("huge", lambda p: p.write_text("# " + "x" * 200_000 + "\n"), "at most 65536 bytes"),
    ("wrong type", lambda p: p.write_text("store = [" + "1," * 5000 + "]\n"), "store: must be a store directory path"),
])
def test_a_hostile_importer_config_is_one_line(store_dir, job_env, tmp_path, kind, make, problem):
    config = tmp_path / "pyxis.toml"
    make(config)
    env = {**job_env, "EFABUILD_PYXIS_CONFIG": str(config)}
    result = subprocess.run([*IMPORTER, "get", "docker://efabuild://ngc-efa:user"], capture_output=True,
                            text=True, env=env, cwd=tmp_path, timeout=20)
    assert (result.returncode, result.stdout) == (2, "")
    line = _one_line(result.stderr)
    assert line.startswith(f"efabuild: {config}") and problem in line and len(line) < 300, line


def test_a_job_user_cannot_name_another_users_directory(job_env, monkeypatch):
    """Pyxis runs the importer as the job's user, so SLURM_JOB_UID must be that uid. The tests run
    as root and this machine's Python is not reachable by another user, so the importer's view of
    its own uid is what is changed here (os.getuid), in process."""
    from efabuild.pyxis import importer as pyxis

    monkeypatch.setattr(pyxis.os, "getuid", lambda: 1000)
    env = {**job_env, "SLURM_JOB_UID": "1001"}
    with pytest.raises(InputError, match="must be the importer's own uid 1000, not '1001'"):
        pyxis.release(env)
    assert pyxis._step_path({**job_env, "SLURM_JOB_UID": "1000"}).parent.name == "1000"
    assert pyxis._step_path(job_env).parent.name == "1000"  # unset: the importer's own


def _store_toml_fifo(base: Path) -> str:
    (base / "fifo-store").mkdir()
    os.mkfifo(base / "fifo-store" / "store.toml")
    return str(base / "fifo-store")


def _bare_fifo(base: Path) -> str:
    os.mkfifo(base / "store-fifo")
    return str(base / "store-fifo")


@pytest.mark.parametrize("store, image, problem", [
    (_bare_fifo, "efabuild://ngc-efa:user", "not a directory"),
    (_store_toml_fifo, "efabuild://ngc-efa:user", "a FIFO"),
    (lambda base: "/dev/zero", "efabuild://ngc-efa:user", "under /dev"),
    (None, "efabuild://../../etc/passwd", "not a key"),
    (None, "docker://efabuild://-h", "not a key"),
    (None, "efabuild://ngc-efa:user\n/etc/passwd", "not an artifact name"),
])
def test_a_job_users_store_or_image_string_is_one_line_and_no_path(store_dir, job_env, tmp_path, store, image,
                                                                    problem):
    """The job user chooses EFABUILD_STORE and the image string: a FIFO or device for the store, a
    path or an option for the image is refused at once, and nothing reaches stdout."""
    env = {**job_env, "EFABUILD_STORE": store(tmp_path) if store else str(store_dir)}
    result = subprocess.run([*IMPORTER, "get", image], capture_output=True, text=True, env=env, cwd=tmp_path,
                            timeout=20)
    assert (result.returncode, result.stdout) == (2, ""), result
    assert problem in _one_line(result.stderr), result.stderr


@pytest.mark.s3
def test_a_verifying_get_of_a_name_fetched_from_s3_reads_the_copy_once(tmp_path, job_env, settings, monkeypatch):
    """Slip: the cache kept only on the path of a local name. A name the node's store copied from S3
    is resolved through S3 at every start, and the copy it finds was re-hashed each time."""
    import time

    from efabuild.signing import verifycache
    from efabuild.store import transfer
    from tests.plugins.s3server import DUMMY_CREDENTIALS

    builder = Store([FilesystemTier(tmp_path / "builder", "local")], settings, show_progress=False)
    sqsh = make_sqsh(tmp_path, os.urandom(200_000))
    key = key_for("fetched")
    builder.publish(key, sqsh, record_for(key, "ngc-efa:user", sqsh))
    shared = tmp_path / "fsx"
    shared.mkdir()
    (shared / "store.toml").write_text((tmp_path / "builder" / "store.toml").read_text())
    hashed = []
    real_digest = transfer.file_digest
    monkeypatch.setattr(transfer, "file_digest", lambda path: hashed.append(path) or real_digest(path))
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + verifycache.RACY_SECONDS + 0.1)
    config = tmp_path / "pyxis.toml"
    config.write_text("verify = true\n")
    env = {**job_env, **DUMMY_CREDENTIALS, "EFABUILD_STORE": str(shared), "EFABUILD_PYXIS_CONFIG": str(config),
           verifycache.CACHE_ENV: str(cache_dir(tmp_path / "verified"))}
    first = importer("get", "docker://efabuild://ngc-efa:user", env=env, cwd=tmp_path)
    assert (first.returncode, first.stdout) == (0, f"{shared / 'objects' / key[:2] / key}.sqsh\n"), first.stderr
    assert hashed == []  # the copy the fetch has just checked is not hashed again
    for _ in range(2):
        again = importer("get", "docker://efabuild://ngc-efa:user", env=env, cwd=tmp_path)
        assert (again.returncode, again.stdout) == (0, first.stdout), again.stderr
    assert len(hashed) == 1  # the next start verified it once, and remembered it
    copy = Path(first.stdout.strip())
    before = copy.stat()
    copy.chmod(0o644)
    with open(copy, "r+b") as handle:
        handle.write(b"rot")
    os.utime(copy, ns=(before.st_atime_ns, before.st_mtime_ns))
    damaged = importer("get", "docker://efabuild://ngc-efa:user", env=env, cwd=tmp_path)
    assert damaged.returncode == 1 and damaged.stdout == "" and "corrupt artifact: digest" in damaged.stderr


def test_a_verifying_get_never_loads_the_native_helper_the_jobs_environment_names(store_dir, job_env, tmp_path):
    """The job's user sets the importer's environment: $EFABUILD_BLAKE3_LIB must not make it load
    their library, whatever its owner (only make's ancestor check uses the helper)."""
    from tests.host.test_blake3tree import _planted_library

    marker = tmp_path / "ran"
    library = _planted_library(tmp_path, marker)
    config = tmp_path / "pyxis.toml"
    config.write_text(f'store = "{store_dir}"\nverify = true\n')
    env = {**job_env, "EFABUILD_PYXIS_CONFIG": str(config), "EFABUILD_BLAKE3_LIB": str(library)}
    result = subprocess.run([*IMPORTER, "get", "docker://efabuild://ngc-efa:user"], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith(str(store_dir)), result
    assert not marker.exists()
