"""A make's result as the job side reads it: each artifact name's key per platform."""

from __future__ import annotations

from efabuild.make.result import MakeResult, published_platforms
from efabuild.make.schedule import BUILT, EXPORTED, FAILED, REUSED, SKIPPED, Outcome

AMD, ARM = "linux/amd64", "linux/arm64"


def test_published_platforms_names_every_available_artifact_per_platform():
    outcomes = (
        Outcome("demo:efa@linux/amd64", "a" * 64, BUILT),
        Outcome("demo:efa@linux/arm64", "b" * 64, REUSED),
        Outcome("demo:deepep@linux/amd64", "c" * 64, BUILT),  # no artifact: not published
        Outcome("demo:user@linux/amd64", "d" * 64, EXPORTED),
        Outcome("demo:user@linux/arm64", "e" * 64, FAILED),  # nothing to run on arm64 nodes
        Outcome("side:tool@linux/arm64", "f" * 64, SKIPPED),
    )
    layers = {o.qualname: (o.qualname.split("@")[0], o.qualname.split("@")[1]) for o in outcomes}
    artifacts = frozenset(n for n in layers if ":deepep" not in n)
    built_for = {"demo:efa": (AMD, ARM), "demo:user": (AMD, ARM), "side:tool": (ARM,)}
    index = published_platforms(MakeResult(outcomes, {}, layers, artifacts), built_for)
    # demo:user has no arm64 artifact from this make: its index stays as it was (the name moves whole)
    assert index == {"demo:efa": {AMD: "a" * 64, ARM: "b" * 64}}


def test_a_one_platform_make_names_its_artifacts_under_their_own_names():
    result = MakeResult((Outcome("demo:user", "d" * 64, BUILT),), {}, {"demo:user": ("demo:user", AMD)},
                        frozenset({"demo:user"}))
    assert published_platforms(result, {"demo:user": (AMD,)}) == {"demo:user": {AMD: "d" * 64}}
    assert result.platform_of("demo:user") == AMD and result.counts() == {BUILT: 1}
