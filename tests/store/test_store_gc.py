"""`efabuild ls` and `efabuild gc` on a workspace store with a local and a shared tier."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from efabuild.host.digest import file_digest
from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import FilesystemTier
from efabuild.host.owner import Owner, owned_name
from efabuild.store.record import ArtifactRecord
from efabuild.store.gc.sweep import remove
from tests.kits.storekit import REPO, efabuild, key_for

# name -> keys in the order they were built (oldest first)
BUILDS = {
    "ngc-efa:user": [key_for(f"user{i}") for i in range(4)],
    "ngc-efa:deepep": [key_for(f"deepep{i}") for i in range(2)],
    "other:tool": [key_for("tool0")],
}


def publish(store: Store, key: str, name: str, day: int, directory: Path) -> None:
    sqsh = directory / f"{key[:12]}.sqsh"
    sqsh.write_bytes(os.urandom(4096))  # content does not matter to gc
    record = ArtifactRecord.for_file(key, name, sqsh, file_digest(sqsh), created=f"2026-11-{day:02d}T00:00:00.000000Z")
    store.publish(key, sqsh, record)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "BUILD.toml").write_text(
        '[store]\nlocal = "cache"\nshared = "fsx"\nkeep = 2\n'
        f'pins = ["{BUILDS["ngc-efa:user"][0][:10]}"]\n'
    )
    store = Store([FilesystemTier(tmp_path / "fsx", "shared"), FilesystemTier(tmp_path / "cache", "local")],
                  show_progress=False)
    exports = tmp_path / "exports"
    exports.mkdir()
    day = 1
    for name, keys in BUILDS.items():
        for key in keys:
            publish(store, key, name, day, exports)
            day += 1
    return tmp_path


def listed(workspace: Path) -> dict[str, list[str]]:
    result = efabuild("ls", "--json", cwd=workspace, check=True)
    return {item["key"]: item["tiers"] for item in json.loads(result.stdout)["artifacts"]}


def test_ls_shows_key_name_size_created_and_tiers(workspace):
    result = efabuild("ls", cwd=workspace, check=True)
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["KEY", "NAME", "SIZE", "S3", "STORED/UNIQUE", "CREATED", "TIERS"]
    assert len(lines) == 1 + 7
    first = BUILDS["ngc-efa:deepep"][0]
    assert lines[1].split() == [first[:12], "ngc-efa:deepep", "4.0", "KiB", "-", "2026-11-05", "00:00:00Z",
                                "shared,local"]  # no S3 tier: no S3 bytes
    assert set(listed(workspace)) == {k for keys in BUILDS.values() for k in keys}


def test_gc_dry_run_deletes_nothing_and_yes_deletes_what_it_listed(workspace):
    user = BUILDS["ngc-efa:user"]
    before = listed(workspace)
    dry = efabuild("gc", cwd=workspace, check=True)
    # keep 2 newest per name (user2, user3), the pin (user0); user1 goes, from both tiers
    assert dry.stdout.splitlines() == [
        f"would delete  shared  {user[1][:12]}  ngc-efa:user  4.0 KiB  2026-11-02 00:00:00Z",
        f"would delete  local  {user[1][:12]}  ngc-efa:user  4.0 KiB  2026-11-02 00:00:00Z",
        "gc: would delete 2 objects, 8.0 KiB; kept 6 keys (newest 2 per name, current refs, pins); "
        "run with --yes to delete",
    ]
    assert listed(workspace) == before
    assert efabuild("lookup", user[1], cwd=workspace).returncode == 0

    build_lock = FilesystemTier(workspace / "cache", "local").layout.build_lock_path(user[1])
    build_lock.parent.mkdir(parents=True, exist_ok=True)
    build_lock.touch()  # left by the make that built user1
    done = efabuild("gc", "--yes", cwd=workspace, check=True)
    assert done.stdout.splitlines()[-1].startswith("gc: deleted 2 objects, 8.0 KiB")
    assert not build_lock.exists()
    after = listed(workspace)
    assert set(before) - set(after) == {user[1]}
    assert efabuild("lookup", user[1], cwd=workspace).returncode == 1
    assert efabuild("lookup", "ngc-efa:user", cwd=workspace).stdout.strip().endswith(f"{user[3]}.sqsh")
    history = json.loads((workspace / "fsx" / "refs" / "ngc-efa" / "user.json").read_text())["history"]
    assert [entry["key"] for entry in history] == [user[0], user[2], user[3]]


def test_keep_and_pin_options_and_the_current_ref_stays(workspace):
    user = BUILDS["ngc-efa:user"]
    store = Store([FilesystemTier(workspace / "fsx", "shared"), FilesystemTier(workspace / "cache", "local")],
                  show_progress=False)
    # roll the name back to an older build: the ref now points at user2, not the newest user3
    for tier in store.fs_tiers:
        tier.names.append("ngc-efa:user", user[2])
    result = efabuild("gc", "--keep", "1", "--pin", "other:tool", "--json", "--yes", cwd=workspace, check=True)
    report = json.loads(result.stdout)
    deleted = {(r["tier"], r["key"]) for r in report["removals"]}
    assert deleted == {(tier, key) for tier in ("shared", "local")
                       for key in (user[1], BUILDS["ngc-efa:deepep"][0])}
    assert set(listed(workspace)) == {user[0], user[2], user[3], BUILDS["ngc-efa:deepep"][1], BUILDS["other:tool"][0]}
    assert efabuild("lookup", "ngc-efa:user", cwd=workspace).stdout.strip().endswith(f"{user[2]}.sqsh")


def test_gc_removes_leftovers_of_dead_writers_and_skips_objects_in_use(workspace):
    cache = FilesystemTier(workspace / "cache", "local")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    host = socket.gethostname().split(".")[0]
    leftover = cache.layout.tmp_dir / f"efatmp.{host}.{dead.stdout.strip()}.0badc0de.x.sqsh"
    leftover.write_bytes(b"half an export")
    live = cache.layout.tmp_dir / f"efatmp.{host}.{os.getpid()}.0badc0de.y.sqsh"
    live.write_bytes(b"being written")
    foreign = cache.layout.tmp_dir / "context-user-abc"  # another tool's temp dir: not ours
    foreign.mkdir()
    orphan_key = key_for("interrupted")
    cache.layout.object_dir(orphan_key).mkdir(parents=True, exist_ok=True)
    cache.layout.record_path(orphan_key).write_text("{}")

    # a publisher holds the lock of user1 (which gc would delete)
    user1 = BUILDS["ngc-efa:user"][1]
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom efabuild.store.tiers.fs import FilesystemTier\n"
         "lock = FilesystemTier(sys.argv[1], 'local').key_lock(sys.argv[2]); lock.acquire()\n"
         "print('held', flush=True); time.sleep(600)\n", str(cache.root), user1],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        dry = efabuild("gc", cwd=workspace, check=True).stdout
        assert f"would remove leftover  local  {leftover}" in dry
        assert f"would remove leftover  local  {cache.layout.record_path(orphan_key)}" in dry
        assert str(live) not in dry and "context-user-abc" not in dry
        out = efabuild("gc", "--yes", cwd=workspace, check=True).stdout
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert f"skipped (in use)  local  {user1[:12]}" in out
    assert f"deleted  shared  {user1[:12]}" in out
    assert not leftover.exists() and not cache.layout.record_path(orphan_key).exists()
    assert live.exists() and foreign.is_dir()
    assert cache.has(user1)


@pytest.mark.engine
def test_gc_removes_the_export_container_of_a_killed_make_and_not_a_running_ones(workspace, busybox_image):
    """A make killed while exporting leaves its (never started) export container on the engine."""
    from efabuild.engine.containers import EXPORT_LABEL, OWNER_LABEL
    from efabuild.host.owner import start_time

    (workspace / "graphs").mkdir()  # a workspace with a graph: its builder is the engine asked
    (workspace / "graphs" / "g.toml").write_text('[layers.a]\nbase = "busybox:latest"\ndockerfile = "RUN true"\n')
    finished = subprocess.Popen(["true"])
    dead = Owner(socket.gethostname().split(".")[0], finished.pid, start_time(finished.pid))
    finished.wait()
    target = (workspace / "cache" / "tmp").resolve()
    names = {who: f"efabuild-export-{who}-{os.urandom(6).hex()}" for who in ("dead", "live")}
    for who, owner in (("dead", dead), ("live", Owner.current())):
        subprocess.run(["docker", "container", "create", "--name", names[who],
                        "--label", f"{EXPORT_LABEL}={target}/efatmp.{who}.sqsh", "--label", f"{OWNER_LABEL}={owner.token}",
                        busybox_image, "/bin/true"], capture_output=True, check=True)

    def exists(name: str) -> bool:
        return subprocess.run(["docker", "container", "inspect", name], capture_output=True).returncode == 0

    try:
        dry = efabuild("gc", cwd=workspace, check=True).stdout
        assert f"would remove leftover  engine  container {names['dead']}" in dry and names["live"] not in dry
        assert exists(names["dead"])  # a dry run removes nothing
        out = efabuild("gc", "--yes", cwd=workspace, check=True).stdout
        assert f"removed leftover  engine  container {names['dead']}" in out
        assert not exists(names["dead"]) and exists(names["live"])
    finally:
        subprocess.run(["docker", "container", "rm", "--force", *names.values()], capture_output=True)


def test_gc_judges_temp_files_and_check_directories_by_their_owners_start_time_too(workspace):
    """pids are reused: a temp file of this pid but another start time is a dead writer's; a
    killed `make --check` leaves a directory named by its owner, removed once that owner is gone."""
    cache = FilesystemTier(workspace / "cache", "local")
    cache.checked_tmp_dir()
    me = Owner.current()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    reused = cache.layout.tmp_dir / f"efatmp.{me.host}.{me.pid}.{me.start + 1}.0badc0de.x.sqsh"
    reused.write_bytes(b"half an export of an earlier process with this pid")
    live = cache.staging_path(key_for("live"))
    live.write_bytes(b"being written")
    killed_check = cache.layout.tmp_dir / f"check-{me.host}.{dead}.{me.start}-0badc0de-user"
    (killed_check / "rebuilt.sqsh").parent.mkdir()
    (killed_check / "rebuilt.sqsh").write_bytes(b"half a rebuild")
    live_check = cache.layout.tmp_dir / owned_name("check", "user")
    live_check.mkdir()
    dry = efabuild("gc", cwd=workspace, check=True).stdout
    assert f"would remove leftover  local  {reused}" in dry
    assert f"would remove leftover  local  {killed_check}" in dry
    assert str(live) not in dry and str(live_check) not in dry
    efabuild("gc", "--yes", cwd=workspace, check=True)
    assert not reused.exists() and not killed_check.exists()
    assert live.exists() and live_check.is_dir()


def _aged(path: Path, days: float = 2) -> Path:
    """Every entry under `path`, then `path` itself, last changed `days` ago (links not followed)."""
    then = time.time() - days * 24 * 3600
    for entry in sorted(path.rglob("*"), reverse=True):
        os.utime(entry, (then, then), follow_symlinks=False)
    os.utime(path, (then, then), follow_symlinks=False)
    return path


def test_gc_removes_unowned_check_directories_of_earlier_versions_only_when_surely_abandoned(workspace, tmp_path):
    """Before check directories named their owner they were `check-<layer>-XXXXXXXX` (mkdtemp): one
    goes when it is this user's, nothing in it changed for a day and no process works in it."""
    cache = FilesystemTier(workspace / "cache", "local")
    tmp = cache.checked_tmp_dir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"not the store's")

    def old_check(name: str) -> Path:
        path = tmp / name
        path.mkdir()
        (path / "rebuilt.sqsh").write_bytes(b"half a rebuild")
        (path / "link").symlink_to(outside / "precious")  # removed as a link, never followed
        return path

    abandoned = _aged(old_check("check-user-k3x_9q2a"))
    fresh = old_check("check-user-0a1b2c3d")  # a day has not passed: an old make may still be at it
    held = _aged(old_check("check-deepep-zz9y8x7w"))
    others = _aged(old_check("check-user-abcdefgh"))
    os.chown(others, 65534, 65534)  # another user's
    planted = tmp / "check-user-linkedaa"
    planted.symlink_to(_aged(outside), target_is_directory=True)
    sleeper = subprocess.Popen(["sleep", "60"], cwd=held)  # a process working in it
    try:
        dry = efabuild("gc", cwd=workspace, check=True).stdout
        assert f"would remove leftover  local  {abandoned}" in dry
        assert not [p for p in (fresh, held, others, planted) if str(p) in dry], dry
        efabuild("gc", "--yes", cwd=workspace, check=True)
        assert not abandoned.exists()
        assert fresh.is_dir() and held.is_dir() and others.is_dir() and planted.is_symlink()
        assert (outside / "precious").read_bytes() == b"not the store's"
    finally:
        sleeper.kill()
        sleeper.wait()
    efabuild("gc", "--yes", cwd=workspace, check=True)
    assert not held.exists() and fresh.is_dir()  # once nothing works in it


