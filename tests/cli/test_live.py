"""Progress of a make (--progress): plain lines in logs and CI, a live per-layer view on a
terminal, JSON events for a program; colour only on a terminal that wants it."""

from __future__ import annotations

import pytest

import io
import json
import threading
import time

from efabuild.make.schedule import Outcome
from efabuild.cli.colour import Palette, wanted
from efabuild.cli.live import JsonReporter, LiveReporter, PlainReporter, announce_after, chosen_mode, reporter_for

BUILT = Outcome("demo:efa", "4be3f0c1a9d2" * 5 + "abcd", "built", 1.04, ("build", "export"),
                "cache/logs/demo/efa/x.log", "cache/objects/4b/x.sqsh")
FAILED = Outcome("demo:user", "9a41c3d0e5b7" * 5 + "abcd", "failed", 3.21,
                 error="demo:user: step RUN false failed (exit 1)\n  last lines: ...")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    reporter = reporter_for(out)
    assert type(reporter) is PlainReporter
    reporter.started("demo:efa", "build", "new layer")
    reporter.line("demo:efa", "#5 [2/3] RUN apt-get update")  # log lines stay in the log file
    reporter.finished(BUILT)
    reporter.finished(FAILED)
    assert out.getvalue() == (
        "[demo:efa] build: new layer\n"
        "[demo:efa] built (build + export) in 1.0s\n  log: cache/logs/demo/efa/x.log\n"
        "  artifact: cache/objects/4b/x.sqsh\n"
        "[demo:user] failed after 3.2s\n")  # the real time; the message itself once, after the summary
    assert "\x1b[" not in out.getvalue()


def test_live_view_shows_the_latest_log_line_of_each_running_layer_in_aligned_rows():
    out = Terminal()
    reporter = reporter_for(out, "auto", environ={"TERM": "xterm"})
    assert isinstance(reporter, LiveReporter)
    try:
        reporter.started("demo:efa", "build")
        reporter.started("other:deepep", "pull")
        reporter.started("x:user", "export")
        reporter.line("demo:efa", "#7 [3/4] RUN ./efa_installer.sh -y -g")
        reporter.finished(Outcome("other:deepep", "0" * 64, "pulled", 0.2, ("pull",)))
        reporter._redraw()
        screen = out.getvalue()
        block = screen.rsplit("\x1b[J", 1)[-1].splitlines()
        assert len(block) == 2 and "efa_installer.sh" in block[0]
        # names, actions and times in columns: the time of every row ends at the same place
        assert block[0].index("s  ") == block[1].index("s  ")
        assert block[0].startswith("  demo:efa  build ") and block[1].startswith("  x:user    export")
        assert "other:deepep" not in "".join(block)  # finished layers leave the live block
        assert "[other:deepep] \x1b[34mpulled\x1b[0m (pull) in 0.2s" in screen  # coloured on a terminal
    finally:
        reporter.close()
    assert out.getvalue().endswith("\x1b[J")  # the block is erased at the end


def test_colour_only_on_a_terminal_without_no_color_or_term_dumb():
    assert wanted(Terminal(), {"TERM": "xterm-256color"})
    assert not wanted(io.StringIO(), {"TERM": "xterm-256color"})  # a pipe, a CI log file
    assert not wanted(Terminal(), {"TERM": "xterm", "NO_COLOR": "1"})
    assert not wanted(Terminal(), {"TERM": "dumb"})
    assert wanted(Terminal(), {"TERM": "xterm", "NO_COLOR": ""})  # no-color.org: only a non-empty value
    # padding stays outside the colour, so a coloured table keeps its columns
    assert Palette(True).state("to build   ") == "\x1b[33mto build\x1b[0m   "
    assert Palette(True).state("available (.sqsh)") == "\x1b[32mavailable (.sqsh)\x1b[0m"
    assert Palette(True).state("RESULT") == "RESULT" and Palette(False).state("failed") == "failed"


