"""The platform of the node a job starts on: `uname -m` mapped as Enroot maps it, unless
`$EFABUILD_PLATFORM` or an explicit platform says otherwise (efabuild/platforms.py decides)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from efabuild.platforms import wanted_platform


def node_platform(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> tuple[str, bool]:
    """(the platform to pick, whether it was asked for explicitly: `@os/arch` or --platform)."""
    return wanted_platform(os.environ if environ is None else environ, os.uname().machine, explicit)
