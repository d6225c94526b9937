"""Layer keys and the names people and engines give them: short keys, prefixes, graph:layer
names, and the engine tag of a finished layer.

Pure and stdlib only: `efabuild lookup` imports this on its fast path.
"""

from __future__ import annotations

import re

from efabuild.errors import EfabuildError, InputError

KEY_LENGTH = 64
SHORT_KEY_LENGTH = 12
MIN_PREFIX_LENGTH = 8
IMAGE_REPO = "efabuild"
KEY_LABEL = "org.efabuild.key"  # on every layer image: the key it was built for
GRAPH_LABEL = "org.efabuild.graph"
LAYER_LABEL = "org.efabuild.layer"
TITLE_LABEL = "org.opencontainers.image.title"  # the layer's graph:layer
SOURCE_LABEL = "org.opencontainers.image.source"  # the workspace's git remote
REVISION_LABEL = "org.opencontainers.image.revision"  # the workspace's git HEAD
# Labels a build sets from what is no input of the key (the layer's name, the workspace's git
# state): on the engine's image for `docker inspect` and registries, but never in a .sqsh, whose
# bytes the key alone decides (the revision goes to the provenance manifest instead).
UNKEYED_LABELS = frozenset((GRAPH_LABEL, LAYER_LABEL, TITLE_LABEL, SOURCE_LABEL, REVISION_LABEL))
KEY_TAG = re.compile(r"^[0-9a-f]{64}$")

_HEX = frozenset("0123456789abcdef")
# graph and layer names become path components: no separators, no leading dot
NAME_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


class AmbiguousRef(EfabuildError):
    """A key prefix matches several artifacts. Exit status 1, like an absent artifact."""


def is_hex(text: str) -> bool:
    return bool(text) and all(c in _HEX for c in text)


def is_key(text: object) -> bool:
    return isinstance(text, str) and len(text) == KEY_LENGTH and is_hex(text)


def short(key: str) -> str:
    return key[:SHORT_KEY_LENGTH]


def check_key(key: str) -> str:
    if not is_key(key):
        raise InputError(f"not a layer key (64 lowercase hex characters): {key!r}")
    return key


def split_name(name: str, where: str | None = None) -> tuple[str, str]:
    """'graph:layer' -> ('graph', 'layer'), both safe as path components."""
    graph, sep, layer = name.partition(":")
    if not sep or not NAME_PART.fullmatch(graph) or not NAME_PART.fullmatch(layer):
        raise InputError(
            f"not an artifact name of the form graph:layer (letters, digits, _ . + -): {name!r}",
            where,
        )
    return graph, layer


def classify_ref(ref: str) -> tuple[str, str]:
    """What a user typed: ('key', key), ('prefix', hex) or ('name', 'graph:layer')."""
    if ":" in ref:
        split_name(ref)
        return "name", ref
    lowered = ref.lower()
    if is_hex(lowered):
        if len(lowered) == KEY_LENGTH:
            return "key", lowered
        if len(lowered) > KEY_LENGTH:
            raise InputError(f"too long for a layer key ({len(ref)} > {KEY_LENGTH} hex characters): {ref!r}")
        if len(lowered) < MIN_PREFIX_LENGTH:
            raise InputError(
                f"key prefix {ref!r} is too short: give at least {MIN_PREFIX_LENGTH} hex characters"
            )
        return "prefix", lowered
    raise InputError(f"not a key, key prefix (≥ {MIN_PREFIX_LENGTH} hex) or graph:layer name: {ref!r}")


def pick_one(ref: str, candidates: list[str] | set[str]) -> str | None:
    """The single key a prefix matched; None for no match; AmbiguousRef for several."""
    unique = sorted(set(candidates))
    if len(unique) > 1:
        shown = ", ".join(short(k) for k in unique[:5]) + (", ..." if len(unique) > 5 else "")
        raise AmbiguousRef(f"key prefix {ref} is ambiguous: {len(unique)} artifacts match ({shown})")
    return unique[0] if unique else None


def image_tag(layer_name: str, key: str) -> str:
    """The engine tag of a finished layer: `efabuild/<layer>:<key>`."""
    return f"{IMAGE_REPO}/{layer_name}:{key}"


PLATFORM_MARK = "@"  # `demo:train@linux/arm64`: a layer on one platform of a several-platform workspace


def on_platform(qualname: str, platform: str, several: bool) -> str:
    """The name of `qualname` built for `platform`: itself in a one-platform workspace (its names
    and records stay as they were), `graph:layer@os/arch` when the workspace has several."""
    return f"{qualname}{PLATFORM_MARK}{platform}" if several else qualname


def layer_of(name: str) -> str:
    """`demo:train@linux/arm64` → `demo:train` (a name without a platform is itself)."""
    return name.partition(PLATFORM_MARK)[0]
