"""Layer diffs applied to the ancestor's tree, with the export filter's rules for what they bring.

Overlay semantics, oldest layer first: an entry replaces what its path held (a directory over a
directory keeps the children, anything else drops the subtree), `.wh.NAME` deletes NAME, and
`.wh..wh..opq` drops what the lower layers had in its directory. Each new entry gets what the
tar filter gives it in a full export (`tarfilter`): dropped paths stay out, Enroot's modes, the
plan's times, the container's init-layer files kept as the ancestor has them, and at the end
the files Enroot writes from the child's config, the working directory, and pinned times.

A layer file's body goes to a spool first and its blocks are written at the end, in the merged
tree's path order: the child's bytes are then a function of that tree, not of the order the
layer tars list their members in (the overlay2 walk sorts them, BuildKit's tars need not) nor of
how the same change is split into layers; a file a later layer replaces is never written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import BinaryIO

from efabuild.errors import InputError
from efabuild.export.squashfs.data import DataWriter
from efabuild.export.squashfs.layertar import Entry, LayerReader, split_path
from efabuild.export.squashfs.tree import BLKDEV, CHRDEV, DIR, FIFO, FILE, SYMLINK, Node, Unsupported, encode_dev, walk
from efabuild.export.tarfilter import INIT_LAYER_FILES, INIT_LAYER_PATHS, WRITTEN_MODE, RewritePlan, fixed_mode

_OPAQUE = ".wh..wh..opq"
_WHITEOUT = ".wh."
_KINDS = {b"2": SYMLINK, b"3": CHRDEV, b"4": BLKDEV, b"5": DIR, b"6": FIFO}
_COPY = 1 << 20
MAX_TIME = 0xFFFFFFFF  # squashfs keeps 32-bit unsigned times


def _enc(part: str) -> bytes:
    return part.encode("utf-8", "surrogateescape")


class Applier:
    def __init__(self, root: Node, plan: RewritePlan, data: DataWriter, spool: BinaryIO,
                 read_old: Callable[[Node], bytes] | None = None) -> None:
        self.root, self.plan, self.data, self.spool = root, plan, data, spool
        self.spooled: dict[int, int] = {}  # id(a layer's file node) -> where its body starts in `spool`
        self.read_old = read_old  # an ancestor file's bytes: a written file that stays is not written again
        self.aliases: dict[str, tuple[Node, str]] = {}  # hard links to a written file: its text goes there too
        # the ancestor's written files, and the child's (text, mode) of each: see aliases.py
        self.before = {path: node for path, _ in plan.files for node in [self.lookup(tuple(path.split("/")))]
                       if node is not None and node.kind == FILE}
        self.written: dict[str, tuple[bytes, int]] = {}
        self.touched: set[tuple[str, ...]] = set()

    # -- the tree

    def lookup(self, parts: tuple[str, ...]) -> Node | None:
        node = self.root
        for part in parts:
            if node.children is None:
                return None
            child = node.children.get(_enc(part))
            if child is None:
                return None
            node = child
        return node

    def _parent(self, parts: tuple[str, ...], where: str) -> Node:
        """The directory `parts` goes in; a missing one is made 0755 as mksquashfs makes it, dated the
        epoch (mksquashfs dates it now, which no two exports would share)."""
        node = self.root
        for part in parts[:-1]:
            assert node.children is not None
            child = node.children.get(_enc(part))
            if child is None:
                child = node.children[_enc(part)] = Node.directory(0o755, self.plan.epoch)
            elif not child.is_dir:
                raise InputError(f"entry {'/'.join(parts)!r} lies below {part!r}, which is not a directory", where)
            node = child
        return node

    def _put(self, parts: tuple[str, ...], node: Node, where: str) -> None:
        self._parent(parts, where).children[_enc(parts[-1])] = node  # type: ignore[index]
        for i in range(1, len(parts) + 1):
            self.touched.add(parts[:i])

    def _remove(self, parts: tuple[str, ...]) -> None:
        parent = self.lookup(parts[:-1])
        if parent is not None and parent.children is not None:
            parent.children.pop(_enc(parts[-1]), None)

    # -- one layer

    def layer(self, reader: LayerReader) -> None:
        self.touched = set()
        for entry in reader.entries():
            if entry.parts:
                self._entry(entry, reader)

    def _entry(self, entry: Entry, reader: LayerReader) -> None:
        parts, path, plan, where = entry.parts, entry.path, self.plan, reader.where
        name = parts[-1]
        if name.startswith(_WHITEOUT):
            self._whiteout(parts[:-1], name, where)
            return
        self.aliases.pop(path, None)
        if path in INIT_LAYER_FILES:
            return  # the container's own copy covers the image's (the ancestor has it)
        if plan.drops(path):
            if path in plan.replaced:  # the image's own copy: the written file takes its mode
                self._remove(parts)
                if entry.typeflag == b"0":
                    self._put(parts, Node(FILE, fixed_mode(entry.mode, is_dir=False, depth=0), 0), where)
            return
        if entry.typeflag == b"1":
            self._hard_link(entry, where)
            return
        mtime = int(plan.mtime(path, entry.mtime))
        if not 0 <= mtime <= MAX_TIME:
            raise InputError(f"entry {path!r} has a time squashfs cannot hold ({mtime})", where)
        if entry.typeflag == b"2":  # mksquashfs gives every symlink 0777, whatever the tar says
            self._put(parts, Node(SYMLINK, 0o777, mtime, target=_enc(entry.link)), where)
            return
        mode = fixed_mode(entry.mode, is_dir=entry.typeflag == b"5", depth=len(parts))
        if entry.typeflag == b"0":
            self._put(parts, self._spool(reader, Node(FILE, mode, mtime, size=entry.size)), where)
        elif entry.typeflag == b"5":
            old = self.lookup(parts)
            if old is not None and old.is_dir and old is not self.root:
                old.mode, old.mtime = mode, mtime
                self._put(parts, old, where)
            else:
                self._put(parts, Node.directory(mode, mtime), where)
        else:
            rdev = encode_dev(entry.major, entry.minor) if entry.typeflag in (b"3", b"4") else 0
            self._put(parts, Node(_KINDS[entry.typeflag], mode, mtime, rdev=rdev), where)

    def _whiteout(self, parent: tuple[str, ...], name: str, where: str) -> None:
        directory = self.lookup(parent)
        _keeps_init_layer(parent + (() if name == _OPAQUE else (name[len(_WHITEOUT):],)), name == _OPAQUE)
        if name == _OPAQUE:
            if directory is not None and directory.children is not None:
                for child in sorted(directory.children):
                    if parent + (child.decode("utf-8", "surrogateescape"),) not in self.touched:
                        del directory.children[child]
            return
        if name.startswith(_WHITEOUT + _WHITEOUT):
            return  # AUFS' own entries (.wh..wh.plnk, .wh..wh.aufs): not a file of the image
        target = name[len(_WHITEOUT):]
        if target in ("", ".", ".."):
            raise InputError(f"a whiteout {'/'.join(parent + (name,))!r} names {target!r}", where)
        parts = parent + (target,)
        path = "/".join(parts)
        self.aliases.pop(path, None)
        if path in INIT_LAYER_FILES or (self.plan.drops(path) and path not in self.plan.replaced):
            return
        self._remove(parts)

    def _hard_link(self, entry: Entry, where: str) -> None:
        target_parts = split_path(entry.link, where)
        target = "/".join(target_parts)
        if target in self.plan.replaced:  # Enroot rewrites the shared inode: the link gets the text
            self._put(entry.parts, placeholder := Node(FILE, 0, 0), where)
            self.aliases[entry.path] = (placeholder, target)
            return
        node = self.lookup(target_parts) if target_parts else None
        if node is None:
            raise InputError(f"hard link {entry.path!r} points at {entry.link!r}, which is not in this layer "
                             "or below", where)
        if node.is_dir:
            raise InputError(f"hard link {entry.path!r} points at a directory", where)
        self._put(entry.parts, node, where)

    def _spool(self, reader: LayerReader, node: Node) -> Node:
        self.spooled[id(node)] = self.spool.seek(0, 2)
        left = node.size
        while left:
            chunk = reader.read(min(left, _COPY))
            self.spool.write(chunk)
            left -= len(chunk)
        return node

    # -- after the last layer

    def _write_spooled(self) -> None:
        """The layers' files that are in the merged tree, written in its path order (a hard
        link's inode once, at its first name)."""
        for _path, node in walk(self.root):
            start = self.spooled.pop(id(node), None)
            if start is not None:
                self.spool.seek(start)
                self.data.fill(node, self.spool.read)
        self.spooled.clear()

    def finish(self) -> None:
        plan = self.plan
        self._write_spooled()
        for directory in plan.wanted_dirs():
            parts = tuple(directory.split("/"))
            node = self.lookup(parts)
            if node is None:
                self._put(parts, Node.directory(0o755, plan.epoch), "the working directory")
            elif not node.is_dir:
                break  # as the filter: a symlink or file on the way is left as the image has it
        for path in sorted(plan.pinned):
            node = self.lookup(tuple(path.split("/")))
            if node is not None and node is not self.root:
                node.mtime = plan.epoch
        for path, text in plan.files:
            parts = tuple(path.split("/"))
            parent = self.lookup(parts[:-1])
            if parent is None or not parent.is_dir:
                continue
            # the image's copy is the file there (the ancestor's, or a layer's stand-in): its mode
            old = self.lookup(parts)
            mode = old.mode if old is not None and old.kind == FILE else WRITTEN_MODE
            data = text.encode("utf-8", "surrogateescape")
            self.written[path] = (data, mode)
            if not (old is not None and old is self.before.get(path) and (old.mode, old.mtime, old.size) ==
                    (mode, plan.epoch, len(data)) and self.read_old is not None and self.read_old(old) == data):
                self._put(parts, self.data.add_bytes(data, mode, plan.epoch), path)
            for alias, (placeholder, target) in sorted(self.aliases.items()):
                if target == path and self.lookup(tuple(alias.split("/"))) is placeholder:
                    self._put(tuple(alias.split("/")), self.data.add_bytes(data, mode, plan.epoch), alias)
        self.data.flush()


def _keeps_init_layer(parts: tuple[str, ...], opaque: bool) -> None:
    """Unsupported when deleting `parts` (its contents only, `opaque`) would take entries of the
    container's init layer (/etc/hosts, /dev, ...), which `docker export` puts back over any layer."""
    path = "/".join(parts)
    if path in INIT_LAYER_FILES or (parts and parts[-1].startswith(_WHITEOUT)):
        return  # kept by the caller's rules
    below = [p for p in INIT_LAYER_PATHS if p.startswith(path + "/") or not path] if opaque else \
        [p for p in INIT_LAYER_PATHS if p == path or p.startswith(path + "/")]
    if below:
        what = f"an opaque /{path}" if opaque else f"a whiteout of /{path}"
        raise Unsupported(f"{what} deletes /{sorted(below)[0]}, which the container's init layer puts back")
