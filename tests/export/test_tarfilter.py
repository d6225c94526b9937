"""The export's tar filter on hand-made archives, no engine: what Enroot's rootfs would hold."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efabuild.errors import EfabuildError
from efabuild.export.enroot import ImageConfig
from efabuild.export.tarfilter import RewritePlan, fixed_mode, rewrite_tar, time_clamp
from efabuild.export.tarheader import number

T0 = 1_700_000_000


def _tar(entries: list[tuple[str, str, int, bytes]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """(name, kind 'f'|'d'|'l'|'h', mode, data or link target) → tar bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, kind, mode, data in entries:
            info = tarfile.TarInfo(name)
            info.mode, info.mtime, info.uid, info.gid = mode, T0, 1000, 1000
            if kind == "d":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind in ("l", "h"):
                info.type = tarfile.SYMTYPE if kind == "l" else tarfile.LNKTYPE
                info.linkname = data.decode()
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _filter(tmp_path: Path, data: bytes, plan: RewritePlan) -> dict[str, tarfile.TarInfo | bytes]:
    src, dst = tmp_path / "in.tar", tmp_path / "out.tar"
    src.write_bytes(data)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        assert rewrite_tar(fin.fileno(), fout.fileno(), plan) == len(data)
    out: dict[str, tarfile.TarInfo | bytes] = {}
    with tarfile.open(dst) as tar:
        for member in tar.getmembers():
            out[member.name.rstrip("/")] = member
            if member.isfile():
                out[member.name + "#data"] = tar.extractfile(member).read()  # type: ignore[union-attr]
    return out


PLAN = RewritePlan.for_config(
    ImageConfig(env=("A=1",), working_dir="/workspace/app", volumes=("/data",)), epoch=42
)


def test_etc_rc_keeps_the_labels_the_key_decides_and_no_other():
    """The base's and the Dockerfile's labels and the key are the key's; the layer's name and the
    workspace's git state are not, and would give one key two .sqsh files."""
    def rc(**labels: str) -> str:
        cfg = ImageConfig.from_docker({"Labels": {"com.nvidia.nccl.version": "2.30.7", "org.efabuild.key": "k" * 64,
                                                  **labels}, "Cmd": ["bash"]})
        return dict(RewritePlan.for_config(cfg).files)["etc/rc"]

    here = rc(**{"org.opencontainers.image.revision": "a" * 40, "org.opencontainers.image.source": "https://x/y.git",
                 "org.opencontainers.image.title": "g:tools", "org.efabuild.graph": "g", "org.efabuild.layer": "tools"})
    assert here == rc(**{"org.opencontainers.image.revision": "b" * 40, "org.opencontainers.image.title": "other:kit",
                         "org.efabuild.graph": "other", "org.efabuild.layer": "kit"}) == rc()
    assert here.startswith(f"# com.nvidia.nccl.version 2.30.7\n# org.efabuild.key {'k' * 64}\n\n")


def test_filter_drops_dev_contents_and_dockerenv_and_replaces_config_files(tmp_path: Path) -> None:
    out = _filter(tmp_path, _tar([
        (".dockerenv", "f", 0o755, b""),
        ("dev", "d", 0o755, b""),
        ("dev/console", "f", 0o755, b""),
        ("dev/pts", "d", 0o755, b""),
        ("etc", "d", 0o755, b""),
        ("etc/environment", "f", 0o640, b"OLD=1\n"),
        ("etc/hosts", "f", 0o644, b""),
        ("bin", "d", 0o755, b""),
        ("bin/tool", "f", 0o755, b"x" * 300_000),
    ]), PLAN)
    assert ".dockerenv" not in out and "dev/console" not in out and "dev/pts" not in out
    assert "dev" in out
    assert out["etc/environment#data"] == b"A=1\n"
    assert out["etc/environment"].mode == 0o640  # the image's file keeps its (fixed) mode
    assert out["etc/rc.local"].mode == 0o644  # a new file gets Enroot's umask default
    assert out["bin/tool#data"] == b"x" * 300_000
    assert out["workspace"].isdir() and out["workspace/app"].isdir()


