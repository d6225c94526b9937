"""The incremental `.sqsh` writer (export/squashfs) against a full export of the same tree.

The reference is what a full export makes of the merged image: its rootfs as a tar, through the
export's tar filter, into `mksquashfs - full.sqsh -tar` with the export's options. The child
written from the ancestor and the layer diffs must list the same (`unsquashfs -lln`) and unpack
to the same bytes, hard links, modes, times, link targets and device numbers.
"""

from __future__ import annotations

import io
import os
import random
import stat
import subprocess
from pathlib import Path

import pytest

from efabuild.export.enroot import ImageConfig
from efabuild.export.squashfs import write_incremental
from efabuild.export.tarfilter import RewritePlan
from efabuild.settings import ExportSettings
from tests.tarkit import T0, Item, full_export, tar_entries, tree_tar, walk_key

CLAMP = T0 + 5000
PLAN_A = RewritePlan.for_config(ImageConfig(env=("A=1",), working_dir="/workspace"), epoch=T0, clamp=CLAMP)
PLAN_B = RewritePlan.for_config(ImageConfig(env=("A=2", "B=x y"), working_dir="/workspace"), epoch=T0, clamp=CLAMP)


def lln(sqsh: Path) -> str:
    return subprocess.run(["unsquashfs", "-lln", str(sqsh)], capture_output=True, text=True, check=True).stdout


def unpacked(sqsh: Path, dest: Path) -> dict[str, tuple]:
    """path → what a user sees of it after `unsquashfs -d`; hard links as the group of their paths."""
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(dest), str(sqsh)], check=True, capture_output=True)
    seen: dict[str, tuple] = {}
    groups: dict[int, list[str]] = {}
    for top, dirs, files in os.walk(dest):
        for name in dirs + files:
            full = os.path.join(top, name)
            rel = os.path.relpath(full, dest)
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode):
                groups.setdefault(st.st_ino, []).append(rel)
                body: object = Path(full).read_bytes()
            elif stat.S_ISLNK(st.st_mode):
                body = os.readlink(full)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                body = (os.major(st.st_rdev), os.minor(st.st_rdev))
            else:
                body = None
            seen[rel] = (st.st_mode, st.st_mtime, st.st_nlink if not stat.S_ISDIR(st.st_mode) else 0, body)
    for paths in groups.values():
        for path in paths:
            seen[path] += (tuple(sorted(paths)),)
    return seen


def assert_same(inc: Path, full: Path, tmp: Path, why: str = "") -> None:
    assert lln(inc) == lln(full), why
    assert unpacked(inc, tmp / f"{inc.name}.d") == unpacked(full, tmp / f"{full.name}.d"), why
    subprocess.run(["rm", "-rf", str(tmp / f"{inc.name}.d"), str(tmp / f"{full.name}.d")], check=True)


def incremental(ancestor: Path, layers: list[bytes], out: Path, plan: RewritePlan = PLAN_B, **kw):
    result = write_incremental(ancestor, [io.BytesIO(layer) for layer in layers], out, plan=plan, **kw)
    assert not result.full_needed, result.reason
    return result


# ---------------------------------------------------------------- layer diffs


def parent_of(path: str) -> str:
    return path.rpartition("/")[0]


