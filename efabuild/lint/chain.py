"""Each layer seen with what it inherits: the parent's environment, whether the EFA installer
already ran below it, and whether its chain starts from an NGC PyTorch base.

What counts as an NGC base: a base whose repository's last path component is `pytorch`
(`nvcr.io/nvidia/pytorch:26.08-py3`, the offline fixture `efabuild-fixtures/pytorch:…`, a private
mirror `registry.example/nvidia/pytorch`), except Docker Hub's `pytorch/pytorch`, which is built
by the PyTorch project, not NVIDIA, and carries no NGC Open MPI. A layer's ENV carries on to its
descendants (it is part of the image config); ARG values do not (each layer is its own build).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from efabuild.lint.dockerfile import Evaluated, evaluate
from efabuild.lint.locate import GraphTexts, Locator, locator_for
from efabuild.lint.shell import Command
from efabuild.model import Layer, Workspace
from efabuild.settings import Settings


class LayerFacts(NamedTuple):
    layer: Layer
    evaluated: Evaluated
    locator: Locator
    settings: Settings
    ngc: bool  # the chain starts from an NGC PyTorch base
    installer_before: bool  # an ancestor layer ran efa_installer.sh
    env_before: Mapping[str, str]  # the image environment the layer starts from

    @property
    def installer_here(self) -> bool:
        return any(is_installer(rc.command) for rc in self.evaluated.runs)


def is_installer(command: Command) -> bool:
    return installer_arguments(command) is not None


# commands that run the next word as a program: `bash -x ./efa_installer.sh`, `timeout 1800 ...`
_WRAPPERS = frozenset({"bash", "sh", "timeout", "nice", "env", "exec", "eval", "stdbuf", "time", "sudo"})


def installer_arguments(command: Command) -> list[str] | None:
    """The words after `efa_installer.sh` when `command` runs it (directly, through a shell or
    a wrapper, or inside `sh -c "..."`), else None. Words are split as the shell would split an
    expanded variable or a `-c` script."""
    tokens = [token for word in command.argv for token in word.split()]
    for index, token in enumerate(tokens):
        name = token.rsplit("/", 1)[-1]
        if name == "efa_installer.sh":
            return tokens[index + 1:]
        wrapper_argument = index > 0 and (token.startswith("-") or token[:1].isdigit() or "=" in token)
        if name not in _WRAPPERS and not wrapper_argument:
            return None
    return None


def is_ngc_ref(ref: str) -> bool:
    name = ref.split("@", 1)[0]
    last_slash = name.rfind("/")
    if ":" in name[last_slash + 1:]:
        name = name[:name.rfind(":")]
    parts = name.split("/")
    if parts[-1] != "pytorch":
        return False
    # Docker Hub's pytorch/pytorch (also written docker.io/pytorch/pytorch) is not an NGC image
    path = parts[1:] if len(parts) > 2 and ("." in parts[0] or ":" in parts[0]) else parts
    if parts[0] in ("docker.io", "index.docker.io", "registry-1.docker.io"):
        path = parts[1:]
    return path != ["pytorch", "pytorch"]


def layer_facts(ws: Workspace, texts: GraphTexts | None = None) -> dict[str, LayerFacts]:
    """Facts for every layer of the workspace, parents evaluated before children.

    Linear in the number of layers: each is evaluated once, from its parent's facts, and each
    graph file is indexed once (`texts`). Iterative, so a chain of any length needs no recursion.
    """
    layers = ws.layers
    texts = texts or GraphTexts()
    facts: dict[str, LayerFacts] = {}
    for start in layers:
        # the not yet evaluated part of the chain above `start`, nearest first
        pending: list[Layer] = []
        seen: set[str] = set()
        qualname: str | None = start
        while qualname is not None and qualname not in facts:
            layer = layers.get(qualname)
            if layer is None or qualname in seen:  # unknown parent or a cycle: the loader reports those
                pending = []
                break
            seen.add(qualname)
            pending.append(layer)
            qualname = layer.parent
        for layer in reversed(pending):
            facts[layer.qualname] = _facts(ws, layer, facts.get(layer.parent) if layer.parent else None, texts)
    return facts


def _facts(ws: Workspace, layer: Layer, parent: LayerFacts | None, texts: GraphTexts) -> LayerFacts:
    if parent is not None:
        env_before: Mapping[str, str] = parent.evaluated.env_after
        installer_before = parent.installer_before or parent.installer_here
        ngc = parent.ngc
    else:
        env_before, installer_before = {}, False
        ngc = layer.base is not None and is_ngc_ref(layer.base.ref)
    evaluated = evaluate(layer.dockerfile, layer.args_dict, env_before)
    return LayerFacts(
        layer=layer, evaluated=evaluated, locator=locator_for(ws, layer, texts), settings=ws.settings,
        ngc=ngc, installer_before=installer_before, env_before=env_before,
    )
