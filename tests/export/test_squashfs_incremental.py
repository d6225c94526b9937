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
import struct
import subprocess
from pathlib import Path

import pytest

from efabuild.export.enroot import ImageConfig
from efabuild.export.squashfs import write_incremental
from efabuild.export.tarfilter import RewritePlan
from efabuild.settings import ExportSettings
from tests.kits.tarkit import T0, Item, full_export, tar_entries, tree_tar, walk_key

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
        if p not in changed and new[p].kind != "d" and new[p].inode is not None:
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
            link = lower_member.get(item.inode) or first.get(item.inode) if item.inode is not None else None
            if link:
                entries.append((p, "h", item.mode, item.mtime, link))
            else:
                if item.inode is not None:
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
        roll = self.rng.random()
        if roll < 0.1:
            return bytes(size)  # zero blocks: mksquashfs stores them as sparse blocks
        return self.rng.randbytes(size) if roll < 0.7 else bytes([self.rng.randrange(256)]) * size

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
            tree[path] = Item("l", self.rng.choice([0o777, 0o755]), self.mtime(), target=self.rng.choice(["a", "../x", "/etc/passwd", "z" * 200]))
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
            elif op in (4, 5, 8) and path == "etc":  # the init layer's /etc: its own test (hostile/)
                self.add(tree)
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
            elif op == 7 and path != "etc":  # a file becomes a directory or a directory a file
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


# four rounds in the quick part, all thirty in the whole suite
@pytest.mark.parametrize("seed", [seed if seed < 4 else pytest.param(seed, marks=pytest.mark.slow) for seed in range(30)])
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
        aliased = linked_to_written(tree)
        tree = new
        child = tmp_path / f"chain{step}.sqsh"
        result = write_incremental(chain, [io.BytesIO(layers[-1])], child, plan=PLAN_B, max_dead_share=1.0)
        if result.full_needed:  # the one case it gives up on, and only then
            assert aliased and "may be a hard link to it" in result.reason, f"seed {seed}: {result.reason}"
            return
        chain = child
    full = full_export(tree_tar(tree), tmp_path / "full.sqsh", PLAN_B, extra=extra)
    incremental(base, layers, tmp_path / "all.sqsh", max_dead_share=1.0)
    assert_same(tmp_path / "all.sqsh", full, tmp_path, f"seed {seed}: all layers at once")
    assert_same(chain, full, tmp_path, f"seed {seed}: one child per layer")


def linked_to_written(tree: dict[str, Item]) -> bool:
    """Whether a path is a hard link to one of the files Enroot writes from the config."""
    written = {tree[p].inode for p, _ in PLAN_A.files if p in tree}
    return any(item.inode in written for p, item in tree.items() if p not in PLAN_A.replaced)


def test_an_image_hard_link_to_a_written_file_follows_it_or_asks_for_a_full_export(tmp_path: Path) -> None:
    """Enroot writes /etc/environment through the link too; in the ancestor's .sqsh it is a copy."""
    tree = {"etc": Item("d", 0o755), "etc/environment": Item("f", 0o600, data=b"IMAGE=1\n", inode=1),
            "opt": Item("d", 0o755), "opt/env": Item("f", 0o600, data=b"IMAGE=1\n", inode=1)}
    base = full_export(tree_tar(tree), tmp_path / "base.sqsh", PLAN_A)
    new = dict(tree, **{"opt/new": Item("f", data=b"n", inode=2)})
    layer = layer_between(tree, new)
    same_text = RewritePlan.for_config(ImageConfig(env=("A=1",), working_dir="/workspace", cmd=("sh",)), epoch=T0,
                                       clamp=CLAMP)
    incremental(base, [layer], tmp_path / "inc.sqsh", plan=same_text)  # /etc/environment as before: a copy is right
    assert_same(tmp_path / "inc.sqsh", full_export(tree_tar(new), tmp_path / "full.sqsh", same_text), tmp_path)
    result = write_incremental(base, [io.BytesIO(layer)], tmp_path / "child.sqsh", plan=PLAN_B)
    assert result.full_needed and result.reason.startswith("/opt/env has the bytes, time and mode of /etc/environment")
    assert not (tmp_path / "child.sqsh").exists()


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
@pytest.mark.slow
def test_a_grandchild_of_an_incremental_child_equals_its_full_export(options, extra, tmp_path: Path) -> None:
    base, grand, full = chain_case(tmp_path, options, extra)
    assert_same(grand, full, tmp_path)
    in_kernel = kernel_view(grand, tmp_path)  # the kernel decodes every block, fragment and table
    assert in_kernel is None or in_kernel == kernel_view(full, tmp_path)
    info = subprocess.run(["unsquashfs", "-s", str(grand)], capture_output=True, text=True, check=True).stdout
    assert f"Compression {options.compression}" in info
    assert info.splitlines()[1:4] != []


