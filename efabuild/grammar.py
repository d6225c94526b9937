"""The grammar of values handed to other tools (docker CLI, BuildKit, boto3), checked up front.

Image references follow the distribution project's grammar (github.com/distribution/reference,
regexp.go), which the docker CLI and BuildKit parse with:

    reference   := name [ ":" tag ]             (a digest is pinned separately: `digest = ...`)
    name        := [domain "/"] path-component ["/" path-component]*
    domain      := domain-component ["." domain-component]* [":" port]  |  "[" IPv6 "]" [":" port]
    path-component := [a-z0-9]+ ((\\.|_|__|-+) [a-z0-9]+)*
    tag         := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}

So no value accepted here starts with `-`: none can be taken for an option by a CLI.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
IMAGE_REF = re.compile(rf"(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?")
# a registry and optional repository path: `host[:port][/path]`, as [registry] url takes it
REGISTRY = re.compile(rf"{_DOMAIN}(?:/{_PATH_COMPONENT})*")
MAX_NAME = 255  # the distribution project's limit on the name part

# `os/arch[/variant]`, as BuildKit's platforms parser takes them (lowercase words)
PLATFORM = re.compile(r"[a-z0-9_]+/[a-z0-9_]+(?:/[a-z0-9_]+)?")
# docker context and buildx builder names (docker/cli's restrictedNamePattern)
TOOL_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.+-]*")
HOST_SCHEMES = ("unix", "tcp", "ssh", "npipe", "fd")


def image_ref_problem(ref: str) -> str | None:
    """Why `ref` is not an image reference without digest, or None when it is one."""
    if "@" in ref:
        return "must be an image reference without digest (pin with digest = \"sha256:...\")"
    match = IMAGE_REF.fullmatch(ref)
    if not match:
        return ("must be an image reference like registry/repo:tag (lowercase repository path, "
                "no spaces, not starting with '-')")
    if len(match.group("name")) > MAX_NAME:
        return f"repository name longer than {MAX_NAME} characters"
    return None


def registry_problem(url: str) -> str | None:
    if "://" in url:
        return "give host[:port][/path] without a scheme"
    if not REGISTRY.fullmatch(url):
        return "must be host[:port][/path], like 123456789012.dkr.ecr.us-east-1.amazonaws.com"
    return None


def platform_problem(value: str) -> str | None:
    if not PLATFORM.fullmatch(value):
        return "must be os/arch[/variant], like linux/amd64 or linux/arm64"
    return None


def tool_name_problem(value: str) -> str | None:
    if not TOOL_NAME.fullmatch(value):
        return "must be a name of letters, digits and _.+- that starts with a letter or digit"
    return None


def host_problem(value: str) -> str | None:
    """A docker host URL: scheme://address, as `docker --host` takes it."""
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in HOST_SCHEMES:
        return f"must be a URL with one of the schemes {', '.join(s + '://' for s in HOST_SCHEMES)}"
    if not rest or any(c.isspace() or ord(c) < 32 for c in rest):
        return "must name an address after the scheme, without spaces"
    return None


def endpoint_url_problem(url: str) -> str | None:
    """An S3 endpoint: http(s)://host[:port][/path], as botocore accepts it."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError when not a number in range
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host, like https://s3.us-east-1.amazonaws.com"
    if any(c.isspace() or ord(c) < 32 for c in url) or port == 0:
        return "must be an http:// or https:// URL with a host, like https://s3.us-east-1.amazonaws.com"
    return None
