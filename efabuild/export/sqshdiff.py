"""What differs between two .sqsh files, file by file: content, mode, owner, time, added, removed.

Each image is read once as a stream (`sqfs2tar` from squashfs-tools-ng turns it into a tar on a
pipe), file contents are hashed on the way, nothing is unpacked to disk. The comparison itself
is pure.
"""

from __future__ import annotations

import datetime
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path

import attrs
import blake3

from efabuild.display import shown
from efabuild.errors import EfabuildError
from efabuild.host import children
from efabuild.provenance.fsview import MAX_ENTRIES

_CHUNK = 1 << 20
# the order differences are shown in, for one path
KINDS = ("added", "removed", "type", "content", "mode", "owner", "time")


@attrs.frozen
class FileFacts:
    kind: str  # "file", "dir", "symlink", "hardlink", "other"
    mode: int
    owner: str  # "uid/gid"
    mtime: int
    size: int = 0
    digest: str = ""  # blake3 of a file's content; a link's target


@attrs.frozen
class Difference:
    path: str
    kind: str  # one of KINDS
    before: str = ""  # the stored artifact's value, shown
    after: str = ""  # the rebuilt one's

    def render(self) -> str:
        """One line; names from the images (a path, a link's target) with escapes and bytes that
        are not UTF-8 shown, not sent to the terminal."""
        change = f"  {shown(self.before)} → {shown(self.after)}" if self.before or self.after else ""
        return f"{self.kind:8} {shown(self.path)}{change}"


def _kind(member: tarfile.TarInfo) -> str:
    if member.isreg():
        return "file"
    if member.isdir():
        return "dir"
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    return "other"


def read_sqsh(sqsh: Path) -> dict[str, FileFacts]:
    """path ("/" for the root) → its facts, streamed through `sqfs2tar`."""
    with tempfile.TemporaryFile() as errors:
        try:
            proc = children.popen(["sqfs2tar", "--no-xattr", "--root-becomes", ".", str(sqsh)],
                                    stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise EfabuildError("sqfs2tar not found: install squashfs-tools-ng (scripts/setup-host.sh)") from None
        assert proc.stdout is not None
        facts: dict[str, FileFacts] = {}
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                for member in tar:
                    if len(facts) >= MAX_ENTRIES:  # a SquashFS bomb: a few bytes a hard link
                        raise EfabuildError(f"{sqsh}: holds more than {MAX_ENTRIES} entries: not compared")
                    path = "/" + member.name.removeprefix(".").strip("/")
                    kind = _kind(member)
                    digest = member.linkname if kind in ("symlink", "hardlink") else ""
                    if kind == "file":
                        hasher = blake3.blake3()
                        body = tar.extractfile(member)
                        assert body is not None
                        while chunk := body.read(_CHUNK):
                            hasher.update(chunk)
                        digest = hasher.hexdigest()
                    facts[path] = FileFacts(kind, member.mode & 0o7777, f"{member.uid}/{member.gid}",
                                            int(member.mtime), member.size, digest)
        except tarfile.TarError as exc:
            proc.kill()
            raise EfabuildError(f"{sqsh}: cannot read: {exc}") from None
        except EfabuildError:
            proc.kill()
            raise
        finally:
            proc.stdout.close()
            returncode = proc.wait()
        if returncode != 0:
            errors.seek(0)
            lines = [ln for ln in errors.read().decode(errors="replace").splitlines() if ln.strip()]
            raise EfabuildError(f"{sqsh}: cannot read: {lines[-1] if lines else f'sqfs2tar exit {returncode}'}")
    return facts


def _time(seconds: int) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def compare(stored: dict[str, FileFacts], rebuilt: dict[str, FileFacts]) -> list[Difference]:
    """Every difference, by path, in KINDS order for one path."""
    out: list[Difference] = []
    for path in sorted(stored.keys() | rebuilt.keys()):
        a, b = stored.get(path), rebuilt.get(path)
        if a is None:
            out.append(Difference(path, "added"))
            continue
        if b is None:
            out.append(Difference(path, "removed"))
            continue
        if a.kind != b.kind:
            out.append(Difference(path, "type", a.kind, b.kind))
            continue
        if a.digest != b.digest or a.size != b.size:
            if a.kind in ("symlink", "hardlink"):
                shown = (a.digest, b.digest)
            elif a.size != b.size:
                shown = (f"{a.size} B", f"{b.size} B")
            else:
                shown = (f"blake3 {a.digest[:12]}", b.digest[:12])
            out.append(Difference(path, "content", *shown))
        if a.mode != b.mode:
            out.append(Difference(path, "mode", f"{a.mode:o}", f"{b.mode:o}"))
        if a.owner != b.owner:
            out.append(Difference(path, "owner", a.owner, b.owner))
        if a.mtime != b.mtime:
            out.append(Difference(path, "time", _time(a.mtime), _time(b.mtime)))
    return out


def summary(differences: Iterable[Difference]) -> dict[str, int]:
    counts = {kind: 0 for kind in KINDS}
    for difference in differences:
        counts[difference.kind] += 1
    return {kind: n for kind, n in counts.items() if n}
