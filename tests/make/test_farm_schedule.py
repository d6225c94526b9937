"""Which builder of a farm takes a build or an export: no engine needed, the builders are only
slots here (Farm.take never reaches them)."""

from __future__ import annotations

import threading

from efabuild.make.farm import Farm
from efabuild.settings import RegistrySettings


def farm(nodes: int, jobs: int = 1) -> Farm:
    return Farm(nodes=[f"node-{i}" for i in range(nodes)], registry=RegistrySettings(url="127.0.0.1:5000"),
                jobs=jobs, busy=[0] * nodes)


def test_builds_go_to_the_least_busy_builder_in_turn():
    f = farm(2)
    with f.take() as first:
        with f.take() as second:
            assert {first, second} == {"node-0", "node-1"}
    with f.take() as third:
        assert third == "node-0"  # both free again: the turn goes on from the last one chosen


def test_an_export_runs_on_the_builder_that_built_its_layer_when_that_one_is_free():
    f = farm(2)
    with f.take() as built:
        assert built == "node-0"
    # without a preference the turn would send the export to node-1, which lacks the image's layers
    with f.take(prefer=0) as exported:
        assert exported == "node-0"
    with f.take() as other:
        with f.take(prefer=1) as exported:  # node-1 is busy: the least busy free one instead
            assert (other, exported) == ("node-1", "node-0")


def test_a_preferred_builder_without_a_free_slot_is_not_waited_for():
    f = farm(2)
    taken = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with f.take(prefer=1):
            taken.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait(10)
    try:
        with f.take(prefer=1) as exported:
            assert exported == "node-0"
    finally:
        release.set()
        holder.join()
