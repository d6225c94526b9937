"""Which builder builds which platform: what each builder runs natively, and the check, before any
build, that every platform to build has one (or may be emulated).

A builder's native platforms are what it declares (`[builder] farm` entries `NAME@linux/arm64`)
or, undeclared, its engine's own os/arch. BuildKit's platform list is no answer: once QEMU is
registered in binfmt_misc it lists every emulated platform too, and an emulated build of a CUDA
stack is many times slower; only `[builder] emulate` lets a platform fall back to QEMU.
"""

from __future__ import annotations

from efabuild.engine.client import connect
from efabuild.errors import InputError
from efabuild.make.farm import node_platforms, node_settings
from efabuild.plan import BUILD
from efabuild.settings import BuilderSettings


def native_platforms(settings: BuilderSettings, engine, nodes=None) -> set[str]:  # noqa: ANN001
    """Every platform some builder of this make runs natively: each farm node's (declared, or
    its engine's when undeclared), else the one engine's. `nodes`: the farm's engines when
    already connected."""
    if settings.farm and nodes is None:
        nodes = [connect(node_settings(entry, settings), farm_entry=entry) for entry in settings.farm]
    if settings.farm:
        return {p for node in nodes for p in node_platforms(node)}
    return set(node_platforms(engine)) if engine is not None else set()


def check_platforms(prepared, native: set[str]) -> None:  # noqa: ANN001 - a Prepared
    """One line, before any build, when a layer to build is for a platform no builder runs
    natively and [builder] emulate does not allow QEMU for it."""
    allowed = set(prepared.ws.settings.builder.emulate)
    for lp in prepared.plan.layers:
        if lp.action == BUILD and lp.platform not in native and lp.platform not in allowed:
            shown = ", ".join(sorted(native)) or "none"
            raise InputError(
                f"{lp.qualname}: no builder runs {lp.platform} (native: {shown}); add a builder of it to "
                f"[builder] farm (e.g. \"buildx:NAME@{lp.platform}\"), or allow QEMU emulation, many times "
                f"slower: emulate = [\"{lp.platform}\"]", "BUILD.toml: builder")