def test_hard_links_to_a_rewritten_file_get_its_new_text(tmp_path: Path) -> None:
    """Enroot writes /etc/fstab & co. in place, so a hard link to one sees the new text too."""
    out = _filter(tmp_path, _tar([
        ("etc", "d", 0o755, b""),
        ("etc/fstab", "f", 0o644, b"old\n"),
        ("etc/fstab.orig", "h", 0o644, b"etc/fstab"),
        ("etc/hostname.bak", "h", 0o644, b"etc/hosts"),  # a link to a kept file stays a link
        ("etc/hosts", "f", 0o644, b""),
    ]), PLAN)
    assert out["etc/fstab.orig"].isfile()
    assert out["etc/fstab.orig#data"] == out["etc/fstab#data"] != b"old\n"
    assert out["etc/hostname.bak"].islnk()


def test_filter_fixes_permissions_as_enroot(tmp_path: Path) -> None:
    """Enroot ≥ 4.0 makes directories writable down to depth 15 (`find -maxdepth 15`); 3.x stopped
    at 5, which left depth 6-15 read-only directories that Enroot 4 fixes."""
    chain = ["/".join(f"d{i}" for i in range(1, n + 1)) for n in range(1, 17)]  # depths 1..16
    out = _filter(tmp_path, _tar([
        ("etc", "d", 0o755, b""),
        ("etc/shadow", "f", 0o000, b"secret"),
        ("etc/sudoers.d", "d", 0o550, b""),
        ("run.sh", "f", 0o010, b""),
        *[(path, "d", 0o500, b"") for path in chain],
        ("link", "l", 0o777, b"etc/shadow"),
    ]), PLAN)
    assert out["etc/shadow"].mode == 0o400  # u+r
    assert out["etc/sudoers.d"].mode == 0o750  # directories: u+rwx
    assert out["run.sh"].mode == 0o510  # some x bit → u+x
    assert out[chain[5]].mode == 0o700  # depth 6: writable (Enroot 3.x left it 0500)
    assert out[chain[14]].mode == 0o700  # depth 15: still made writable
    assert out[chain[15]].mode == 0o500  # depth 16: Enroot's find stops at depth 15


def test_filter_pins_the_times_docker_create_sets_and_keeps_the_others(tmp_path: Path) -> None:
    out = _filter(tmp_path, _tar([
        ("etc", "d", 0o755, b""), ("etc/hosts", "f", 0o644, b""), ("etc/motd", "f", 0o644, b"hi"),
        ("workspace", "d", 0o755, b""), ("data", "d", 0o755, b""),
    ]), PLAN)
    assert out["etc"].mtime == 42 and out["etc/hosts"].mtime == 42
    assert out["workspace"].mtime == 42 and out["data"].mtime == 42
    assert out["etc/motd"].mtime == T0
    assert out["etc/rc"].mtime == 42


