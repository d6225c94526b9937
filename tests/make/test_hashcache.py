"""The stat-keyed hash cache of context files (make/hashcache.py), through the plans it serves.

The slips the cache's key could hide (its inode, its size) are guarded in tests/core/test_invariants.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from efabuild.cli import main
from tests.core.test_plan import by_name, record_all
from tests.kits.wsfactory import make_workspace


def plan(root: Path, capsys, monkeypatch) -> dict[str, dict]:
    monkeypatch.chdir(root)
    capsys.readouterr()
    assert main(["plan", "--offline", "--json"]) == 0
    return by_name(json.loads(capsys.readouterr().out))


def test_a_file_hashed_just_after_it_was_written_is_hashed_again(tmp_path, capsys, monkeypatch):
    """Slip: the racy window is ignored. A file written again within the filesystem's timestamp
    granularity (same size, same mtime, same inode: what a coarse clock gives two quick saves)
    would keep the first write's digest, and its layer its stale key."""
    root = make_workspace(tmp_path / "ws")
    record_all(root)
    train = root / "app" / "train.py"
    before = plan(root, capsys, monkeypatch)  # hashed within the window: not cached
    stamp = train.stat()
    with open(train, "r+") as handle:  # in place, same size
        handle.write(train.read_text().replace("train", "TRAIN"))
    os.utime(train, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert (train.stat().st_ino, train.stat().st_size) == (stamp.st_ino, stamp.st_size)
    after = plan(root, capsys, monkeypatch)
    assert after["stack:user"]["key"] != before["stack:user"]["key"]
    assert after["stack:user"]["reasons"] == ["context app/train.py changed"]


def test_the_cache_is_never_written_through_a_state_directory_replaced_by_a_link(tmp_path, capsys, monkeypatch, settled_clock):
    """The local store may sit on a shared path: a co-tenant who replaces its state/ with a link
    to another directory must not have a plan (run as root) replace a file there, nor leave one."""
    root = make_workspace(tmp_path / "ws")
    old = os.path.getmtime(root / "app" / "train.py") - 60
    for path in (root / "app").rglob("*"):
        os.utime(path, (old, old))  # out of the racy window: the plan caches their digests
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "hashes").write_text("a file of the directory's owner\n")
    (root / "cache").mkdir()
    (root / "cache" / "state").symlink_to(victim)
    plan(root, capsys, monkeypatch)
    assert (victim / "hashes").read_text() == "a file of the directory's owner\n"
    assert sorted(p.name for p in victim.iterdir()) == ["hashes"]
    (root / "cache" / "state").unlink()  # the store as efabuild made it: the cache is kept there
    plan(root, capsys, monkeypatch)
    assert (root / "cache" / "state" / "hashes").stat().st_size > len("a file of the directory's owner\n")


def test_a_same_size_edit_whose_mtime_was_put_back_is_hashed_again(tmp_path, capsys, monkeypatch, settled_clock):
    """`touch -r`, `rsync -t`, an editor or a checkout tool that restores a file's mtime after a
    same-size edit: the cached stamp must still see it. Slip: a stamp of size, mtime and inode
    alone kept the old digest, and the layer its old key (ctime moves on every change)."""
    root = make_workspace(tmp_path / "ws")
    record_all(root)
    train = root / "app" / "train.py"
    plan(root, capsys, monkeypatch)
    before = plan(root, capsys, monkeypatch)  # the stamps are cached by now
    stamp = train.stat()
    with open(train, "r+") as handle:
        handle.write(train.read_text().replace("train", "TRAIN"))
    os.utime(train, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert (train.stat().st_ino, train.stat().st_size, train.stat().st_mtime_ns) == \
        (stamp.st_ino, stamp.st_size, stamp.st_mtime_ns)
    after = plan(root, capsys, monkeypatch)
    assert after["stack:user"]["key"] != before["stack:user"]["key"]
    assert after["stack:user"]["reasons"] == ["context app/train.py changed"]
