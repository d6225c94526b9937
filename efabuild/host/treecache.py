"""The BLAKE3 trees (the 1 MiB units' chaining values) of store files this user hashed whole, by
stat stamp: the next fetch onto a fetched file (the previous version on a node, whose units the
new one copies at the same offsets) takes their values from here instead of hashing 99 % of the
file again, and make's next check of an ancestor's copy reads none of it.

A tree is remembered by the fetch that wrote the file and hashed it, once the file is under its
name, and by make's check of an ancestor (store/transfer.py), for a file only this user can
write (host/statstamp.py); it is believed for the same device, inode and stamp, and the check
uses it only once its values make the record's digest. It is remembered at once, where the verification cache waits until a
stamp has settled: the racy case, a second write within the clock's step of the stamp, needs a
writer that opens the store file to change it in place within that step of its rename. efabuild
never writes a stored file in place, and a writer of this user's that did so on purpose could as
well rewrite this user's caches. A fetch still lends a seed's units only if its stamp had settled
before the copy and is the same after it (store/chunked/assembly.py); values that are wrong for
the seed only make the fetch's digest differ from its record, and the file is then hashed whole.

Entries are binary: a JSON header line, then the units' values. The newest KEEP are kept; each
is read only from a directory this user owns (host/usercache.py), owned by them, and no larger
than the tree of a file of the seed's size.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from efabuild.host import statstamp
from efabuild.host.fsutil import replace_owned
from efabuild.host.usercache import make_dir, open_trusted, own_dir, pinned

FORMAT = b"efabuild.tree/v1"
UNIT = 1 << 20  # host/blake3tree.py's unit
CV = 32
KEEP = 32  # entries kept: one per fetched file, whose inode the node may still hold
_HEADER_BYTES = 512
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _directory(environ: dict[str, str] | None = None) -> Path:
    return own_dir(environ) / "trees"


def _name(dev: int, ino: int) -> str:
    return f"{dev:x}-{ino:x}.tree"


def remember(path: Path, checked: tuple[int, int], digest: str, cvs: bytes,
             environ: dict[str, str] | None = None) -> bool:
    """Keep the tree (`digest`, the whole units' values `cvs`) of the file a fetch checked as the
    inode `checked` (device, inode) and has put at `path`; False when it is not kept (another
    file there now, one someone else can write, values of another size, no trusted directory)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if (not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != tuple(checked)
            or statstamp.others_may_write(info) or len(cvs) != (info.st_size // UNIT) * CV):
        return False
    header = json.dumps({"stamp": list(statstamp.stamp(info)), "digest": digest}).encode()
    directory = _directory(environ)
    if not (make_dir(directory.parent, environ) and make_dir(directory, environ)):
        return False
    dir_fd = _opened(directory)
    if dir_fd is None:
        return False
    try:
        replace_owned(pinned(dir_fd) / _name(info.st_dev, info.st_ino), FORMAT + b"\n" + header + b"\n" + cvs,
                      0o600, temp_prefix=".tree")
    except OSError:
        return False
    else:
        _prune(dir_fd)
    finally:
        os.close(dir_fd)
    return True


def recall(fd: int, environ: dict[str, str] | None = None) -> tuple[str, bytes] | None:
    """(digest, the whole units' values) remembered for the open file `fd` as it is now, or None."""
    info = os.fstat(fd)
    if statstamp.others_may_write(info):
        return None
    dir_fd = _opened(_directory(environ))
    if dir_fd is None:
        return None
    expected = (info.st_size // UNIT) * CV
    try:
        data = _read(dir_fd, _name(info.st_dev, info.st_ino), len(FORMAT) + _HEADER_BYTES + expected)
    finally:
        os.close(dir_fd)
    if data is None:
        return None
    try:
        magic, header, cvs = data.split(b"\n", 2)
        # a header is short: a long one (nested lists) is not parsed, nor is a deep one unwound
        fields = json.loads(header) if len(header) <= _HEADER_BYTES else None
    except (ValueError, RecursionError):
        return None
    if (magic != FORMAT or not isinstance(fields, dict) or fields.get("stamp") != list(statstamp.stamp(info))
            or not isinstance(fields.get("digest"), str) or len(cvs) != expected):
        return None
    return fields["digest"], cvs


def _opened(directory: Path) -> int | None:
    """A descriptor of `directory` (trees/) once it and its parent are found trusted as opened,
    neither through a link: whatever is renamed or linked over a name of theirs after the check
    (a job user's, whose directory root's `$EFABUILD_VERIFY_CACHE` may name) is not written."""
    parent = open_trusted(directory.parent, os.geteuid())
    if parent is None:
        return None
    try:
        fd = os.open(directory.name, _DIR_FLAGS, dir_fd=parent)
    except OSError:
        return None
    finally:
        os.close(parent)
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
        return fd
    os.close(fd)
    return None


def _read(dir_fd: int, name: str, most: int) -> bytes | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_size > most:
            return None
        chunks, left = [], st.st_size
        while left > 0:
            got = os.read(fd, left)
            if not got:
                break
            chunks.append(got)
            left -= len(got)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _prune(dir_fd: int) -> None:
    """The oldest entries past KEEP removed: their files were most likely replaced since."""
    try:
        with os.scandir(pinned(dir_fd)) as found:
            entries = [(e.stat(follow_symlinks=False).st_mtime_ns, e.name) for e in found
                       if e.name.endswith(".tree") and e.is_file(follow_symlinks=False)]
    except OSError:
        return
    for _, name in sorted(entries, reverse=True)[KEEP:]:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass
