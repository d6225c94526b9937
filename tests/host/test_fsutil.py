"""host/fsutil.py: the file operations every store tier is built on."""

from __future__ import annotations

import os
import stat

from efabuild.host import fsutil


def test_a_copy_into_a_shared_tier_is_never_open_to_the_group_while_it_is_written(tmp_path):
    """A publish copies a .sqsh into a shared tier's tmp/ when it cannot link it, under the group
    umask 002 a shared store asks for: a group member who opened the copy for writing before it is
    made 0444 would keep that descriptor (and change the stored artifact through a mapping later
    without moving its stamp)."""
    source = tmp_path / "artifact.sqsh"
    source.write_bytes(os.urandom(3 << 20))
    dest = tmp_path / "tmp" / "staged.sqsh"
    dest.parent.mkdir()
    modes = []

    def seen(count: int) -> None:  # called as each part is copied
        modes.append(stat.S_IMODE(os.stat(dest).st_mode))

    old = os.umask(0o002)
    try:
        fsutil.copy_file(source, dest, seen)
    finally:
        os.umask(old)
    assert modes and all(not mode & 0o022 for mode in modes)
    assert dest.read_bytes() == source.read_bytes()
