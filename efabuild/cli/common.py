"""Helpers shared by command modules: finding the workspace, writing a file the user named, --builder."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from efabuild import grammar
from efabuild.errors import InputError
from efabuild.host.fsutil import UnsafeEntry, atomic_write_bytes, kind_of, parse_temp_owner
from efabuild.redact import shown_value
from efabuild.workspace import find_root, load_workspace


def workspace():
    return load_workspace(find_root(Path.cwd()))


def write_file(name: str, data: bytes) -> None:
    """Write a report or picture the user named: all of it or nothing (temp file, fsync, rename).

    Only a regular file (or nothing) is replaced: the rename would put a file in place of
    /dev/null or of the /dev/stdout link, and a link planted in a shared /tmp is refused."""
    path = Path(name)
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        mode = None  # absent (or unreachable: the write says why)
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise InputError(f"{kind_of(mode)}, not a file: name a file to write the output to", name)
    directory = path.parent if str(path.parent) else Path(".")
    _remove_dead_temps(directory, path.name)
    try:
        atomic_write_bytes(path, data, directory)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror}", name) from None
    except UnsafeEntry as exc:  # a directory where the file goes: the name given is wrong
        raise InputError(str(exc)) from None


def _remove_dead_temps(directory: Path, name: str) -> None:
    """Temp files of this output that a killed efabuild left beside it (their names say whose)."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        owner = parse_temp_owner(entry) if entry.endswith(f".{name}.part") else None
        if owner is not None and owner.gone():
            try:
                os.unlink(directory / entry)
            except OSError:
                pass


def add_builder_option(parser) -> None:
    parser.add_argument("--builder", metavar="NAME",
                        help="build elsewhere: a Docker context, a host URL (unix://, tcp://, ssh://), "
                             "or buildx:NAME for a buildx builder")


def with_builder(ws, value: str | None):
    """The workspace with `--builder` replacing [builder]'s context/host/buildx_builder."""
    if not value:
        return ws

    builder = ws.settings.builder._replace(context=None, host=None, buildx_builder=None, farm=())
    if "://" in value:
        problem = grammar.host_problem(value)
        builder = builder._replace(host=value)
    elif value.startswith("buildx:"):
        problem = grammar.tool_name_problem(value.split(":", 1)[1])
        builder = builder._replace(buildx_builder=value.split(":", 1)[1])
    else:
        problem = grammar.tool_name_problem(value)
        builder = builder._replace(context=value)
    if problem:  # a URL's password is not repeated
        raise InputError(problem, f"--builder {shown_value('builder', value)!r}")
    return ws._replace(settings=ws.settings._replace(builder=builder))
