"""Platforms of a name: the `NAME@os/arch` spelling, the node's platform from its machine, and the
per-name platform index a make publishes (which key each platform of one name has).

The index is a small JSON object, in the spirit of an OCI image index:

    {"created": "...", "name": "demo:train", "platforms": {"linux/amd64": KEY, "linux/arm64": KEY},
     "version": 1}

stored as canonical bytes and addressed by their sha256 (hashlib: lookup's fast path checks it
without loading blake3). Pure and stdlib only: `efabuild lookup` imports this on its fast path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from efabuild.display import shown
from efabuild.errors import EfabuildError, InputError, NotFound
from efabuild.grammar import PLATFORM, platform_problem
from efabuild.refs import NAME_PART, is_key

MARK = "@"  # `demo:train@linux/arm64`: one platform of a name
PLATFORM_ENV = "EFABUILD_PLATFORM"
INDEX_VERSION = 1
INDEX_LIMIT = 64 << 10  # an index of a few platforms is a few hundred bytes
MAX_PLATFORMS = 64
INDEX_PAYLOAD_TYPE = "application/vnd.efabuild.platform-index+json"  # its DSSE envelope's
# `uname -m` -> the architecture of a container platform, as Enroot maps it (enroot's
# common.sh: x86_64 -> amd64, aarch64 -> arm64; others keep their name)
MACHINE_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
                "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}


def platform_of_machine(machine: str) -> str:
    """`uname -m` of a Linux node -> its platform (`x86_64` -> `linux/amd64`)."""
    arch = MACHINE_ARCH.get(machine)
    if arch is None:
        raise EfabuildError(f"no container platform for this machine ({machine[:40]!r} from uname -m): "
                            f"set {PLATFORM_ENV}=os/arch")
    return f"linux/{arch}"


def _brief(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def checked_platform(value: str, where: str) -> str:
    """`value` when it is os/arch[/variant]; one InputError naming `where` otherwise."""
    problem = platform_problem(value) if isinstance(value, str) and len(value) <= 64 else "must be os/arch[/variant]"
    if problem:
        raise InputError(f"{problem}, not {_brief(value)}", where)
    return value


def wanted_platform(environ: Mapping[str, str], machine: str, explicit: str | None = None) -> tuple[str, bool]:
    """(the platform to pick, whether it was asked for: `@os/arch` or --platform, not the
    environment or the machine): explicit, else $EFABUILD_PLATFORM, else the machine's."""
    if explicit:
        return checked_platform(explicit, "--platform"), True
    value = environ.get(PLATFORM_ENV)
    if value:
        return checked_platform(value, PLATFORM_ENV), False
    return platform_of_machine(machine), False


def split_platform(ref: str) -> tuple[str, str | None]:
    """`demo:train@linux/arm64` -> ('demo:train', 'linux/arm64'); a ref without `@` is itself.
    A key or key prefix names one artifact already: `@` goes with a name only."""
    name, mark, platform = ref.partition(MARK)
    if not mark:
        return ref, None
    if ":" not in name:
        raise InputError(f"{_brief(ref)}: a key names one artifact of one platform; @os/arch goes with a "
                         f"graph:layer name")
    return name, checked_platform(platform, shown(ref if len(ref) <= 120 else ref[:117] + "..."))


def with_platform(name: str, platform: str) -> str:
    return f"{name}{MARK}{platform}"


# ---- the index
def index_bytes(name: str, platforms: Mapping[str, str], created: str) -> bytes:
    """The canonical bytes of an index (sorted keys, compact, a newline): its sha256 names it."""
    data = {"created": created, "name": name, "platforms": dict(sorted(platforms.items())),
            "version": INDEX_VERSION}
    problems = index_problems(data)
    if problems:
        raise EfabuildError(f"platform index of {name}: {problems[0]}")
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def index_digest(data: bytes) -> str:
    import hashlib  # only for a name with an index: OpenSSL's is a few ms of a plain lookup's start

    return hashlib.sha256(data).hexdigest()


