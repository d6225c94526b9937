"""What the benchmark reports, without running it: the table and JSON of results built here. A
target that holds only at full size, measured with --quick, is "not applicable at this size",
never a miss."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench  # noqa: E402
from benchmarks.common import Check, Result  # noqa: E402


def _chunked() -> Result:
    # a quick run's chunked figures: one changed chunk is 9.2 % of its tiny image
    return Result(id="chunked", what="user layer, one file changed", checks=(
        Check("publish: bytes sent", 9.2, 1.0, "lower", unit="%", full_size_only=True),
        Check("ls: time vs listing the records", 4.0, 3.0, "lower"),
    ))


def _met_column(table: str) -> dict[str, str]:
    rows = table.splitlines()[2:]
    return {measure: row.split("  ")[-1].strip() for row in rows
            for measure in ("publish: bytes sent", "ls: time vs listing the records") if measure in row}


def test_a_full_size_target_missed_in_a_quick_run_is_not_applicable_not_no():
    assert _met_column(bench.render([_chunked()], quick=True)) == {
        "publish: bytes sent": "n/a at this size", "ls: time vs listing the records": "NO"}


def test_at_full_size_the_same_miss_is_no():
    assert _met_column(bench.render([_chunked()], quick=False)) == {
        "publish: bytes sent": "NO", "ls: time vs listing the records": "NO"}


@pytest.mark.parametrize("quick", [True, False])
def test_the_json_says_which_targets_are_size_dependent_and_whether_they_apply(quick):
    data = _chunked().to_json(quick)
    sent, listed = data["checks"]
    assert (sent["full_size_only"], sent["applies"], sent["met"]) == (True, not quick, False)
    assert (listed["full_size_only"], listed["applies"]) == (False, True)


def test_a_scenario_is_met_when_every_target_that_applies_is():
    fine = Result(id="chunked", what="x", checks=(
        Check("publish: bytes sent", 9.2, 1.0, "lower", unit="%", full_size_only=True),
        Check("ls: time vs listing the records", 2.0, 3.0, "lower"),
    ))
    assert fine.to_json(quick=True)["met"] is True
    assert fine.to_json(quick=False)["met"] is False


def test_the_chunked_scenarios_size_dependent_targets_are_marked():
    text = (Path(bench.__file__).parent / "benchmarks" / "chunked.py").read_text()
    for measure in ("publish: bytes sent", "fetch: bytes downloaded"):
        start = text.index(f'Check("{measure}"')
        assert "full_size_only=True" in text[start:text.index("Check(", start + 1)], measure