def test_a_key_made_current_again_while_gc_runs_is_not_deleted(tmp_path: Path):
    """gc decides from a snapshot; a rollback make that makes an old key current in between wins."""
    store = Store([FilesystemTier(tmp_path / "fsx", "shared")], keep=1, show_progress=False)
    old, new = key_for("rollback-old"), key_for("rollback-new")
    publish(store, old, "demo:user", 1, tmp_path)
    publish(store, new, "demo:user", 2, tmp_path)
    decided = store.gc(dry_run=True)
    assert [r.record.key for r in decided.removals] == [old]
    store.name("demo:user", old)  # the rollback lands between gc's decision and its deletion
    remove(store.fs_tiers, decided.removals, ())
    assert store.lookup("demo:user") == store.fs_tiers[0].sqsh_path(old)


def test_pruning_refs_never_drops_a_names_newest_entry(tmp_path: Path):
    """Had gc deleted a key just made current, the name fails loudly instead of quietly reverting."""
    tier = FilesystemTier(tmp_path / "fsx", "shared")
    older, newest = key_for("older"), key_for("newest")
    tier.names.append("demo:user", older)
    tier.names.append("demo:user", newest)
    tier.names.drop("demo:user", {older, newest})
    assert [entry["key"] for entry in tier.names.read("demo:user")] == [newest]


