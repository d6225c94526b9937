"""Progress of long transfers: what a user reads on a terminal and in a log file."""

from __future__ import annotations

import io
import re

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


def test_an_export_whose_tar_outgrows_the_image_size_never_reads_past_its_total():
    """An export's total is the image's size, an estimate the tar stream (headers, padding) exceeds:
    the line read '43.7 MiB / 43.4 MiB (100%)' while the export went on."""
    clock, out = FakeClock(), Terminal()
    with Progress("export demo:user", 40 * MiB, stream=out, clock=clock, estimate=True) as bar:
        for _ in range(44):
            clock.now += 0.25
            bar.update(MiB)
    lines = [line.removesuffix("\x1b[K") for line in out.getvalue().replace("\n", "\r").split("\r") if line]
    assert lines[0] == "export demo:user: 1.0 MiB / ~40.0 MiB (2%)"
    drawn = lines[:-1]
    assert "export demo:user: 44.0 MiB / ~44.0 MiB (99%), 4.0 MiB/s" in drawn
    for line in drawn:  # never more done than the total shown, never 100% before the end
        done, total = re.match(r"export demo:user: ([0-9.]+) MiB / ~([0-9.]+) MiB", line).groups()
        assert float(done) <= float(total) and "(100%)" not in line, line
    assert lines[-1] == "export demo:user: done, 44.0 MiB in 11s (4.0 MiB/s)"


def test_no_rate_from_a_near_zero_interval():
    """The first read of a full pipe arrives microseconds after the start: 2.5 TiB/s is no rate."""
    clock, out = FakeClock(), Terminal()
    with Progress("export demo:user", 64 * MiB, stream=out, clock=clock) as bar:
        clock.now += 20e-6
        bar.update(32 * MiB)
    text = out.getvalue()
    assert "/s" not in text and "TiB" not in text
    assert text.endswith("export demo:user: done, 32.0 MiB in 0s\x1b[K\n")
    out = io.StringIO()  # a log file: the quarter lines alike
    with Progress("export demo:user", 64 * MiB, stream=out, clock=clock) as bar:
        bar.update(40 * MiB)
        clock.now += 2.0
        bar.update(24 * MiB)
    assert out.getvalue().splitlines() == ["export demo:user: 40.0 MiB / 64.0 MiB (62%)",
                                           "export demo:user: 64.0 MiB / 64.0 MiB (100%), 32.0 MiB/s",
                                           "export demo:user: done, 64.0 MiB in 2s (32.0 MiB/s)"]


def test_a_makes_export_line_takes_the_image_size_as_an_estimate(monkeypatch):
    """What make shows while it exports (make/publish.py): the image's size is the total."""
    from efabuild.make.publish import export_progress
    from efabuild.store import progress

    out = io.StringIO()
    monkeypatch.setattr(progress, "_sink", lambda: out)
    with export_progress("demo:user", 40 * MiB) as bar:
        for _ in range(11):
            bar.update(4 * MiB)
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("export demo:user: done, 44.0 MiB in ")
    assert lines[:-1] and all(" / ~" in line and "(100%)" not in line for line in lines[:-1]), lines
