"""Processes of this host: whether a pid or a pid namespace is still alive, and the host name an
owner carries (with the pid namespace, where that is not the host's own).

Stdlib only, and at the bottom of the host floor: locks, owners and leftovers judge by these.
"""

from __future__ import annotations

import functools
import os


# the kernel's PROC_PID_INIT_INO: the host's own pid namespace
_INIT_PID_NAMESPACE = 0xEFFFFFFC


def host_name(name: str) -> str:
    """The host `name` as an owner's "host", in which its pid is judged: a process in another pid
    namespace under the same name (a container sharing the host's name, `--network host`) sees
    other pids, so there the name carries the namespace. The host's own stays the bare name."""
    namespace = _pid_namespace()
    return name if namespace in (None, _INIT_PID_NAMESPACE) else f"{name}-pidns{namespace}"


@functools.cache
def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None  # no /proc: the name alone, as before


def pid_namespace_alive(namespace: int) -> bool:
    """Whether a process of this host is in the pid namespace `namespace` (its inode), as seen
    from the namespace this process is in; True too when a process in some namespace below it
    could not be looked at (another user's: only root sees every one)."""
    try:
        pids = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            if os.stat(f"/proc/{pid}/ns/pid").st_ino == namespace:
                return True
        except FileNotFoundError:
            continue  # ended meanwhile
        except OSError:
            if _nested(pid):
                return True  # in some namespace below this one, maybe that one: cannot say
    return False


def _nested(pid: str) -> bool:
    """Whether the process has a pid in a namespace below this one too (its status, unlike its
    ns/ link, anyone may read: NSpid lists one pid per namespace level)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"NSpid:"):
                    return len(line.split()) > 2
    except OSError:
        return False  # ended meanwhile
    return True  # a kernel older than NSpid (4.1): cannot tell


def pid_alive(pid: object) -> bool:
    """Whether a process with this pid exists on this host (one we may not signal counts)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
