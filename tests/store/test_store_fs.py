"""Filesystem tiers (local cache/ and a shared FSx-like path): atomic, concurrent, verifiable."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from efabuild.host.digest import file_digest
from efabuild.errors import EfabuildError, NotFound
from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import PUBLISHED, REUSED, FilesystemTier
from efabuild.refs import AmbiguousRef
from tests.kits.storekit import (
    collect_warnings,
    key_for,
    kill_publisher_at,
    make_sqsh,
    race_publishers,
    record_for,
    start_publisher,
    unsquash_list,
)


@pytest.fixture
def sqsh(tmp_path: Path) -> Path:
    return make_sqsh(tmp_path, os.urandom(300_000))


def subdir(base: Path, name: str) -> Path:
    (base / name).mkdir()
    return base / name


def two_tier_store(base: Path) -> Store:
    return Store([FilesystemTier(base / "shared", "shared"), FilesystemTier(base / "cache", "local")],
                 show_progress=False)


def test_publish_then_lookup_gives_the_same_squashfs(tmp_path, sqsh):
    store = two_tier_store(tmp_path)
    key = key_for("user")
    results = store.publish(key, sqsh, record_for(key, "ngc-efa:user", sqsh), b'{"versions": {}}')
    assert results == {"local": PUBLISHED, "shared": PUBLISHED}

    path = store.lookup("ngc-efa:user")
    assert path == tmp_path / "shared" / "objects" / key[:2] / f"{key}.sqsh"  # shared first
    assert file_digest(path) == file_digest(sqsh)
    assert any(line.endswith("/payload.bin") for line in unsquash_list(path))
    assert store.manifest(key) == b'{"versions": {}}'
    record = store.record(key)
    assert record.name == "ngc-efa:user" and record.size == sqsh.stat().st_size
    assert record.manifest_digest.startswith("blake3:")
    # stored artifacts are read-only
    assert not os.stat(path).st_mode & 0o222


def test_same_filesystem_publish_links_instead_of_copying(tmp_path, sqsh):
    store = Store([FilesystemTier(tmp_path / "cache", "local")], show_progress=False)
    key = key_for("link")
    store.publish(key, sqsh, record_for(key, "g:l", sqsh))
    assert os.stat(store.lookup(key)).st_ino == os.stat(sqsh).st_ino


def test_other_filesystem_publish_copies_completely(tmp_path, sqsh):
    if not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs a second filesystem (tmpfs at /dev/shm)")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        store = Store([FilesystemTier(Path(other) / "shared", "shared"),
                       FilesystemTier(tmp_path / "cache", "local")], show_progress=False)
        key = key_for("copy")
        store.publish(key, sqsh, record_for(key, "g:l", sqsh))
        shared = store.lookup(key)
        assert shared.is_relative_to(other)
        assert os.stat(shared).st_ino != os.stat(sqsh).st_ino
        assert file_digest(shared) == file_digest(sqsh)
        assert os.listdir(Path(other) / "shared" / "tmp") == []


def test_second_publish_reuses_and_keeps_the_stored_bytes(tmp_path, sqsh, monkeypatch):
    warnings = collect_warnings(monkeypatch)
    store = two_tier_store(tmp_path)
    key = key_for("again")
    store.publish(key, sqsh, record_for(key, "g:l", sqsh))
    stored = file_digest(store.lookup(key))
    # A second export of the same key that is not byte-identical: the stored one stays.
    other = make_sqsh(subdir(tmp_path, "second"), os.urandom(300_000))
    assert store.publish(key, other, record_for(key, "g:l", other)) == {"local": REUSED, "shared": REUSED}
    assert file_digest(store.lookup(key)) == stored
    assert any("not byte-identical" in warning for warning in warnings), warnings


def test_record_without_sqsh_is_invisible_and_repaired_by_the_next_publish(tmp_path, sqsh):
    tier = FilesystemTier(tmp_path / "cache", "local")
    key = key_for("half")
    record = record_for(key, "g:l", sqsh)
    tier.layout.object_dir(key).mkdir(parents=True)
    tier.layout.record_path(key).write_bytes(record.to_json())  # an interrupted publish
    store = Store([tier], show_progress=False)
    assert not tier.has(key)
    with pytest.raises(NotFound):
        store.lookup(key)
    assert store.ls() == []
    assert store.publish(key, sqsh, record) == {"local": PUBLISHED}
    assert file_digest(store.lookup(key)) == record.digest


def test_verify_refuses_a_corrupted_object(tmp_path, sqsh):
    store = two_tier_store(tmp_path)
    key = key_for("rot")
    store.publish(key, sqsh, record_for(key, "g:l", sqsh))
    path = store.lookup(key)
    os.chmod(path, 0o644)
    with open(path, "r+b") as handle:  # bit rot in the middle: same size, other bytes
        handle.seek(100_000)
        byte = handle.read(1)
        handle.seek(100_000)
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert store.lookup(key) == path  # a plain lookup does not read 25 GB
    with pytest.raises(EfabuildError, match="corrupt artifact: digest"):
        store.lookup(key, verify=True)


def test_resolve_by_key_prefix_name_and_the_failures(tmp_path):
    store = Store([FilesystemTier(tmp_path / "cache", "local")], show_progress=False)
    # two keys sharing their first 9 hex characters
    keys = ["abcdef012" + "0" * 55, "abcdef012" + "1" * 55]
    for index, key in enumerate(keys):
        sqsh = make_sqsh(subdir(tmp_path, f"s{index}"), os.urandom(10_000))
        store.publish(key, sqsh, record_for(key, "g:l", sqsh))
    assert store.resolve(keys[0]) == keys[0]
    assert store.resolve("abcdef0120") == keys[0]
    assert store.resolve("g:l") == keys[1]  # newest publish of the name
    with pytest.raises(AmbiguousRef, match="ambiguous: 2 artifacts match"):
        store.resolve("abcdef01")
    with pytest.raises(NotFound, match="no artifact named g:other"):
        store.resolve("g:other")
    with pytest.raises(NotFound):
        store.lookup("f" * 64)


# ---- interrupted publishers ---------------------------------------------------------------

POINTS = ["mid-copy", "after-manifest", "before-record", "before-sqsh-link", "after-sqsh-link"]


@pytest.mark.parametrize("point", POINTS)
def test_kill_9_at_any_point_never_shows_a_partial_artifact(tmp_path, sqsh, point):
    if point == "mid-copy" and (not Path("/dev/shm").is_dir()
                                or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev):
        pytest.skip("a copy needs a second filesystem (tmpfs at /dev/shm)")
    with tempfile.TemporaryDirectory(dir="/dev/shm" if point == "mid-copy" else tmp_path) as shared_dir:
        tiers = [["shared", shared_dir], ["local", str(tmp_path / "cache")]]
        key = key_for("killed")
        plan = {"tiers": tiers, "key": key, "name": "g:l", "sqsh": str(sqsh), "pause": point,
                "manifest": '{"m": 1}'}
        kill_publisher_at(plan, tmp_path / "plan.json")
        store = Store([FilesystemTier(p, n) for n, p in tiers], show_progress=False)
        # Tiers are written local first; the copy to the other filesystem (shared) comes after.
        complete = {"mid-copy": {"local"}, "after-sqsh-link": {"local"}}.get(point, set())
        for tier in store.fs_tiers:
            if tier.name in complete:
                tier.verify(key)  # whole, never partial
            else:
                assert not tier.has(key) and not tier.sqsh_path(key).exists()
                assert store.ls() == [] or tier.name not in store.ls()[0].tiers
        # a rerun finishes the job; then gc clears the dead writer's temp files
        rerun = start_publisher({**plan, "pause": None}, tmp_path / "plan2.json")
        out, err = rerun.communicate(timeout=120)
        assert rerun.returncode == 0, err
        for tier in store.fs_tiers:
            tier.verify(key)
        assert store.lookup("g:l") == Path(shared_dir) / "objects" / key[:2] / f"{key}.sqsh"
        store.gc(dry_run=False)
        for tier in store.fs_tiers:
            assert os.listdir(tier.layout.tmp_dir) == []


def test_kill_9_at_random_moments(tmp_path):
    """Kills at arbitrary moments (not only the named points): the invariant must still hold."""
    rng = random.Random(20261130)
    sqsh = make_sqsh(tmp_path, os.urandom(2_000_000))
    for attempt in range(4):
        tiers = [["shared", str(tmp_path / f"shared{attempt}")], ["local", str(tmp_path / f"cache{attempt}")]]
        key = key_for(f"random{attempt}")
        plan = {"tiers": tiers, "key": key, "name": "g:l", "sqsh": str(sqsh)}
        child = start_publisher(plan, tmp_path / f"plan{attempt}.json")
        try:
            child.wait(timeout=rng.uniform(0.05, 1.5))
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
            child.wait()
        for name, root in tiers:
            tier = FilesystemTier(root, name)
            if tier.has(key):
                tier.verify(key)
            else:
                assert tier.record(key) is None


# ---- concurrent publishers ----------------------------------------------------------------

def test_four_processes_publishing_one_key(tmp_path, sqsh):
    tiers = [["shared", str(tmp_path / "shared")], ["local", str(tmp_path / "cache")]]
    key = key_for("race")
    go = tmp_path / "go"
    plans = []
    for index in range(4):
        copy = tmp_path / f"export{index}.sqsh"
        copy.write_bytes(sqsh.read_bytes())  # each builder has its own export of the same layer
        plans.append({"tiers": tiers, "key": key, "name": "g:l", "sqsh": str(copy), "go": str(go)})
    outcomes = race_publishers(plans, go, tmp_path, timeout=120)
    for tier in ("local", "shared"):
        assert sorted(o[tier] for o in outcomes) == [PUBLISHED, REUSED, REUSED, REUSED]
    store = Store([FilesystemTier(p, n) for n, p in tiers], show_progress=False)
    for tier in store.fs_tiers:
        tier.verify(key)
        assert [e["key"] for e in tier.names.read("g:l")] == [key]
    assert [l.record.key for l in store.ls()] == [key]


def test_concurrent_ref_appends_lose_no_entry(tmp_path):
    tier = FilesystemTier(tmp_path / "cache", "local")
    keys = [key_for(f"ref{i}") for i in range(24)]
    script = (
        "import sys\nfrom efabuild.store.tiers.fs import FilesystemTier\n"
        "tier = FilesystemTier(sys.argv[1], 'local')\n"
        "for key in sys.argv[2:]:\n    tier.names.append('g:l', key)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tier.root), *keys[i::4]], env=env)
             for i in range(4)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    assert sorted(e["key"] for e in tier.names.read("g:l")) == sorted(keys)


def test_a_write_that_fails_names_the_file_it_was_writing_not_its_temp_file(tmp_path):
    """Writes below a store's root go through a directory descriptor, so the system's error names
    only the bare temp file; the message (efabuild: FILE: reason) must name the file instead."""
    from efabuild.host.fsutil import replace_owned

    target = tmp_path / "state" / "hashes"
    (target / "inside").mkdir(parents=True)  # a directory where the file belongs: the rename fails
    with pytest.raises(OSError) as failed:
        replace_owned(target, b"data", below=tmp_path)
    assert failed.value.filename == str(target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["hashes"]  # the temp file is gone


def test_an_atomic_write_reaches_the_disk_before_its_rename(tmp_path, monkeypatch):
    """Slip: atomic_write_bytes without its fsync before the rename. A record, ref or index must be
    on disk before its name points at it: after a power cut
    the rename may have reached the disk and the data not, and a reader gets an empty or partial
    file under the final name. No crash of the kernel can be staged in a test, so the order of
    the calls is what is checked: fsync of the new file, then the rename, then fsync of the
    directory that holds the name."""
    import stat

    from efabuild.host import fsutil

    calls: list[tuple[str, object]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        # the file is open for writing only: its bytes are read through its name
        kind = "dir" if stat.S_ISDIR(info.st_mode) else Path(f"/proc/self/fd/{fd}").read_bytes()
        calls.append(("fsync", kind))
        real_fsync(fd)

    def replace(*args, **kwargs) -> None:  # noqa: ANN002, ANN003
        calls.append(("rename", None))
        real_replace(*args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "store" / "refs" / "demo" / "user.json"
    fsutil.atomic_write_bytes(target, b'{"key": "new"}', tmp_path / "store" / "tmp")
    assert target.read_bytes() == b'{"key": "new"}'
    assert calls == [("fsync", b'{"key": "new"}'), ("rename", None), ("fsync", "dir")]


def test_a_copy_swapped_for_a_fifo_after_its_stat_is_damaged_not_a_hang(tmp_path, monkeypatch):
    """The check stats the file, then reads it: a co-tenant who swaps the .sqsh for a FIFO in
    between held the hash (and with it a lookup --verify or a job's start) until someone wrote to
    the FIFO. The swap is staged by answering the stat for the file that was there."""
    from efabuild.store import transfer
    from efabuild.store.record import ArtifactRecord
    from tests.kits.fifos import without_blocking_on

    real = tmp_path / "real.sqsh"
    real.write_bytes(b"squashfs bytes")
    record = ArtifactRecord.for_file("a" * 64, "demo:user", real, file_digest(real))
    planted = tmp_path / "planted.sqsh"
    os.mkfifo(planted)
    real_lstat = Path.lstat
    monkeypatch.setattr(Path, "lstat", lambda self: real_lstat(real) if self == planted else real_lstat(self))
    with pytest.raises(transfer.DamagedCopy, match="not a regular file"):
        without_blocking_on(planted, lambda: transfer.check_file("shared", planted, record))
    transfer.check_file("shared", real, record)  # the file itself is intact


def test_only_an_ancestors_check_loads_the_native_blake3_helper(tmp_path):
    """A job start's check (the Pyxis importer's verify, lookup --verify) hashes with the binding and
    never loads a native library; an incremental export's ancestor check asks for its subtrees."""
    import subprocess
    import sys

    sqsh = tmp_path / "a.sqsh"
    sqsh.write_bytes(os.urandom(3 << 20))
    code = f"""
import os, sys
from pathlib import Path
from efabuild.host.digest import file_digest
from efabuild.store.record import ArtifactRecord
from efabuild.store.transfer import check_file, open_checked_stamped
path = Path({str(sqsh)!r})
record = ArtifactRecord.for_file("a" * 64, "n:l", path, file_digest(path))
check_file("shared", path, record)
print("efabuild.host.blake3tree" in sys.modules)
checked = open_checked_stamped("shared", path, record, with_tree=True)
print(checked.tree is not None and checked.tree.digest == record.digest)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


def test_a_copy_found_damaged_is_repaired_from_another_tier_else_withdrawn(tmp_path):
    """make's check of an ancestor found other bytes than its record names: the copy is repaired
    from a tier holding a good one, or, where none does, withdrawn, so that no later make builds on
    it and no lookup hands it out (the next make exports it again)."""
    from efabuild.errors import NotFound
    from efabuild.store.tiered import Store
    from efabuild.store.tiers.fs import FilesystemTier
    from tests.kits.storekit import key_for, make_sqsh, record_for

    local, shared = FilesystemTier(tmp_path / "local", "local"), FilesystemTier(tmp_path / "fsx", "shared")
    store = Store([shared, local], show_progress=False)
    key = key_for("withdrawn")
    sqsh = make_sqsh(tmp_path, os.urandom(50_000))
    store.publish(key, sqsh, record_for(key, "g:l", sqsh))

    def damage(tier: FilesystemTier) -> None:
        # this tier's copy alone (the tiers here share a filesystem, and publish links their copies)
        path = tier.sqsh_path(key)
        data = bytearray(path.read_bytes())
        data[30_000:30_003] = b"\xff\x00\xff"
        other = path.with_suffix(".rot")
        other.write_bytes(bytes(data))
        os.replace(other, path)

    damage(local)
    assert store.withdraw_damaged(key, local, "damaged") == "repaired from another tier"
    assert local.sqsh_path(key).read_bytes() == sqsh.read_bytes()
    alone = Store([local], show_progress=False)
    damage(local)
    assert alone.withdraw_damaged(key, local, "damaged") == "withdrawn"
    assert not local.sqsh_path(key).exists() and local.record(key) is None
    with pytest.raises(NotFound):
        alone.lookup(key)
