"""Image → .sqsh export: real exports through the engine, checked with the real unsquashfs
(the tar filter on its own: test_tarfilter.py)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import uuid
from pathlib import Path

import blake3
import pytest

from efabuild.engine.containers import EXPORT_LABEL
from efabuild.errors import EfabuildError, InputError, NotFound
from efabuild.export.squash import ExportResult, export_image, mksquashfs_options
from efabuild.settings import ExportSettings
from tests.kits.tarkit import add_entry

T0 = 1_700_000_000


def _unsquash_list(sqsh: Path) -> dict[str, list[str]]:
    """path → the `unsquashfs -lln` columns (mode, owner, size, date, time[, -> target])."""
    text = subprocess.run(["unsquashfs", "-lln", str(sqsh)], capture_output=True, text=True, check=True).stdout
    entries = {}
    for line in text.splitlines():
        cols = line.split()
        if len(cols) >= 6 and cols[5].startswith("squashfs-root"):
            entries[cols[5][len("squashfs-root"):] or "/"] = cols
    return entries


def _cat(sqsh: Path, path: str) -> str:
    return subprocess.run(
        ["unsquashfs", "-cat", str(sqsh), path], capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def small_image(docker_engine):
    """A small image made with `docker import`: odd permissions, a foreign owner, an old
    /etc/environment, a symlink and a hard link, and a config with every field Enroot reads."""
    from python_on_whales import docker

    tag = f"efabuild-test/sqsh:{uuid.uuid4().hex[:12]}"
    busybox = Path("/bin/busybox").read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name, kind="f", mode=0o644, data=b"", uid=0, link=""):  # owned by uid:uid
            add_entry(tar, name, kind, mode, data, uid=uid, gid=uid, link=link)
        add("bin", "d", 0o755)
        add("bin/busybox", mode=0o755, data=busybox)
        add("bin/sh", "l", link="busybox")
        add("etc", "d", 0o755)
        add("etc/environment", mode=0o644, data=b"STALE=1\n")
        add("etc/shadow", mode=0o000, data=b"root:*:19000::::::\n")
        add("etc/sudoers.d", "d", 0o550)
        add("home", "d", 0o755)
        add("home/user", "d", 0o700, uid=1000)
        add("home/user/notes.txt", mode=0o600, data=b"mine\n" * 1000, uid=1000)
        add("home/user/notes-link.txt", "h", mode=0o600, link="home/user/notes.txt", uid=1000)
    with_config = [
        "ENV PATH=/usr/bin:/bin", 'ENV GREETING="hello world"', "LABEL com.nvidia.nccl.version=2.30.7",
        "LABEL org.example.b=two", "WORKDIR /workspace/app", "VOLUME /data",
        'ENTRYPOINT ["/bin/sh", "-c"]', 'CMD ["echo it\'s"]',
    ]
    subprocess.run(
        ["docker", "import", *[a for c in with_config for a in ("-c", c)], "-", tag],
        input=buf.getvalue(), check=True, capture_output=True,
    )
    yield tag
    docker.image.remove(tag, force=True)


def _no_export_container(out: Path) -> bool:
    """No container of an export to `out` is left (other exports may run meanwhile)."""
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={EXPORT_LABEL}={out}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    return ids == []


@pytest.mark.engine
def test_export_matches_enroot_import(small_image: str, tmp_path: Path) -> None:
    seen = []
    result = export_image(
        small_image, tmp_path / "img.sqsh", options=ExportSettings(),
        progress=lambda done, total: seen.append(done),
    )
    sqsh = tmp_path / "img.sqsh"
    assert result.path == sqsh and result.size == sqsh.stat().st_size > 0
    assert result.digest == "blake3:" + blake3.blake3(sqsh.read_bytes()).hexdigest()
    assert seen and seen[-1] >= sqsh.stat().st_size // 2
    assert sorted(os.listdir(tmp_path)) == ["img.sqsh"]  # no temp file left
    assert _no_export_container(sqsh)

    entries = _unsquash_list(sqsh)
    assert {cols[1] for cols in entries.values()} == {"0/0"}  # all owned by root
    assert "/.dockerenv" not in entries
    assert entries["/dev"][0].startswith("d") and not [p for p in entries if p.startswith("/dev/")]
    assert entries["/etc/shadow"][0] == "-r--------"
    assert entries["/etc/sudoers.d"][0] == "drwxr-x---"
    assert entries["/home/user/notes.txt"][0] == "-rw-------"
    assert entries["/workspace/app"][0] == "drwxr-xr-x"
    assert entries["/"][0] == "drwxr-xr-x"
    assert entries["/bin/sh"][-1] == "busybox"  # symlink kept
    assert entries["/home/user/notes.txt"][3:5] == ["2023-11-14", "22:13"]  # mtimes kept

    assert _cat(sqsh, "etc/environment") == "PATH=/usr/bin:/bin\nGREETING=hello world\n"
    assert _cat(sqsh, "etc/fstab") == "${ENROOT_ROOTFS}/data /data none x-create=dir,bind,rw,nosuid,nodev\n"
    rc = _cat(sqsh, "etc/rc")
    assert rc.startswith("# com.nvidia.nccl.version 2.30.7\n# org.example.b two\n\n")
    assert 'cd "/workspace/app" && unset OLDPWD || exit 1\n' in rc
    assert "    exec '/bin/sh' '-c' \"$@\"\nelse\n    exec '/bin/sh' '-c' 'echo it'\\''s'\nfi\n" in rc
    assert _cat(sqsh, "etc/rc.local").startswith("# This file is sourced by /etc/rc")
    assert _cat(sqsh, "home/user/notes-link.txt") == "mine\n" * 1000


@pytest.mark.engine
def test_export_is_deterministic_and_records_its_options(small_image: str, tmp_path: Path) -> None:
    one = export_image(small_image, tmp_path / "one.sqsh", options=ExportSettings())
    two = export_image(small_image, tmp_path / "two.sqsh", options=ExportSettings())
    assert (tmp_path / "one.sqsh").read_bytes() == (tmp_path / "two.sqsh").read_bytes()
    assert one.digest == two.digest
    assert one.options == mksquashfs_options(ExportSettings())
    assert one.options[-3:] == ("-comp", "lzo", "-noD")
    assert {"-tar", "-all-root"} <= set(one.options)
    info = subprocess.run(["unsquashfs", "-s", str(tmp_path / "one.sqsh")], capture_output=True, text=True).stdout
    assert "Compression lzo" in info and "Data is uncompressed" in info


@pytest.mark.engine
def test_export_with_other_compression(small_image: str, tmp_path: Path) -> None:
    settings_ = ExportSettings(compression="zstd", compress_data=True)
    result = export_image(small_image, tmp_path / "z.sqsh", options=settings_)
    info = subprocess.run(["unsquashfs", "-s", str(result.path)], capture_output=True, text=True).stdout
    assert "Compression zstd" in info and "Data is compressed" in info
    assert "-noD" not in result.options


@pytest.mark.engine
def test_export_of_unknown_image_leaves_nothing(docker_engine, tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="no such image"):
        export_image("efabuild-test/does-not-exist:1", tmp_path / "x.sqsh", options=ExportSettings())
    assert os.listdir(tmp_path) == []


@pytest.mark.engine
def test_failing_mksquashfs_leaves_nothing_and_says_why(small_image: str, tmp_path: Path) -> None:
    with pytest.raises(EfabuildError, match=r"mksquashfs failed: .*nope"):
        export_image(small_image, tmp_path / "x.sqsh", options=ExportSettings(compression="nope"))
    assert os.listdir(tmp_path) == []
    assert _no_export_container(tmp_path / "x.sqsh")


@pytest.mark.engine
def test_interrupted_export_leaves_nothing(small_image: str, tmp_path: Path) -> None:
    def interrupt(done: int, total: int | None) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export_image(small_image, tmp_path / "x.sqsh", options=ExportSettings(), progress=interrupt)
    assert os.listdir(tmp_path) == []
    assert _no_export_container(tmp_path / "x.sqsh")


@pytest.mark.engine
def test_export_replaces_an_older_file_atomically(small_image: str, tmp_path: Path) -> None:
    target = tmp_path / "img.sqsh"
    target.write_bytes(b"old")
    result = export_image(small_image, target, options=ExportSettings())
    assert isinstance(result, ExportResult) and target.read_bytes()[:4] == b"hsqs"


@pytest.mark.engine
def test_export_onto_a_directory_fails_cleanly(small_image: str, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(EfabuildError, match="cannot write"):
        export_image(small_image, tmp_path / "taken", options=ExportSettings())
    assert os.listdir(tmp_path) == ["taken"]
    assert _no_export_container(tmp_path / "taken")


# --- hostile [export] settings: mksquashfs runs on the host, as the user running make ---

PSEUDO_FILE_ATTACKS = [
    ["-p", "/pwn f 644 0 0 sh -c 'touch {marker}'"],
    ["-pf", "{marker}.defs"],
    ["-Xalgorithm", "lzo1x_1", "-pd", "/x"],
    ["-sort", "/etc/passwd"],
    ["-ef", "/etc/shadow"],
    ["-e", "etc"],
    ["-root-becomes", "pwn"],
    ["-b", "-p", "/pwn f 644 0 0 sh -c 'touch {marker}'"],  # a value that is an option
    ["-comp", "xz"],
]


@pytest.mark.engine
@pytest.mark.parametrize("extra", PSEUDO_FILE_ATTACKS)
def test_export_never_passes_pseudo_file_or_path_options_to_mksquashfs(small_image, tmp_path, extra) -> None:
    """`-p "/pwn f 644 0 0 CMD"` made mksquashfs run CMD on the host during the export."""
    marker = tmp_path / "pwned"
    (tmp_path / "pwned.defs").write_text(f"/pwn f 644 0 0 sh -c 'touch {marker}'\n")
    options = ExportSettings(extra_options=tuple(word.format(marker=marker) for word in extra))
    with pytest.raises(InputError, match="extra_options"):
        export_image(small_image, tmp_path / "x.sqsh", options=options)
    assert not marker.exists()
    assert not (tmp_path / "x.sqsh").exists() and _no_export_container(tmp_path / "x.sqsh")


def test_filesystem_shaping_options_are_allowed() -> None:
    from efabuild.grammar import extra_options_problem

    for extra in (["-Xalgorithm", "lzo1x_1"], ["-b", "1M", "-noI", "-noF", "-noX"], ["-processors", "2", "-mem", "512M"],
                  ["-Xcompression-level", "19"], ["-no-fragments"], ["-Xbcj", "x86", "-Xdict-size", "100%"], []):
        assert extra_options_problem(extra) is None, extra
    for extra, problem in ((["-b"], "needs a value"), (["-b", "3000"], "not a valid value"),
                           (["-processors", "/x"], "not a valid value"), (["-Xhc", "-p"], "is not allowed")):
        assert problem in extra_options_problem(extra)


def test_an_export_for_a_chunked_tier_cuts_its_chunks_in_the_digest_pass(tmp_path: Path) -> None:
    """A tar from a command (as a farm's build streams it; `cat` here, no engine): with `chunking`,
    the result carries the chunk index of the very file it wrote, digest and sha256 unchanged."""
    import random

    from efabuild.export.enroot import ImageConfig
    from efabuild.export.squash import export_tar_stream
    from efabuild.chunks.cdc import chunk_file
    from efabuild.host.digest import file_digest, sha256_file

    rng = random.Random(4)
    source = tmp_path / "rootfs.tar"
    with tarfile.open(source, "w", format=tarfile.PAX_FORMAT) as tar:
        folder = tarfile.TarInfo("opt")  # else mksquashfs dates the directory it makes now
        folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, T0
        tar.addfile(folder)
        for number in range(6):
            data = rng.randbytes(200_000)
            info = tarfile.TarInfo(f"opt/part{number}.bin")
            info.size, info.mtime = len(data), T0
            tar.addfile(info, io.BytesIO(data))
    chunking = (16 * 1024, 64 * 1024, 256 * 1024)
    common = {"what": "test", "config": ImageConfig(), "created": [], "options": ExportSettings()}
    chunked = export_tar_stream(["cat", str(source)], tmp_path / "chunked.sqsh", chunking=chunking, **common)
    plain = export_tar_stream(["cat", str(source)], tmp_path / "plain.sqsh", **common)
    assert plain.index is None
    assert chunked.index == chunk_file(chunked.path, chunking=chunking) and len(chunked.index.chunks) > 4
    assert chunked.digest == chunked.index.digest == plain.digest == file_digest(chunked.path)
    assert chunked.sha256 == plain.sha256 == sha256_file(chunked.path)


@pytest.mark.parametrize("killed", ["the tar source", "mksquashfs"])
def test_a_side_killed_by_a_signal_after_a_complete_stream_keeps_no_sqsh(tmp_path, monkeypatch, killed):
    """Slip: only a positive exit status fails the export. Killed (OOM killer, an operator) after
    its last byte, a side exits by a signal, not with a status: nothing says its work was complete (mksquashfs may not have written its tables), so
    the export fails and nothing is kept under the artifact's name."""
    import shutil

    from efabuild.errors import EfabuildError
    from efabuild.export.enroot import ImageConfig
    from efabuild.export.squash import export_tar_stream

    source = tmp_path / "rootfs.tar"
    with tarfile.open(source, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("opt/tool")
        info.size, info.mtime = 5, T0
        tar.addfile(info, io.BytesIO(b"tool\n"))
    command = ["cat", str(source)]
    if killed == "the tar source":
        command = ["sh", "-c", 'cat "$1" && kill -9 $$', "sh", str(source)]
    else:  # mksquashfs writes the whole file, then dies
        wrapper = tmp_path / "bin" / "mksquashfs"
        wrapper.parent.mkdir()
        wrapper.write_text(f'#!/bin/sh\n{shutil.which("mksquashfs")} "$@" && kill -9 $$\n')
        wrapper.chmod(0o755)
        monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")
    out = tmp_path / "out" / "artifact.sqsh"
    with pytest.raises(EfabuildError, match="^export test: interrupted$"):
        export_tar_stream(command, out, what="test", config=ImageConfig(), created=[], options=ExportSettings())
    assert list(out.parent.iterdir()) == []


def test_mksquashfs_caches_are_bounded_and_an_export_option_can_raise_them(tmp_path, monkeypatch):
    """Its default takes a quarter of the node's memory for caches (4.1-4.8 GB at a 5.5 GB image):
    the export bounds it, before the export's own options, so `[export] extra_options = ["-mem",
    "4G"]` still wins (mksquashfs takes the last)."""
    import io

    from efabuild.export import squash
    from efabuild.settings import ExportSettings

    started = []
    from efabuild.export import mksquashfs

    monkeypatch.setattr(mksquashfs.children, "popen", lambda argv, **kwargs: started.append(argv))
    opts = squash.mksquashfs_options(ExportSettings(extra_options=("-mem", "4G")))
    squash.start_mksquashfs(tmp_path / "o.sqsh", opts, io.BytesIO())
    [argv] = started
    bound = argv.index("-mem")
    assert argv[bound + 1].endswith("M") and 256 <= int(argv[bound + 1][:-1]) <= 1024
    assert argv[argv.index("-mem", bound + 1) + 1] == "4G"  # the export's own, after the bound
    assert "-mem" not in squash.mksquashfs_options(ExportSettings())  # not recorded: no byte depends on it
