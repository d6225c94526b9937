"""The registry of layer rules and what they share: where a finding points, a layer's RUNs.

A rule is a function `(LayerFacts) -> Iterable[Finding]`, registered in LAYER_RULES by its ID
(the catalogue of IDs, severities and titles is `efabuild.lint.finding.RULES`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

from efabuild.lint.chain import LayerFacts, is_installer
from efabuild.lint.dockerfile import RunCommand
from efabuild.lint.finding import Finding, finding

HEX40 = re.compile(r"[0-9a-f]{40}")
UNRESOLVED = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")

LayerRule = Callable[[LayerFacts], Iterable[Finding]]
LAYER_RULES: dict[str, LayerRule] = {}


def rule(rule_id: str) -> Callable[[LayerRule], LayerRule]:
    def register(fn: LayerRule) -> LayerRule:
        LAYER_RULES[rule_id] = fn
        return fn

    return register


def at(facts: LayerFacts, rule_id: str, line: int, message: str, fix: str) -> Finding:
    """A finding at a line of the layer's Dockerfile text."""
    file, file_line = facts.locator.text(line)
    return finding(rule_id, file, file_line, facts.layer.qualname, message, fix)


def at_key(facts: LayerFacts, rule_id: str, key: tuple[str, ...], message: str, fix: str) -> Finding:
    """A finding at a key of the layer's table in the graph TOML."""
    file, line = facts.locator.key(*key)
    return finding(rule_id, file, line, facts.layer.qualname, message, fix)


def layer_platforms(facts: LayerFacts) -> tuple[str, ...]:
    """The platforms this layer is built for: its own resolved `platforms` (a several-platform
    workspace), else `[builder] platforms`, else `[builder] platform` (read tolerant of either)."""
    own = tuple(getattr(facts.layer, "platforms", ()) or ())
    builder = facts.settings.builder
    return own or tuple(getattr(builder, "platforms", ()) or ()) or (builder.platform,)


def runs(facts: LayerFacts) -> dict[int, list[RunCommand]]:
    """The layer's commands grouped by the RUN they belong to."""
    by_run: dict[int, list[RunCommand]] = {}
    for rc in facts.evaluated.runs:
        by_run.setdefault(rc.run_index, []).append(rc)
    return by_run


def installer_commands(facts: LayerFacts) -> Iterator[tuple[RunCommand, list[RunCommand]]]:
    """Each installer command with the commands of its RUN (in order)."""
    for commands in runs(facts).values():
        for rc in commands:
            if is_installer(rc.command):
                yield rc, commands


def arg_names(text: str) -> list[str]:
    """The variables a text refers to (`${A}`, `$B`)."""
    return UNRESOLVED.findall(text)
