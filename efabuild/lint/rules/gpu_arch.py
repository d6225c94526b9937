"""Kernels compiled for no GPU of the nodes a layer is built for (EFA023).

The guide builds DeepEP with `TORCH_CUDA_ARCH_LIST=10.0` for the node's own GPU (B200): kernels
compiled for a list without the node's architecture do not run there ("no kernel image is
available for execution on the device"). A layer built only for arm64 runs only on Grace nodes,
whose GPUs are Grace Hopper (GH200: 9.0) and Grace Blackwell (GB200: 10.0); a layer built for
x86_64 too may serve H100 or B200 nodes with either list, and is left alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from efabuild.lint.chain import LayerFacts
from efabuild.lint.finding import Finding
from efabuild.lint.rules.registry import at, layer_platforms, rule
from efabuild.provenance import elf

GRACE_ARCHS = {"9.0": "GH200", "10.0": "GB200"}
# an entry of the list: `9.0`, `9.0a` (arch-specific features), `10.0+PTX`
_ARCH_ENTRY = re.compile(r"^([0-9]+\.[0-9]+)[a-z]?(?:\+PTX)?$")


@rule("EFA023")
def torch_arch_without_grace(facts: LayerFacts) -> Iterator[Finding]:
    platforms = layer_platforms(facts)
    if any(elf.machine_of_platform(platform) != "aarch64" for platform in platforms):
        return
    for env in facts.evaluated.envs:
        if env.name != "TORCH_CUDA_ARCH_LIST" or "$" in env.value:
            continue
        archs = {m.group(1) for entry in re.split(r"[;\s,]+", env.value) if (m := _ARCH_ENTRY.match(entry))}
        if archs & set(GRACE_ARCHS):
            continue
        shown = env.value if len(env.value) <= 80 else env.value[:77] + "..."
        yield at(facts, "EFA023", env.line,
                 f"TORCH_CUDA_ARCH_LIST={shown!r} names neither 9.0 (GH200) nor 10.0 (GB200), the GPUs of the "
                 f"{', '.join(platforms)} nodes this layer is built only for: kernels compiled here would not run "
                 "there (no kernel image is available for execution on the device)",
                 "name the partition's GPU: `ENV TORCH_CUDA_ARCH_LIST=10.0` for GB200, `9.0` for GH200, or both")