def layer_between(old: dict[str, Item], new: dict[str, Item], opaque: frozenset[str] = frozenset()) -> bytes:
    """The layer tar that turns `old` into `new`, as a build's diff has it: changed entries with
    their parent directories, whiteouts for what went away, an opaque marker and the whole new
    content for each directory of `opaque`; a hard link to a member of its inode the lower
    layers already hold, else to the first member this layer writes."""
    changed = {p for p in new if old.get(p) != new[p]}
    for d in opaque:
        changed |= {d} | {p for p in new if p.startswith(d + "/")}

    def covered(p: str) -> bool:
        return any(p.startswith(d + "/") for d in opaque)

    gone = []
    for p in old:
        if p in new:
            continue
        parent = parent_of(p)
        if (not parent or (old.get(parent, Item("f")).kind == "d" and new.get(parent, Item("f")).kind == "d")) \
                and not covered(p):
            gone.append(p)
            if parent:
                changed.add(parent)
    for p in list(changed):
        while (p := parent_of(p)):
            changed.add(p)
    lower_member = {}
    for p in sorted(new, key=walk_key):
        if p not in changed and new[p].kind == "f":
            lower_member.setdefault(new[p].inode, p)
    entries, first = [], {}
    marks = [(p, "wh") for p in gone] + [(d, "opq") for d in opaque] + [(p, "entry") for p in changed]
    for p, what in sorted(marks, key=lambda m: (walk_key(m[0]), m[1] != "entry")):
        if what == "wh":
            entries.append(((parent_of(p) + "/" if parent_of(p) else "") + ".wh." + p.rpartition("/")[2], "f", 0o644,
                            T0, b""))
        elif what == "opq":
            entries.append((p + "/.wh..wh..opq", "f", 0o644, T0, b""))
        else:
            item = new[p]
            link = lower_member.get(item.inode) or first.get(item.inode) if item.kind == "f" else None
            if link:
                entries.append((p, "h", item.mode, item.mtime, link))
            else:
                if item.kind == "f":
                    first[item.inode] = p
                entries.append((p, item.kind, item.mode, item.mtime,
                                {"f": item.data, "l": item.target, "c": item.dev, "b": item.dev}.get(item.kind)))
    return tar_entries(entries)


# ---------------------------------------------------------------- the random trees

NAMES = ["a", "b", "lib", "x y", "ñame", "z" * 120, "deep", "01", "A", "lib64", "é"]
MODES = [0o644, 0o600, 0o755, 0o000, 0o4755, 0o640, 0o444]
DIR_MODES = [0o755, 0o700, 0o500, 0o555, 0o000, 0o1777]


