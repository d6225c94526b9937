"""The incremental export's rules that stand between a child and another image's bytes, each on
its own: the ancestor is the nearest artifact layer below, and the image's layers must start with
that ancestor image's (pure, with stand-ins for the plan and the layer source)."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest

from efabuild.export import incremental
from efabuild.export.incremental import LayerSourceUnavailable, ancestor_layer, layers_digest


def test_the_ancestor_is_the_nearest_artifact_layer_below():
    chain = [SimpleNamespace(qualname=name, artifact=artifact)
             for name, artifact in (("g:base", True), ("g:efa", True), ("g:deepep", False), ("g:user", True))]
    plan = SimpleNamespace(chain=lambda qualname: chain[: [c.qualname for c in chain].index(qualname) + 1])
    assert ancestor_layer(plan, "g:user").qualname == "g:efa"  # not g:base, the farthest
    assert ancestor_layer(plan, "g:deepep").qualname == "g:efa"
    assert ancestor_layer(plan, "g:base") is None


class _Source:
    where = "engine's"

    def __init__(self, layers, below) -> None:  # noqa: ANN001
        self.layers, self.below, self.opened = layers, below, None

    def diff_ids(self, ancestor):  # noqa: ANN001, ANN202
        return self.layers, self.below

    def open(self, first, count):  # noqa: ANN001, ANN202
        self.opened = (first, count)
        return []


def test_the_images_layers_must_start_with_the_ancestor_images():
    below = ("sha256:a", "sha256:b")
    ancestor = SimpleNamespace(export={"image_layers": layers_digest(below)}, tag="efabuild/efa:k")
    good = _Source(("sha256:a", "sha256:b", "sha256:c"), below)
    assert incremental._diff_streams(good, ancestor) == [] and good.opened == (2, 3)
    # the same number of layers below, but others: the child's diffs would sit on another image's files
    for layers in (("sha256:x", "sha256:b", "sha256:c"), ("sha256:a", "sha256:x", "sha256:c"), ("sha256:a",)):
        other = _Source(layers, below)
        with pytest.raises(LayerSourceUnavailable, match="do not start with the ancestor image's"):
            incremental._diff_streams(other, ancestor)
        assert other.opened is None


# ---- the writer (export/squashfs/incremental.py): times, dead bytes, durability ----------------
def test_only_a_path_the_ancestor_pinned_and_the_child_does_not_stops_the_writer():
    """The ancestor's entries keep their times: a path it dated to the epoch (its working
    directory) that the child does not would carry the wrong time. A path the child pins that the
    ancestor lacks (a WORKDIR its own layer makes) is written by the child: no reason to stop."""
    from efabuild.export.squashfs.incremental import _other_times

    def plan(*pinned: str) -> SimpleNamespace:
        return SimpleNamespace(epoch=7, clamp=None, pinned=frozenset(pinned))

    assert _other_times(7, plan("workspace", "opt/new"), plan("workspace")) == ""
    assert _other_times(7, plan("workspace"), plan("workspace", "srv")) == (
        "the ancestor pinned the time of 'srv', the child does not (another working directory?)")


def test_dead_bytes_count_blocks_two_files_share_once():
    """Two files of the ancestor on the same blocks (a duplicate, stored once) are one live span:
    counted twice, an ancestor looks less dead than it is and a child keeps more dead bytes."""
    from efabuild.export.squashfs.incremental import dead_bytes
    from efabuild.export.squashfs.tree import FILE, Node

    blocks = struct.pack("<2I", 100, 100)  # two blocks of 100 stored bytes: [1000, 1200)
    root = Node.directory(0o755, 0)
    root.children = {b"a": Node(FILE, 0o644, 0, size=200, blocks_start=1000, blocks=blocks),
                     b"b": Node(FILE, 0o644, 0, size=200, blocks_start=1000, blocks=blocks),
                     b"c": Node(FILE, 0o644, 0, size=150, blocks_start=1100, blocks=struct.pack("<2I", 100, 50))}
    parent = SimpleNamespace(data_start=1000, sb=SimpleNamespace(inode_table=2000), fragments=(),
                             data_end=2000)
    assert dead_bytes(parent, root) == 1000 - 250  # live: [1000, 1250), whatever the overlap


def test_the_child_is_on_disk_before_its_name_is(tmp_path, monkeypatch):
    """fsync of the temp file before the rename, and of the directory after: a crash must not
    leave a child at its name whose blocks never reached the disk."""
    import io
    import os

    from efabuild.export.squashfs import incremental as writer
    from efabuild.export.squashfs import write_incremental
    from tests.export.test_squashfs_incremental import PLAN_B, layer_between, small_base
    from tests.kits.tarkit import Item

    tree, base = small_base(tmp_path)
    layer = layer_between(tree, dict(tree, **{"opt/added": Item("f", data=b"new", inode=9)}))
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync " + ("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file"))
        real_fsync(fd)

    def replace(src, dst) -> None:  # noqa: ANN001
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(writer.os, "fsync", fsync)
    monkeypatch.setattr(writer.os, "replace", replace)
    result = write_incremental(base, [io.BytesIO(layer)], tmp_path / "child.sqsh", plan=PLAN_B)
    assert not result.full_needed
    assert events[events.index("rename") - 1] == "fsync file" and "fsync dir" in events[events.index("rename"):]


def test_an_opaque_directory_keeps_what_its_own_layer_put_there_before_the_marker(tmp_path):
    """`.wh..wh..opq` drops what the LOWER layers had in its directory: a layer tar that lists the
    directory's new entries before its marker (a registry's writer may) keeps them."""
    import io
    import tarfile

    from tests.export.test_squashfs_incremental import PLAN_B, assert_same, incremental, layer_between, small_base
    from tests.kits.tarkit import Item, full_export, tree_tar

    tree, base = small_base(tmp_path)
    new = {p: i for p, i in tree.items() if not p.startswith("opt/")}
    new["opt/fresh"] = Item("f", data=b"fresh\n", inode=7)
    layer = layer_between(tree, new, opaque=frozenset({"opt"}))
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = [(m, tar.extractfile(m).read() if m.isreg() else None) for m in tar]
    assert any(m.name.endswith(".wh..wh..opq") for m, _ in members)
    members.sort(key=lambda m: m[0].name.endswith(".wh..wh..opq"))  # the marker last
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, body in members:
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    child = tmp_path / "child.sqsh"
    incremental(base, [buf.getvalue()], child, max_dead_share=1.0)
    assert_same(child, full_export(tree_tar(new), tmp_path / "full.sqsh", PLAN_B), tmp_path)


def test_a_write_the_writer_declines_is_a_full_export_with_its_reason(tmp_path, monkeypatch):
    """write_incremental declines (dead bytes over the share, an input it does not handle) by
    returning full_needed and writing nothing: export_incremental must then hand back its reason
    (make exports in full), never keep what is not a child. The engine's side is stood in for: the
    writer's answer is the subject here (tests/make/test_incremental_export.py runs it for real)."""
    from efabuild.export.squashfs.incremental import IncrementalResult

    out = tmp_path / "child.sqsh"
    monkeypatch.setattr(incremental, "read_ahead", lambda path: None)
    monkeypatch.setattr(incremental, "_plans", lambda *args: (SimpleNamespace(labels={}), None, None))
    monkeypatch.setattr(incremental, "_diff_streams", lambda source, ancestor: [])
    monkeypatch.setattr(incremental, "write_incremental", lambda *args, **kwargs: IncrementalResult(
        out, size=100, dead_bytes=90, full_needed=True, reason="90 of its 100 bytes would be dead blocks"))
    source = SimpleNamespace(image="efabuild/user:k", problems=lambda streams, verify: [])
    ancestor = SimpleNamespace(sqsh=tmp_path / "ancestor.sqsh", stamp=None, key="ab" * 32, digest="blake3:00")
    from efabuild.settings import ExportSettings

    made = incremental.export_incremental(source, ancestor, out, options=ExportSettings(), epoch=0, recorded={})
    assert made == "90 of its 100 bytes would be dead blocks" and not out.exists()
    assert list(tmp_path.iterdir()) == []
