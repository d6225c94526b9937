"""The benchmark runs end to end (`scripts/bench.py --quick`), so it cannot rot unnoticed.

No timing thresholds: figures depend on the machine and its load. What is checked is what a
reader of the results relies on: every scenario ran, the table shows each of them, and the JSON
holds a finite ratio and the timed repeats behind every figure.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ("plan", "hash", "export", "farm", "incremental", "publish", "fetch", "chunked", "lookup", "importer",
             "scale", "scale-real", "sign", "lint", "children")

# the module's first test waits for the whole quick benchmark (up to 900 s)
pytestmark = [pytest.mark.engine, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def quick_run(docker_engine, tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path_factory.mktemp("bench") / "results" / "bench.json"
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "bench.py"), "--quick", "--json-out", str(out),
         "--work-dir", str(tmp_path_factory.mktemp("bench-work"))],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=900,
    )
    assert done.returncode == 0, f"bench failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done, json.loads(out.read_text())


def test_every_scenario_runs_and_is_in_the_table(quick_run):
    done, data = quick_run
    assert [s["id"] for s in data["scenarios"]] == list(SCENARIOS)
    assert [s["id"] for s in data["scenarios"] if s["error"]] == []
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["scenario", "measure", "efabuild"]
    for scenario in SCENARIOS:
        assert any(line.startswith(scenario + " ") for line in lines), f"no table row for {scenario}"
    assert "ERROR" not in done.stdout
    # one run: what the performance page says of it
    assert data["selected"] == list(SCENARIOS) and len(data["run_id"]) == 12 and len(data["commit"]) == 40
    assert data["started"] < data["finished"] and len(data["load_before"]) == len(data["load_after"]) == 3


def test_every_figure_has_its_target_and_repeats(quick_run):
    _, data = quick_run
    assert data["mode"] == "quick"
    for scenario in data["scenarios"]:
        assert scenario["checks"], scenario["id"]
        for check in scenario["checks"]:
            if check["value"] is not None:  # the scale fit may be drowned by noise: then null
                assert math.isfinite(check["value"]) and check["value"] >= 0, (scenario["id"], check)
            assert check["better"] in ("higher", "lower") and check["target"] > 0
            assert isinstance(check["met"], bool)
            # a target that holds only at full size does not apply to a --quick run
            assert check["applies"] is not check["full_size_only"], (scenario["id"], check)
        for timing in scenario["timings"]:
            assert timing["seconds"] and all(s > 0 for s in timing["seconds"]), (scenario["id"], timing)
            assert min(timing["seconds"]) <= timing["median"] <= max(timing["seconds"])
    ratios = {s["id"]: s["checks"][0]["value"] for s in data["scenarios"]}
    for scenario in ("plan", "hash", "export", "publish", "fetch", "lookup"):
        assert ratios[scenario] is not None and ratios[scenario] > 0, scenario


def test_results_describe_the_machine_and_leave_no_secret(quick_run):
    done, data = quick_run
    machine = data["machine"]
    assert machine["nproc"] >= 1 and machine["memory"] and machine["docker"]
    text = json.dumps(data) + done.stdout + done.stderr
    assert "bench-secret-key" not in text  # the loopback S3 server's dummy credentials
    publish = next(s for s in data["scenarios"] if s["id"] == "publish")
    # the read counter works in the bench process (boto3 reads the file through read(2)), and
    # efabuild reads the data once: the export's chunk index says where each chunk lies, and each
    # is read back with pread(2) as it is sent
    figures = publish["figures"]
    assert min(figures["boto3_read_bytes"]) >= figures["bytes"]
    assert 0.95 * figures["bytes"] <= max(figures["efabuild_read_bytes"]) <= 1.05 * figures["bytes"]