class Trees:
    """A seeded generator of a base tree and the trees after each layer."""

    def __init__(self, seed: int, block: int) -> None:
        self.rng = random.Random(seed)
        self.block = block
        self.inode = 0

    def data(self) -> bytes:
        b = self.block
        size = self.rng.choice([0, 1, 100, 3000, b - 1, b, b + 1, 2 * b + 7, 3 * b, self.rng.randrange(1, 3 * b)])
        return self.rng.randbytes(size) if self.rng.random() < 0.7 else bytes([self.rng.randrange(256)]) * size

    def file(self, **kw) -> Item:
        self.inode += 1
        return Item("f", kw.pop("mode", self.rng.choice(MODES)), self.mtime(), data=self.data(), inode=self.inode, **kw)

    def mtime(self) -> int:
        return self.rng.choice([T0, T0 - 86400 * 400, T0 + 10, CLAMP + 999, self.rng.randrange(T0 - 10**6, T0 + 10**4)])

    def dirs(self, tree: dict[str, Item]) -> list[str]:
        return [""] + sorted((p for p, i in tree.items() if i.kind == "d"), key=walk_key)

    def fresh(self, tree: dict[str, Item], parent: str) -> str:
        for _ in range(20):
            name = self.rng.choice(NAMES) + ("" if self.rng.random() < 0.6 else str(self.rng.randrange(100)))
            path = f"{parent}/{name}" if parent else name
            if path not in tree:
                return path
        return f"{parent}/n{self.rng.randrange(10**9)}".lstrip("/")

    def add(self, tree: dict[str, Item]) -> None:
        parent = self.rng.choice(self.dirs(tree))
        path = self.fresh(tree, parent)
        roll = self.rng.random()
        if roll < 0.45:
            tree[path] = self.file()
        elif roll < 0.6:
            tree[path] = Item("d", self.rng.choice(DIR_MODES), self.mtime())
        elif roll < 0.7:
            tree[path] = Item("l", 0o777, self.mtime(), target=self.rng.choice(["a", "../x", "/etc/passwd", "z" * 200]))
        elif roll < 0.78:
            tree[path] = Item(self.rng.choice("cb"), 0o600, self.mtime(),
                              dev=(self.rng.randrange(300), self.rng.choice([0, 5, 255, 256, 70000])))
        elif roll < 0.82:
            tree[path] = Item("p", 0o644, self.mtime())
        elif roll < 0.92:
            files = [p for p, i in tree.items() if i.kind == "f"]
            if files:  # a hard link: one more name of an inode
                tree[path] = tree[self.rng.choice(files)]
        else:  # a deep path, past Enroot's fixperms depth
            for _ in range(self.rng.randrange(5, 19)):
                tree[path] = Item("d", self.rng.choice(DIR_MODES[:3]), self.mtime())
                path = self.fresh(tree, path)
            tree[path] = self.file()

    def base(self) -> dict[str, Item]:
        tree = {"etc": Item("d", 0o755), "etc/passwd": self.file(mode=0o644), "usr": Item("d", 0o755)}
        if self.rng.random() < 0.5:
            tree["etc/environment"] = self.file(mode=0o600)  # the image's copy: its mode is kept
        for _ in range(self.rng.randrange(10, 40)):
            self.add(tree)
        return tree

    def subtree(self, tree: dict[str, Item], path: str) -> list[str]:
        return [p for p in tree if p == path or p.startswith(path + "/")]

    def change(self, old: dict[str, Item]) -> tuple[dict[str, Item], frozenset[str]]:
        tree, opaque = dict(old), set()
        for _ in range(self.rng.randrange(1, 8)):
            paths = sorted(tree, key=walk_key)
            path = self.rng.choice(paths) if paths else ""
            op = self.rng.randrange(10)
            item = tree.get(path)
            if op <= 2 or item is None:
                self.add(tree)
            elif op == 3 and item.kind == "f":  # new content: a new inode, its other names keep the old
                tree[path] = self.file(mode=item.mode)
            elif op == 4:  # delete
                for p in self.subtree(tree, path):
                    del tree[p]
            elif op == 5:  # rename: delete here, add there
                dest = self.fresh(tree, self.rng.choice([d for d in self.dirs(tree) if not (d + "/").startswith(path + "/")]))
                for p in self.subtree(tree, path):
                    moved = tree.pop(p)
                    tree[dest + p[len(path):]] = moved if moved.kind != "f" else self.file(mode=moved.mode)
            elif op == 6:  # mode or time, on every name of the inode
                changed = Item(item.kind, self.rng.choice(DIR_MODES if item.kind == "d" else MODES), self.mtime(),
                               item.data, item.target, item.dev, item.inode)
                for p in [p for p in tree if tree[p] is item or (item.inode and tree[p].inode == item.inode)]:
                    tree[p] = changed
            elif op == 7:  # a file becomes a directory or a directory a file
                for p in self.subtree(tree, path):
                    del tree[p]
                tree[path] = self.file() if item.kind == "d" else Item("d", 0o755, self.mtime())
            elif op == 8 and item.kind == "d" and not any(d.startswith(path + "/") or path.startswith(d + "/") for d in opaque):
                inodes = [tree[p].inode for p in self.subtree(tree, path) if tree[p].kind == "f"]
                shared = [p for p, i in {**old, **tree}.items() if i.kind == "f" and i.inode in inodes]
                if all(p.startswith(path + "/") for p in shared) and path in old and old[path].kind == "d":
                    opaque.add(path)  # an opaque directory: the layer brings all it holds
                    for p in self.subtree(tree, path)[1:]:
                        if self.rng.random() < 0.3:
                            tree.pop(p, None)
            else:
                self.add(tree)
        for p in list(tree):  # what lost its directory went with it
            if parent_of(p) and tree.get(parent_of(p), Item("f")).kind != "d":
                del tree[p]
        while True:
            orphans = [p for p in tree if parent_of(p) and parent_of(p) not in tree]
            if not orphans:
                break
            for p in orphans:
                del tree[p]
        return tree, frozenset(p for p in opaque if p in tree and tree[p].kind == "d")


