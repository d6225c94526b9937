"""efabuild lint: the guide's pitfalls found in graphs, Dockerfiles and job scripts before a build.

    findings = lint_workspace(ws)            # every graph and scripts/
    findings = lint_workspace(ws, ["ngc-efa"])  # one graph (its layers, seen with their ancestors)
    if errors_only(findings): ...            # make stops here unless --no-lint
    print(render_text(findings))

Per-layer `ignore = [{rule = "EFA010", reason = "..."}]` in a graph drops that rule's findings for
that layer. Rules and their severities: `efabuild.lint.finding.RULES`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from efabuild.display import shown
from efabuild.errors import InputError
from efabuild.lint.chain import layer_facts
from efabuild.lint.finding import RULES, SEVERITIES, Finding, finding
from efabuild.lint.rules import LAYER_RULES
from efabuild.lint.scripts import job_scripts, lint_script
from efabuild.model import Workspace

__all__ = ["RULES", "Finding", "errors_only", "lint_workspace", "render_text", "to_json", "counts"]


def lint_workspace(ws: Workspace, graphs: Sequence[str] | None = None,
                   scripts: Sequence[Path] | None = None) -> list[Finding]:
    """Findings for the named graphs (all when None) and job scripts, sorted by file and line.

    `scripts=None` lints the job scripts under `scripts/` when no graph is named; pass a list to
    lint exactly those files (an empty list: none).
    """
    selected = _select_graphs(ws, graphs)
    facts = layer_facts(ws)
    findings: list[Finding] = []
    for graph in ws.graphs:
        if graph.name not in selected:
            continue
        for layer in graph.layers:
            layer_facts_ = facts.get(layer.qualname)
            if layer_facts_ is None:
                continue
            ignored = {ignore.rule for ignore in layer.ignore}
            for rule_id, check in LAYER_RULES.items():
                if rule_id in ignored:
                    continue
                findings.extend(check(layer_facts_))
            for rule_id in sorted(ignored - set(RULES)):
                file, line = layer_facts_.locator.key("ignore")
                findings.append(finding("EFA000", file, line, layer.qualname,
                                        f"ignore names {rule_id}, which is not a lint rule",
                                        f"use one of {', '.join(r for r in RULES if r != 'EFA000')}"))
    if scripts is None:
        scripts = job_scripts(ws.root) if graphs is None else []
    for path in scripts:
        findings.extend(lint_script(Path(path), ws.relpath(Path(path).resolve())))
    return sorted(set(findings), key=Finding.sort_key)


def _select_graphs(ws: Workspace, graphs: Sequence[str] | None) -> set[str]:
    names = {graph.name for graph in ws.graphs}
    if graphs is None:
        return names
    by_file = {ws.relpath(graph.source): graph.name for graph in ws.graphs}
    selected = set()
    for wanted in graphs:
        if wanted in names:
            selected.add(wanted)
        elif wanted in by_file:
            selected.add(by_file[wanted])
        else:
            known = ", ".join(sorted(names)) or "none"
            raise InputError(f"unknown graph '{wanted}' (graphs: {known})", "lint")
    return selected


def errors_only(findings: Iterable[Finding]) -> list[Finding]:
    """The findings that stop a build."""
    return [f for f in findings if f.severity == "error"]


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    totals = dict.fromkeys(SEVERITIES, 0)
    for f in findings:
        totals[f.severity] += 1
    return totals


def render_text(findings: Sequence[Finding]) -> str:
    """`file:line: ID severity layer: message` and an indented `fix:` line per finding, then totals.
    A message quoting a Dockerfile shows its control characters escaped (it may come from anyone's
    pull request, read in a CI log on a terminal)."""
    lines = []
    for f in findings:
        where = f"{f.file}:{f.line}" if f.line else f.file
        layer = f" {f.layer}" if f.layer else ""
        lines.append(shown(f"{where}: {f.rule} {f.severity}{layer}: {f.message}"))
        lines.append(shown(f"  fix: {f.fix}"))
    totals = counts(findings)
    summary = ", ".join(f"{n} {sev}{'s' if n != 1 else ''}" for sev, n in totals.items())
    lines.append(f"lint: {summary}" if findings else "lint: no findings")
    return "\n".join(lines)


def to_json(findings: Sequence[Finding]) -> dict[str, Any]:
    return {"findings": [f.to_json() for f in findings], "counts": counts(findings)}
