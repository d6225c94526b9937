"""Platforms as a careless operator writes them in BUILD.toml, and as a job user or a writer of
the store hands them to lookup and the importer: one line each, exit 2 for bad input, never a
build started for a platform efabuild cannot make an image of."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kits.inprocess import run_efabuild
from tests.kits.wsfactory import BUILD_TOML, make_workspace


def _plan(root: Path, builder: str):
    make_workspace(root, build=BUILD_TOML + "[builder]\n" + builder + "\n")
    return run_efabuild(["plan"], cwd=root)


@pytest.mark.parametrize("builder", ['platforms = ["linux/amd64", "windows/amd64"]',
                                     'platform = "darwin/arm64"'])
def test_a_platform_other_than_linux_is_one_line_before_any_plan(tmp_path: Path, builder: str):
    # an Enroot image is a Linux rootfs; make offered `emulate` for it, then BuildKit failed on the base
    proc = _plan(tmp_path / "ws", builder)
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "BUILD.toml: builder.platform" in proc.stderr and "linux/ platforms only" in proc.stderr


def test_linux_platforms_with_a_variant_still_plan(tmp_path: Path):
    proc = _plan(tmp_path / "ws", 'platforms = ["linux/amd64", "linux/amd64/v2"]')
    assert proc.returncode == 0, proc.stderr
    assert "stack:efa@linux/amd64/v2" in proc.stdout and "stack:efa@linux/amd64 " in proc.stdout