@pytest.mark.parametrize("seed", range(30))
def test_random_layers_give_what_a_full_export_of_the_merged_tree_gives(seed: int, tmp_path: Path) -> None:
    block = 4096 if seed % 2 else 131072
    extra = ("-b", str(block))
    trees = Trees(seed, block)
    tree = trees.base()
    base = full_export(tree_tar(tree), tmp_path / "base.sqsh", PLAN_A, extra=extra)
    layers, chain = [], base
    for step in range(1 + seed % 3):
        new, opaque = trees.change(tree)
        layers.append(layer_between(tree, new, opaque))
        tree = new
        child = tmp_path / f"chain{step}.sqsh"
        incremental(chain, [layers[-1]], child, max_dead_share=1.0)
        chain = child
    full = full_export(tree_tar(tree), tmp_path / "full.sqsh", PLAN_B, extra=extra)
    incremental(base, layers, tmp_path / "all.sqsh", max_dead_share=1.0)
    assert_same(tmp_path / "all.sqsh", full, tmp_path, f"seed {seed}: all layers at once")
    assert_same(chain, full, tmp_path, f"seed {seed}: one child per layer")


# ---------------------------------------------------------------- chains, options, readers


def chain_case(tmp_path: Path, options: ExportSettings = ExportSettings(), extra: tuple[str, ...] = (),
               seed: int = 7) -> tuple[Path, Path, Path]:
    """ancestor (full) → child (incremental) → grandchild (incremental), and the grandchild's full export."""
    trees = Trees(seed, 131072)
    tree = trees.base()
    for _ in range(40):
        trees.add(tree)
    base = full_export(tree_tar(tree), tmp_path / "base.sqsh", PLAN_A, options, extra)
    child_tree, opaque = trees.change(tree)
    child = tmp_path / "child.sqsh"
    write_incremental(base, [io.BytesIO(layer_between(tree, child_tree, opaque))], child, plan=PLAN_B,
                      max_dead_share=1.0)
    grand_tree, opaque = trees.change(child_tree)
    grand = tmp_path / "grandchild.sqsh"
    result = write_incremental(child, [io.BytesIO(layer_between(child_tree, grand_tree, opaque))], grand,
                               plan=PLAN_B, max_dead_share=1.0)
    assert not result.full_needed, result.reason
    return base, grand, full_export(tree_tar(grand_tree), tmp_path / "full.sqsh", PLAN_B, options, extra)


@pytest.mark.parametrize(("options", "extra"), [
    (ExportSettings(), ()),
    (ExportSettings(compression="gzip", compress_data=True), ()),
    (ExportSettings(compression="xz", compress_data=True), ()),
    (ExportSettings(compression="zstd", compress_data=True), ()),
    (ExportSettings(), ("-no-fragments",)),
    (ExportSettings(), ("-always-use-fragments", "-noF")),
    (ExportSettings(compression="gzip"), ("-noI", "-no-exports")),
], ids=["lzo-noD", "gzip", "xz", "zstd", "no-fragments", "always-fragments-noF", "noI-no-exports"])
def test_a_grandchild_of_an_incremental_child_equals_its_full_export(options, extra, tmp_path: Path) -> None:
    base, grand, full = chain_case(tmp_path, options, extra)
    assert_same(grand, full, tmp_path)
    info = subprocess.run(["unsquashfs", "-s", str(grand)], capture_output=True, text=True, check=True).stdout
    assert f"Compression {options.compression}" in info
    assert info.splitlines()[1:4] != []


