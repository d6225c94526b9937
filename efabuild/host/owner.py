"""Who left something behind, and whether that process is gone.

Temporary build contexts and export containers carry their owner's host, pid and start time (in
their name or a label). A leftover is removed only when its owner is on this host and gone: its
pid no longer exists, or now belongs to a process started at another time (pids are reused).
An owner on another host is never judged from here. One in another pid namespace of this host (a
container sharing its name: see host.pids.host_name) is judged only from the host's own
namespace: gone once no process is left in its namespace.
"""

from __future__ import annotations

import os
import re
from functools import cache
from typing import NamedTuple

from efabuild.host.pids import host_name, pid_alive, pid_namespace_alive

# host.pid.start, the host without its domain (no dots), start in clock ticks since boot
TOKEN = r"(?P<host>[^./]+)\.(?P<pid>[0-9]+)\.(?P<start>[0-9]+)"
_TOKEN = re.compile(TOKEN)


def this_host() -> str:
    import socket  # with the first owned name: a no-op plan writes none

    return host_name(socket.gethostname().split(".")[0] or "host")


def start_time(pid: int) -> int:
    """The process' start time (field 22 of /proc/PID/stat); 0 when unknown (not Linux, gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    # the command name (field 2) is in parentheses and may contain spaces: split after it
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return 0


class Owner(NamedTuple):
    host: str
    pid: int
    start: int  # 0: unknown, then the pid alone decides

    @classmethod
    def current(cls) -> Owner:
        return _current(os.getpid())  # keyed by pid: a forked child is its own owner

    @property
    def token(self) -> str:
        return f"{self.host}.{self.pid}.{self.start}"

    @classmethod
    def parse(cls, token: str) -> Owner | None:
        match = _TOKEN.fullmatch(token or "")
        return cls(match["host"], int(match["pid"]), int(match["start"])) if match else None

    def gone(self) -> bool:
        """True only when this process certainly no longer runs: it ran on this host, or in a pid
        namespace of this host (a container sharing its name) in which no process is left."""
        here = this_host()
        if self.host != here:
            base, _, namespace = self.host.rpartition("-pidns")
            # judged from the host's own namespace only, the one that sees every other
            return base == here and namespace.isdigit() and not pid_namespace_alive(int(namespace))
        if not pid_alive(self.pid):
            return True
        now = start_time(self.pid)
        return bool(self.start and now and now != self.start)


@cache
def _current(pid: int) -> Owner:
    return Owner(this_host(), pid, start_time(pid))


def owned_name(prefix: str, what: str) -> str:
    """`PREFIX-HOST.PID.START-RANDOM-WHAT`: a name that says which process made it."""
    return f"{prefix}-{Owner.current().token}-{os.urandom(4).hex()}-{what}"


def owner_of(name: str, prefix: str) -> Owner | None:
    """The owner in an owned_name() with this prefix; None for any other name."""
    if not name.startswith(prefix):  # most of a shared /tmp: no pattern to build and match
        return None
    match = re.match(rf"{re.escape(prefix)}-{TOKEN}-[0-9a-f]{{8}}-", name)
    return Owner(match["host"], int(match["pid"]), int(match["start"])) if match else None


def remove_dead_owned(directory: str | os.PathLike | int, prefix: str) -> None:
    """Delete the owned_name() files with this prefix in `directory` (a path, or a descriptor of
    one) whose owner is gone: what writers killed between creating a temp file and renaming it
    left behind."""
    dir_fd = directory if isinstance(directory, int) else None
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        owner = owner_of(name, prefix)
        if owner is not None and owner.gone():
            try:  # a link itself, never what it points at
                os.unlink(name if dir_fd is not None else os.path.join(directory, name), dir_fd=dir_fd)
            except OSError:
                pass  # gone already, or a directory: not ours to judge
