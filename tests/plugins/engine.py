"""The real Docker engine (dockerd + buildx), as started by scripts/setup-host.sh."""

from __future__ import annotations

import shutil
import subprocess

import pytest


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """Skip nothing silently: a missing engine fails the test that needs it, with the fix."""
    if shutil.which("docker") is None or subprocess.run(
        ["docker", "info"], capture_output=True
    ).returncode != 0:
        pytest.fail("no Docker engine reachable: run `bash scripts/setup-host.sh` (as root) first")
