"""Layer keys: blake3 over a canonical, versioned encoding of everything that decides a layer.

Inputs: the parent's key (or the base reference and, when known, its digest), the Dockerfile text,
build args, target platform, and each context file's relative path, mode and content hash. No
absolute paths, mtimes, owners or hostnames, and mode is reduced to what git keeps (executable or
not), so the same inputs give the same key on any machine and checkout.

Pure: the context's entries come hashed from `efabuild.make.context`, which reads the files.
"""

from __future__ import annotations

import functools
import itertools
import json
from typing import Any, NamedTuple

import blake3

from efabuild.redact import shown_args, shown_dockerfile

KEY_SCHEMA = "efabuild.layer/v1"


class ContextEntry(NamedTuple):
    """One context file. A tuple, not an attrs class: a plan makes one per context file (10k and
    more), and a tuple is made several times faster; ordered by path first."""

    path: str  # workspace-relative, '/'-separated
    mode: str  # "644", "755" or "symlink"
    digest: str  # blake3 hex of the content (of the link target text for a symlink)


class _Inputs(NamedTuple):
    dockerfile: str
    platform: str
    parent_key: str | None = None
    base_ref: str | None = None
    base_digest: str | None = None
    args: tuple[tuple[str, str], ...] = ()
    context: tuple[ContextEntry, ...] = ()
    secrets: tuple[str, ...] = ()  # BuildKit secrets by name: their values are never an input
    exclude: tuple[str, ...] = ()  # the layer's `exclude` patterns


class LayerInputs(_Inputs):
    """What a key is made of; recorded beside each build so a later plan can say what changed.
    A subclass of its fields' tuple, so that it has a __dict__ to keep its key in."""

    def to_dict(self) -> dict[str, Any]:
        return self._dict(list(map(list, self.context)))  # [path, mode, digest] each

    def _dict(self, context: list[list[str]] | None) -> dict[str, Any]:
        data = {
            "schema": KEY_SCHEMA,
            "parent_key": self.parent_key,
            "base": {"ref": self.base_ref, "digest": self.base_digest} if self.base_ref else None,
            "dockerfile": self.dockerfile,
            "args": dict(self.args),
            "platform": self.platform,
            "context": context,
        }
        if self.secrets:  # absent when none, so the keys of layers without secrets stay as they were
            data["secrets"] = list(self.secrets)
        if self.exclude:  # likewise: absent when none
            data["exclude"] = list(self.exclude)
        return data

    def to_shown_dict(self) -> dict[str, Any]:
        """to_dict() with secret-looking build args and ARG/ENV defaults replaced by a digest: for
        output and records."""
        data = self.to_dict()
        data["args"] = shown_args(data["args"])
        data["dockerfile"] = shown_dockerfile(data["dockerfile"])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerInputs:
        base = data.get("base") or {}
        return cls(
            dockerfile=data["dockerfile"], platform=data["platform"], parent_key=data.get("parent_key"),
            base_ref=base.get("ref"), base_digest=base.get("digest"),
            args=tuple(sorted(data.get("args", {}).items())),
            context=tuple(ContextEntry(*entry) for entry in data.get("context", [])),
            secrets=tuple(data.get("secrets", ())), exclude=tuple(data.get("exclude", ())),
        )

    def canonical(self) -> bytes:
        """canonical_json(self.to_dict()), byte for byte. The context, nearly all of a large
        layer's encoding, is written by _context_json; the keys around it sort before and after
        "context" (`args` and `base` before, `dockerfile` and `schema` after: never empty)."""
        data = self._dict(None)
        before = canonical_json({name: value for name, value in data.items() if name < "context"})
        after = canonical_json({name: value for name, value in data.items() if name > "context"})
        return b"".join((before[:-1], b',"context":', _context_json(self.context), b",", after[1:]))

    def key(self) -> str:
        return self._key

    @functools.cached_property
    def _key(self) -> str:
        # computed once: a plan asks for each key several times, and encoding a context of
        # 100k files costs tens of milliseconds each time
        return blake3.blake3(self.canonical()).hexdigest()


def _context_json(entries: tuple[ContextEntry, ...]) -> bytes:
    """canonical_json of the entries as [path, mode, digest] lists, by joins in C: a third fewer
    instructions than the encoder's value-by-value walk. When some field needs an escape (a quote,
    a backslash, a control character) the encoder writes them all, as it would anyway."""
    text = "".join(itertools.chain.from_iterable(entries)).encode("utf-8")
    if not entries or len(text.translate(None, _ESCAPED)) != len(text):
        return canonical_json(list(map(list, entries)))
    return b"".join((b'[["', '"],["'.join(map('","'.join, entries)).encode("utf-8"), b'"]]'))


_ESCAPED = bytes(range(0x20)) + b'"\\'  # what JSON escapes in a string (json.dumps, ensure_ascii=False)


def canonical_json(value: Any) -> bytes:
    # check_circular=False: the same bytes without a lookup per list and dict to catch a cycle
    # (inputs are trees); a sixth less of encoding a large context
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      check_circular=False).encode("utf-8")