def kernel_view(sqsh: Path, tmp: Path) -> dict[str, object] | None:
    """path → bytes or link target, read through a kernel loop mount; None where mounting is not allowed."""
    point = tmp / f"mnt-{sqsh.stem}"
    point.mkdir()
    mounted = subprocess.run(["mount", "-o", "loop,ro", "-t", "squashfs", str(sqsh), str(point)],
                             capture_output=True, text=True, timeout=60)
    if mounted.returncode != 0:
        point.rmdir()
        return None
    seen: dict[str, object] = {}
    try:
        for top, dirs, files in os.walk(point):
            for name in dirs + files:
                full = Path(top) / name
                rel = str(full.relative_to(point))
                seen[rel] = (os.readlink(full) if full.is_symlink() else full.read_bytes() if full.is_file()
                             else stat.S_IFMT(full.lstat().st_mode))
    finally:
        subprocess.run(["umount", str(point)], check=True, timeout=60)
        point.rmdir()
    return seen


def test_the_child_starts_with_the_ancestors_blocks_byte_for_byte(tmp_path: Path) -> None:
    from efabuild.export.squashfs.inodes import decode
    from efabuild.export.squashfs.metadata import Region, read_table
    from efabuild.export.squashfs.reader import read_ancestor

    base, grand, _full = chain_case(tmp_path)
    child = read_ancestor(grand)
    sb = child.sb
    with open(grand, "rb") as f:  # the export table (NFS) names each inode by its number
        refs = read_table(f, sb.export_table, sb.inode_count, 8, sb.bytes_used, child.codec, "export table")
        inodes = Region(f, sb.inode_table, sb.directory_table, child.codec, "inode table")
    for number, (ref,) in enumerate(struct.iter_unpack("<Q", refs), 1):
        pos = inodes.offset(ref >> 16, ref & 0xFFFF)
        assert decode(inodes, pos, block_size=sb.block_size, fragments=sb.fragment_count, id_count=1).number == number
    start = int.from_bytes(base.read_bytes()[64:72], "little")  # the ancestor's inode table start
    assert grand.read_bytes()[96:start] == base.read_bytes()[96:start]


@pytest.mark.slow
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
    # a lookup by name goes through the directory's index in the kernel
    point = tmp_path / "mnt"
    point.mkdir()
    mounted = subprocess.run(["mount", "-o", "loop,ro", "-t", "squashfs", str(tmp_path / "inc.sqsh"), str(point)],
                             capture_output=True, text=True, timeout=60)
    if mounted.returncode != 0:
        pytest.skip(f"no kernel loop mount here: {mounted.stderr.strip()}")
    try:
        for name, item in sorted(new.items())[::97] + sorted(new.items())[-3:]:
            if name.startswith("big/"):
                assert (point / name).read_bytes() == item.data, name
        assert not (point / "big" / f"{'n' * 40}00007").exists()
        assert not (point / "big" / f"{'m' * 60}99999").exists()
    finally:
        subprocess.run(["umount", str(point)], check=True, timeout=60)


def test_with_the_init_layer_a_layers_etc_hosts_stays_the_containers(tmp_path: Path) -> None:
    """A build's rootfs (init_layer): the filter puts the container's /etc/hosts & co. over the image's."""
    plan_a = RewritePlan.for_config(ImageConfig(env=("A=1",)), epoch=T0, init_layer=True)
    plan_b = RewritePlan.for_config(ImageConfig(env=("A=2",)), epoch=T0, init_layer=True)
    tree = {"etc": Item("d", 0o755), "etc/hosts": Item("f", data=b"image's\n", inode=1), "opt": Item("d", 0o755)}
    base = full_export(tree_tar(tree), tmp_path / "base.sqsh", plan_a)
    new = dict(tree, **{"etc/hosts": Item("f", data=b"a layer's\n", inode=2), "opt/x": Item("f", data=b"x", inode=3),
                        "etc/hostname": Item("f", data=b"node\n", inode=4)})
    incremental(base, [layer_between(tree, new)], tmp_path / "inc.sqsh", plan=plan_b)
    assert_same(tmp_path / "inc.sqsh", full_export(tree_tar(new), tmp_path / "full.sqsh", plan_b), tmp_path)
    assert "squashfs-root/dev\n" in lln(tmp_path / "inc.sqsh")


