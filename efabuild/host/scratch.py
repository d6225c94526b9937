"""Scratch directories in the system's temp directory, named by their owner.

A build's iid and metadata files, a farm export's one-line Dockerfile, a fixture's context: each
lives in `$TMPDIR/efabuild-HOST.PID.START-RANDOM-WHAT...`, removed when its step ends. A process
killed meanwhile leaves it behind; the next make and `gc` remove those whose owner is gone from
this host (see efabuild.host.owner), never a running process's.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from efabuild.errors import InputError
from efabuild.display import shown
from efabuild.host.owner import owned_name, owner_of

PREFIX = "efabuild"


def scratch_dir(what: str) -> tempfile.TemporaryDirectory:
    """A TemporaryDirectory whose name says which process made it."""
    return tempfile.TemporaryDirectory(prefix=owned_name(PREFIX, what) + "-")


def check_temp_dir() -> None:
    """$TMPDIR, when set, must be a directory this user may write: docker buildx and mksquashfs
    write there and would each fail on their own, one failure per build (Python's tempfile
    silently falls back to /tmp instead)."""
    path = os.environ.get("TMPDIR")
    if not path:
        return
    try:
        is_dir = stat.S_ISDIR(os.stat(path).st_mode)
    except OSError as exc:
        raise InputError(f"{shown(path)}: {exc.strerror.lower()}", "TMPDIR") from None
    if not is_dir:
        raise InputError(f"{shown(path)}: not a directory", "TMPDIR")
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"{shown(path)}: permission denied (not writable)", "TMPDIR")


def dead_scratch_dirs(root: Path | None = None) -> list[Path]:
    """Scratch directories of processes gone from this host, in `root` (the system temp dir)."""
    root = Path(root or tempfile.gettempdir())
    found = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    # a shared /tmp holds thousands of names: only ours are sorted and parsed
    for name in sorted(name for name in names if name.startswith(PREFIX)):
        owner = owner_of(name, PREFIX)
        if owner is None or not owner.gone():
            continue
        try:
            info = os.stat(root / name, follow_symlinks=False)
        except OSError:
            continue
        # ours only if this user made it: /tmp is shared, and a planted link is not followed
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
            found.append(root / name)
    return found


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)  # a link inside is removed, never followed
