"""Lint findings as a SARIF 2.1.0 log, the format code-scanning services read (GitHub, GitLab,
Azure DevOps).

Pure: findings in, a JSON-ready dict out. Locations are workspace-relative URIs under the
`%SRCROOT%` base, so a service that checked out the same repository places them on its lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from efabuild.lint.finding import RULES, Finding

SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
VERSION = "2.1.0"
SRCROOT = "%SRCROOT%"
# SARIF's levels: error, warning, note
LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def to_sarif(findings: Sequence[Finding], root: Path, tool_version: str) -> dict[str, Any]:
    """One run of `efabuild lint`: its rules, and each finding as a result."""
    rule_ids = list(RULES)
    return {
        "$schema": SCHEMA,
        "version": VERSION,
        "runs": [{
            "tool": {"driver": {
                "name": "efabuild lint",
                "version": tool_version,
                "rules": [_rule(RULES[rule_id]) for rule_id in rule_ids],
            }},
            "originalUriBaseIds": {SRCROOT: {"uri": root.resolve().as_uri() + "/"}},
            "results": [_result(f, rule_ids.index(f.rule)) for f in findings],
        }],
    }


def _rule(rule) -> dict[str, Any]:  # noqa: ANN001 - efabuild.lint.finding.Rule
    return {
        "id": rule.id,
        "shortDescription": {"text": rule.title},
        "defaultConfiguration": {"level": LEVELS[rule.severity]},
    }


def _result(f: Finding, rule_index: int) -> dict[str, Any]:
    location: dict[str, Any] = {"physicalLocation": {
        "artifactLocation": {"uri": quote(f.file), "uriBaseId": SRCROOT},
        **({"region": {"startLine": f.line}} if f.line else {}),
    }}
    if f.layer:
        location["logicalLocations"] = [{"fullyQualifiedName": f.layer, "kind": "module"}]
    return {
        "ruleId": f.rule,
        "ruleIndex": rule_index,
        "level": LEVELS[f.severity],
        "message": {"text": f"{f.message}\nfix: {f.fix}"},
        "locations": [location],
        "properties": {"layer": f.layer, "fix": f.fix},
    }