def test_hard_links_to_symlinks_fifos_and_devices_and_symlink_modes_as_in_a_full_export(tmp_path: Path) -> None:
    tree = {"etc": Item("d", 0o755), "opt": Item("d", 0o755), "opt/l": Item("l", 0o755, target="x", inode=1),
            "opt/p": Item("p", 0o600, inode=2), "opt/c": Item("c", 0o600, dev=(1, 3), inode=3),
            "opt/f": Item("f", 0o644, data=b"f", inode=4), "opt/f2": Item("f", 0o644, data=b"f", inode=4)}
    base = full_export(tree_tar(tree), tmp_path / "base.sqsh", PLAN_A)
    new = dict(tree, **{"opt/l2": tree["opt/l"], "opt/p2": tree["opt/p"], "opt/c2": tree["opt/c"],
                        "etc/l3": Item("l", 0o700, target="../opt", inode=5), "etc/l4": Item("l", 0o700, target="../opt", inode=5)})
    del new["opt/f2"]
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


def reordered(layer: bytes, rng: random.Random) -> bytes:
    """The same layer tar with its members in another order, as another tar writer may list them
    (a hard link still after the member it names, which a tar reader needs)."""
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = [(m, tar.extractfile(m).read() if m.isreg() else None) for m in tar]
    rng.shuffle(members)
    members.sort(key=lambda m: m[0].islnk())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, body in members:
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    return buf.getvalue()


@pytest.mark.parametrize("seed", [6, 8, 13])
def test_the_child_is_the_same_bytes_whatever_order_the_layer_lists_its_members_in(seed: int, tmp_path: Path) -> None:
    """The overlay2 walk lists a layer sorted, a registry's layer tar in its writer's order: the
    same key must give the same .sqsh from either source."""
    trees = Trees(seed, 4096)
    tree = trees.base()
    base = full_export(tree_tar(tree), tmp_path / "base.sqsh", PLAN_A, extra=("-b", "4096"))
    layers = []
    for _ in range(2):
        new, opaque = trees.change(tree)
        layers.append(layer_between(tree, new, opaque))
        tree = new
    rng = random.Random(seed)
    children = []
    for n, order in enumerate((layers, [reordered(layer, rng) for layer in layers],
                               [reordered(layer, rng) for layer in layers])):
        assert n == 0 or order != layers
        result = write_incremental(base, [io.BytesIO(layer) for layer in order], tmp_path / f"child{n}.sqsh",
                                   plan=PLAN_B, max_dead_share=1.0)
        if result.full_needed:
            assert "may be a hard link to it" in result.reason, result.reason
            pytest.skip(f"seed {seed} links to a written file: {result.reason}")
        children.append((tmp_path / f"child{n}.sqsh").read_bytes())
    assert children[1] == children[0] and children[2] == children[0]
    full = full_export(tree_tar(tree), tmp_path / "full.sqsh", PLAN_B, extra=("-b", "4096"))
    assert_same(tmp_path / "child1.sqsh", full, tmp_path)


@pytest.mark.slow
def test_squashfuse_and_the_kernel_read_an_incremental_child(tmp_path: Path) -> None:
    from tests.scenarios.test_squashfuse import _fuse_missing, hard_links, squashfuse_mounted, tree

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


# ---------------------------------------------------------------- when a full export is needed


def small_base(tmp_path: Path, **kw) -> tuple[dict[str, Item], Path]:
    tree = {"etc": Item("d"), "etc/passwd": Item("f", data=b"root\n", inode=1),
            "opt": Item("d"), "opt/big": Item("f", data=bytes(range(256)) * 4096, inode=2),
            "opt/small": Item("f", data=b"s" * 5000, inode=3)}
    return tree, full_export(tree_tar(tree), tmp_path / "base.sqsh", PLAN_A, **kw)


def test_a_change_that_leaves_most_of_the_ancestor_dead_asks_for_a_full_export(tmp_path: Path) -> None:
    tree, base = small_base(tmp_path)
    new = {p: i for p, i in tree.items() if p != "opt/big"}
    layer = layer_between(tree, new)
    out = tmp_path / "child.sqsh"
    first = write_incremental(base, [io.BytesIO(layer)], out, plan=PLAN_B)
    assert first.full_needed and "dead" in first.reason and not out.exists()
    assert sorted(os.listdir(tmp_path)) == ["base.sqsh"]
    assert first.dead_bytes == 1 << 20  # the file's blocks, stored uncompressed (-noD)
    assert write_incremental(base, [io.BytesIO(layer)], out, plan=PLAN_B) == first  # a function of its inputs
    kept = write_incremental(base, [io.BytesIO(layer)], out, plan=PLAN_B, max_dead_share=1.0)
    assert not kept.full_needed and kept.dead_bytes == 1 << 20 and out.exists()
    assert_same(out, full_export(tree_tar(new), tmp_path / "full.sqsh", PLAN_B), tmp_path)


