"""Which values are secrets, and how they are shown: never their value.

Secrets do not belong in build args (lint rule EFA013 says so, and offers a layer's `secrets`,
passed to BuildKit as secrets). When one is in a build arg anyway, plans, build records and
manifests show a short digest instead, so a change is still visible; and since BuildKit expands
ARG values into its step names (`RUN echo "$HF_TOKEN"` is logged with the value), every line of a
build's output, failure message and summary goes through a Redactor that knows the values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import blake3

SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "ACCESS_KEY", "PRIVATE")
REDACTED = "<redacted>"
# shorter values are not redacted: replacing every "1" or "ab" in a log would hide the log itself
MIN_REDACTED_CHARS = 4

_SECRET_NAME_PARTS = {"TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL",
                      "CREDENTIALS", "APIKEY"}
_SECRET_NAME_PAIRS = {("API", "KEY"), ("ACCESS", "KEY"), ("PRIVATE", "KEY"), ("SECRET", "KEY"),
                      ("AUTH", "KEY"), ("SESSION", "KEY")}
SECRET_VALUE = re.compile(
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"  # AWS access key id
    r"|\bgh[pousr]_[A-Za-z0-9]{36,}"  # GitHub tokens
    r"|\bgithub_pat_[A-Za-z0-9_]{22,}"
    r"|\bhf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|\bnvapi-[A-Za-z0-9_-]{20,}"  # NGC API key
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|\bsk-[A-Za-z0-9_-]{32,}"  # OpenAI-style
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|://[^/\s:@]+:[^/\s@]+@"  # user:password@ in a URL
)


def secret_name(name: str) -> bool:
    """A name whose words say it holds a secret (HF_TOKEN, AWS_SECRET_ACCESS_KEY, DB_PASSWORD)."""
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", name.upper()) if p]
    if any(part in _SECRET_NAME_PARTS for part in parts):
        return True
    return any(pair in _SECRET_NAME_PAIRS for pair in zip(parts, parts[1:]))


def secret_value(value: str) -> bool:
    """A value shaped like a known kind of credential."""
    return SECRET_VALUE.search(value) is not None


def is_secret_name(name: str) -> bool:
    return secret_name(name) or any(word in name.upper() for word in SECRET_WORDS)


def is_secret_arg(name: str, value: str) -> bool:
    return is_secret_name(name) or secret_value(value)


def shown_value(name: str, value: str) -> str:
    """`value`, or for a secret a stand-in that changes when the value changes (idempotent)."""
    if not is_secret_arg(name, value) or _is_stand_in(value):
        return value
    return f"<redacted {blake3.blake3(f'{name}={value}'.encode()).hexdigest()[:12]}>"


def shown_args(args: dict[str, str]) -> dict[str, str]:
    return {name: shown_value(name, value) for name, value in args.items()}


# `ARG NAME=value` / `ENV NAME=value` (one pair per line, optionally quoted): defaults that lint's
# EFA013 refuses, hidden in output all the same when a build goes ahead with --no-lint
_DOCKERFILE_PAIR = re.compile(r"""^\s*(?:ARG|ENV)\s+([A-Za-z_][A-Za-z0-9_]*)=(["']?)(.*?)\2\s*$""",
                              re.IGNORECASE | re.MULTILINE)


def dockerfile_secret_values(text: str) -> list[str]:
    """The secret-looking values a Dockerfile text sets with ARG or ENV."""
    return [value for name, _, value in _DOCKERFILE_PAIR.findall(text)
            if value and is_secret_arg(name, value) and not _is_stand_in(value)]


def shown_dockerfile(text: str) -> str:
    """The Dockerfile text with those values replaced as `shown_value` does (idempotent)."""
    def replace(match: re.Match) -> str:
        name, quote, value = match.groups()
        shown = shown_value(name, value) if value and not _is_stand_in(value) else value
        start, end = match.span(3)
        return match.group(0)[: start - match.start()] + shown + match.group(0)[end - match.start():]
    return _DOCKERFILE_PAIR.sub(replace, text)


def _is_stand_in(value: str) -> bool:
    return value.startswith("<redacted") and value.endswith(">")


class Redactor:
    """Replaces every occurrence of the given secret values in a text with REDACTED."""

    def __init__(self, values: Iterable[str]) -> None:
        pieces = set()
        for value in values:
            # a multi-line secret (a private key) is also hidden line by line, as logs split it
            for piece in (value, *value.splitlines()):
                if len(piece.strip()) >= MIN_REDACTED_CHARS:
                    pieces.add(piece)
        self._pieces = sorted(pieces, key=len, reverse=True)  # longest first: no partial leftovers

    def __call__(self, text: str) -> str:
        for piece in self._pieces:
            if piece in text:
                text = text.replace(piece, REDACTED)
        return text

    def __bool__(self) -> bool:
        return bool(self._pieces)

    @classmethod
    def for_build(cls, args: Mapping[str, str], secrets: Iterable[str], environ: Mapping[str, str]) -> Redactor:
        """The values a build must never show: secret-looking build args and its BuildKit secrets."""
        values = [value for name, value in args.items() if is_secret_arg(name, value)]
        values += [environ[name] for name in secrets if environ.get(name)]
        return cls(values)
