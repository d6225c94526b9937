"""The OCI labels an image gets from the workspace's git state: where its sources are and at which
commit. Nothing when the workspace is no git checkout (or git is missing); a remote URL's user and
password or token are never kept, and a URL holding spaces or control characters is left out.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

SOURCE = "org.opencontainers.image.source"
REVISION = "org.opencontainers.image.revision"
TITLE = "org.opencontainers.image.title"
GIT_LABELS = (SOURCE, REVISION)
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_TIMEOUT_S = 10


def _git(root: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def git_labels(root: Path) -> dict[str, str]:
    """{source: the `origin` remote's URL without credentials, revision: HEAD's commit}, each only
    when the workspace has it."""
    labels = {}
    revision = _git(root, "rev-parse", "--verify", "--quiet", "HEAD")
    if re.fullmatch(r"[0-9a-f]{40,64}", revision):
        labels[REVISION] = revision
    source = _USERINFO.sub("", _git(root, "config", "--get", "remote.origin.url"))
    # one printable word: a line break or terminal escape would reach /etc/rc and `docker inspect`
    if source and revision and source.isprintable() and not any(c.isspace() for c in source):
        labels[SOURCE] = source
    return labels