def test_filter_clamps_newer_times_and_keeps_older_ones(tmp_path: Path) -> None:
    """A build's files carry its wall-clock time: clamped. The base's files are older: kept."""
    plan = attrs.evolve(PLAN, clamp=T0 - 100)
    long = "usr/lib/" + "p" * 120 + "/written.py"  # a pax header carries its name
    data = _tar([("etc", "d", 0o755, b""), ("etc/motd", "f", 0o644, b"hi"), (long, "f", 0o644, b"x")])
    old = io.BytesIO()
    with tarfile.open(fileobj=old, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("usr/lib/base.py")
        info.mtime, info.size = T0 - 5000, 1
        tar.addfile(info, io.BytesIO(b"y"))
    out = _filter(tmp_path, _concat(data, old.getvalue()), plan)
    assert out["etc/motd"].mtime == T0 - 100 and out[long].mtime == T0 - 100
    assert out[long + "#data"] == b"x"
    assert out["usr/lib/base.py"].mtime == T0 - 5000
    assert out["etc"].mtime == 42  # pinned entries keep the export's epoch
    unclamped = _filter(tmp_path, data, PLAN)
    assert unclamped["etc/motd"].mtime == T0


def _concat(first: bytes, second: bytes) -> bytes:
    """Two tar archives as one stream: the first without its end-of-archive blocks."""
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        end = max(m.offset_data + (m.size + 511) // 512 * 512 for m in tar.getmembers())
    return first[:end] + second


def test_time_clamp_is_the_latest_creation_time_in_whole_seconds() -> None:
    assert time_clamp(["2026-11-30T15:44:25.022946752Z", "1980-01-01T00:00:00Z",
                       "2026-11-30T16:44:25+01:00", "", "garbage"]) == 1796053465
    assert time_clamp([""]) is None


def test_filter_reads_long_names_from_pax_and_gnu_headers(tmp_path: Path) -> None:
    long_dir = "d" * 120
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        out = _filter(tmp_path, _tar([
            (long_dir, "d", 0o500, b""),
            (f"{long_dir}/{'f' * 150}", "f", 0o000, b"payload"),
            ("dev", "d", 0o755, b""),
            (f"dev/{'x' * 150}", "f", 0o644, b"dropped"),
        ], fmt), PLAN)
        assert out[long_dir].mode == 0o700
        assert out[f"{long_dir}/{'f' * 150}#data"] == b"payload"
        assert out[f"{long_dir}/{'f' * 150}"].mode == 0o400
        assert not [name for name in out if name.startswith("dev/")]


def test_filter_rewrites_a_pax_mtime_of_a_pinned_entry(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("etc")
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        info.pax_headers = {"mtime": "1700000000.123456"}
        tar.addfile(info)
    out = _filter(tmp_path, buf.getvalue(), PLAN)
    assert out["etc"].mtime == 42


def test_a_rewritten_pax_mtime_is_one_mksquashfs_reads(tmp_path: Path) -> None:
    """mksquashfs 4.6 refuses a pax mtime without a decimal point ("Failed to parse pax header"),
    so a pinned or clamped sub-second time failed the whole export."""
    import subprocess

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, mtime in (("etc", tarfile.DIRTYPE, "1700000000.123456"), ("new.txt", tarfile.REGTYPE,
                                  f"{T0 + 999}.5"), ("old.txt", tarfile.REGTYPE, f"{T0 - 9}.25")):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.pax_headers = kind, 0o755, {"mtime": mtime}
            tar.addfile(info)
    (tmp_path / "in.tar").write_bytes(buf.getvalue())
    with open(tmp_path / "in.tar", "rb") as fin, open(tmp_path / "out.tar", "wb") as fout:
        rewrite_tar(fin.fileno(), fout.fileno(), attrs.evolve(PLAN, clamp=T0))
    with open(tmp_path / "out.tar", "rb") as fin:
        done = subprocess.run(["mksquashfs", "-", str(tmp_path / "o.sqsh"), "-tar", "-noappend", "-quiet",
                               "-no-progress"], stdin=fin, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    listed = subprocess.run(["unsquashfs", "-lls", "-full-precision", str(tmp_path / "o.sqsh")], capture_output=True,
                            text=True, check=True).stdout
    times = {line.split()[-1][len("squashfs-root/"):]: " ".join(line.split()[3:5]) for line in listed.splitlines()[1:]}
    assert {name: times[name] for name in ("etc", "new.txt", "old.txt")} == {"etc": "1970-01-01 00:00:42", "new.txt": "2023-11-14 22:13:20", "old.txt": "2023-11-14 22:13:11"}


def test_filter_refuses_a_truncated_or_corrupt_stream(tmp_path: Path) -> None:
    data = _tar([("f", "f", 0o644, b"x" * 5000)])
    with pytest.raises(EfabuildError, match="ended early"):
        _filter(tmp_path, data[:2048], PLAN)
    broken = bytearray(data)
    broken[0] ^= 0xFF
    with pytest.raises(EfabuildError, match="corrupt header"):
        _filter(tmp_path, bytes(broken), PLAN)


def test_base256_numbers_for_huge_sizes() -> None:
    field = bytes([0x80]) + (20 * 2**30).to_bytes(11, "big")
    assert number(field) == 20 * 2**30
    assert number(b"00000000644\0") == 0o644


_NAMES = st.text(alphabet="abcxyz._-", min_size=1, max_size=8)


@settings(max_examples=40, deadline=None)
@given(st.lists(
    st.tuples(st.lists(_NAMES, min_size=1, max_size=7), st.sampled_from("fd"),
              st.integers(0, 0o7777), st.binary(max_size=700)),
    max_size=25,
))
@pytest.mark.slow
def test_filter_keeps_every_other_entry_with_fixed_modes(tmp_path_factory, entries) -> None:
    tmp_path = tmp_path_factory.mktemp("prop")
    seen: dict[str, tuple[str, int, bytes]] = {}
    ordered = []
    for parts, kind, mode, data in entries:
        path = "/".join(["top", *parts])
        prefix = path.rsplit("/", 1)[0]
        if any(p == prefix or prefix.startswith(p + "/") for p, v in seen.items() if v[0] == "f"):
            continue  # a file cannot hold children
        if path in seen or any(p.startswith(path + "/") for p in seen):
            continue
        for i in range(1, path.count("/") + 1):  # parents first, as docker export writes them
            parent = "/".join(path.split("/")[:i])
            if parent not in seen:
                seen[parent] = ("d", 0o755, b"")
                ordered.append((parent, "d", 0o755, b""))
        seen[path] = (kind, mode, data)
        ordered.append((path, kind, mode, data))
    out = _filter(tmp_path, _tar(ordered), PLAN)
    for path, (kind, mode, data) in seen.items():
        member = out[path]
        depth = path.count("/") + 1
        assert member.mode == fixed_mode(mode, is_dir=kind == "d", depth=depth)
        if kind == "f":
            assert out[path + "#data"] == data


def _order(tmp_path: Path, data: bytes, plan: RewritePlan) -> list[tuple[str, int, int, str, bytes]]:
    """(name, mode, mtime, link target, data) of every entry the filter writes, in stream order."""
    src, dst = tmp_path / "order-in.tar", tmp_path / "order-out.tar"
    src.write_bytes(data)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        rewrite_tar(fin.fileno(), fout.fileno(), plan)
    with tarfile.open(dst) as tar:
        return [(m.name.rstrip("/"), m.mode, m.mtime, m.linkname,
                 tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()]  # type: ignore[union-attr]


def test_a_builds_own_tar_gets_docker_creates_entries_where_docker_export_has_them(tmp_path):
    """A build's `type=tar` lacks the container's init layer; with `init_layer` the filter adds it,
    replacing the image's own /etc/hostname, in the walk order docker export uses (mksquashfs
    numbers inodes in stream order, so the .sqsh bytes depend on it)."""
    image = [("bin", "d", 0o755, b""), ("bin/sh", "f", 0o755, b"#!"), ("etc", "d", 0o755, b""),
             ("etc/group", "f", 0o644, b"root:x:0:\n"), ("etc/hostname", "f", 0o644, b"from-the-image\n"),
             ("etc/passwd", "f", 0o644, b"root:x:0:0::/:/bin/sh\n"), ("opt", "d", 0o755, b""),
             ("usr", "d", 0o755, b"")]
    # what docker export gives for the same image: its init layer's entries, in walk order
    exported = [(".dockerenv", "f", 0o755, b""), ("bin", "d", 0o755, b""), ("bin/sh", "f", 0o755, b"#!"),
                ("dev", "d", 0o755, b""), ("dev/console", "f", 0o755, b""), ("dev/pts", "d", 0o755, b""),
                ("dev/shm", "d", 0o755, b""), ("etc", "d", 0o755, b""), ("etc/group", "f", 0o644, b"root:x:0:\n"),
                ("etc/hostname", "f", 0o755, b""), ("etc/hosts", "f", 0o755, b""),
                ("etc/mtab", "l", 0o777, b"/proc/mounts"), ("etc/passwd", "f", 0o644, b"root:x:0:0::/:/bin/sh\n"),
                ("etc/resolv.conf", "f", 0o755, b""), ("opt", "d", 0o755, b""), ("proc", "d", 0o755, b""),
                ("sys", "d", 0o755, b""), ("usr", "d", 0o755, b"")]
    cfg = ImageConfig(env=("A=1",), working_dir="/opt")
    streamed = _order(tmp_path, _tar(image), RewritePlan.for_config(cfg, epoch=42, clamp=T0, init_layer=True))
    assert streamed == _order(tmp_path, _tar(exported), RewritePlan.for_config(cfg, epoch=42, clamp=T0))
    names = [entry[0] for entry in streamed]
    assert names.index("etc/hosts") < names.index("etc/passwd") < names.index("etc/resolv.conf") < names.index("opt")
    # without init_layer (docker export's own stream) nothing is added
    plain = _order(tmp_path, _tar(image), RewritePlan.for_config(cfg, epoch=42, clamp=T0))
    assert "etc/hosts" not in [entry[0] for entry in plain]


@pytest.mark.slow
@pytest.mark.parametrize("size", [3 * 2**20 + 5, 8 * 2**30 + 5], ids=["3MiB", "8GiB"])
def test_a_file_whose_size_only_a_pax_record_gives_is_passed_whole(size: int) -> None:
    """Slip: the filter ignores a pax `size`. Go's archive/tar (docker export) gives a file of 8 GiB
    or more its size in a pax record,
    the ustar field (11 octal digits) left 0: read by that field, its body would be taken for
    headers and every file after it lost from the image. The stream goes through pipes, generated
    as it is read: none of it is written to disk."""
    import os
    import threading

    from efabuild.export.tarheader import header_block, padded, pax_block

    head = pax_block({"size": str(size)}) + header_block("big.bin", typeflag=b"0", mode=0o644, size=0, mtime=T0)
    after = header_block("after.txt", typeflag=b"0", mode=0o644, size=5, mtime=T0) + b"after".ljust(512, b"\0")
    total_in = len(head) + padded(size) + len(after) + 1024
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()

    def produce() -> None:
        zeros = memoryview(bytes(4 << 20))
        with os.fdopen(in_w, "wb", buffering=0) as sink:
            sink.write(head)
            left = padded(size)
            while left:
                left -= sink.write(zeros[:min(left, len(zeros))])
            sink.write(after + bytes(1024))

    read: list[int] = []

    def run_filter() -> None:
        try:
            read.append(rewrite_tar(in_r, out_w, PLAN))
        finally:
            os.close(out_w)
            os.close(in_r)

    threads = [threading.Thread(target=produce, daemon=True), threading.Thread(target=run_filter, daemon=True)]
    for thread in threads:
        thread.start()
    first, last, block, total_out = b"", b"", b"", 0
    with os.fdopen(out_r, "rb", buffering=0) as source:
        while chunk := source.read(4 << 20):
            total_out += len(chunk)
            first = first or chunk[:4096]
            last, block = block, chunk  # only the end is kept: the files after the big one
    tail = last + block
    for thread in threads:
        thread.join(60)
    assert read == [total_in]
    assert f"size={size}\n".encode() in first and b"big.bin" in first
    assert total_out > size
    assert b"after.txt" in tail and b"after\0" in tail[tail.index(b"after.txt") + 512:][:512]