def test_auto_is_the_live_view_only_on_a_terminal_that_can_move_its_cursor():
    assert chosen_mode("auto", Terminal(), {"TERM": "xterm"}) == "tty"
    assert chosen_mode("auto", Terminal(), {"TERM": "dumb"}) == "plain"
    assert chosen_mode("auto", io.StringIO(), {"TERM": "xterm"}) == "plain"
    assert chosen_mode("tty", io.StringIO(), {}) == "tty"  # asked for: as buildx, drawn anyway
    assert type(reporter_for(Terminal(), "plain")) is PlainReporter


def test_json_progress_is_one_object_per_event_in_the_json_convention():
    out = Terminal()  # even on a terminal: no colour, no cursor movement
    reporter = reporter_for(out, "json")
    assert isinstance(reporter, JsonReporter)
    reporter.planning()
    reporter.started("demo:efa", "build", "")
    reporter.line("demo:efa", "#5 RUN make")
    reporter.finished(BUILT)
    reporter.finished(FAILED)
    reporter.notice("warning", "S3 tier not consulted")
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["planning", "started", "log", "finished", "finished", "warning"]
    assert {e["format"] for e in events} == {"efabuild.progress/v1"}
    assert events[1] == {"format": "efabuild.progress/v1", "event": "started", "name": "demo:efa",
                         "action": "build", "detail": None}
    built, failed = events[3], events[4]
    assert built["path"] == "cache/objects/4b/x.sqsh" and built["key"] == BUILT.key and built["error"] is None
    assert failed["status"] == "failed" and failed["seconds"] == 3.21 and failed["path"] is None
    assert failed["error"].startswith("demo:user: step RUN false failed")
    assert "\x1b[" not in out.getvalue()


def test_a_line_while_a_long_plan_gathers_facts_and_none_for_a_quick_one():
    said = threading.Event()
    with announce_after(said.set, seconds=0.05):
        time.sleep(0.3)
    assert said.is_set()
    quick = threading.Event()
    with announce_after(quick.set, seconds=0.2):
        pass
    time.sleep(0.3)
    assert not quick.is_set()


@pytest.mark.slow
def test_plan_and_make_say_they_gather_facts_while_an_engine_is_slow_to_answer(tmp_path):
    """An engine that takes its time (here a socket that answers nothing for 2 s: a real engine
    cannot be made that slow on purpose) keeps a plan waiting: it says so on stderr first."""
    import os
    import socket
    import subprocess
    import sys
    import tempfile

    from tests.kits.wsfactory import make_workspace

    root = make_workspace(tmp_path / "ws")
    with tempfile.TemporaryDirectory(dir="/tmp") as short:  # a unix socket path has at most 107 bytes
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(f"{short}/engine.sock")
        listener.listen(8)
        held: list[socket.socket] = []

        def stall() -> None:
            while True:
                try:
                    held.append(listener.accept()[0])
                except OSError:
                    return
                threading.Timer(2.0, held[-1].close).start()

        threading.Thread(target=stall, daemon=True).start()
        env = {**os.environ, "DOCKER_HOST": f"unix://{short}/engine.sock"}
        try:
            runs = {args: subprocess.run([sys.executable, "-m", "efabuild", "-C", str(root), *args], env=env,
                                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
                    for args in (("plan",), ("make", "--dry-run", "--progress", "json"), ("plan", "--offline"))}
        finally:
            listener.close()
    plan, make, offline = runs.values()
    assert plan.returncode == 0 and "LAYER" in plan.stdout, plan.stderr
    assert plan.stderr.splitlines()[0] == "efabuild: gathering facts for the plan: build contexts, " \
                                          "the engine's images, the store…"
    first = json.loads(make.stderr.splitlines()[0])  # --progress json: the same as an event
    assert (first["format"], first["event"]) == ("efabuild.progress/v1", "planning")
    assert offline.returncode == 0 and "gathering facts" not in offline.stderr  # quick: nothing said
