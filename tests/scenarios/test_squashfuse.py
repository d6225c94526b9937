"""Every exported .sqsh read through squashfuse, as a job start reads it with Pyxis's
use_squashfuse=1 (no unpack), against unsquashfs: the same paths, kinds, modes, owners, times,
sizes, contents, link targets, hard links and xattrs.

Each mount is undone in a `finally` (fusermount3 -u, else a lazy umount), every command has a
timeout, and the test fails if a mount is left behind. Without /dev/fuse or squashfuse the tests
skip and say which is missing (scripts/setup-host.sh installs squashfuse and fuse3).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest

from efabuild.export.enroot import ImageConfig
from efabuild.export.squash import export_tar_stream
from efabuild.settings import ExportSettings
from tests.kits.tarkit import add_entry
from tests.make.test_make import demo_ws, efabuild, mini_ngc  # noqa: F401  (the demo workspace's fixtures)

TIMEOUT_S = 120


def _fuse_missing() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is absent (no fuse module, or a container without the device)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    for tool in ("squashfuse", "squashfuse_ll", "fusermount3", "unsquashfs"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup-host.sh installs squashfuse and fuse3)"
    return None


pytestmark = pytest.mark.skipif(_fuse_missing() is not None, reason=str(_fuse_missing()))


def _mounts() -> str:
    with open("/proc/self/mounts") as handle:
        return handle.read()


@contextlib.contextmanager
def squashfuse_mounted(sqsh: Path, where: Path, program: str = "squashfuse") -> Iterator[Path]:
    """`sqsh` mounted read-only with squashfuse at a new directory below `where`; always unmounted."""
    point = where / f"mnt-{sqsh.stem[:16]}"
    point.mkdir(parents=True)
    try:
        done = subprocess.run([program, str(sqsh), str(point)], capture_output=True, text=True,
                              timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{program} {sqsh}: {done.stderr}"
        assert f" {point} fuse.{program} " in _mounts()
        yield point
    finally:
        if f" {point} " in _mounts():
            unmounted = subprocess.run(["fusermount3", "-u", str(point)], capture_output=True, timeout=TIMEOUT_S)
            if unmounted.returncode != 0:  # busy: detach it now, the kernel frees it when idle
                subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=TIMEOUT_S)
        assert f" {point} " not in _mounts(), f"{point} is still mounted"
        point.rmdir()


def tree(root: Path) -> dict[str, tuple]:
    """path -> (mode, uid, gid, mtime, size or rdev, blake3 or link target, xattrs, link count) of
    every entry below `root`, links not followed."""
    out: dict[str, tuple] = {}
    for path in _paths(root):
        rel = "/" + os.path.relpath(path, root) if path != str(root) else "/"
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            with open(path, "rb") as handle:
                body = blake3.blake3(handle.read()).hexdigest()
            detail = st.st_size
        elif stat.S_ISLNK(st.st_mode):
            body, detail = os.readlink(path), st.st_size
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            body, detail = None, st.st_rdev
        else:
            body, detail = None, None
        xattrs = tuple(sorted((key, os.getxattr(path, key, follow_symlinks=False))
                              for key in os.listxattr(path, follow_symlinks=False)))
        nlink = st.st_nlink if not stat.S_ISDIR(st.st_mode) else None  # squashfuse counts a directory's as 2
        out[rel] = (stat.filemode(st.st_mode), st.st_uid, st.st_gid, int(st.st_mtime), detail, body, xattrs, nlink)
    return out


def _paths(root: Path) -> list[str]:
    paths = [str(root)]
    for directory, dirs, files in os.walk(root):
        paths += [os.path.join(directory, name) for name in (*dirs, *files)]
    return paths


def hard_links(root: Path) -> tuple[tuple[str, ...], ...]:
    """The groups of paths below `root` that are one inode."""
    inodes: dict[tuple[int, int], list[str]] = {}
    for path in _paths(root):
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
            inodes.setdefault((st.st_dev, st.st_ino), []).append("/" + os.path.relpath(path, root))
    return tuple(sorted(tuple(sorted(group)) for group in inodes.values()))


def listing(sqsh: Path) -> dict[str, tuple[str, str, str | None]]:
    """path -> (mode string, uid/gid, link target) as `unsquashfs -lln` prints them."""
    text = subprocess.run(["unsquashfs", "-lln", "-d", "", str(sqsh)], capture_output=True, text=True,
                          check=True, timeout=TIMEOUT_S).stdout
    out = {}
    for line in text.splitlines():
        cols = line.split(None, 5)
        if len(cols) == 6 and cols[0][0] in "-dlcbps" and len(cols[0]) == 10:
            path, _, target = cols[5].partition(" -> ")
            out[path or "/"] = (cols[0], cols[1], target if cols[0][0] == "l" else None)
    return out


def compare_with_unsquashfs(sqsh: Path, scratch: Path) -> dict[str, tuple]:
    """The squashfuse view of `sqsh`, checked against an unsquashfs extract and its -lln listing."""
    extracted = scratch / f"x-{sqsh.stem[:16]}"
    done = subprocess.run(["unsquashfs", "-no-progress", "-d", str(extracted), str(sqsh)], capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    try:
        # as Enroot mounts it (high-level squashfuse): the numbers it gives hard links differ, their counts do not
        with squashfuse_mounted(sqsh, scratch) as point:
            mounted = tree(point)
        with squashfuse_mounted(sqsh, scratch, "squashfuse_ll") as point:  # inode numbers as stored
            links = hard_links(point)
        unpacked = tree(extracted)
        assert links == hard_links(extracted)
    finally:
        shutil.rmtree(extracted)
    # the extract's root is the directory unsquashfs made, the mount's the archive's root inode
    assert {k: v for k, v in mounted.items() if k != "/"} == {k: v for k, v in unpacked.items() if k != "/"}
    mounted["<links>"] = links
    listed = listing(sqsh)
    assert set(listed) | {"/"} == set(mounted) - {"<links>"}  # -d "" lists the root as no name
    for path, (mode, owner, target) in listed.items():
        seen = mounted[path]
        assert (seen[0], f"{seen[1]}/{seen[2]}") == (mode, owner), path
        if target is not None:
            assert seen[5] == target, path
    return mounted


def _rich_tar(path: Path) -> None:
    """A root filesystem with what a squashfs reader can get wrong: odd and special modes, foreign
    owners, a hard link, symlinks (one dangling), xattrs, an empty file, a file of several blocks
    with a fragment tail, a deep directory and names that need care."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        add = functools.partial(add_entry, tar)
        add("bin", "d", 0o755)
        add("bin/tool", mode=0o4755, data=b"#!/bin/sh\necho tool\n")
        add("bin/sh", "l", link="tool")
        add("etc", "d", 0o755)
        add("etc/shadow", mode=0o640, data=b"root:*:19000::::::\n", gid=42)
        add("etc/dangling", "l", link="/nowhere/at/all")
        add("home", "d", 0o755)
        add("home/user", "d", 0o700, uid=1000, gid=1000)
        add("home/user/notes.txt", mode=0o600, data=b"mine\n" * 1000, uid=1000, gid=1000,
            xattrs={"user.origin": "efabuild test"})
        add("home/user/same.txt", "h", link="home/user/notes.txt", uid=1000, gid=1000)
        add("home/user/empty", mode=0o444, data=b"", uid=1000, gid=1000)
        add("opt", "d", 0o1777)
        add("opt/big.bin", mode=0o644, data=os.urandom(3 * 131072 + 4321))
        add("opt/a b, c (d)", mode=0o644, data=b"spaces and commas\n")
        add("opt/" + "/".join(f"d{i}" for i in range(20)), "d", 0o750)
        add("opt/" + "/".join(f"d{i}" for i in range(20)) + "/leaf", mode=0o644, data=b"deep\n")


