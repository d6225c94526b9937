"""Incremental export in `make`: the ancestor rule, where the layer diffs come from (the engine's
overlay2 directories), and the full export's reasons, shown and recorded."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

from efabuild.export import incremental
from efabuild.export.layerdiff import LayerSourceUnavailable, layer_tar, overlay_dirs, stream_layers
from tests.kits.wsfactory import demo_on_base
from tests.make.test_make import efabuild, plan  # the CLI as a process, and the plan by name

REPO = Path(__file__).resolve().parents[2]


def _entries(data: bytes) -> dict[str, tuple]:
    """name -> (type, mode, uid, gid, size, link, sha256 of the body) of an uncompressed tar."""
    found = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar:
            body = tar.extractfile(m).read() if m.isreg() else b""
            found[m.name.lstrip("./").rstrip("/")] = (m.type, m.mode & 0o7777, m.uid, m.gid, m.size, m.linkname,
                                                   hashlib.sha256(body).hexdigest())
    return found


# ---- the overlay2 directory as a layer tar (no engine) -------------------------------------------

@pytest.fixture
def diff_dir(tmp_path: Path) -> Path:
    """A layer directory as overlay2 keeps one: a whiteout, an opaque directory, links out."""
    if os.geteuid() != 0:
        pytest.skip("overlay whiteouts (char devices 0:0) and trusted.* xattrs need root, as dockerd does")
    root = tmp_path / "diff"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "conf").write_text("new\n")
    os.link(root / "etc" / "conf", root / "etc" / "conf.hard")
    os.mknod(root / "etc" / "gone", 0o600 | 0o020000, os.makedev(0, 0))  # overlay's whiteout
    (root / "opt" / "fresh").mkdir(parents=True)
    (root / "opt" / "fresh" / "only").write_text("x")
    os.setxattr(root / "opt" / "fresh", "trusted.overlay.opaque", b"y")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("never in a layer")
    (root / "escape").symlink_to(outside)  # a directory link: an entry, never walked into
    (root / "passwd").symlink_to("/etc/passwd")
    os.mkfifo(root / "pipe")  # listed, never opened: a FIFO would hang a reader
    return root


def test_an_overlay_dir_becomes_an_oci_layer_tar_with_whiteouts_and_links_as_entries(diff_dir: Path):
    out = io.BytesIO()
    written = layer_tar(str(diff_dir), out)
    entries = _entries(out.getvalue())
    assert written == len(out.getvalue())
    assert entries["etc/.wh.gone"][0] == tarfile.REGTYPE and "etc/gone" not in entries
    assert entries["opt/fresh/.wh..wh..opq"][0] == tarfile.REGTYPE and "opt/.wh..wh..opq" not in entries
    assert entries["opt/fresh/only"][4] == 1
    assert entries["etc/conf.hard"][:1] == (tarfile.LNKTYPE,) and entries["etc/conf.hard"][5] == "etc/conf"
    assert entries["escape"][0] == tarfile.SYMTYPE and entries["escape"][5] == str(diff_dir.parent / "outside")
    assert entries["passwd"][5] == "/etc/passwd"
    assert not any(name.startswith("escape/") for name in entries)  # the link's target was not read
    assert entries["pipe"][0] == tarfile.FIFOTYPE
    # names sorted: the same directory gives the same bytes
    again = io.BytesIO()
    layer_tar(str(diff_dir), again)
    assert again.getvalue() == out.getvalue()


def test_layer_streams_fill_through_pipes_and_name_a_directory_that_vanished(diff_dir: Path, tmp_path: Path):
    good, gone = stream_layers([str(diff_dir), str(tmp_path / "no-such-layer")])
    assert "etc/conf" in _entries(good.read())
    assert gone.read() == b"" and "no-such-layer" in gone.errors_seen[0]
    good.close(), gone.close()


def test_directories_nested_past_the_walks_depth_end_the_stream_with_a_reason_not_a_traceback(tmp_path, capfd):
    root = tmp_path / "deep"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(400):  # made one openat at a time, as a build can nest them past PATH_MAX
        os.mkdir("d", dir_fd=fd)
        fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(parent)
    os.close(fd)
    limit = sys.getrecursionlimit()
    # the walk's depth is the interpreter's limit: lowered here so that the tree stays shallow
    # enough for pytest's own clean-up (shutil.rmtree recurses too)
    sys.setrecursionlimit(250)
    try:
        (stream,) = stream_layers([str(root)])
        stream.read()
    finally:
        sys.setrecursionlimit(limit)
    stream.close()
    _remove_nested(root)  # pytest's clean-up (shutil.rmtree) recurses once per level, and failed at exit
    assert "nested deeper than 250 levels" in stream.errors_seen[0]
    assert "Traceback" not in capfd.readouterr().err


def _remove_nested(root) -> None:  # noqa: ANN001
    """Remove a chain of directories named `d`, deepest first, one descriptor per level."""
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        while True:
            try:
                fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
            except FileNotFoundError:
                break
        os.close(fds.pop())
        while fds:
            fd = fds.pop()
            os.rmdir("d", dir_fd=fd)
            os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)


def test_a_file_shorter_than_its_stat_fails_the_layer_rather_than_padding_it():
    from efabuild.errors import EfabuildError
    from efabuild.export.layerdiff import _Bounded

    header = tarfile.TarInfo("etc/conf")
    header.size = 10  # what the stat said; the file now holds 3 bytes
    with tarfile.open(fileobj=io.BytesIO(), mode="w|") as tar:
        with pytest.raises(EfabuildError, match="etc/conf: shorter than its size"):
            tar.addfile(header, _Bounded(io.BytesIO(b"abc"), 10, "etc/conf"))
    grown = _Bounded(io.BytesIO(b"abcdef"), 3, "etc/conf")  # one that grew is cut at the stat's size
    assert grown.read(100) == b"abc" and grown.read(100) == b""


def test_another_storage_driver_or_too_few_directories_is_a_reason_not_a_guess():
    with pytest.raises(LayerSourceUnavailable, match="storage driver is vfs, not overlay2"):
        overlay_dirs({"Name": "vfs", "Data": {}}, 1)
    with pytest.raises(LayerSourceUnavailable, match="lists 3 layer directories, 4 needed"):
        overlay_dirs({"Name": "overlay2", "Data": {"UpperDir": "/u", "LowerDir": "/l1:/l2"}}, 4)
    assert overlay_dirs({"Name": "overlay2", "Data": {"UpperDir": "/u", "LowerDir": "/l1:/l2"}}, 2) == ["/l1", "/u"]


# ---- the rules that decide a full export (no engine) ---------------------------------------------

def test_only_a_re_dated_path_the_ancestor_has_or_another_recorded_option_stops_an_incremental_export(tmp_path):
    from efabuild.export.incremental import _present, packing_difference

    tree = tmp_path / "tree"
    (tree / "opt" / "x").mkdir(parents=True)
    (tree / "opt" / "x" / "f").write_text("a")
    sqsh = tmp_path / "ancestor.sqsh"
    subprocess.run(["mksquashfs", str(tree), str(sqsh), "-noappend", "-quiet", "-no-progress"], check=True)
    # a WORKDIR the child's layer makes is no reason; one the ancestor has is, at any depth
    assert _present(sqsh, {"workspace", "op", "opt/x/g"}) == []
    assert _present(sqsh, {"workspace", "opt", "opt/x"}) == ["opt", "opt/x"]
    recorded = {"mksquashfs": ["-tar"], "compression": "lzo", "compress_data": False, "epoch": 315532800,
                "enroot_format": "4.1.2", "rc_labels": "keyed", "time_clamp": 1}
    assert packing_difference(recorded, {**recorded, "incremental": {"full": "x"}}) is None
    assert packing_difference(recorded, {**recorded, "time_clamp": None}) == "time_clamp"
    assert packing_difference({k: v for k, v in recorded.items() if k != "rc_labels"}, recorded) == "rc_labels"


def test_without_layer_diffs_to_read_the_ancestor_is_neither_fetched_nor_re_hashed():
    from types import SimpleNamespace

    from efabuild.make.ancestry import export_ancestor

    # no plan and no store to reach: either would be an AttributeError
    no_registry = SimpleNamespace(settings=SimpleNamespace(registry=None, export=SimpleNamespace(incremental=True)))
    for prepared, remote, reason in ((SimpleNamespace(engine=None, ws=no_registry), True, incremental.REMOTE_BUILDER),
                                     (SimpleNamespace(engine=SimpleNamespace(api=None), ws=no_registry), False,
                                      incremental.NOT_ON_THIS_HOST)):
        with export_ancestor(prepared, "demo:user", remote=remote) as found:
            assert found == (None, reason)


def test_a_full_export_asked_for_takes_no_ancestor_and_says_why(monkeypatch):
    from types import SimpleNamespace

    from efabuild.make import ancestry

    # the graph's rule gives an artifact layer below (it is tested on the engine): only the setting
    # stops the incremental export, before any store or engine is reached (neither is here)
    monkeypatch.setattr(ancestry, "ancestor_layer", lambda plan, qualname: SimpleNamespace(key="ab" * 32))
    no_incremental = SimpleNamespace(settings=SimpleNamespace(export=SimpleNamespace(incremental=False), registry=None))
    for remote in (False, True):
        with ancestry.export_ancestor(SimpleNamespace(ws=no_incremental, plan=None), "demo:user", remote=remote) as found:
            assert found == (None, incremental.FULL_ASKED)
    # a root artifact keeps its own reason, asked for or not
    monkeypatch.setattr(ancestry, "ancestor_layer", lambda plan, qualname: None)
    with ancestry.export_ancestor(SimpleNamespace(ws=no_incremental, plan=None, engine=None), "demo:efa",
                                  remote=False) as found:
        assert found == (None, incremental.NOT_ON_THIS_HOST)


# ---- on the engine: the demo graph, made, then a one-file change in the user layer ---------------

@pytest.fixture
def demo_ws(tmp_path, pinned_fixture_base):
    """The shipped demo graph on the fixture base pinned by digest (its keys hold while another
    checkout rebuilds the shared fixture tag), with a run-unique build arg: keys new to the engine."""
    ref, digest = pinned_fixture_base.split("@")
    root = demo_on_base(tmp_path / "ws", f"{ref}:26.08-py3", digest, uuid.uuid4().hex[:12],
                        '[workspace]\ngraphs = ["graphs/*.toml"]\n')
    yield root
    keys = set()  # every key this workspace built, as its build records list them
    for path in (root / "cache" / "builds" / "layers").rglob("*.json") if (root / "cache").exists() else []:
        keys |= {entry["key"] for entry in json.loads(path.read_text())["builds"]}
    tags = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "efabuild/*"],
                          capture_output=True, text=True).stdout.split()
    doomed = [t for t in tags if t.rsplit(":", 1)[-1] in keys]
    if doomed:
        subprocess.run(["docker", "image", "rm", "-f", *doomed], capture_output=True)


@pytest.fixture(scope="module")
def registry_base(pinned_fixture_base, second_engine) -> str:
    """The fixture base from the loopback registry, pulled by both engines: the same keys on each."""
    for host in (None, second_engine):
        subprocess.run(["docker", *(["--host", host] if host else []), "image", "pull", pinned_fixture_base],
                       capture_output=True, check=True)
    return pinned_fixture_base


def _record(root: Path, name: str) -> dict:
    sqsh = Path(efabuild(root, "lookup", name, check=True).stdout.strip())
    return json.loads(sqsh.with_suffix(".json").read_text())


def _change_one_file(root: Path) -> None:
    with (root / "app" / "train.py").open("a") as f:
        f.write(f"\n# {uuid.uuid4().hex}\n")


def _export_line(proc: subprocess.CompletedProcess, name: str) -> str:
    return next((line for line in (proc.stdout + proc.stderr).splitlines() if name in line and "export: " in line),
                "")


def test_the_layer_diffs_read_from_overlay2_are_the_engines_own_layer_tars(demo_ws, tmp_path):
    """The user image's layers above the efa image's, read from the engine's directories, hold
    exactly the entries `docker save` gives for the same layers."""
    from efabuild.engine.client import connect
    from efabuild.engine.images import layer_facts
    from efabuild.settings import BuilderSettings

    efabuild(demo_ws, "make", "demo", check=True)
    keys = {name: entry["key"] for name, entry in plan(demo_ws).items()}
    user, efa = f"efabuild/user:{keys['demo:user']}", f"efabuild/efa:{keys['demo:efa']}"
    engine = connect(BuilderSettings())
    (driver, layers), (_, below) = layer_facts(engine, user), layer_facts(engine, efa)
    assert layers[:len(below)] == below and len(layers) > len(below)
    ours = [_entries(stream.read()) for stream in stream_layers(overlay_dirs(driver, len(layers) - len(below)))]
    saved = tmp_path / "saved"
    saved.mkdir()
    subprocess.run(["docker", "save", "-o", str(saved / "image.tar"), user], check=True)
    with tarfile.open(saved / "image.tar") as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
        theirs = [_entries(tar.extractfile(name).read()) for name in manifest[0]["Layers"][len(below):]]
    assert ours == theirs
    assert any("workspace/app/train.py" in entries for entries in ours)


def test_a_one_file_change_is_exported_from_the_ancestor_artifact(demo_ws, tmp_path):
    from efabuild.host.digest import file_digests

    first = efabuild(demo_ws, "make", "demo", check=True)
    efa = _record(demo_ws, "demo:efa")
    assert efa["export"]["incremental"] == {"full": "no artifact layer below it"}
    assert _export_line(first, "demo:efa") == ""  # recorded, not shown: a root artifact has no ancestor
    _change_one_file(demo_ws)
    again = efabuild(demo_ws, "make", "demo", check=True)
    made = _record(demo_ws, "demo:user")["export"]["incremental"]
    shown = efabuild(demo_ws, "show", "demo:user", check=True).stdout
    assert made["ancestor"] == efa["key"] and made["ancestor_digest"] == efa["digest"]
    assert f"export: incremental from {efa['key'][:12]}" in _export_line(again, "demo:user")
    assert f"from ancestor {efa['key']}" in shown
    # the sha256 cosign and in-toto check, taken while the ancestor's range was copied, is the file's
    record = _record(demo_ws, "demo:user")
    child = Path(efabuild(demo_ws, "lookup", "demo:user", check=True).stdout.strip())
    assert (record["digest"], record["sha256"]) == file_digests(child)
    _same_as_a_full_export(demo_ws, tmp_path)
    efabuild(demo_ws, "make", "--check", "demo:user", check=True)


def _same_as_a_full_export(root: Path, tmp_path: Path) -> None:
    from efabuild.engine.client import connect
    from efabuild.export.squash import export_image
    from efabuild.make.run import SOURCE_DATE_EPOCH
    from efabuild.settings import BuilderSettings, ExportSettings

    key = plan(root)["demo:user"]["key"]
    child = Path(efabuild(root, "lookup", "demo:user", check=True).stdout.strip())
    whole = export_image(f"efabuild/user:{key}", tmp_path / "whole.sqsh", options=ExportSettings(),
                         engine=connect(BuilderSettings()), epoch=SOURCE_DATE_EPOCH).path
    listings = [subprocess.run(["unsquashfs", "-lln", "-d", "", str(p)], capture_output=True, text=True,
                               check=True).stdout for p in (child, whole)]
    assert listings[0] == listings[1]
    trees = []
    for n, sqsh in enumerate((child, whole)):
        subprocess.run(["unsquashfs", "-q", "-n", "-d", str(tmp_path / f"tree{n}"), str(sqsh)], check=True)
        trees.append({str(p.relative_to(tmp_path / f"tree{n}")): p.read_bytes()
                      for p in (tmp_path / f"tree{n}").rglob("*") if p.is_file() and not p.is_symlink()})
    assert trees[0] == trees[1]


def test_the_ancestors_check_keeps_what_the_child_is_hashed_from(demo_ws, monkeypatch):
    """make's check of the ancestor's copy keeps its stamp and the chaining values of its subtrees
    (the child's digest is assembled from them), and they are the checked bytes'."""
    from efabuild.host.blake3tree import file_tree
    from efabuild.make.ancestry import ancestor_copy
    from efabuild.make.prepare import prepare
    from efabuild.workspace import load_workspace

    efabuild(demo_ws, "make", "demo", check=True)
    monkeypatch.chdir(demo_ws)
    prepared = prepare(load_workspace(demo_ws), ["demo:user"])
    with ancestor_copy(prepared, "demo:user") as (found, why):
        assert found is not None, why
        assert found.stamp is not None and found.tree is not None
        again = file_tree(found.sqsh)
        assert (found.tree.digest, found.tree.cvs) == (found.digest, again.cvs)


def test_a_damaged_ancestor_copy_is_never_built_on(demo_ws):
    efabuild(demo_ws, "make", "demo", check=True)
    efa = Path(efabuild(demo_ws, "lookup", "demo:efa", check=True).stdout.strip())
    with efa.open("r+b") as f:  # same size, other bytes: only the digest tells
        f.seek(efa.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    _change_one_file(demo_ws)
    again = efabuild(demo_ws, "make", "demo:user", check=True)
    made = _record(demo_ws, "demo:user")["export"]["incremental"]
    assert made["full"] == f"ancestor copy damaged: {efa} is not the bytes its record names"
    assert "export: full (ancestor copy damaged:" in _export_line(again, "demo:user")
    # withdrawn, no tier holding a good copy: no lookup hands it out, no make builds on it; the
    # next make exports it again and the child is incremental from the good copy
    assert "no tier holds a good copy: withdrawn" in again.stderr
    assert efabuild(demo_ws, "lookup", "demo:efa").returncode == 1 and not efa.exists()
    _change_one_file(demo_ws)
    third = efabuild(demo_ws, "make", "demo", check=True)
    assert efabuild(demo_ws, "lookup", "demo:efa", check=True).stdout.strip() == str(efa)
    assert "export: incremental from" in _export_line(third, "demo:user"), third.stderr


def test_a_child_of_another_users_ancestor_copy_is_incremental_and_hashed_from_its_own_bytes(demo_ws):
    """In a shared tier the ancestor's copy is another builder's, who can change it without moving
    its stamp: the child is still written from it, and its record names the child's own bytes."""
    from efabuild.host.digest import file_digest, sha256_file

    if os.geteuid() != 0:
        pytest.skip("giving the copy to another user needs root")
    efabuild(demo_ws, "make", "demo", check=True)
    efa = Path(efabuild(demo_ws, "lookup", "demo:efa", check=True).stdout.strip())
    os.chown(efa, 65534, 65534)
    _change_one_file(demo_ws)
    again = efabuild(demo_ws, "make", "demo:user", check=True)
    assert "export: incremental from" in _export_line(again, "demo:user"), again.stdout + again.stderr
    record = _record(demo_ws, "demo:user")
    child = Path(efabuild(demo_ws, "lookup", "demo:user", check=True).stdout.strip())
    assert (record["digest"], record["sha256"]) == (file_digest(child), sha256_file(child))
    efabuild(demo_ws, "make", "--check", "demo:user", check=True)


def test_a_workdir_that_re_dates_a_path_the_ancestor_has_is_a_full_export_with_the_reason(demo_ws):
    efabuild(demo_ws, "make", "demo", check=True)
    graph = demo_ws / "graphs" / "demo.toml"
    graph.write_text(graph.read_text().replace("WORKDIR /workspace", "WORKDIR /opt"))
    again = efabuild(demo_ws, "make", "demo", check=True)
    reason = "WORKDIR or VOLUME re-date /opt, which the ancestor has"
    assert _record(demo_ws, "demo:user")["export"]["incremental"] == {"full": reason}
    assert f"export: full ({reason})" in _export_line(again, "demo:user")


def test_make_full_export_writes_the_child_whole_and_records_why(demo_ws, tmp_path):
    efabuild(demo_ws, "make", "demo", check=True)
    _change_one_file(demo_ws)
    again = efabuild(demo_ws, "make", "--full-export", "demo", check=True)
    assert _record(demo_ws, "demo:user")["export"]["incremental"] == {"full": incremental.FULL_ASKED}
    assert f"export: full ({incremental.FULL_ASKED})" in _export_line(again, "demo:user")
    # a full export's bytes: those of the image exported whole, byte for byte
    from efabuild.engine.client import connect
    from efabuild.export.squash import export_image
    from efabuild.make.run import SOURCE_DATE_EPOCH
    from efabuild.settings import BuilderSettings, ExportSettings

    child = Path(efabuild(demo_ws, "lookup", "demo:user", check=True).stdout.strip())
    whole = export_image(f"efabuild/user:{plan(demo_ws)['demo:user']['key']}", tmp_path / "whole.sqsh",
                         options=ExportSettings(), engine=connect(BuilderSettings()), epoch=SOURCE_DATE_EPOCH).path
    assert child.read_bytes() == Path(whole).read_bytes()
    # stored already: left as it is, and make says so rather than nothing
    same = efabuild(demo_ws, "make", "--full-export", "demo:user", check=True)
    assert "--full-export: demo:efa, demo:user are stored already under their keys and not exported again" \
        in same.stderr, same.stderr
    assert Path(efabuild(demo_ws, "lookup", "demo:user", check=True).stdout.strip()).read_bytes() == child.read_bytes()


def test_publishing_the_changed_child_to_the_chunked_tier_sends_a_small_share_of_it(demo_ws, moto_server, s3_bucket,
                                                                                  s3_client):
    """An image of the size chunks are made for: the fixture's efa layer with 64 MiB of libraries."""
    with (demo_ws / "BUILD.toml").open("a") as f:
        f.write(f'[store.s3]\nbucket = "{s3_bucket}"\nprefix = "images/"\nendpoint_url = "{moto_server}"\n')
    graph = demo_ws / "graphs" / "demo.toml"
    anchor = "ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${LD_LIBRARY_PATH}\n"
    graph.write_text(graph.read_text().replace(
        anchor, anchor + "RUN dd if=/dev/urandom of=/opt/amazon/libpayload.so bs=1M count=64 2>/dev/null\n", 1))
    efabuild(demo_ws, "make", "demo", check=True)

    def stored() -> dict[str, int]:
        pages = s3_client.get_paginator("list_objects_v2").paginate(Bucket=s3_bucket, Prefix="images/")
        return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}

    before = stored()
    _change_one_file(demo_ws)
    efabuild(demo_ws, "make", "demo", check=True)
    child = _record(demo_ws, "demo:user")
    sent = {key: size for key, size in stored().items() if key not in before}
    chunks = {key.rsplit("/", 1)[-1]: size for key, size in sent.items() if "/chunks/" in key}
    assert any(key.endswith(f"{child['key']}.chunks.json") for key in sent)
    assert "ancestor" in child["export"]["incremental"], child["export"]["incremental"]
    # its index lends the ancestor's chunks where the child reuses its bytes, never cutting them
    # again: it is still the index a whole cut of the child gives
    from efabuild.chunks.cdc import ChunkIndex, chunk_file

    sqsh = Path(efabuild(demo_ws, "lookup", "demo:user", check=True).stdout.strip())
    kept = ChunkIndex.from_json(sqsh.with_name(f"{child['key']}.chunks.json").read_bytes(), "kept index")
    assert kept == chunk_file(sqsh, chunking=kept.chunking)
    # sent: exactly the child's chunks the bucket lacked (the rewritten superblock's, the changed
    # file's, the new tables'), a small share of it; FastCDC's cuts follow the image's random
    # payload and a chunk may be 16 MiB, so the bound is their count and their share together
    known = {key.rsplit("/", 1)[-1] for key in before if "/chunks/" in key}
    new = {cid: length for cid, length in kept.unique().items() if cid not in known}
    assert set(chunks) == set(new) and 0 < len(new) <= 5, (sorted(chunks), sorted(new))
    assert sum(new.values()) < 0.3 * child["size"], (new, child["size"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_engines_write_byte_identical_incremental_children(registry_base, second_engine, tmp_path):
    run_id = uuid.uuid4().hex[:12]
    sides = {"here": (), "there": ("--builder", second_engine)}
    ref, digest = registry_base.split("@")
    roots = {side: demo_on_base(tmp_path / side, f"{ref}:26.08-py3", digest, run_id,
                                '[workspace]\ngraphs = ["graphs/*.toml"]\n') for side in sides}
    line = f"\n# the same change on both sides {run_id}\n"
    keys = set()
    try:
        for side, builder in sides.items():
            efabuild(roots[side], "make", *builder, "demo", check=True)
            with (roots[side] / "app" / "train.py").open("a") as f:
                f.write(line)
            efabuild(roots[side], "make", *builder, "demo", check=True)
            keys |= {(name, entry["key"]) for name, entry in plan(roots[side], *builder).items()}
        children = [Path(efabuild(roots[side], "lookup", "demo:user", check=True).stdout.strip()) for side in sides]
        made = [json.loads(child.with_suffix(".json").read_text())["export"]["incremental"] for child in children]
        assert made[0] == made[1] and "ancestor" in made[0], made
        assert children[0].read_bytes() == children[1].read_bytes()
    finally:
        tags = [f"efabuild/{name.split(':')[1]}:{key}" for name, key in keys]
        for host in (None, second_engine):
            subprocess.run(["docker", *(["--host", host] if host else []), "image", "rm", "-f", *tags],
                           capture_output=True)
