"""make's progress as a person sees it: `efabuild make` run on a real pseudo-terminal, its output
drawn by a terminal emulator (pyte), frame by frame. The live view's rows line up while layers
build, states are coloured, and the summary stays on the screen; NO_COLOR and TERM=dumb give
plain text."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
import uuid
from pathlib import Path

import pyte
import pytest

from tests.kits.wsfactory import make_workspace

COLUMNS, LINES = 160, 50
SGR = re.compile(rb"\x1b\[[0-9;]*m")  # a colour (select graphic rendition) sequence
CLEAR = b"\x1b[J"  # the live view erases its block before each redraw
# pyte's names for the SGR colours cli/colour.py gives outcomes
COLOURS = {"built": "brown", "reused": "green"}


def graph(base: str, token: str) -> str:
    """Two independent layers that each run a few seconds, printing as they go: with --jobs 2 both
    are in the live view at once."""
    layer = ("[layers.{name}]\nbase = \"{base}\"\ndockerfile = '''\n"
             "RUN for i in 1 2 3 4 5 6; do echo {name}-step-$i-{token}; sleep 0.5; done\n'''\n\n")
    return "".join(layer.format(name=name, base=base, token=token) for name in ("alpha", "omega"))


def run_on_a_terminal(root: Path, *args: str, env: dict[str, str], timeout: float = 300) -> tuple[int, bytes]:
    """`efabuild ARGS` with stdin, stdout and stderr on a new pseudo-terminal of COLUMNS × LINES;
    its exit status and every byte it wrote there."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "efabuild", "-C", str(root), *args], stdin=slave,
                            stdout=slave, stderr=slave, env={**os.environ, **env}, start_new_session=True)
    os.close(slave)
    output = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end has closed it
                break
            if not data:
                break
            output += data
        else:
            proc.kill()
            pytest.fail(f"make on a terminal did not finish in {timeout}s: {bytes(output[-2000:])!r}")
    finally:
        os.close(master)
    return proc.wait(timeout=30), bytes(output)


def frames(output: bytes) -> tuple[list[list[str]], pyte.Screen]:
    """The screen's lines just before each redraw of the live block (when it is whole), and the
    screen at the end (with its colours)."""
    shots = []
    screen = pyte.Screen(COLUMNS, LINES)
    stream = pyte.ByteStream(screen)
    pieces = output.split(CLEAR)
    for index, piece in enumerate(pieces):
        stream.feed(piece)  # the cursor is back at the block's top: the rows are still there
        shots.append(text(screen))
        if index < len(pieces) - 1:
            stream.feed(CLEAR)
    return shots, screen


def text(screen: pyte.Screen) -> list[str]:
    return [line.rstrip() for line in screen.display]


def summary_rows(lines: list[str]) -> dict[str, tuple[int, list[str]]]:
    """The rows of make's summary table (the plan's table above it has rows of the same layers)."""
    header = next(y for y, line in enumerate(lines) if line.split()[:3] == ["LAYER", "KEY", "RESULT"])
    return {line.split()[0]: (y, line.split()) for y, line in enumerate(lines)
            if y > header and line.startswith("g:")}


def colour_of(screen: pyte.Screen, y: int, word: str) -> str:
    x = screen.display[y].index(word)
    return screen.buffer[y][x].fg


@pytest.fixture
def workspace(busybox_image, tmp_path):
    root = make_workspace(tmp_path / "ws", {"g": graph(busybox_image, uuid.uuid4().hex)})
    yield root
    from tests.make.test_make import _remove_images_of

    _remove_images_of(root)


def new_layers(root: Path, base: str) -> None:
    (root / "graphs" / "g.toml").write_text(graph(base, uuid.uuid4().hex))


def test_make_on_a_terminal_shows_aligned_live_rows_coloured_states_and_its_summary(workspace, busybox_image):
    status, output = run_on_a_terminal(workspace, "make", "--progress", "auto", "--jobs", "2", "--no-lint",
                                       env={"TERM": "xterm-256color", "NO_COLOR": ""})
    shots, screen = frames(output)
    final = shots[-1]
    assert status == 0, "\n".join(final)

    # while both layers built: one row each, name, action and time in columns, the latest log line
    def live_rows(lines: list[str]) -> list[str]:
        return [line for line in lines if re.match(r"  g:(alpha|omega) +build +\d+s  ", line)]

    both = [rows for rows in map(live_rows, shots) if len(rows) == 2]
    assert both, "never saw both layers building at once:\n" + "\n".join(final)
    for rows in both:
        assert len({row.index("s  ") for row in rows}) == 1, rows  # times end in the same column
        assert len({row.index("build") for row in rows}) == 1, rows
    assert any(re.search(r"(alpha|omega)-step-\d", row) for rows in both for row in rows), both

    # at the end the live block is gone and the summary stays, outcomes coloured
    assert not any(live_rows(shots[-1]))
    rows = summary_rows(final)
    assert {name: row[2] for name, (_, row) in rows.items()} == {"g:alpha": "built", "g:omega": "built"}
    header = next(y for y, line in enumerate(final) if line.split()[:3] == ["LAYER", "KEY", "RESULT"])
    assert final[header].split() == ["LAYER", "KEY", "RESULT", "TIME", "ARTIFACT"]
    assert final[header].index("RESULT") == final[rows["g:alpha"][0]].index("built")  # aligned under it
    for y, _ in rows.values():
        assert colour_of(screen, y, "built") == COLOURS["built"]
    assert "2 built" in final
    progress = [y for y, line in enumerate(final) if line.startswith(("[g:alpha] built", "[g:omega] built"))]
    assert len(progress) == 2 and {colour_of(screen, y, "built") for y in progress} == {COLOURS["built"]}

    # nothing left to do: the plan's states and the outcomes are coloured too
    status, output = run_on_a_terminal(workspace, "make", "--no-lint", env={"TERM": "xterm", "NO_COLOR": ""})
    shots, screen = frames(output)
    assert status == 0 and "2 reused" in shots[-1]
    y, row = summary_rows(shots[-1])["g:alpha"]
    assert row[2] == "reused" and colour_of(screen, y, "reused") == COLOURS["reused"]
    planned = next(y for y, line in enumerate(shots[-1]) if line.startswith("g:alpha") and "available" in line)
    assert colour_of(screen, planned, "available") == COLOURS["reused"]  # green: nothing to do


@pytest.mark.parametrize("environment", [{"TERM": "xterm", "NO_COLOR": "1"}, {"TERM": "dumb"}])
def test_no_color_and_term_dumb_give_plain_text(workspace, busybox_image, environment):
    new_layers(workspace, busybox_image)
    status, output = run_on_a_terminal(workspace, "make", "--jobs", "2", "--no-lint", env=environment)
    final = frames(output)[0][-1]
    assert status == 0, "\n".join(final)
    assert not SGR.search(output), output  # no colour anywhere
    if environment["TERM"] == "dumb":  # no cursor movement either: one line per event, as in a log
        assert b"\x1b" not in output
        assert any(line.startswith("[g:alpha] build: ") for line in final)
    else:
        assert CLEAR in output  # the live view still draws (NO_COLOR is about colour only)
    assert "2 built" in final
    assert {name: row[2] for name, (_, row) in summary_rows(final).items()} == {
        "g:alpha": "built", "g:omega": "built"}
