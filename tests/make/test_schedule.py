"""The scheduling of a make: parallel branches up to --jobs, a failure skipping its descendants
while other branches finish, and identical layers in two graphs built once.

`FakeEngine` stands in for the engine only to test this order (the real engine paths are covered
by test_make.py): a build takes a moment, checks that its FROM image exists, and leaves its tag.
Everything else is real: the workspace, the plan, the store's build locks and the build records.
"""

from __future__ import annotations

import threading
import time

import pytest

from efabuild.make.prepare import prepare
from efabuild.make.run import BUILT, FAILED, REUSED, SKIPPED, run
from efabuild.errors import EfabuildError
from efabuild.workspace import load_workspace
from tests.kits.wsfactory import SIMPLE_GRAPH, make_workspace

IMAGES_ONLY = SIMPLE_GRAPH.replace("artifact = true\n", "")
OTHER_BASE = IMAGES_ONLY.replace("example.com", "other.example")


class FakeEngine:
    def __init__(self, seconds: float = 0.15) -> None:
        self.seconds = seconds
        self.images: set[str] = set()
        self.built: list[str] = []
        self.tagged: list[tuple[str, str]] = []
        self.running = self.most_running = 0
        self._lock = threading.Lock()

    def has_image(self, tag: str) -> bool:
        return tag in self.images

    def tag(self, source: str, target: str) -> None:
        assert source in self.images
        self.tagged.append((source, target))
        self.images.add(target)

    def build(self, request, log_path, on_line, cancel, redact, log_root=None) -> None:
        from_image = request.dockerfile.splitlines()[0].removeprefix("FROM ")
        assert from_image.startswith(("example.com/", "other.example/")) or from_image in self.images, \
            f"{request.tag} built before its parent {from_image}"
        with self._lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            time.sleep(self.seconds)
            if "exit 1" in request.dockerfile:
                raise EfabuildError(f"{request.tag}: RUN exit 1 failed")
            with self._lock:
                self.built.append(request.tag)
                self.images.add(request.tag)
        finally:
            with self._lock:
                self.running -= 1

    def pull(self, tag: str, registry) -> bool:
        raise AssertionError("no registry is configured: nothing is pulled")

    def push(self, tag: str, registry) -> None:
        raise AssertionError("no registry is configured: nothing is pushed")

    def remove_dead_leftovers(self, stores) -> None:
        raise AssertionError("without an engine connection there is nothing of it to sweep")


def make(root, jobs: int, engine: FakeEngine):
    prepared = prepare(load_workspace(root), use_engine=False)
    result = run(prepared, jobs=jobs, engine_steps=engine)
    return prepared, {o.qualname: o for o in result.outcomes}


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_independent_branches_build_side_by_side_up_to_jobs(tmp_path, jobs):
    root = make_workspace(tmp_path / "ws", {"a": IMAGES_ONLY, "b": OTHER_BASE})
    engine = FakeEngine()
    prepared, outcomes = make(root, jobs, engine)
    assert {name: o.status for name, o in outcomes.items()} == {name: BUILT for name in prepared.order}
    assert len(engine.built) == 6
    # two chains: never more than two builds at once, whatever --jobs allows
    assert engine.most_running == min(jobs, 2)
    # what is built is the baseline of the next plan
    again = prepare(load_workspace(root), use_engine=False)
    assert {lp.action for lp in again.plan.layers} == {"none"}


def test_a_failed_layer_skips_its_descendants_while_the_other_branch_finishes(tmp_path):
    broken = IMAGES_ONLY.replace("RUN echo deepep ${HYBRID_EP_COMMIT}", "RUN exit 1")
    root = make_workspace(tmp_path / "ws", {"a": broken, "b": OTHER_BASE})
    engine = FakeEngine()
    _, outcomes = make(root, 2, engine)
    assert {name: o.status for name, o in outcomes.items()} == {
        "a:efa": BUILT, "a:deepep": FAILED, "a:user": SKIPPED, "b:efa": BUILT, "b:deepep": BUILT, "b:user": BUILT}
    assert outcomes["a:deepep"].error.endswith("RUN exit 1 failed")
    # the time it ran before failing (the fake build takes 0.15 s), not 0.0s
    assert 0.15 <= outcomes["a:deepep"].seconds < 5
    assert outcomes["a:user"].error == "parent a:deepep did not finish"
    assert len(engine.built) == 4  # a:user never reached the engine


def test_identical_layers_in_two_graphs_are_built_once_and_tagged_under_both_names(tmp_path):
    renamed = (IMAGES_ONLY.replace("[layers.efa]", "[layers.efa2]").replace('parent = "efa"', 'parent = "efa2"'))
    root = make_workspace(tmp_path / "ws", {"a": IMAGES_ONLY, "b": renamed})
    engine = FakeEngine()
    prepared, outcomes = make(root, 3, engine)
    keys = {lp.qualname: lp.key for lp in prepared.plan.layers}
    assert keys["a:efa"] == keys["b:efa2"] and keys["a:user"] == keys["b:user"]
    assert sorted(engine.built) == sorted(f"efabuild/{layer}:{keys['a:' + layer]}" for layer in ("efa", "deepep", "user"))
    assert [outcomes[n].status for n in ("b:efa2", "b:deepep", "b:user")] == [REUSED] * 3
    efa = keys["a:efa"]
    assert (f"efabuild/efa:{efa}", f"efabuild/efa2:{efa}") in engine.tagged
