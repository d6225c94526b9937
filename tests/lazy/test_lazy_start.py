"""The Pyxis importer's lazy start (`lazy = true`): a job step on a node whose store knows only S3
gets the artifact's .sqsh served from its chunks through a real FUSE mount, read through
squashfuse as Pyxis's use_squashfuse=1 reads it; `release` unmounts once nothing reads it. Only a
chunk index the artifact's record names (and, with require_signature, its signed statement) is
used; anything else is one line on stderr and the whole file, verified as before (moto's S3
server, real FUSE, real squashfuse, real signatures)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from efabuild.chunks.cdc import chunk_file
from efabuild.store.config import locate, store_config_text
from efabuild.store.record import ArtifactRecord
from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import FilesystemTier
from tests.kits.signkit import make_key, trust_config
from tests.kits.storekit import CHUNKED, REPO, key_for, make_sqsh, record_for
from tests.plugins.s3server import DUMMY_CREDENTIALS
from tests.pyxis.test_pyxis import importer

pytestmark = [pytest.mark.skipif(not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
                                 reason="no /dev/fuse or fusermount3 here"), pytest.mark.timeout(180)]

URI = "docker://efabuild://demo:user"


def _publish(tmp_path: Path, settings, *, signer=None, manifest_names_index: bool = True) -> tuple[Path, str, Path]:  # noqa: ANN001
    """A builder publishes one artifact to S3 (chunked) as make does: its record names the chunk
    index, and with `signer` its manifest and signed statement do too (unless told otherwise:
    a statement signed before chunk indexes were). (the node's store directory, key, .sqsh)"""
    from efabuild.host.digest import file_digests
    from efabuild.provenance.stored import describe_sqsh
    from efabuild.signing.attest import signed

    key = key_for(f"lazy start {tmp_path}")
    sqsh = make_sqsh(tmp_path, os.urandom(2 << 20))
    builder = Store([FilesystemTier(tmp_path / "builder", "local")], settings, show_progress=False,
                    s3_options=CHUNKED)
    blake3, sha256 = file_digests(sqsh)
    record = ArtifactRecord.for_file(key, "demo:user", sqsh, blake3, sha256=sha256)
    manifest = envelope = None
    if signer is not None:
        index = chunk_file(sqsh, chunking=CHUNKED["chunking"])
        manifest = describe_sqsh(sqsh, key=key, name="demo:user", sqsh_digest=blake3, sqsh_sha256=sha256,
                                 export_options={}, base=None, chain=[], builder={}, times={},
                                 chunk_index=index.identity() if manifest_names_index else None)
        envelope = signed(manifest, signer)
    builder.publish(key, sqsh, record, manifest, envelope=envelope)
    node = FilesystemTier(tmp_path / "node", "store")
    node.root.mkdir()
    node.write_config(store_config_text(settings))
    return node.root, key, sqsh


def _job(tmp_path: Path, node: Path, **config: object) -> dict[str, str]:
    runtime = tmp_path / "pyxis-runtime"
    runtime.mkdir(exist_ok=True)
    (tmp_path / "node-tmp").mkdir(exist_ok=True)
    lines = [f'lazy_cache = "{tmp_path / "node-tmp"}"', "lazy = true"]
    lines += [f"{name} = {json.dumps(value)}" for name, value in config.items()]
    (tmp_path / "pyxis.toml").write_text("\n".join(lines) + "\n")
    return {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "HOME": str(tmp_path), **DUMMY_CREDENTIALS,
            "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "PYXIS_RUNTIME_PATH": str(runtime),
            "EFABUILD_STORE": str(node), "EFABUILD_PYXIS_CONFIG": str(tmp_path / "pyxis.toml")}


def _step_dir(tmp_path: Path) -> Path:
    return tmp_path / "pyxis-runtime" / str(os.getuid()) / "4242.0.lazy"


def _mount_process(where: Path) -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mount" in argv and str(where).encode() in argv:
            return int(pid)
    return None


@pytest.fixture
def cleanup(tmp_path: Path):
    yield
    for where in (tmp_path / "rootfs", _step_dir(tmp_path)):
        subprocess.run(["fusermount3", "-uz", str(where)], capture_output=True, timeout=30)


@pytest.mark.s3
def test_a_lazy_get_serves_the_artifact_from_its_chunks_and_release_unmounts_once_nothing_reads(
        tmp_path, settings, cleanup):
    node, key, sqsh = _publish(tmp_path, settings)
    s3 = Store.from_config(locate(str(node))).s3
    assert s3.record(key).chunks == s3.chunk_index(key).identity()  # the publish bound the index to the record
    env = _job(tmp_path, node)
    got = importer("get", URI, env=env, cwd=tmp_path)
    served = _step_dir(tmp_path) / f"{key}.sqsh"
    assert (got.returncode, got.stdout, got.stderr) == (0, f"{served}\n", "")
    assert os.path.ismount(_step_dir(tmp_path))
    assert not list(node.rglob("*.sqsh"))  # no whole copy was fetched onto the node's store
    # the container is created from it (use_squashfuse=1), then Pyxis releases while it runs
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    subprocess.run(["squashfuse", str(served), str(rootfs)], check=True, timeout=30)
    payload = (tmp_path / "artifact-rootfs" / "payload.bin").read_bytes()
    assert "payload.bin" in os.listdir(rootfs)  # nothing of the payload read yet
    daemon = _mount_process(_step_dir(tmp_path))
    assert daemon is not None
    for _ in range(2):  # called twice per step
        done = importer("release", env=env, cwd=tmp_path)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert not _step_dir(tmp_path).exists()
    # the running container reads on: its first read of the file's data, served through the released mount
    assert (rootfs / "payload.bin").read_bytes() == payload
    subprocess.run(["fusermount3", "-u", str(rootfs)], check=True, timeout=30)
    deadline = time.monotonic() + 30  # the last reader gone, the mount ends on its own
    while time.monotonic() < deadline and _running(daemon):
        time.sleep(0.1)
    assert not _running(daemon)


def _running(pid: int) -> bool:
    """Alive and not a zombie (the importer ran in this process: its mount is this process's child)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.s3
def test_a_record_naming_no_chunk_index_is_fetched_whole_after_one_line(tmp_path, settings, s3_client, cleanup):
    """A record published before records named their index: its chunks could be checked only once
    the whole file is read, so the job gets the whole file, verified, as without `lazy`."""
    node, key, sqsh = _publish(tmp_path, settings)
    s3 = Store.from_config(locate(str(node))).s3
    older = s3.record(key)._replace(chunks=None)
    s3_client.put_object(Bucket=settings.bucket, Key=s3.record_object(key), Body=older.to_json())
    got = importer("get", URI, env=_job(tmp_path, node), cwd=tmp_path)
    whole = node / "objects" / key[:2] / f"{key}.sqsh"
    assert (got.returncode, got.stdout) == (0, f"{whole}\n"), got.stderr
    assert got.stderr.count("\n") == 1 and "no lazy start" in got.stderr and "names no chunk index" in got.stderr
    assert whole.read_bytes() == sqsh.read_bytes()
    assert not _step_dir(tmp_path).exists()


@pytest.mark.s3
def test_a_chunk_index_other_than_the_one_the_record_names_is_never_mounted(tmp_path, settings, s3_client, cleanup):
    """A co-tenant replaces the S3 index with one of the same bytes cut otherwise (valid, of the
    record's size and digest, naming chunks of their choosing): refused by `efabuild mount` and by
    the lazy start, whose fallback fetch checks the whole file against the record."""
    node, key, sqsh = _publish(tmp_path, settings)
    s3 = Store.from_config(locate(str(node))).s3
    forged = chunk_file(sqsh, chunking=(16 * 1024, 64 * 1024, 256 * 1024))
    s3_client.put_object(Bucket=settings.bucket, Key=s3.index_object(key), Body=forged.to_json())
    where = tmp_path / "mnt"
    where.mkdir()
    done = subprocess.run(["python3", "-m", "efabuild", "mount", "--background", "--store", str(node), "--cache",
                           str(tmp_path / "cache"), key, str(where)], capture_output=True, text=True, timeout=90,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (done.returncode, done.stdout) == (1, "") and not os.path.ismount(where)
    assert f"its record names {s3.record(key).chunks}" in done.stderr
    got = importer("get", URI, env=_job(tmp_path, node), cwd=tmp_path)
    assert "no lazy start (refusing the chunk index" in got.stderr
    if got.returncode == 0:  # fetched whole: every byte checked against the record's digest
        assert Path(got.stdout.strip()).read_bytes() == sqsh.read_bytes()
    assert not _step_dir(tmp_path).exists()


@pytest.fixture
def release_key(tmp_path: Path):  # noqa: ANN201 - (PemSigner, public key path)
    from efabuild.signing.keys import PemSigner

    private, public = make_key(tmp_path / "keys", "ed25519")
    return PemSigner(private), public


@pytest.mark.s3
@pytest.mark.parametrize("names_index", [True, False], ids=["statement names the index", "signed before"])
def test_under_require_signature_only_a_signed_index_is_mounted(tmp_path, settings, release_key, cleanup,
                                                                 names_index):
    signer, public = release_key
    node, key, sqsh = _publish(tmp_path, settings, signer=signer, manifest_names_index=names_index)
    env = {**_job(tmp_path, node, require_signature=True),
           "EFABUILD_TRUST_CONFIG": str(trust_config(tmp_path / "trust.toml", public)),
           "EFABUILD_VERIFY_CACHE": str(tmp_path / "verified")}
    got = importer("get", URI, env=env, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    if names_index:
        assert (got.stdout, got.stderr) == (f"{_step_dir(tmp_path) / key}.sqsh\n", "")
    else:  # the whole file, its signature verified as before
        assert got.stdout == f"{node / 'objects' / key[:2] / key}.sqsh\n"
        assert "no lazy start" in got.stderr and "names no chunk index" in got.stderr
    assert Path(got.stdout.strip()).read_bytes() == sqsh.read_bytes()
    assert importer("release", env=env, cwd=tmp_path).returncode == 0
    assert not _step_dir(tmp_path).exists()


def test_a_signed_statement_binds_the_chunk_index_it_names(tmp_path, release_key):
    """The statement's byproduct `<key>.chunks` is what a lazy start checks the index against."""
    from efabuild.host.digest import file_digests
    from efabuild.provenance.stored import describe_sqsh
    from efabuild.signing.attest import signed
    from efabuild.signing.trust import TRUST_CONFIG_ENV, node_policy
    from efabuild.signing.verify import signed_problems

    signer, public = release_key
    sqsh = make_sqsh(tmp_path, os.urandom(300_000))
    key = key_for("bound")
    blake3, sha256 = file_digests(sqsh)
    index = chunk_file(sqsh, chunking=CHUNKED["chunking"])
    manifest = describe_sqsh(sqsh, key=key, name="demo:user", sqsh_digest=blake3, sqsh_sha256=sha256,
                             export_options={}, base=None, chain=[], builder={}, times={},
                             chunk_index=index.identity())
    envelope = signed(manifest, signer)
    policy = node_policy({TRUST_CONFIG_ENV: str(trust_config(tmp_path / "trust.toml", public))})
    record = record_for(key, "demo:user", sqsh)

    def problems(chunk_index: str | None) -> list[str]:
        return signed_problems(envelope, key, record, policy, blake3, None, sqsh="a.sqsh", where="statement",
                               chunk_index=chunk_index)

    assert problems(None) == [] and problems(index.identity()) == []
    other = chunk_file(sqsh, chunking=(16 * 1024, 64 * 1024, 256 * 1024)).identity()
    assert problems(other) == [f"statement: the signed statement names another chunk index than {other}"]


@pytest.mark.s3
def test_release_clears_a_mount_whose_process_was_killed(tmp_path, settings, cleanup):
    """Slurm kills a step's processes, the OOM killer picks the mount: every stat of the mount point
    then fails (ENOTCONN), and release must still find it (in the mount table) and clear it."""
    import signal

    node, key, _ = _publish(tmp_path, settings)
    env = _job(tmp_path, node)
    target = tmp_path / "not-the-runtime"
    target.write_text("theirs")
    (tmp_path / "pyxis-runtime" / str(os.getuid())).mkdir(parents=True, mode=0o700)
    planted = _step_dir(tmp_path).with_name("4242.0.lazy.log")
    planted.symlink_to(target)  # the user's own directory: a link at the log's name is not written through
    got = importer("get", URI, env=env, cwd=tmp_path)
    assert got.returncode == 0 and got.stdout == f"{_step_dir(tmp_path) / key}.sqsh\n", got.stderr
    assert target.read_text() == "theirs"
    daemon = _mount_process(_step_dir(tmp_path))
    os.kill(daemon, signal.SIGKILL)
    while _running(daemon):
        time.sleep(0.05)
    with pytest.raises(OSError):
        os.stat(_step_dir(tmp_path) / f"{key}.sqsh")
    done = importer("release", env=env, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert str(_step_dir(tmp_path)) not in Path("/proc/self/mountinfo").read_text()
    assert not os.path.lexists(_step_dir(tmp_path)) and not os.path.lexists(planted)
