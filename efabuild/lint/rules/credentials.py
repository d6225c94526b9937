"""Secrets written into a layer: build args, ARG defaults, ENV and RUN literals (EFA013)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from efabuild.lint.chain import LayerFacts
from efabuild.lint.finding import Finding
from efabuild.lint.rules.registry import arg_names, at, at_key, rule
from efabuild.redact import secret_name, secret_value


# --- EFA013: secrets --------------------------------------------------------------------------------

_ONLY_A_VARIABLE = re.compile(r"^\$\{?[A-Za-z_][A-Za-z0-9_]*\}?$")
_SECRET_FIX = ("declare `secrets = [\"NAME\"]` in the layer and read it in a `RUN --mount=type=secret,id=NAME` "
               "(or pass it at run time); literals, build args and ENV are stored in the image and its history")


def _secret_fix(name: str) -> str:
    return (f"declare `secrets = [\"{name}\"]` in the layer, set {name} in make's environment, and read it "
            f"in the RUN that needs it: `RUN --mount=type=secret,id={name} ... $(cat /run/secrets/{name})`; "
            "a secret is never in the key, the image, its history or the registry (build args and ENV are)")


@rule("EFA013")
def secrets(facts: LayerFacts) -> Iterator[Finding]:
    declared = {arg.name: arg for arg in facts.evaluated.args}
    for name, value in facts.layer.args:
        if value and (secret_name(name) or secret_value(value)):
            yield at_key(facts, "EFA013", ("args", name),
                          f"build arg {name} carries a secret (value not shown)", _secret_fix(name))
    for arg in facts.evaluated.args:
        if arg.from_graph or not arg.value:
            continue  # graph values are reported above, at the graph's line
        if secret_name(arg.name) or secret_value(arg.value):
            yield at(facts, "EFA013", arg.line,
                      f"ARG {arg.name} has a default that looks like a secret (value not shown)",
                      _secret_fix(arg.name))
    for env in facts.evaluated.envs:
        if not env.value or _ONLY_A_VARIABLE.match(env.value):
            continue  # `ENV X=${X}` with X unset: nothing is stored
        via_arg = any(name in declared for name in arg_names(env.raw))
        if secret_name(env.name) or secret_value(env.value):
            what = "copies a build arg that looks like a secret" if via_arg else "looks like a secret"
            yield at(facts, "EFA013", env.line,
                      f"ENV {env.name} {what} (value not shown): it stays in the image config",
                      _secret_fix(env.name))
    for rc in facts.evaluated.runs:
        if any(secret_value(word) for word in rc.command.words):
            yield at(facts, "EFA013", rc.line,
                      f"a RUN command ({rc.command.program}) contains a literal credential (value not shown)",
                      _SECRET_FIX)
