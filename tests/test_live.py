"""Progress of a make: plain lines in logs and CI, a live per-layer view on a terminal."""

from __future__ import annotations

import io

from efabuild.cli.live import LiveReporter, PlainReporter, reporter_for


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    reporter = reporter_for(out)
    assert type(reporter) is PlainReporter
    reporter.started("demo:efa", "build", "new layer")
    reporter.line("demo:efa", "#5 [2/3] RUN apt-get update")  # log lines stay in the log file
    reporter.finished("demo:efa", "built in 1.0s")
    assert out.getvalue() == "[demo:efa] build: new layer\n[demo:efa] built in 1.0s\n"


def test_live_view_shows_the_latest_log_line_of_each_running_layer():
    out = Terminal()
    reporter = reporter_for(out)
    assert isinstance(reporter, LiveReporter)
    try:
        reporter.started("demo:efa", "build")
        reporter.started("other:efa", "pull")
        reporter.line("demo:efa", "#7 [3/4] RUN ./efa_installer.sh -y -g")
        reporter.finished("other:efa", "pulled in 0.2s")
        reporter._redraw()
        screen = out.getvalue()
        block = screen.rsplit("\x1b[J", 1)[-1]
        assert "demo:efa build" in block and "efa_installer.sh" in block
        assert "other:efa pull" not in block  # finished layers leave the live block
        assert "[other:efa] pulled in 0.2s" in screen
    finally:
        reporter.close()
    assert out.getvalue().endswith("\x1b[J")  # the block is erased at the end
