"""NCCL settings in the image's ENV that push NCCL off the EFA path (EFA006, EFA007); job scripts
are checked with the same `nccl_env_problems`."""

from __future__ import annotations

from collections.abc import Iterator

from efabuild.lint.chain import LayerFacts
from efabuild.lint.finding import Finding
from efabuild.lint.rules.registry import at, rule
from efabuild.nccl import forces_other_network, is_infiniband_setting, is_ofi_plugin


# --- EFA006 / EFA007: NCCL environment ------------------------------------------------------------


def nccl_env_problems(name: str, value: str) -> tuple[str, str, str] | None:
    """(rule, message, fix) when an NCCL setting pushes NCCL off the EFA path; None when fine.

    Used for image ENV and for variables exported by job scripts. Never echoes anything but the
    variable's own value, and only for NCCL_* names.
    """
    if name == "NCCL_NET_PLUGIN" and not is_ofi_plugin(value):
        what = "removes NCCL_NET_PLUGIN" if not value else f"sets NCCL_NET_PLUGIN={value}"
        return ("EFA006",
                f"{what}: the default libnccl-net.so in the image is the InfiniBand plugin; only 'ofi' "
                "selects aws-ofi-nccl and the EFA path (else NCCL falls back to TCP sockets)",
                "keep NCCL_NET_PLUGIN=ofi (the NGC base sets it)")
    if forces_other_network(name, value):
        return ("EFA007", f"NCCL_NET={value} forces a network other than EFA's Libfabric",
                "remove NCCL_NET (or set it to Libfabric)")
    if is_infiniband_setting(name, value):
        return ("EFA007",
                f"{name} is an InfiniBand/SHARP setting: leftovers like it push NCCL off EFA or do nothing",
                f"remove {name}")
    return None


def _env_findings(facts: LayerFacts, rule_id: str) -> Iterator[Finding]:
    """The layer's ENV settings that `nccl_env_problems` files under `rule_id`."""
    for env in facts.evaluated.envs:
        problem = nccl_env_problems(env.name, env.value)
        if problem and problem[0] == rule_id:
            yield at(facts, rule_id, env.line, problem[1], problem[2])


@rule("EFA006")
def nccl_net_plugin(facts: LayerFacts) -> Iterator[Finding]:
    return _env_findings(facts, "EFA006")


@rule("EFA007")
def infiniband_nccl_settings(facts: LayerFacts) -> Iterator[Finding]:
    return _env_findings(facts, "EFA007")
