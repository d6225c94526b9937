"""Another machine's directories and downloads in a layer built for one platform (EFA021, EFA022).

The platforms are the layer's (the workspace's `[builder] platforms`, as its graph or the layer
narrows them): each is judged, and a name is foreign to one machine only. An arm64 (Grace) loader skips x86_64
libraries without an error, so an `LD_LIBRARY_PATH` naming only
/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu leaves NCCL without aws-ofi-nccl on arm64 (it falls
back to another plugin or TCP sockets); awsome-distributed-training's nccl-tests image names both
triplets' directories so one ENV serves both. A download or path with `x86_64`/`amd64` written
into a RUN brings an x86_64 program into an arm64 image (NVIDIA's arm64 server repositories say
`sbsa`). Both checks are symmetric: aarch64 names in an amd64 layer are found the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from efabuild.lint.chain import LayerFacts
from efabuild.lint.finding import Finding
from efabuild.lint.rules.registry import at, rule
from efabuild.provenance import elf
from efabuild.redact import secret_value

# how each machine is spelled in triplets, download URLs and package file names
_SPELLINGS = {"x86_64": ("x86_64", "amd64"), "aarch64": ("aarch64", "arm64", "sbsa")}


def _whole_words(names: list[str]) -> re.Pattern[str]:
    return re.compile(r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, names)) + r")(?![A-Za-z0-9])")


# per machine: the other machines' spellings
_FOREIGN = {m: _whole_words([n for other, names in _SPELLINGS.items() if other != m for n in names])
            for m in _SPELLINGS}
_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/]*@")
_FILE_NAME = re.compile(r"\.(?:deb|rpm|tar|tgz|gz|xz|bz2|zst|zip|sh|run|whl|so|bin|AppImage)\b")


def _platform_machines(facts: LayerFacts) -> list[tuple[str, str]]:
    """(platform, machine) of every platform the layer is built for (its own list, resolved by the
    workspace loader; the workspace's first platform for a layer made by hand)."""
    found = []
    for platform in facts.layer.platforms or (facts.settings.builder.platform,):
        machine = elf.machine_of_platform(platform)
        if machine:
            found.append((platform, machine))
    return found


# --- EFA021: another machine's triplet directory on a search path ---------------------------------
@rule("EFA021")
def foreign_triplet_directory(facts: LayerFacts) -> Iterator[Finding]:
    # an entry is foreign to one machine only: no finding comes twice
    for platform, machine in _platform_machines(facts):
        yield from _foreign_triplets(facts, platform, machine)


def _foreign_triplets(facts: LayerFacts, platform: str, machine: str) -> Iterator[Finding]:
    own = elf.triplet(machine)
    foreign = [t for t in elf.TRIPLETS if t != own]
    for env in facts.evaluated.envs:
        entries = [e.rstrip("/") for e in env.value.split(":")]
        present = set(entries)  # a value of thousands of entries: each twin looked up at once
        inherited = set(facts.env_before.get(env.name, "").split(":"))
        for entry in entries:
            if entry in inherited or not entry.startswith("/"):
                continue
            parts = entry.split("/")
            for other in foreign:
                if other not in parts:
                    continue
                twin = "/".join(own if p == other else p for p in parts)
                if twin in present:
                    continue  # both machines' directories: the portable form
                yield at(facts, "EFA021", env.line,
                         f"{env.name} names {entry} ({other}) but not {twin}: this layer builds "
                         f"for {platform}, whose loader skips {other.split('-')[0]} libraries: what is only "
                         "there (aws-ofi-nccl, a libfabric provider) is not loaded, and NCCL falls back without "
                         "an error",
                         f"name {twin} (or both, as `ENV {env.name}={twin}:{entry}:${{{env.name}}}`)")
                break


# --- EFA022: another machine's download or path written into a RUN --------------------------------
@rule("EFA022")
def foreign_machine_download(facts: LayerFacts) -> Iterator[Finding]:
    for platform, machine in _platform_machines(facts):
        yield from _foreign_downloads(facts, platform, machine)


def _foreign_downloads(facts: LayerFacts, platform: str, machine: str) -> Iterator[Finding]:
    pattern = _FOREIGN[machine]
    for rc in facts.evaluated.runs:
        for word in rc.command.argv:
            if not ("://" in word or word.startswith("/") or _FILE_NAME.search(word)):
                continue  # `dpkg --add-architecture amd64`, a case pattern: not a download or path
            hit = pattern.search(word)
            if hit is None:
                continue
            yield at(facts, "EFA022", rc.line,
                     f"{_shown(word)} names {hit.group(1)} in a layer built for {platform}: it fetches or uses "
                     f"another machine's file, which the {elf.architecture(machine)} image cannot run",
                     "derive the machine from the build: `ARG TARGETARCH` (amd64/arm64) or `$(uname -m)` "
                     "(x86_64/aarch64)")
            break


def _shown(word: str) -> str:
    """The word as quoted in a finding: never a URL's credentials or a secret-looking literal."""
    if secret_value(word) or _USERINFO.match(word):
        return "a URL with credentials (not shown)"
    return f"'{word[:157]}...'" if len(word) > 160 else f"'{word}'"