def test_the_child_starts_with_the_ancestors_blocks_byte_for_byte(tmp_path: Path) -> None:
    base, grand, _full = chain_case(tmp_path)
    start = int.from_bytes(base.read_bytes()[64:72], "little")  # the ancestor's inode table start
    assert grand.read_bytes()[96:start] == base.read_bytes()[96:start]


def test_a_directory_of_thousands_of_entries_lists_as_in_a_full_export(tmp_path: Path) -> None:
    """Over 64 KiB of listing: an extended directory inode, several directory headers."""
    tree = {"etc": Item("d"), "big": Item("d", 0o755)}
    tree.update({f"big/{'n' * 40}{i:05d}": Item("f", data=b"%d" % i, inode=i) for i in range(2500)})
    base = full_export(tree_tar(tree), tmp_path / "base.sqsh", PLAN_A)
    new = dict(tree)
    new.update({f"big/{'m' * 60}{i:05d}": Item("f", data=b"new %d" % i, inode=10**6 + i) for i in range(1500)})
    del new[f"big/{'n' * 40}00007"]
    incremental(base, [layer_between(tree, new)], tmp_path / "inc.sqsh")
    assert_same(tmp_path / "inc.sqsh", full_export(tree_tar(new), tmp_path / "full.sqsh", PLAN_B), tmp_path)


def test_two_runs_write_the_same_bytes(tmp_path: Path) -> None:
    trees = Trees(3, 4096)
    tree = trees.base()
    base = full_export(tree_tar(tree), tmp_path / "base.sqsh", PLAN_A, extra=("-b", "4096"))
    new, opaque = trees.change(tree)
    layer = layer_between(tree, new, opaque)
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = incremental(base, [layer], tmp_path / "one" / "child.sqsh")
    second = incremental(base, [layer], tmp_path / "two" / "other-name.sqsh")
    assert (tmp_path / "one" / "child.sqsh").read_bytes() == (tmp_path / "two" / "other-name.sqsh").read_bytes()
    assert first.size == second.size == (tmp_path / "one" / "child.sqsh").stat().st_size
    assert first.reused_bytes + first.new_bytes == first.size
    assert sorted(os.listdir(tmp_path / "one")) == ["child.sqsh"]  # no temp file left


def test_squashfuse_and_the_kernel_read_an_incremental_child(tmp_path: Path) -> None:
    from tests.test_squashfuse import _fuse_missing, hard_links, squashfuse_mounted, tree

    _base, grand, full = chain_case(tmp_path)
    if _fuse_missing() is None:  # as a job starts from it: squashfuse, and squashfuse_ll for inode numbers
        views = []
        for sqsh in (grand, full):
            with squashfuse_mounted(sqsh, tmp_path / "fuse") as point:
                seen = tree(point)
            with squashfuse_mounted(sqsh, tmp_path / "fuse_ll", "squashfuse_ll") as point:
                views.append((seen, hard_links(point)))
        assert views[0] == views[1]
        assert views[0][1]  # the case has hard links
    point = tmp_path / "mnt"
    point.mkdir()
    mounted = subprocess.run(["mount", "-o", "loop,ro", "-t", "squashfs", str(grand), str(point)],
                             capture_output=True, text=True, timeout=60)
    if mounted.returncode != 0:
        pytest.skip(f"no kernel loop mount here: {mounted.stderr.strip()}")
    try:
        seen = sorted(os.path.relpath(os.path.join(top, name), point)
                      for top, dirs, files in os.walk(point) for name in dirs + files)
        for rel in seen:
            full_path = point / rel
            if full_path.is_file() and not full_path.is_symlink():
                full_path.read_bytes()  # every block and fragment decodes in the kernel
    finally:
        subprocess.run(["umount", str(point)], check=True, timeout=60)
    listed = [line.split(" squashfs-root/", 1)[1].partition(" -> ")[0] for line in lln(full).splitlines()[1:]]
    assert seen == sorted(listed)
    if _fuse_missing() is not None:
        pytest.skip(f"squashfuse: {_fuse_missing()}")