def test_a_small_change_keeps_the_ancestors_bytes_and_counts_no_dead_ones(tmp_path: Path) -> None:
    tree, base = small_base(tmp_path)
    new = dict(tree, **{"opt/added": Item("f", data=b"new", inode=9)})
    result = incremental(base, [layer_between(tree, new)], tmp_path / "child.sqsh")
    # written: opt/added and /etc/environment, whose text changes; rc, rc.local, fstab stay the ancestor's
    assert result.dead_bytes == 0 and result.reused_bytes > 1 << 20 and result.files_written == 2
    assert result.new_bytes < 16384


def test_everything_but_the_reused_range_is_written_before_it_is_copied(tmp_path: Path) -> None:
    """A sha256 must start at byte 0 (the child's superblock), so it can run beside the copy of
    the ancestor's range only when the rest of the child is final before that copy: what
    `before_copy` sees of the child and the ancestor is then the finished file."""
    import hashlib

    tree, base = small_base(tmp_path)
    new = dict(tree, **{"opt/added": Item("f", data=b"new", inode=9)})
    seen = []

    def before_copy(fd: int, reused: int) -> None:
        size = os.fstat(fd).st_size
        child = os.pread(fd, size, 0)
        assert child[96:reused] == bytes(reused - 96)  # not yet copied
        seen.append((reused, child[:96] + base.read_bytes()[96:reused] + child[reused:]))

    result = incremental(base, [layer_between(tree, new)], tmp_path / "child.sqsh", before_copy=before_copy)
    [(reused, spliced)] = seen
    assert reused == result.reused_bytes
    final = (tmp_path / "child.sqsh").read_bytes()
    assert spliced == final and hashlib.sha256(spliced).hexdigest() == hashlib.sha256(final).hexdigest()


def test_the_child_being_written_is_never_open_to_the_group_even_under_a_shared_stores_umask(tmp_path: Path) -> None:
    """A shared store's users work with umask 002, and the child is written in its tmp/: a group
    member who opened it for writing then (before publish makes it 0444) would keep that
    descriptor, and could change the stored artifact later through a mapping without moving its
    stamp, which every cache and the fetch's seed rule take for its bytes."""
    tree, base = small_base(tmp_path)
    new = dict(tree, **{"opt/added": Item("f", data=b"new", inode=9)})
    modes = []
    old = os.umask(0o002)
    try:
        incremental(base, [layer_between(tree, new)], tmp_path / "child.sqsh",
                    before_copy=lambda fd, reused: modes.append(stat.S_IMODE(os.fstat(fd).st_mode)))
    finally:
        os.umask(old)
    assert modes and not modes[0] & 0o022
    assert not (tmp_path / "child.sqsh").stat().st_mode & 0o022


def test_an_ancestor_exported_with_other_times_is_left_to_a_full_export(tmp_path: Path) -> None:
    """Its unchanged files carry the old plan's clamp and pinned times, which a layer diff does not redo."""
    _tree, base = small_base(tmp_path)
    layer = tar_entries([("etc/x", "f", 0o644, T0, b"x")])
    other_clamp = RewritePlan.for_config(ImageConfig(working_dir="/workspace"), epoch=T0, clamp=CLAMP + 1)
    other_workdir = RewritePlan.for_config(ImageConfig(working_dir="/srv/app"), epoch=T0, clamp=CLAMP)
    for plan, why in ((other_clamp, "clamped"), (other_workdir, "pinned")):
        result = write_incremental(base, [io.BytesIO(layer)], tmp_path / "c.sqsh", plan=plan, ancestor_plan=PLAN_A)
        assert result.full_needed and why in result.reason and not (tmp_path / "c.sqsh").exists()
    assert not incremental(base, [layer], tmp_path / "c.sqsh", ancestor_plan=PLAN_A).full_needed


