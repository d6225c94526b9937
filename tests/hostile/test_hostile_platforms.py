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


@pytest.mark.parametrize("arm64", ["failed", "not targeted"])
def test_a_make_that_gave_a_name_no_arm64_artifact_leaves_arm64_nodes_the_one_they_had(tmp_path: Path, arm64: str):
    # `make demo:train@linux/amd64`, or a make whose arm64 build failed: an index of amd64 alone
    # would leave every arm64 node with "has no linux/arm64 artifact"
    from efabuild.make.result import MakeResult, published_platforms, unpublished_platforms
    from efabuild.make.schedule import BUILT, FAILED, Outcome
    from efabuild.store.tiered import Store
    from tests.kits.platformkit import BOTH, NAME, publish_platforms
    from tests.kits.storekit import key_for, make_sqsh, record_for

    store = Store.at(tmp_path / "store", show_progress=False)
    before = publish_platforms(store, tmp_path, label="v1")
    new_amd64 = key_for("v2 amd64")
    (tmp_path / "v2").mkdir()
    sqsh = make_sqsh(tmp_path / "v2", b"v2" * 1000)
    store.publish(new_amd64, sqsh, record_for(new_amd64, NAME, sqsh)._replace(platform="linux/amd64"))
    outcomes = [Outcome(f"{NAME}@linux/amd64", new_amd64, BUILT)]
    if arm64 == "failed":
        outcomes.append(Outcome(f"{NAME}@linux/arm64", key_for("v2 arm64"), FAILED))
    result = MakeResult(tuple(outcomes), {}, {o.qualname: (NAME, o.qualname.split("@")[1]) for o in outcomes},
                        frozenset(o.qualname for o in outcomes))
    for name, platforms in published_platforms(result, {NAME: BOTH}).items():  # as make publishes
        store.publish_index(name, platforms)
    assert store.resolve(f"{NAME}@linux/arm64") == before["linux/arm64"]
    assert store.resolve(f"{NAME}@linux/amd64") == before["linux/amd64"]  # the name moves as a whole
    assert unpublished_platforms(result, {NAME: BOTH}) == {NAME: ["linux/arm64"]}  # make's warning
    both = MakeResult((outcomes[0], Outcome(f"{NAME}@linux/arm64", before["linux/arm64"], BUILT)), {},
                      {f"{NAME}@{p}": (NAME, p) for p in BOTH}, frozenset(f"{NAME}@{p}" for p in BOTH))
    assert published_platforms(both, {NAME: BOTH}) == {NAME: {"linux/amd64": new_amd64,
                                                              "linux/arm64": before["linux/arm64"]}}
