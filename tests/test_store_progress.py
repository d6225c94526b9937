"""Progress of long transfers: what a user reads on a terminal and in a log file."""

from __future__ import annotations

import io

from efabuild.store.progress import Progress, human_bytes, human_duration, status_text

MiB = 1024 * 1024


class FakeClock:
    """Progress reads a clock for rate and ETA; the test sets it instead of sleeping."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_human_units():
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(25 * 1024**3) == "25.0 GiB"
    assert human_duration(42) == "42s"
    assert human_duration(75) == "1m15s"
    assert human_duration(3725) == "1h02m"


def test_status_line_has_bytes_rate_and_eta():
    line = status_text("fetch 0123abcd4567", 256 * MiB, 1024 * MiB, 2.0)
    assert line == "fetch 0123abcd4567: 256.0 MiB / 1.0 GiB (25%), 128.0 MiB/s, ETA 6s"


def test_log_output_is_a_few_plain_lines():
    clock, out = FakeClock(), io.StringIO()
    with Progress("upload abc", 400 * MiB, stream=out, clock=clock) as bar:
        for _ in range(400):
            clock.now += 0.01
            bar.update(MiB)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert len(lines) == 4  # 25 %, 50 %, 75 %, done
    assert lines[0].startswith("upload abc: 100.0 MiB / 400.0 MiB (25%), 100.0 MiB/s, ETA 3s")
    assert lines[-1] == "upload abc: done, 400.0 MiB in 4s (100.0 MiB/s)"


def test_terminal_output_redraws_one_line():
    clock, out = FakeClock(), Terminal()
    with Progress("fetch abc", 100 * MiB, stream=out, clock=clock) as bar:
        for _ in range(100):
            clock.now += 0.05
            bar.update(MiB)
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    assert text.count("\r") > 5
    assert "fetch abc: done, 100.0 MiB" in text


def test_small_transfers_and_failures():
    out = io.StringIO()
    with Progress("copy tiny", 1000, stream=out) as bar:
        bar.update(1000)
    assert out.getvalue() == ""
    out = io.StringIO()
    try:
        with Progress("upload big", 64 * MiB, stream=out) as bar:
            bar.update(MiB)
            raise RuntimeError("network gone")
    except RuntimeError:
        pass
    assert "upload big: failed, 1.0 MiB" in out.getvalue()


def test_the_library_writes_progress_only_where_the_cli_says(monkeypatch, capsys):
    """Used as a library, efabuild prints no progress of its own; the CLI installs its stderr."""
    from efabuild.store import progress

    monkeypatch.setattr(progress, "_sink", None)
    with Progress("upload big", 64 * MiB) as bar:
        bar.update(64 * MiB)
    assert capsys.readouterr() == ("", "")
    out = io.StringIO()
    progress.use(lambda: out)
    with Progress("upload big", 64 * MiB) as bar:
        bar.update(64 * MiB)
    assert capsys.readouterr() == ("", "")
    assert out.getvalue().splitlines()[-1].startswith("upload big: done, 64.0 MiB in ")
