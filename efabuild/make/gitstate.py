"""The OCI labels an image gets from the workspace's git state: where its sources are and at which
commit. Nothing when the workspace is no git checkout (or git is missing); a remote URL's user and
password or token (in its user part, query or fragment) are never kept, and a URL holding spaces or
control characters, or too long to pass as an argument, is left out. A git that hangs (a FIFO named by an include.path) costs one timeout.
An artifact's manifest reads them back from the image it was exported from (`vcs_of`), checked again.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from efabuild.refs import REVISION_LABEL as REVISION
from efabuild.refs import SOURCE_LABEL as SOURCE

GIT_LABELS = (SOURCE, REVISION)
_COMMIT = re.compile(r"[0-9a-f]{40,64}")
_TIMEOUT_S = 10
# a label is one argument of `docker buildx build`: the kernel refuses one over 128 KiB, and no
# repository URL is anywhere near this long
MAX_SOURCE_CHARS = 4096


class _GitHung(Exception):
    pass


def _git(root: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise _GitHung from None
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def git_labels(root: Path) -> dict[str, str]:
    """{source: the `origin` remote's URL without credentials, revision: HEAD's commit}, each only
    when the workspace has it."""
    labels = {}
    try:
        revision = _git(root, "rev-parse", "--verify", "--quiet", "HEAD")
        url = _git(root, "config", "--get", "remote.origin.url") if revision else ""
    except _GitHung:  # the second call would read the same config and hang as long
        return {}
    if _COMMIT.fullmatch(revision):
        labels[REVISION] = revision
    source = _source(url)
    if source and revision:
        labels[SOURCE] = source
    return labels


def vcs_of(labels: Mapping[str, str]) -> dict[str, str]:
    """{revision, source} as an image's labels say it was built (from the git state of the
    workspace that built it, maybe another machine's), for its manifest: each only when well
    formed, since an image from a shared engine or a registry may carry any label."""
    revision = labels.get(REVISION, "")
    if not isinstance(revision, str) or not _COMMIT.fullmatch(revision):
        return {}
    source = labels.get(SOURCE, "")
    source = _source(source) if isinstance(source, str) else ""
    return {"revision": revision, **({"source": source} if source else {})}


def _source(url: str) -> str:
    """`url` without credentials when it is one printable word that fits as an argument, else ''."""
    # a line break or terminal escape would reach `docker inspect` and manifests (checked before
    # parsing, which drops some of them silently)
    fits = len(url) <= MAX_SOURCE_CHARS and url.isprintable() and not any(c.isspace() for c in url)
    return without_credentials(url) if fits else ""


def without_credentials(url: str) -> str:
    """`scheme://[userinfo@]host/path[?query][#fragment]` → `scheme://host/path`: the userinfo up
    to its last `@` (a password may hold a raw one), and the query and fragment where tokens are
    also passed. An scp-like `user:password@host:path` loses `user:password@`; `git@host:path` is
    kept as it is (a user name, no secret). '' for a URL that cannot be parsed."""
    if "://" not in url:
        # the host is the word between the userinfo's last `@` and the `:` before the path; an `@`
        # further on is part of the path (`git@host:team/stack@v2.git`)
        userinfo = re.match(r"(.*)@(?=[^@:/]+:)", url)
        return url[userinfo.end():] if userinfo and ":" in userinfo.group(1) else url
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