def primary_key(index: Mapping) -> str:
    """The key a name's history entry carries beside its index: the first platform's, for readers
    that know no index."""
    return index["platforms"][min(index["platforms"])]


def parse_index(data: bytes, digest: str, where: str) -> dict:
    """An index read from a store: the bytes its history entry names (sha256), a JSON object of
    the form above; one EfabuildError naming `where` otherwise."""
    if len(data) > INDEX_LIMIT:
        raise EfabuildError(f"{where}: {len(data)} bytes, larger than any platform index efabuild writes")
    if index_digest(data) != digest:
        raise EfabuildError(f"{where}: its sha256 is not the {digest[:12]} its name's history names "
                            f"(damaged or rewritten)")
    try:
        index = json.loads(data)
    except (ValueError, RecursionError):
        raise EfabuildError(f"{where}: not a JSON platform index") from None
    problems = index_problems(index)
    if problems:
        raise EfabuildError(f"{where}: {problems[0]}")
    return index


def index_problems(index: object) -> list[str]:
    """What is wrong with an index's fields ([] when nothing): never trusted as written."""
    if not isinstance(index, dict):
        return ["not a JSON object"]
    if index.get("version") != INDEX_VERSION:
        return [f"version {_brief(str(index.get('version')))}, not {INDEX_VERSION}"]
    name = index.get("name")
    graph, sep, layer = name.partition(":") if isinstance(name, str) else ("", "", "")
    if not (sep and NAME_PART.fullmatch(graph) and NAME_PART.fullmatch(layer)):
        return [f"name {_brief(str(name))} is not graph:layer"]
    if not isinstance(index.get("created"), str):
        return ["created is not a time"]
    platforms = index.get("platforms")
    if not isinstance(platforms, dict) or not platforms or len(platforms) > MAX_PLATFORMS:
        return [f"platforms is not a table of 1 to {MAX_PLATFORMS} platforms and keys"]
    for platform, key in platforms.items():
        if not PLATFORM.fullmatch(platform) or len(platform) > 64:
            return [f"platform {_brief(platform)} is not os/arch[/variant]"]
        if not is_key(key):
            return [f"the key of {platform} is not 64 lowercase hex characters"]
    return []


class MissingPlatform(NotFound):
    """A name that has artifacts, none for the platform wanted. Exit status 1, like an absent one."""


def pick(index: Mapping, platform: str, from_env: bool = False) -> str:
    """The key of `platform` in a checked index; MissingPlatform naming the platforms it has."""
    key = index["platforms"].get(platform)
    if key is None:
        raise MissingPlatform(missing_platform(index["name"], platform, sorted(index["platforms"]), from_env))
    return key


def missing_platform(name: str, platform: str, has: list[str], from_env: bool = False) -> str:
    """Why `name` gives no artifact; `from_env`: $EFABUILD_PLATFORM chose `platform`, not the node."""
    if from_env:
        return (f"{name} has no {platform} artifact (it has {', '.join(has) or 'no platform'}); {PLATFORM_ENV} "
                f"chose {platform}: unset it for this node's platform, or build {platform} with [builder] platforms")
    return (f"{name} has no {platform} artifact (it has {', '.join(has) or 'no platform'}); build it with "
            f"[builder] platforms or set {PLATFORM_ENV}")


def record_disagrees(record: Mapping, name: str, platform: str) -> str | None:
    """Why the record of the key an index names is not that name's artifact for that platform
    (None when it is): an index is never trusted alone, nor the record alone."""
    if record.get("name") != name:
        return f"names {str(record.get('name'))[:80]!r}, not {name}"
    if record.get("platform") != platform:
        shown = record.get("platform")
        return f"is for {shown if isinstance(shown, str) else 'no recorded platform'}, not {platform}"
    return None
