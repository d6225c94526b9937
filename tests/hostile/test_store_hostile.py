"""A store that a hostile writer has tampered with: planted links, FIFOs, devices, directories where
files belong, and junk JSON.

efabuild runs over a shared store that many users write, and admins run `gc` as root. Every case
plants one thing into a store holding two real artifacts, then runs what users and admins run
(`ls`, `audit --all`, `gc`, `gc --yes`, `lookup`) and checks: the exit code, one warning or error
line naming the planted file, the other artifacts still listed and intact, nothing handed out
outside the store, and the files outside the store (what a planted link points at) unchanged in
mode, owner and content. The tests run as root when the machine allows it, as `gc` does on a
cluster, so that a followed link would really change its target.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from efabuild.cli import main
from efabuild.errors import EfabuildError
from efabuild.provenance.audit import PASS
from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import FilesystemTier
from tests.kits.storekit import key_for, make_sqsh, record_for

GOOD = {key_for("hostile-a"): "g:a", key_for("hostile-b"): "g:b"}
PLANTED = key_for("hostile-planted")  # a key the writer fakes an artifact for
STALE = key_for("hostile-stale")  # a record without its .sqsh: gc's debris, looked at under its lock
assert len({k[:2] for k in (*GOOD, PLANTED, STALE)}) == 4  # each in its own fan-out directory

ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def sqsh_files(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("artifacts")
    return {key: make_sqsh(base, os.urandom(20_000) + name.encode(), name=key[:8]) for key, name in GOOD.items()}


@attrs.define
class Scene:
    root: Path  # the store
    outside: Path  # a directory outside the store that planted links point into
    victim: Path  # a file outside the store, e.g. /etc/passwd
    sqsh: dict[str, Path]

    def obj(self, key: str, suffix: str) -> Path:
        return self.root / "objects" / key[:2] / f"{key}{suffix}"

    def record_bytes(self, key: str = PLANTED, name: str = "g:p") -> bytes:
        source = next(iter(self.sqsh.values()))
        return record_for(key, name, source).to_json()

    def fake_object(self, directory: Path, key: str = PLANTED) -> None:
        """A complete-looking artifact (.sqsh and record) in `directory`."""
        directory.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(next(iter(self.sqsh.values())), directory / f"{key}.sqsh")
        (directory / f"{key}.json").write_bytes(self.record_bytes(key))


@pytest.fixture
def scene(tmp_path, sqsh_files, monkeypatch) -> Scene:
    root = tmp_path / "store"
    store = Store([FilesystemTier(root, "store")], show_progress=False)
    for key, name in GOOD.items():
        store.publish(key, sqsh_files[key], record_for(key, name, sqsh_files[key]))
    # an interrupted publish: gc looks at it under its key's lock
    stale = root / "objects" / STALE[:2]
    stale.mkdir()
    (stale / f"{STALE}.json").write_bytes(record_for(STALE, "g:stale", sqsh_files[next(iter(GOOD))]).to_json())
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "passwd"
    victim.write_text("root:x:0:0:root:/root:/bin/bash\n")
    victim.chmod(0o600)
    monkeypatch.chdir(tmp_path)  # no workspace around: the store is given by --store
    monkeypatch.delenv("EFABUILD_STORE", raising=False)
    return Scene(root, outside, victim, sqsh_files)


def snapshot(directory: Path) -> dict[str, tuple]:
    """Every entry under `directory`: type, mode, owner, link count and content."""
    seen = {}
    for path in sorted(directory.rglob("*")):
        info = path.lstat()
        content = path.read_bytes() if stat.S_ISREG(info.st_mode) else os.readlink(path) if path.is_symlink() else None
        seen[str(path.relative_to(directory))] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode),
                                                  info.st_uid, info.st_gid, info.st_nlink, content)
    return seen


class Hang(Exception):
    pass


def run(capsys, *argv: str, seconds: int = 20) -> tuple[int, str, list[str]]:
    """efabuild ARGV in this process: (exit code, stdout, stderr lines). A hang fails the test."""

    def hang(*_):  # noqa: ANN002
        raise Hang(f"efabuild {' '.join(argv)} hangs")

    # pytest-timeout's per-test limit runs on the same timer: it is put back, less the time spent here
    previous = signal.signal(signal.SIGALRM, hang)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        code = main(list(argv))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 0.001))
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


# ---- what a hostile writer plants ------------------------------------------------------------
# Each returns (the planted path a message must name, the ref whose lookup meets it, or None).
Plant = Callable[[Scene], tuple[Path, str | None]]


def sqsh_symlink_out(s: Scene):
    s.obj(PLANTED, ".json").parent.mkdir()
    s.obj(PLANTED, ".json").write_bytes(s.record_bytes())
    s.obj(PLANTED, ".sqsh").symlink_to(s.victim)
    return s.obj(PLANTED, ".sqsh"), PLANTED


def sqsh_symlink_in(s: Scene):
    # even a link to a real artifact of this store: an object is a file, never a pointer
    s.obj(PLANTED, ".json").parent.mkdir()
    s.obj(PLANTED, ".json").write_bytes(s.record_bytes())
    s.obj(PLANTED, ".sqsh").symlink_to(s.obj(next(iter(GOOD)), ".sqsh"))
    return s.obj(PLANTED, ".sqsh"), PLANTED


def sqsh_fifo(s: Scene):
    s.obj(PLANTED, ".json").parent.mkdir()
    s.obj(PLANTED, ".json").write_bytes(s.record_bytes())
    os.mkfifo(s.obj(PLANTED, ".sqsh"))
    return s.obj(PLANTED, ".sqsh"), PLANTED


def sqsh_device(s: Scene):
    if not ROOT:
        pytest.skip("mknod needs root")
    s.obj(PLANTED, ".json").parent.mkdir()
    s.obj(PLANTED, ".json").write_bytes(s.record_bytes())
    os.mknod(s.obj(PLANTED, ".sqsh"), 0o644 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero
    return s.obj(PLANTED, ".sqsh"), PLANTED


def sqsh_directory(s: Scene):
    s.obj(PLANTED, ".json").parent.mkdir()
    s.obj(PLANTED, ".json").write_bytes(s.record_bytes())
    s.obj(PLANTED, ".sqsh").mkdir()
    return s.obj(PLANTED, ".sqsh"), PLANTED


def sqsh_truncated(s: Scene):
    # not planted, but what a lookup must notice without reading it: the size differs from the record
    key = next(iter(GOOD))
    path = s.obj(key, ".sqsh")
    path.chmod(0o644)
    os.truncate(path, path.stat().st_size // 2)
    return path, key


def fanout_symlink(s: Scene):
    s.fake_object(s.outside / "fanout")
    (s.root / "objects" / PLANTED[:2]).symlink_to(s.outside / "fanout")
    return s.root / "objects" / PLANTED[:2], PLANTED


def fanout_file(s: Scene):
    (s.root / "objects" / PLANTED[:2]).write_text("junk\n")
    return s.root / "objects" / PLANTED[:2], None


def objects_symlink(s: Scene):
    objects = s.root / "objects"
    shutil.copytree(objects, s.outside / "objects", symlinks=True)
    shutil.rmtree(objects)
    objects.symlink_to(s.outside / "objects")
    return objects, next(iter(GOOD))


def objects_file(s: Scene):
    objects = s.root / "objects"
    shutil.rmtree(objects)
    objects.write_text("junk\n")
    return objects, None


def record_symlink(s: Scene):
    s.obj(PLANTED, ".json").parent.mkdir()
    shutil.copyfile(next(iter(s.sqsh.values())), s.obj(PLANTED, ".sqsh"))
    (s.outside / "record.json").write_bytes(s.record_bytes())
    s.obj(PLANTED, ".json").symlink_to(s.outside / "record.json")
    return s.obj(PLANTED, ".json"), PLANTED


def record_directory(s: Scene):
    s.obj(PLANTED, ".json").mkdir(parents=True)
    shutil.copyfile(next(iter(s.sqsh.values())), s.obj(PLANTED, ".sqsh"))
    return s.obj(PLANTED, ".json"), PLANTED


def record_fifo(s: Scene):
    s.obj(PLANTED, ".json").parent.mkdir()
    shutil.copyfile(next(iter(s.sqsh.values())), s.obj(PLANTED, ".sqsh"))
    os.mkfifo(s.obj(PLANTED, ".json"))
    return s.obj(PLANTED, ".json"), PLANTED


def record_edit(**changes: object) -> Plant:
    def plant(s: Scene):
        s.obj(PLANTED, ".json").parent.mkdir()
        shutil.copyfile(next(iter(s.sqsh.values())), s.obj(PLANTED, ".sqsh"))
        data = json.loads(s.record_bytes())
        data.update(changes)
        s.obj(PLANTED, ".json").write_text(json.dumps(data))
        return s.obj(PLANTED, ".json"), PLANTED

    return plant


def record_text(text: bytes) -> Plant:
    def plant(s: Scene):
        s.obj(PLANTED, ".json").parent.mkdir()
        shutil.copyfile(next(iter(s.sqsh.values())), s.obj(PLANTED, ".sqsh"))
        s.obj(PLANTED, ".json").write_bytes(text)
        return s.obj(PLANTED, ".json"), PLANTED

    return plant


def record_huge(s: Scene):
    s.obj(PLANTED, ".json").parent.mkdir()
    shutil.copyfile(next(iter(s.sqsh.values())), s.obj(PLANTED, ".sqsh"))
    with open(s.obj(PLANTED, ".json"), "wb") as handle:
        handle.truncate(8 << 30)  # 8 GiB of zeros (sparse): reading it whole would exhaust memory
    return s.obj(PLANTED, ".json"), PLANTED


def record_of_another_key(s: Scene):
    # a writer copies a good artifact's record to a new name: it would answer for the wrong key
    good = next(iter(GOOD))
    s.obj(PLANTED, ".json").parent.mkdir()
    shutil.copyfile(next(iter(s.sqsh.values())), s.obj(PLANTED, ".sqsh"))
    shutil.copyfile(s.obj(good, ".json"), s.obj(PLANTED, ".json"))
    return s.obj(PLANTED, ".json"), PLANTED


def manifest_symlink(s: Scene):
    good = next(iter(GOOD))
    (s.outside / "secret.json").write_text('{"schema": "efabuild.manifest/v1"}\n')
    s.obj(good, ".manifest.json").symlink_to(s.outside / "secret.json")
    return s.obj(good, ".manifest.json"), None


def ref_file(content: Callable[[Scene, Path], None], name: str = "p.json") -> Plant:
    def plant(s: Scene):
        path = s.root / "refs" / "g" / name
        content(s, path)
        return path, "g:p" if name == "p.json" else None

    return plant


def _ref_symlink(s: Scene, path: Path) -> None:
    # names a real artifact: following the link would make g:p resolve
    good = next(iter(GOOD))
    (s.outside / "ref.json").write_text(json.dumps({"name": "g:p", "history": [{"key": good, "time": "x"}]}))
    path.symlink_to(s.outside / "ref.json")


def _ref_bytes(data: bytes) -> Callable[[Scene, Path], None]:
    return lambda s, path: path.write_bytes(data)


def refs_graph_symlink(s: Scene):
    (s.outside / "refs-g").mkdir()
    (s.outside / "refs-g" / "p.json").write_text(json.dumps({"name": "h:p", "history": [{"key": PLANTED}]}))
    (s.root / "refs" / "h").symlink_to(s.outside / "refs-g")
    return s.root / "refs" / "h", "h:p"


def refs_file(s: Scene):
    shutil.rmtree(s.root / "refs")
    (s.root / "refs").write_text("junk\n")
    return s.root / "refs", None


def lock_symlink(key: str) -> Plant:
    def plant(s: Scene):
        (s.root / "locks" / f"{key}.lock").symlink_to(s.victim)
        return s.root / "locks" / f"{key}.lock", None

    return plant


def lock_dangling(s: Scene):
    (s.root / "locks" / f"{STALE}.lock").symlink_to(s.outside / "created-by-root")
    return s.root / "locks" / f"{STALE}.lock", None


def lock_hardlink(s: Scene):
    os.link(s.victim, s.root / "locks" / f"{STALE}.lock")  # protected_hardlinks stops this for others' files
    return s.root / "locks" / f"{STALE}.lock", None


def lock_fifo(s: Scene):
    os.mkfifo(s.root / "locks" / f"{STALE}.lock")
    return s.root / "locks" / f"{STALE}.lock", None


def locks_dir_symlink(s: Scene):
    shutil.rmtree(s.root / "locks")
    (s.outside / "locks").mkdir()
    (s.root / "locks").symlink_to(s.outside / "locks")
    return s.root / "locks", None


def tmp_dir_symlink(s: Scene):
    shutil.rmtree(s.root / "tmp")
    (s.outside / "tmp").mkdir()
    (s.root / "tmp").symlink_to(s.outside / "tmp")
    return s.root / "tmp", None


def tmp_debris_symlink(s: Scene):
    # named like a dead writer's temp file: gc removes debris, and must remove the link, not its target
    path = s.root / "tmp" / "efatmp.nohost.1.deadbeef.x.sqsh"
    path.symlink_to(s.victim)
    return path, None


CASES: dict[str, Plant] = {
    "sqsh-symlink-out": sqsh_symlink_out,
    "sqsh-symlink-in": sqsh_symlink_in,
    "sqsh-fifo": sqsh_fifo,
    "sqsh-device": sqsh_device,
    "sqsh-directory": sqsh_directory,
    "fanout-symlink": fanout_symlink,
    "fanout-file": fanout_file,
    "objects-symlink": objects_symlink,
    "objects-file": objects_file,
    "record-symlink": record_symlink,
    "record-directory": record_directory,
    "record-fifo": record_fifo,
    "record-name-int": record_edit(name=5),
    "record-created-list": record_edit(created=[1]),
    "record-export-str": record_edit(export="abc"),
    "record-size-str": record_edit(size="12"),
    "record-digest-int": record_edit(digest=5),
    "record-key-int": record_edit(key=7),
    "record-other-key": record_of_another_key,
    "record-deep": record_text(b'{"key": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"),
    "record-not-utf8": record_text(b'{"key": "\xff\xfe"}'),
    "record-array": record_text(b"[1, 2]"),
    "record-huge": record_huge,
    "manifest-symlink": manifest_symlink,
    "ref-symlink": ref_file(_ref_symlink),
    "ref-directory": ref_file(lambda s, path: path.mkdir()),
    "ref-fifo": ref_file(lambda s, path: os.mkfifo(path)),
    "ref-deep": ref_file(_ref_bytes(b'{"history": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")),
    "ref-history-junk": ref_file(_ref_bytes(b'{"history": [{"key": 5}, "x", {"key": "' + PLANTED.encode()
                                            + b'", "time": [1]}]}')),
    "ref-junk-name": ref_file(_ref_bytes(b'{"history": []}'), name="Bad Name!.json"),
    "ref-dot-name": ref_file(_ref_bytes(b'{"history": []}'), name=".json"),
    "ref-newline-name": ref_file(_ref_bytes(b'{"history": []}'), name="x\n.json"),
    "refs-graph-symlink": refs_graph_symlink,
    "refs-file": refs_file,
    "lock-symlink-stale": lock_symlink(STALE),
    "lock-dangling": lock_dangling,
    "lock-hardlink": lock_hardlink,
    "lock-fifo": lock_fifo,
    "locks-dir-symlink": locks_dir_symlink,
    "tmp-dir-symlink": tmp_dir_symlink,
    "tmp-debris-symlink": tmp_debris_symlink,
}


# planted entries gc has no need to look at (or removes as it would its own debris): no warning
HARMLESS = {"fanout-file", "manifest-symlink", "ref-dot-name", "ref-history-junk", "tmp-debris-symlink"}


def naming(lines: list[str], planted: Path) -> list[str]:
    """The lines that name the planted file (its path as efabuild prints it)."""
    return [line for line in lines if str(planted).replace("\n", "\\n") in line or repr(str(planted))[1:-1] in line]


@pytest.mark.parametrize("case", sorted(CASES))
def test_planted_entry_is_skipped_with_one_line_and_never_followed(case, scene, capsys, monkeypatch):
    (scene.root / "refs" / "g").mkdir(parents=True, exist_ok=True)
    (scene.root / "locks").mkdir(exist_ok=True)
    planted, ref = CASES[case](scene)
    outside_before = snapshot(scene.outside)
    store = str(scene.root)
    good = set() if case in ("objects-symlink", "objects-file") else set(GOOD)

    # ls: the other artifacts, and one warning line that names the file (when it hides something)
    code, out, err = run(capsys, "ls", "--json", "--store", store)
    assert code == 0, err
    assert {item["key"] for item in json.loads(out)["artifacts"]} == good
    assert all(str(scene.outside) not in line for line in out.splitlines())
    assert len(err) <= 1, err
    if err:
        assert naming(err, planted), err

    # audit --all: the other artifacts audited, their .sqsh intact; a stored object it cannot
    # read is a failed audit (exit 1) naming the tier, not one silently left out
    code, out, err = run(capsys, "audit", "--all", "--json", "--store", store)
    report = {item["key"]: item for item in json.loads(out)["artifacts"]}
    unreadable = {key for key, item in report.items() if item["name"] == "?"}
    assert set(report) - unreadable == good
    for key in unreadable:
        assert report[key]["ok"] is False and code == 1
        assert report[key]["checks"][0]["message"].startswith("store tier: unreadable: ")
    for key in good:
        assert {c["check"]: c["status"] for c in report[key]["checks"]}["sqsh-integrity"] == PASS
    assert len([line for line in err if line != "no artifacts"]) <= 1, err

    # gc as the admin runs it: a dry run, then for real; never a traceback, never out of the store
    for argv in (["gc"], ["gc", "--yes"]):
        code, out, err = run(capsys, *argv, "--store", store)
        assert code == 0, err
        assert len(err) <= 1, err
        if case not in HARMLESS:
            assert len(naming(err, planted)) == 1, err
        assert all(str(scene.outside) not in line for line in out.splitlines()), out

    # lookup, show and the Pyxis importer: the planted thing is no artifact (one line, exit 1);
    # never a path out of the store
    if ref is not None:
        for argv in (["lookup", "--store", store, ref], ["show", "--store", store, ref]):
            code, out, err = run(capsys, *argv)
            assert code == 1, (argv, out, err)
            assert out == ""
            assert len(err) == 1 and err[0].startswith("efabuild: "), err
        monkeypatch.setenv("EFABUILD_STORE", store)
        code, out, err = run(capsys, "pyxis-importer", "get", f"docker://efabuild://{ref}")
        monkeypatch.delenv("EFABUILD_STORE")
        assert (code, out) == (1, ""), err  # stdout is what Pyxis starts: nothing
        assert len(err) == 1 and err[0].startswith("efabuild: "), err
    for key in good:
        code, out, err = run(capsys, "lookup", "--store", store, key)
        assert code == 0 and out.strip() == str(scene.obj(key, ".sqsh")), (out, err)
        assert Path(out.strip()).resolve().is_relative_to(scene.root.resolve())

    # nothing outside the store changed: mode, owner, links, content; nothing created there
    assert snapshot(scene.outside) == outside_before
    code, out, _ = run(capsys, "ls", "--json", "--store", store)
    assert {item["key"] for item in json.loads(out)["artifacts"]} == good


# ---- writes: publishing over what a writer planted -------------------------------------------
@pytest.mark.parametrize("case", ["sqsh-symlink-out", "sqsh-fifo", "sqsh-directory", "record-symlink",
                                  "record-directory", "record-other-key", "record-name-int",
                                  "lock-symlink-planted", "lock-dangling-planted", "tmp-dir-symlink",
                                  "fanout-symlink"])
def test_publish_never_writes_through_a_planted_link(case, scene):
    (scene.root / "locks").mkdir(exist_ok=True)
    if case == "lock-symlink-planted":
        planted = scene.root / "locks" / f"{PLANTED}.lock"
        planted.symlink_to(scene.victim)
    elif case == "lock-dangling-planted":
        planted = scene.root / "locks" / f"{PLANTED}.lock"
        planted.symlink_to(scene.outside / "created-by-root")
    else:
        planted, _ = CASES[case](scene)
    before = snapshot(scene.outside)
    tier = FilesystemTier(scene.root, "store")
    source = next(iter(scene.sqsh.values()))
    record = record_for(PLANTED, "g:p", source)
    try:
        outcome = tier.publish(PLANTED, source, record, show_progress=False)
    except EfabuildError as exc:
        assert str(planted) in str(exc) and "\n" not in str(exc)
    else:
        # published over the planted entry: the object is a real file in the store
        assert outcome in ("published", "repaired")
        sqsh = scene.obj(PLANTED, ".sqsh")
        assert stat.S_ISREG(sqsh.lstat().st_mode) and sqsh.resolve().is_relative_to(scene.root.resolve())
        assert stat.S_ISREG(scene.obj(PLANTED, ".json").lstat().st_mode)
    assert snapshot(scene.outside) == before


# ---- lookup: the size always, the digest with --verify ---------------------------------------
def test_lookup_compares_the_size_with_the_record_without_reading(scene, capsys):
    key = next(iter(GOOD))
    sqsh = scene.obj(key, ".sqsh")
    sqsh.chmod(0o644)
    os.truncate(sqsh, sqsh.stat().st_size - 1)
    code, out, err = run(capsys, "lookup", "--store", str(scene.root), key)
    assert (code, out) == (1, "")
    size = sqsh.stat().st_size
    assert err == [f"efabuild: {sqsh}: corrupt artifact: {size} bytes, its record says {size + 1}"]
    other = next(k for k in GOOD if k != key)
    assert run(capsys, "lookup", "--store", str(scene.root), other)[:2] == (0, f"{scene.obj(other, '.sqsh')}\n")


def test_a_directory_at_an_artifacts_name_is_moved_aside_and_the_artifact_stored(scene, capsys, monkeypatch):
    """A directory planted at a .sqsh's name stopped every make that published that key ("a
    directory, not an artifact") where a FIFO or a link there is repaired: it is moved whole into
    tmp/ (nothing in it followed), the artifact stored, and gc removes the directory once the
    publishing process is gone."""
    from efabuild import notices
    from efabuild.host.owner import Owner
    from efabuild.store.gc import leftovers

    planted = scene.obj(PLANTED, ".sqsh")
    planted.mkdir(parents=True)
    (planted / "victim").symlink_to(scene.victim)
    (planted / "deep").mkdir()
    said: list[str] = []
    monkeypatch.setattr(notices, "warn", said.append)
    before = snapshot(scene.outside)
    tier = FilesystemTier(scene.root, "store")
    source = next(iter(scene.sqsh.values()))
    assert tier.publish(PLANTED, source, record_for(PLANTED, "g:p", source), show_progress=False) in (
        "published", "repaired")
    assert stat.S_ISREG(planted.lstat().st_mode) and planted.read_bytes() == source.read_bytes()
    [moved] = [p for p in (scene.root / "tmp").iterdir() if p.name.startswith(leftovers.PLANTED_PREFIX + "-")]
    assert (moved / "victim").is_symlink() and any(str(planted) in line and str(moved) in line for line in said)
    assert moved not in leftovers.find(tier)  # its publisher, this process, is alive
    monkeypatch.setattr(Owner, "gone", lambda self: True)
    assert moved in leftovers.find(tier)
    leftovers.remove(tier, moved)
    assert not moved.exists() and snapshot(scene.outside) == before
