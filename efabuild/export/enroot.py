"""The files Enroot writes into a rootfs from an image's config, as pure text.

`enroot import` turns the image config (Env, Labels, WorkingDir, Entrypoint, Cmd, Volumes) into
`/etc/environment`, `/etc/rc`, `/etc/rc.local` and `/etc/fstab`, overwriting the image's own, and
creates the working directory. Pyxis and `enroot start` read these files, so an exported `.sqsh`
must carry them byte for byte as Enroot would write them. Enroot builds them with jq and a bash
here-document; the quirks kept below (label order, label newlines as spaces, argument quoting with bash's `${x@Q}`, the
`/bin/sh` default, the literal `${ENROOT_ROOTFS}` in fstab) are Enroot's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

ENVIRONMENT = "etc/environment"
RC = "etc/rc"
RC_LOCAL = "etc/rc.local"
FSTAB = "etc/fstab"

RC_LOCAL_TEXT = (
    "# This file is sourced by /etc/rc when the container starts.\n"
    "# It can be used to manipulate the entrypoint or the command of the container.\n"
)

# bash's $'...' escapes (ansic_quote); other control bytes become 3-digit octal
_ANSI_C_ESCAPES = {
    "\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
    "\x1b": "\\E", "\\": "\\\\", "'": "\\'",
}


def _strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):  # a shell-form string stays one word, as in the JSON array
        return (value,)
    return tuple(str(v) for v in value)


@attrs.frozen
class ImageConfig:
    """The parts of an image config that Enroot turns into files."""

    env: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()  # sorted by key, as `docker inspect` prints them
    working_dir: str = ""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    volumes: tuple[str, ...] = ()  # sorted, as jq's `keys` gives them

    @classmethod
    def from_docker(cls, config: Mapping[str, Any] | None) -> ImageConfig:
        """From the `Config` object of `docker image inspect` (keys in Docker's or lower case)."""
        lowered = {str(k).lower(): v for k, v in (config or {}).items()}
        labels = lowered.get("labels") or {}
        volumes = lowered.get("volumes") or {}
        return cls(
            env=_strings(lowered.get("env")),
            labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
            working_dir=str(lowered.get("workingdir") or ""),
            entrypoint=_strings(lowered.get("entrypoint")),
            cmd=_strings(lowered.get("cmd")),
            volumes=tuple(sorted(str(v) for v in volumes)),
        )

    def without_labels(self, names: Iterable[str]) -> ImageConfig:
        """The same config without the labels `names`."""
        names = frozenset(names)
        return attrs.evolve(self, labels=tuple(item for item in self.labels if item[0] not in names))

    @property
    def workdir(self) -> str:
        """The directory /etc/rc changes to; Enroot creates it in the rootfs."""
        return self.working_dir or "/"


def bash_quote(word: str) -> str:
    """Quote one word as bash 5's `${word@Q}` does in a UTF-8 locale."""
    if word == "'":  # bash special-cases a lone quote (sh_single_quote)
        return "\\'"
    if not any(_needs_ansi_c(ch) for ch in word):
        return "'" + word.replace("'", "'\\''") + "'"
    out = []
    for ch in word:
        if ch in _ANSI_C_ESCAPES:
            out.append(_ANSI_C_ESCAPES[ch])
        elif _needs_ansi_c(ch):
            out.extend(f"\\{b:03o}" for b in ch.encode("utf-8", "surrogateescape"))
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def _needs_ansi_c(ch: str) -> bool:
    if ord(ch) < 0x80:
        return not (0x20 <= ord(ch) < 0x7F)
    # undecodable bytes arrive as lone surrogates; bash prints them in octal too
    return not ch.isprintable() or 0xDC80 <= ord(ch) <= 0xDCFF


def _lines(words: Iterable[str]) -> list[str]:
    """Enroot reads arrays back with `readarray -t` from jq's one-per-line output: a word holding
    a newline becomes several words."""
    words = list(words)
    return "\n".join(words).split("\n") if words else []


def _quoted(words: list[str]) -> str:
    return " ".join(bash_quote(w) for w in words)


def environment_text(cfg: ImageConfig) -> str:
    return "".join(f"{line}\n" for line in cfg.env)


def fstab_text(cfg: ImageConfig) -> str:
    # `${ENROOT_ROOTFS}` is literal: Enroot expands it when it reads the fstab at start
    return "".join(
        f"${{ENROOT_ROOTFS}}{v} {v} none x-create=dir,bind,rw,nosuid,nodev\n" for v in cfg.volumes
    )


def rc_text(cfg: ImageConfig) -> str:
    entrypoint, cmd = _lines(cfg.entrypoint), _lines(cfg.cmd)
    if not entrypoint and not cmd:
        cmd = ["/bin/sh"]
    # Enroot ≥ 4.1.2 writes a label's newlines as spaces: each label stays one comment line
    head = "".join(f"# {key} {value.replace(chr(10), ' ')}\n" for key, value in cfg.labels)
    if head:
        head += "\n"
    ep, args = _quoted(entrypoint), _quoted(cmd)
    workdir = cfg.workdir
    return head + (
        f'mkdir -p "{workdir}" 2> /dev/null\n'
        f'cd "{workdir}" && unset OLDPWD || exit 1\n'
        "\n"
        "if [ -s /etc/rc.local ]; then\n"
        "    . /etc/rc.local\n"
        "fi\n"
        "\n"
        "if [ $# -gt 0 ]; then\n"
        f'    exec {ep} "$@"\n'
        "else\n"
        f"    exec {ep} {args}\n"
        "fi\n"
    )


def enroot_files(cfg: ImageConfig) -> dict[str, str]:
    """rootfs-relative path → text of every file Enroot writes from the config."""
    return {
        FSTAB: fstab_text(cfg),
        ENVIRONMENT: environment_text(cfg),
        RC: rc_text(cfg),
        RC_LOCAL: RC_LOCAL_TEXT,
    }