def test_an_exported_sqsh_reads_the_same_through_squashfuse_as_through_unsquashfs(tmp_path):
    """The export's own pipeline (tar filter + mksquashfs) on a tar, without the engine."""
    source = tmp_path / "rootfs.tar"
    _rich_tar(source)
    config = ImageConfig.from_docker({"Env": ["PATH=/usr/bin:/bin"], "WorkingDir": "/home/user",
                                      "Labels": {"org.example.a": "one"}})
    result = export_tar_stream(["cat", str(source)], tmp_path / "rich.sqsh", what="rich", config=config,
                               created=["2023-11-14T22:13:20Z"], options=ExportSettings(), sha256=False)
    seen = compare_with_unsquashfs(result.path, tmp_path)
    # what the comparison covered, as a person would check it on the mount
    assert seen["/bin/tool"][0] == "-rwsr-xr-x" and seen["/bin/sh"][5] == "tool"
    assert seen["<links>"] == (("/home/user/notes.txt", "/home/user/same.txt"),)
    assert seen["/home/user/notes.txt"][7] == 2 and seen["/home/user/empty"][4] == 0
    assert seen["/opt/big.bin"][4] == 3 * 131072 + 4321 and seen["/etc/dangling"][5] == "/nowhere/at/all"
    assert "/etc/rc" in seen and "/etc/environment" in seen  # Enroot's files, as the export writes them
    # the export is Enroot's: every owner root (-all-root), no xattrs (-no-xattrs)
    assert {v[1:3] for k, v in seen.items() if k != "<links>"} == {(0, 0)}
    assert {v[6] for k, v in seen.items() if k != "<links>"} == {()}


def test_owners_and_xattrs_read_the_same_through_squashfuse(tmp_path):
    """What the export drops (owners other than root, xattrs), kept by a plain mksquashfs of the same
    tar: the comparison sees them too."""
    source = tmp_path / "rootfs.tar"
    _rich_tar(source)
    sqsh = tmp_path / "kept.sqsh"
    done = subprocess.run(["mksquashfs", "-", str(sqsh), "-tar", "-noappend", "-quiet", "-no-progress"],
                          stdin=source.open("rb"), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    seen = compare_with_unsquashfs(sqsh, tmp_path)
    assert seen["/home/user/notes.txt"][1:3] == (1000, 1000) and seen["/etc/shadow"][1:3] == (0, 42)
    assert seen["/home/user/notes.txt"][6] == (("user.origin", b"efabuild test"),)


@pytest.mark.engine
def test_every_artifact_of_the_demo_graph_reads_the_same_through_squashfuse(demo_ws, tmp_path):
    made = efabuild(demo_ws, "make", "demo")
    assert made.returncode == 0, made.stderr
    artifacts = sorted((demo_ws / "cache").rglob("*.sqsh"))
    user, efa = (Path(efabuild(demo_ws, "lookup", name, check=True).stdout.strip()) for name in ("demo:user", "demo:efa"))
    assert {user, efa} <= set(artifacts)
    views = {sqsh: compare_with_unsquashfs(sqsh, tmp_path) for sqsh in artifacts}
    assert all("/opt/amazon/efa_installed_packages" in view and "/.dockerenv" not in view for view in views.values())
    assert "/workspace/app/train.py" in views[user] and "/workspace/app/train.py" not in views[efa]