def test_gc_on_a_read_only_store_is_one_line(workspace):
    """The store mounted read-only (as job users see FSx) in a private mount namespace."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs a private mount namespace (unshare -m) for a read-only bind mount")
    fsx = workspace / "fsx"
    before = sorted(str(p.relative_to(fsx)) for p in fsx.rglob("*"))
    command = (f"mount --bind {fsx} {fsx} && mount -o remount,bind,ro {fsx} && "
               f"exec {sys.executable} -m efabuild gc --yes --store {fsx}")
    result = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, cwd=workspace,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"efabuild: store tier {fsx}: read-only file system")
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert sorted(str(p.relative_to(fsx)) for p in fsx.rglob("*")) == before



def test_gc_keep_zero_is_refused_and_deletes_nothing(workspace):
    """Slip: --keep 0 let through. Every version that no name points at and no pin holds would go,
    the previous one a rollback needs included."""
    before = listed(workspace)
    done = efabuild("gc", "--keep", "0", "--yes", cwd=workspace)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "efabuild: --keep must be at least 1, not 0\n"
    assert listed(workspace) == before

# ---- the keep-set, from hand-made records (store/gc/collect.py: no store, no files) ---------------------

def _held(name: str, key: str, day: int) -> ArtifactRecord:
    return ArtifactRecord(key=key, name=name, size=1, digest="blake3:" + "0" * 64,
                          created=f"2026-11-{day:02d}T00:00:00.000000Z")


def test_a_key_counts_as_new_as_its_newest_copy_in_any_tier():
    """Slip: a key's age is taken from whichever tier was listed last. A copy repaired in the local
    tier (a new record) while the shared tier keeps the old one would then count as old there,
    and `--keep 1` would delete the version just made in favour of an older one."""
    from efabuild.store.gc.collect import keys_to_keep

    repaired, older = key_for("repaired"), key_for("older")
    held = {"local": [_held("demo:user", repaired, 3), _held("demo:user", older, 2)],
            "shared": [_held("demo:user", repaired, 1), _held("demo:user", older, 2)]}
    assert keys_to_keep(held, set(), 1, ()) == {repaired}
    assert keys_to_keep(dict(reversed(held.items())), set(), 1, ()) == {repaired}


def test_gc_in_a_workspace_that_does_not_load_sweeps_the_store_and_says_the_engine_was_not_asked(tmp_path):
    """The store's own table is enough for gc; a mistake elsewhere in BUILD.toml leaves the engine's
    leftovers unlooked-for, which gc says instead of passing over it in silence."""
    (tmp_path / "BUILD.toml").write_text('[store]\nlocal = "cache"\n\n[builder]\njobs = "two"\n')
    done = efabuild("gc", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gc: would delete 0 objects")
    [warning] = done.stderr.splitlines()
    assert warning.startswith("efabuild: warning: engine leftovers not looked for: ") and "jobs" in warning


def test_gc_keeps_the_newest_of_every_name_on_every_platform():
    """Slip: versions grouped by name alone. A name built for amd64 and arm64 keeps the newest N
    of both together, so a week of arm64 builds pushes out every amd64 artifact the x86 nodes run."""
    from efabuild.store.gc.collect import keys_to_keep

    amd = [key_for(f"amd{i}") for i in range(3)]
    arm = [key_for(f"arm{i}") for i in range(3)]
    held = {"local": [_held("demo:user", amd[0], 1)._replace(platform="linux/amd64"),
                      *(_held("demo:user", k, 5 + i)._replace(platform="linux/arm64") for i, k in enumerate(arm))]}
    assert keys_to_keep(held, set(), 1, ()) == {amd[0], arm[2]}
    assert keys_to_keep(held, set(), 2, ()) == {amd[0], arm[1], arm[2]}
    # a record from before platforms were recorded is a group of its own: never the reason another goes
    held["local"].append(_held("demo:user", amd[1], 9))
    assert keys_to_keep(held, set(), 1, ()) == {amd[0], amd[1], arm[2]}


def test_a_record_carries_its_platform_and_a_forged_one_is_refused():
    from efabuild.errors import EfabuildError

    record = _held("demo:user", key_for("arm"), 1)._replace(platform="linux/arm64")
    assert ArtifactRecord.from_json(record.to_json()).platform == "linux/arm64"
    assert "platform" not in json.loads(_held("demo:user", key_for("old"), 1).to_json())  # old stores' form
    for forged in ("../../etc", ["linux/arm64"], "linux/arm64\n"):
        data = json.loads(record.to_json()) | {"platform": forged}
        with pytest.raises(EfabuildError, match="platform .* is not os/arch"):
            ArtifactRecord.from_dict(data)


def test_gc_says_how_many_shared_chunks_it_expires_in_one_line(workspace):
    """Chunks lazy mounts left on the shared tier for other nodes: one line with their count, not
    one line each (a tier may hold a million)."""
    import blake3

    from efabuild.store.chunked import fschunks
    from efabuild.store.chunked.fschunks import FsChunks

    chunks = FsChunks(FilesystemTier(workspace / "fsx", "shared"))
    week_ago = time.time() - fschunks.EXPIRE_SECONDS - 60
    old = []
    for n in range(5):
        data = os.urandom(1000 + n)
        cid = blake3.blake3(data).hexdigest()
        assert chunks.put(cid, data)
        if n < 3:
            path = workspace / "fsx" / "chunks" / cid[:2] / cid
            os.utime(path, (week_ago, week_ago))
            old.append(path)
    dry = efabuild("gc", cwd=workspace, check=True).stdout
    assert "would remove 3 chunks lazy mounts left on the shared tier for other nodes, unread for a week" in dry
    assert all(path.exists() for path in old)
    done = efabuild("gc", "--yes", "--json", cwd=workspace, check=True)
    data = json.loads(done.stdout)
    assert data["expired_chunks_removed"] == 3 and sorted(i["item"] for i in data["expired_chunks"]) == \
        sorted(map(str, old))
    assert not any(path.exists() for path in old)
    assert len(list((workspace / "fsx" / "chunks").glob("*/*"))) == 2
