"""The Enroot containers Pyxis keeps on a node for names a job gave, and which of them are stale.

Pyxis (`container_scope=global`, its default) keeps a container named by `--container-name=NAME` as
`pyxis_NAME` after the job, and a later step with that name starts it again, whatever image it
asks for (slurmd logs "pyxis: reusing existing container filesystem"). A job that names its
container by the artifact's key (`NAME-<12 hex of the key>`) never starts an old image, but leaves
one container per build on each node: `stale` picks those of a name's earlier keys, and `prune`
removes them with `enroot remove`, never one that is running.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

from efabuild.errors import EfabuildError, InputError
from efabuild.host import children

SHORT = 12  # hex digits of the key in a container name: ${KEY:0:12} in the job script
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_KEY = re.compile(r"[0-9a-f]{12,64}")


def container_name(base: str, key: str) -> str:
    """The --container-name a job gives for `key`'s artifact: BASE-<12 hex>."""
    return f"{check_base(base)}-{check_key_part(key)[:SHORT]}"


def check_base(base: str) -> str:
    if not _NAME.fullmatch(base):
        raise InputError(f"container name {base!r}: letters, digits, '.', '_' and '-' (not first), at most 64")
    return base


def check_key_part(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise InputError(f"key {key!r}: give the artifact's key (12 to 64 lowercase hex digits)")
    return key


@dataclass(frozen=True)
class Container:
    """One entry of `enroot list --fancy`: its name and whether a process runs in it."""

    name: str
    running: bool


def parse_list(text: str) -> list[Container]:
    """`enroot list --fancy`'s table: NAME first, then PID when a process runs in it; a line
    that starts with blanks is another process of the container above."""
    found: list[Container] = []
    for line in text.splitlines()[1:]:
        if not line.strip() or line[0].isspace():
            continue
        fields = line.split()
        found.append(Container(fields[0], len(fields) > 1 and fields[1].isdigit()))
    return found


def stale(containers: Iterable[Container], base: str, keep: str, jobid: str | None = None) -> list[Container]:
    """The containers of `base` that name another key than `keep`'s: `pyxis_BASE-<hex>` (global
    scope), or `pyxis_<JOBID>_BASE-<hex>` for the job `jobid` (job scope)."""
    prefix = f"pyxis_{check_base(base)}-" if jobid is None else f"pyxis_{jobid}_{check_base(base)}-"
    current = check_key_part(keep)[:SHORT]
    suffix = re.compile(r"[0-9a-f]{%d}" % SHORT)
    return [c for c in containers
            if c.name.startswith(prefix) and suffix.fullmatch(c.name[len(prefix):]) and c.name[len(prefix):] != current]


def listed(timeout: float = 60) -> list[Container]:
    """This user's Enroot containers (ENROOT_DATA_PATH), by `enroot list --fancy`."""
    done = _enroot(["list", "--fancy"], timeout)
    return parse_list(done.stdout)


def prune(base: str, keep: str, *, dry_run: bool = False, timeout: float = 600) -> tuple[list[str], list[str]]:
    """Remove the stale containers of `base` (`stale`): (removed, skipped because running)."""
    old = stale(listed(), base, keep)
    busy = [c.name for c in old if c.running]
    gone = [c.name for c in old if not c.running]
    if not dry_run:
        for name in gone:
            # a name `stale` accepted starts with pyxis_ and holds no '/': neither an option nor a path
            _enroot(["remove", "--force", "--", name], timeout)
    return gone, busy


def _enroot(args: list[str], timeout: float):  # noqa: ANN202 - a CompletedProcess
    try:
        done = children.run(["enroot", *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise EfabuildError("enroot is not on PATH: run this on a node with Enroot") from None
    except subprocess.TimeoutExpired:
        raise EfabuildError(f"enroot {args[0]} did not finish in {timeout:g} s") from None
    if done.returncode != 0:
        detail = (done.stderr or "").strip().splitlines()
        raise EfabuildError(f"enroot {args[0]} failed (exit status {done.returncode})"
                            + (f": {detail[-1][:200]}" if detail else ""))
    return done