@pytest.mark.parametrize("case", ["xattrs", "owners", "epoch", "lz4", "sparse"])
def test_inputs_it_does_not_handle_are_left_to_a_full_export(case: str, tmp_path: Path) -> None:
    tree = {"etc": Item("d"), "etc/passwd": Item("f", data=b"root\n", inode=1)}
    raw, plan, layer = tree_tar(tree), PLAN_B, tar_entries([("etc/x", "f", 0o644, T0, b"x")])
    base = tmp_path / "base.sqsh"
    opts = list(ExportSettings().mksquashfs_options())
    if case in ("xattrs", "owners"):
        import tarfile

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo("etc/passwd")
            info.size, info.uid = 5, 1000
            info.pax_headers = {"SCHILY.xattr.user.origin": "test"} if case == "xattrs" else {}
            tar.addfile(info, io.BytesIO(b"root\n"))
        flags = ["-noappend", "-root-time", str(T0), "-mkfs-time", str(T0), "-quiet", "-no-progress", *opts]
        flags += ["-all-root"] if case == "xattrs" else ["-no-xattrs"]
        subprocess.run(["mksquashfs", "-", str(base), "-tar", *flags], input=buf.getvalue(), check=True,
                       capture_output=True)
    else:
        full_export(raw, base, PLAN_A, ExportSettings(compression="lz4" if case == "lz4" else "lzo"))
    if case == "epoch":
        plan = RewritePlan.for_config(ImageConfig(env=("A=2",)), epoch=T0 + 1)
    if case == "sparse":
        import tarfile

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo("etc/holes")
            info.size, info.pax_headers = 1, {"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}
            tar.addfile(info, io.BytesIO(b"x"))
        layer = buf.getvalue()
    out = tmp_path / "child.sqsh"
    result = write_incremental(base, [io.BytesIO(layer)], out, plan=plan)
    assert result.full_needed and result.reason and "\n" not in result.reason, result
    assert {"xattrs": "extended attributes", "owners": "owners", "epoch": "epoch", "lz4": "lz4",
            "sparse": "sparse"}[case] in result.reason
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["base.sqsh"]


# ---------------------------------------------------------------- hostile inputs, interruptions


def one_line_error(base: Path, layers: list[bytes], tmp_path: Path) -> str:
    from efabuild.errors import InputError

    out = tmp_path / "child.sqsh"
    with pytest.raises(InputError) as caught:
        write_incremental(base, [io.BytesIO(layer) for layer in layers], out, plan=PLAN_B)
    message = str(caught.value)
    assert message and "\n" not in message and len(message) < 300, message
    assert not out.exists() and not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    return message


def forged(base: Path, tmp_path: Path, offset: int, value: bytes) -> Path:
    raw = bytearray(base.read_bytes())
    raw[offset : offset + len(value)] = value
    bad = tmp_path / "forged.sqsh"
    bad.write_bytes(bytes(raw))
    return bad


def test_a_truncated_or_forged_ancestor_is_one_line(tmp_path: Path) -> None:
    _tree, base = small_base(tmp_path)
    layer = tar_entries([("etc/x", "f", 0o644, T0, b"x")])
    size = base.stat().st_size
    for cut in (0, 50, 96, size // 2, size - 4096):
        (tmp_path / "cut.sqsh").write_bytes(base.read_bytes()[:cut])
        assert "cut.sqsh" in one_line_error(tmp_path / "cut.sqsh", [layer], tmp_path)
    q = lambda n: n.to_bytes(8, "little")  # noqa: E731
    cases = {
        "inode table": (64, q(10**12)), "directory table": (72, q(size * 4)), "id table": (48, q(2**63)),
        "inode count": (4, (2**32 - 1).to_bytes(4, "little")), "fragment count": (16, (2**32 - 1).to_bytes(4, "little")),
        "block size": (12, (3).to_bytes(4, "little")), "magic": (0, b"hsqx"), "root": (32, q(0x7FFF_0000_1234)),
    }
    for what, (offset, value) in cases.items():
        one_line_error(forged(base, tmp_path, offset, value), [layer], tmp_path)


def test_an_ancestor_read_ahead_writes_the_same_child_and_its_errors_come_at_the_writer(
        tmp_path: Path, monkeypatch) -> None:
    """read_ahead parses the ancestor on a thread while the caller waits for other things; the
    writer then takes that parse (it reads no tables itself) and writes the same bytes, and a
    damaged ancestor's one line comes from the writer as it would without it."""
    from efabuild.errors import InputError
    from efabuild.export.squashfs import incremental as writer, read_ahead

    _tree, base = small_base(tmp_path)
    layer = tar_entries([("etc/x", "f", 0o644, T0, b"x")])
    plain = incremental(base, [layer], tmp_path / "plain.sqsh")
    read = read_ahead(base)
    monkeypatch.setattr(writer, "read_ancestor", lambda path: pytest.fail(f"{path} read again"))
    ahead = incremental(base, [layer], tmp_path / "ahead.sqsh", ancestor_read=read)
    assert (tmp_path / "ahead.sqsh").read_bytes() == (tmp_path / "plain.sqsh").read_bytes()
    assert ahead.reused_bytes == plain.reused_bytes > 0
    (tmp_path / "cut.sqsh").write_bytes(base.read_bytes()[:50])
    read = read_ahead(tmp_path / "cut.sqsh")
    with pytest.raises(InputError, match="cut.sqsh"):
        write_incremental(tmp_path / "cut.sqsh", [io.BytesIO(layer)], tmp_path / "c.sqsh", plan=PLAN_B,
                          ancestor_read=read)
    assert not (tmp_path / "c.sqsh").exists()


def test_a_table_larger_than_any_image_has_is_refused_unread(tmp_path: Path, monkeypatch) -> None:
    from efabuild.export.squashfs import metadata

    _tree, base = small_base(tmp_path)
    monkeypatch.setattr(metadata, "MAX_TABLE", 64)  # as a forged table offset would make one span GBs
    assert "more than 64 bytes" in one_line_error(base, [tar_entries([("etc/x", "f", 0o644, T0, b"x")])], tmp_path)


@pytest.mark.parametrize("seed", range(40))
def test_a_damaged_ancestor_gives_a_child_a_full_export_or_one_line(seed: int, tmp_path: Path) -> None:
    """Random bytes over its tables: never another exception, never a hang."""
    from efabuild.errors import InputError

    tree, base = small_base(tmp_path)
    raw = bytearray(base.read_bytes())
    rng = random.Random(seed)
    start = int.from_bytes(raw[64:72], "little")
    used = int.from_bytes(raw[40:48], "little")
    for _ in range(rng.randrange(1, 6)):
        raw[rng.randrange(start, used)] = rng.randrange(256)
    base.write_bytes(bytes(raw))
    try:
        write_incremental(base, [io.BytesIO(tar_entries([("etc/x", "f", 0o644, T0, b"x")]))], tmp_path / "c.sqsh",
                          plan=PLAN_B, max_dead_share=1.0)
    except InputError as exc:
        assert "\n" not in str(exc)


def test_hostile_layer_entries_are_one_line(tmp_path: Path) -> None:
    _tree, base = small_base(tmp_path)
    assert "'..'" in one_line_error(base, [tar_entries([("../escape", "f", 0o644, T0, b"x")])], tmp_path)
    assert "'..'" in one_line_error(base, [tar_entries([("etc/../../x", "f", 0o644, T0, b"x")])], tmp_path)
    assert "whiteout" in one_line_error(base, [tar_entries([("etc/.wh..", "f", 0o644, T0, b"")])], tmp_path)
    assert "'..'" in one_line_error(base, [tar_entries([("etc/l", "h", 0o644, T0, "../../etc/passwd")])], tmp_path)
    assert "not in this layer" in one_line_error(base, [tar_entries([("etc/l", "h", 0o644, T0, "etc/nope")])],
                                                 tmp_path)
    assert "directory" in one_line_error(base, [tar_entries([("etc/l", "h", 0o644, T0, "opt")])], tmp_path)
    assert "corrupt" in one_line_error(base, [b"not a tar" * 100], tmp_path)
    one_line_error(base, [tar_entries([("opt/big2", "f", 0o644, T0, b"x" * 100000)])[:20000]], tmp_path)
    header = tar_entries([("etc/huge", "f", 0o644, T0, b"")])[:1024]  # pax size of 1 PB, 0 bytes follow
    pax = b"24 size=1000000000000000\n"
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("etc/huge")
        info.pax_headers = {"size": "1000000000000000"}
        tar.addfile(info)
    assert header and pax and "ended" in one_line_error(base, [buf.getvalue()], tmp_path)


def test_absolute_and_dotted_names_are_taken_as_the_export_filter_takes_them(tmp_path: Path) -> None:
    tree, base = small_base(tmp_path)
    layer = tar_entries([("/etc", "d", 0o755, T0, None), ("/etc/abs", "f", 0o644, T0, b"abs"),
                         ("./opt/./dot", "f", 0o600, T0, b"dot"), ("opt//l", "h", 0o644, T0, "/etc/passwd")])
    new = dict(tree, etc=Item("d", 0o755), **{"etc/abs": Item("f", data=b"abs", inode=7), "opt/dot": Item("f", 0o600, data=b"dot", inode=8),
                        "opt/l": tree["etc/passwd"]})
    incremental(base, [layer], tmp_path / "inc.sqsh")
    assert_same(tmp_path / "inc.sqsh", full_export(tree_tar(new), tmp_path / "full.sqsh", PLAN_B), tmp_path)


class _Failing(io.RawIOBase):
    """A layer stream that breaks after `after` bytes, as a registry connection does."""

    def __init__(self, data: bytes, after: int) -> None:
        self.data, self.after, self.pos = data, after, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        if self.pos >= self.after:
            raise ConnectionResetError("the registry went away")
        n = min(len(buf), self.after - self.pos)
        buf[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


def test_an_error_mid_way_leaves_no_file_and_the_old_one_in_place(tmp_path: Path) -> None:
    tree, base = small_base(tmp_path)
    new = dict(tree, **{f"opt/n{i}": Item("f", data=os.urandom(200000), inode=10 + i) for i in range(5)})
    layer = layer_between(tree, new)
    out = tmp_path / "child.sqsh"
    out.write_bytes(b"the previous child")
    from efabuild.errors import EfabuildError

    with pytest.raises(EfabuildError, match="^layer 1: cannot read it: the registry went away$"):
        write_incremental(base, [_Failing(layer, len(layer) // 2)], out, plan=PLAN_B)
    assert out.read_bytes() == b"the previous child"
    assert sorted(os.listdir(tmp_path)) == ["base.sqsh", "child.sqsh"]


@pytest.mark.slow
def test_a_kill_mid_way_leaves_no_partial_child(tmp_path: Path) -> None:
    import signal
    import sys
    import time

    tree, base = small_base(tmp_path)
    out = tmp_path / "child.sqsh"
    script = (f"import sys; from pathlib import Path; from efabuild.export.squashfs import write_incremental\n"
              f"from tests.export.test_squashfs_incremental import PLAN_B\n"
              f"write_incremental(Path({str(base)!r}), [sys.stdin.buffer], Path({str(out)!r}), plan=PLAN_B)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, cwd=Path(__file__).parents[2],
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    layer = tar_entries([("opt/grow", "f", 0o644, T0, os.urandom(8 << 20))])
    proc.stdin.write(layer[: 4 << 20])  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    deadline = time.monotonic() + 60
    while not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert not out.exists()


@pytest.mark.slow
def test_a_file_of_a_gibibyte_in_a_layer_is_streamed_in_bounded_memory(tmp_path: Path) -> None:
    """The layer comes from a generator, as from a registry: no copy of it in memory (its file
    bodies wait in an unnamed spool on disk until the merged tree is known)."""
    import sys

    _tree, base = small_base(tmp_path)
    out = tmp_path / "child.sqsh"
    script = f"""
import io, sys
from pathlib import Path
from efabuild.export.squashfs import write_incremental
from efabuild.export.tarheader import header_block
from tests.export.test_squashfs_incremental import PLAN_B

SIZE = (1 << 30) + 12345
class Layer(io.RawIOBase):
    def __init__(self):
        self.head, self.left, self.tail = header_block("opt/huge", typeflag=b"0", mode=0o644, size=SIZE), SIZE, None
    def readable(self):
        return True
    def readinto(self, buf):
        if self.head:
            n = min(len(buf), len(self.head)); buf[:n] = self.head[:n]; self.head = self.head[n:]; return n
        if self.left:
            n = min(len(buf), self.left); buf[:n] = bytes([self.left % 251]) * n; self.left -= n; return n
        if self.tail is None:
            self.tail = bytes(-SIZE % 512 + 1024)
        n = min(len(buf), len(self.tail)); buf[:n] = self.tail[:n]; self.tail = self.tail[n:]; return n
seen = []
r = write_incremental(Path({str(base)!r}), [io.BufferedReader(Layer())], Path({str(out)!r}), plan=PLAN_B,
                      progress=seen.append)
assert not r.full_needed, r
assert len(seen) >= 15 and seen == sorted(seen) and seen[-1] >= 1 << 30, seen
peak = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(int(peak) // 1024)
"""
    root = Path(__file__).parents[2]
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) < 64, done.stdout  # MiB, interpreter and modules included (29 here)
    listed = {line.split()[-1]: line.split()[2] for line in lln(out).splitlines()}
    assert listed["squashfs-root/opt/huge"] == str((1 << 30) + 12345)
    tail = subprocess.run(["unsquashfs", "-cat", str(out), "opt/huge"], capture_output=True, check=True).stdout
    assert len(tail) == (1 << 30) + 12345 and tail[:4096] == bytes([((1 << 30) + 12345) % 251]) * 4096
    out.unlink()


def test_inodes_past_4_gib_and_hard_linked_ones_take_the_extended_form() -> None:
    from efabuild.export.squashfs.inodes import decode, encode
    from efabuild.export.squashfs.metadata import Region, Writer
    from efabuild.export.squashfs.tree import FILE, NO_FRAGMENT, Node

    big = Node(FILE, 0o644, T0, size=5 << 30, blocks_start=6 << 30, blocks=(0x1020000).to_bytes(4, "little") * 40960)
    linked = Node(FILE, 0o600, T0, size=10, fragment=0, fragment_offset=7)
    table = Writer(None)
    raw_big, raw_linked = encode(big, 1, 1), encode(linked, 2, 3)
    table.write(raw_big + raw_linked)
    f = io.BytesIO(table.finish())
    region = Region(f, 0, len(f.getvalue()), None, "inode table")
    got_big = decode(region, 0, block_size=131072, fragments=1, id_count=1)
    got_linked = decode(region, len(raw_big), block_size=131072, fragments=1, id_count=1)
    assert raw_big[0] == raw_linked[0] == 9  # the extended file inode
    assert (got_big.node.size, got_big.node.blocks_start, got_big.node.blocks) == (5 << 30, 6 << 30, big.blocks)
    assert got_big.node.fragment == NO_FRAGMENT and got_linked.nlink == 3 and got_linked.node.fragment_offset == 7


def test_sub_second_pax_times_are_cut_and_clamped_as_in_a_full_export(tmp_path: Path) -> None:
    import tarfile

    tree = {"etc": Item("d", 0o755), "opt": Item("d", 0o755)}
    base = full_export(tree_tar(tree), tmp_path / "base.sqsh", PLAN_A)

    def stream(with_tree: bool) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in ("etc", "opt") if with_tree else ():
                info = tarfile.TarInfo(name)
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, T0
                tar.addfile(info)
            for name, mtime in (("opt/a", T0 + 0.7), ("opt/b", T0 - 0.3), ("opt/c", CLAMP + 0.5), ("etc/d", 2**33)):
                info = tarfile.TarInfo(name)
                info.size, info.mtime = 1, mtime
                tar.addfile(info, io.BytesIO(b"x"))
        return buf.getvalue()

    incremental(base, [stream(False)], tmp_path / "inc.sqsh")
    full = full_export(stream(True), tmp_path / "full.sqsh", PLAN_B)
    assert_same(tmp_path / "inc.sqsh", full, tmp_path)


def test_a_child_that_cannot_be_written_is_one_line_naming_it(tmp_path: Path) -> None:
    from efabuild.errors import EfabuildError, InputError

    _tree, base = small_base(tmp_path)
    out = tmp_path / "missing-dir" / "child.sqsh"
    with pytest.raises(EfabuildError) as caught:
        write_incremental(base, [io.BytesIO(tar_entries([("etc/x", "f", 0o644, T0, b"x")]))], out, plan=PLAN_B)
    assert not isinstance(caught.value, InputError)  # exit 1: the disk, not the input
    assert str(caught.value) == f"{out}: cannot write it: No such file or directory"


def test_without_liblzo2_an_lzo_ancestor_is_left_to_a_full_export(tmp_path: Path, monkeypatch) -> None:
    from efabuild.export.squashfs import codec

    _tree, base = small_base(tmp_path)
    monkeypatch.setattr(codec, "_liblzo", lambda: None)
    result = write_incremental(base, [io.BytesIO(tar_entries([("etc/x", "f", 0o644, T0, b"x")]))],
                               tmp_path / "c.sqsh", plan=PLAN_B)
    assert result.full_needed and result.reason.endswith("compressor lzo: liblzo2 is not installed")


def test_dead_bytes_add_up_along_a_chain_until_a_full_export_is_due(tmp_path: Path) -> None:
    """Each generation replaces one 256 KiB file: its blocks stay in the prefix, dead."""
    tree = {"etc": Item("d", 0o755), "opt": Item("d", 0o755), "opt/keep": Item("f", data=os.urandom(4 << 20), inode=1),
            "opt/hot": Item("f", data=os.urandom(1 << 18), inode=2)}
    ancestor = full_export(tree_tar(tree), tmp_path / "gen0.sqsh", PLAN_A)
    dead = []
    for gen in range(1, 10):
        new = dict(tree, **{"opt/hot": Item("f", data=os.urandom(1 << 18), inode=10 + gen)})
        out = tmp_path / f"gen{gen}.sqsh"
        result = write_incremental(ancestor, [io.BytesIO(layer_between(tree, new))], out, plan=PLAN_B)
        if result.full_needed:
            assert result.dead_bytes > 0.25 * result.size and not out.exists()
            break
        dead.append(result.dead_bytes)
        assert_same(out, full_export(tree_tar(new), tmp_path / "full.sqsh", PLAN_B), tmp_path)
        tree, ancestor = new, out
    # -noD: blocks stored as they are; the config files that stay are not written again, so their
    # fragment (shared with the unchanged rc.local and fstab) stays live
    assert dead == [gen << 18 for gen in range(1, len(dead) + 1)]
    assert len(dead) == 5  # 5 × 256 KiB dead of 5.6 MB; a sixth would pass a quarter
