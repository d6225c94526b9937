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
from urllib.parse import unquote, urlsplit

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
# a build-arg (and secret environment variable) name, as a Dockerfile's ARG takes it
ARG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# an AWS region name, as botocore validates it (botocore/utils.py, validate_region_name)
REGION = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?")


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


PLATFORM_MAX = 64  # linux/arm64/v8 is 14: a longer value is a mistake or an attack, never echoed whole


def platform_problem(value: str) -> str | None:
    if len(value) > PLATFORM_MAX:
        return f"must be os/arch[/variant] of at most {PLATFORM_MAX} characters, like linux/amd64 or linux/arm64"
    if not PLATFORM.fullmatch(value):
        return "must be os/arch[/variant], like linux/amd64 or linux/arm64"
    return None


def tool_name_problem(value: str) -> str | None:
    if not TOOL_NAME.fullmatch(value):
        return "must be a name of letters, digits and _.+- that starts with a letter or digit"
    return None


def builder_problem(value: str) -> str | None:
    """A builder as --builder and [builder] farm name one: a host URL, buildx:NAME or a context."""
    if "://" in value:
        return host_problem(value)
    return tool_name_problem(value.removeprefix("buildx:"))


def host_problem(value: str) -> str | None:
    """A docker host URL: scheme://address, as `docker --host` takes it."""
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in HOST_SCHEMES:
        return f"must be a URL with one of the schemes {', '.join(s + '://' for s in HOST_SCHEMES)}"
    if not rest or any(c.isspace() or ord(c) < 32 for c in rest):
        return "must name an address after the scheme, without spaces"
    authority = rest.partition("/")[0]
    if ":" in authority.rpartition("@")[0]:  # it reaches `ps`, records and messages
        return "must not hold a password (user:password@): ssh and TLS keys authenticate"
    # docker's ssh helper hands the user and host to ssh as arguments: `-oProxyCommand=…` runs a command;
    # docker's URL parser decodes %2D and takes the host out of [brackets] before it does
    if any(unquote(part).lstrip("[").startswith("-") for part in authority.split("@")):
        return "must not have a user or host starting with '-'"
    return None


def region_problem(value: str) -> str | None:
    if not REGION.fullmatch(value):
        return "must be an AWS region name, like us-east-1"
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
    if "@" in parts.netloc:  # it is written into store.toml and shown in messages: never a password
        return "must not hold credentials (user:password@): boto3's chain supplies them (environment, ~/.aws)"
    if parts.hostname.startswith("-"):  # no host name starts with '-' (RFC 1123)
        return "must be an http:// or https:// URL with a host, like https://s3.us-east-1.amazonaws.com"
    return None

# --- mksquashfs options. Which mksquashfs options `[export] extra_options` may add: those that only shape the filesystem.
#
# mksquashfs also reads pseudo-file definitions (`-p "/x f 644 0 0 CMD"` runs CMD on the host, as
# the user running the export), sort and exclude files, and options that move or rename what goes
# into the image. None of those belong in a BUILD.toml setting: the image content comes from the
# build alone. So the options are an allow-list, each with the shape of the values it takes.

# a value is one plain word: never an option (it would shift the pairs) and never a path
_WORD = re.compile(r"[A-Za-z0-9_.,%+]{1,32}")
_NUMBER = re.compile(r"[0-9]{1,9}")
_SIZE = re.compile(r"[0-9]{1,9}[KkMmGg]?")
_BLOCK_SIZES = {str(4096 << i) for i in range(9)} | {f"{4 << i}K" for i in range(9)} | {"1M"}
_LZO_ALGORITHMS = ("lzo1x_1", "lzo1x_1_11", "lzo1x_1_12", "lzo1x_1_15", "lzo1x_999")

# option → a check of its one value (None: the option takes no value)
ALLOWED: dict[str, object] = {
    "-b": lambda v: v in _BLOCK_SIZES or v.upper() in _BLOCK_SIZES,
    "-noI": None, "-noInodeCompression": None,
    "-noId": None, "-noIdTableCompression": None,
    "-noD": None, "-noDataCompression": None,
    "-noF": None, "-noFragmentCompression": None,
    "-noX": None, "-noXattrCompression": None,
    "-no-compression": None,
    "-no-fragments": None, "-always-use-fragments": None,
    "-no-duplicates": None, "-exports": None, "-no-exports": None,
    "-processors": lambda v: bool(_NUMBER.fullmatch(v)),
    "-mem": lambda v: bool(_SIZE.fullmatch(v)),
    "-mem-percent": lambda v: bool(_NUMBER.fullmatch(v)),
    # the compressors' own options
    "-Xalgorithm": lambda v: v in _LZO_ALGORITHMS,
    "-Xcompression-level": lambda v: bool(_NUMBER.fullmatch(v)),
    "-Xwindow-size": lambda v: bool(_NUMBER.fullmatch(v)),
    "-Xstrategy": lambda v: bool(_WORD.fullmatch(v)),
    "-Xbcj": lambda v: bool(_WORD.fullmatch(v)),
    "-Xdict-size": lambda v: bool(_WORD.fullmatch(v)),
    "-Xhc": None,
}

_SET_ELSEWHERE = {
    "-comp": "set `compression` instead",
    "-all-root": "always set", "-no-xattrs": "always set", "-noappend": "always set",
    "-tar": "always set", "-root-mode": "always set", "-root-time": "always set",
    "-mkfs-time": "always set",
}


def extra_options_problem(options: tuple[str, ...] | list[str]) -> str | None:
    """Why `options` may not be given to mksquashfs, or None when every one is allowed."""
    index = 0
    while index < len(options):
        option = options[index]
        shown = option if len(option) <= 40 else option[:37] + "..."
        if option in _SET_ELSEWHERE:
            return f"{shown!r} is not an extra option: {_SET_ELSEWHERE[option]}"
        if option not in ALLOWED:
            return (f"{shown!r} is not allowed: only options that shape the filesystem are "
                    f"(compressor -X… options, -b, -noI/-noD/-noF/-noX, -processors, -mem, fragments)")
        check = ALLOWED[option]
        if check is not None:
            if index + 1 >= len(options):
                return f"{option} needs a value"
            value = options[index + 1]
            if not check(value):
                shown_value = value if len(value) <= 40 else value[:37] + "..."
                return f"{option} {shown_value!r}: not a valid value"
            index += 1
        index += 1
    return None


def split_farm_entry(entry: str) -> tuple[str, tuple[str, ...]]:
    """A [builder] farm entry: (the builder, the platforms it declares). `buildx:b@linux/arm64`
    declares linux/arm64 (several: `@linux/amd64,linux/arm64`); without a suffix, none (the
    builder is asked). An `@` in a host URL's user part is no declaration: a platform has a '/'."""
    builder, sep, tail = entry.rpartition("@")
    if sep and tail and all("/" in part and "://" not in part for part in tail.split(",")):
        return builder, tuple(tail.split(","))
    return entry, ()
