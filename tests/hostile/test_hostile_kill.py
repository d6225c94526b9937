"""Hostile: `efabuild make` killed with SIGKILL at every step boundary and at seeded random points.

After each kill: no child of the make (buildx, docker export, mksquashfs) runs on, no partial file
is visible in the store (everything `ls` lists is found by `lookup`
and passes `audit --all`), `gc` removes the debris, and the next make succeeds and leaves none.
The seed is printed and named in every assertion message; rerun one with EFABUILD_KILL_SEED=N.
The step boundaries are reached with the documented test hook EFABUILD_STOP_AT (efabuild.host.stops):
the make stops itself there and is killed while stopped.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.make.test_make import _remove_images_of, efabuild, mini_ngc  # noqa: F401 - fixture
from tests.make.test_make_interrupt import alive, descendants, export_containers, start_make, tmp_entries, wait_for

pytestmark = [pytest.mark.engine]

SEED = int(os.environ.get("EFABUILD_KILL_SEED") or random.SystemRandom().randrange(2**32))
STEP_BOUNDARIES = ("build", "export", "publish")
RANDOM_POINTS = 2

# passes every audit check on the fixture base (the plugin directories lead LD_LIBRARY_PATH)
GRAPH = """\
[layers.one]
base = "efabuild-fixtures/pytorch:26.08-py3"
dockerfile = '''
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${LD_LIBRARY_PATH}
ARG RUN_ID
RUN echo ${RUN_ID} > /run-id
'''
args = { RUN_ID = "@RUN@" }
artifact = true
ignore = [{ rule = "EFA010", reason = "a local fixture image" }]
"""


@pytest.fixture
def kill_ws(tmp_path, mini_ngc):
    root = tmp_path / "ws"
    (root / "graphs").mkdir(parents=True)
    (root / "BUILD.toml").write_text('[workspace]\ngraphs = ["graphs/*.toml"]\n')
    yield root
    _remove_images_of(root)


def stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2] == "T"


def check_store(root: Path, where: str) -> None:
    """Everything the store lists is whole: found by lookup, with its recorded size, and audited."""
    listed = json.loads(efabuild(root, "ls", "--json", check=True).stdout)["artifacts"]
    for item in listed:
        found = efabuild(root, "lookup", item["key"])
        assert found.returncode == 0, f"{where}: lookup {item['key']}: {found.stderr}"
        assert Path(found.stdout.strip()).stat().st_size == item["size"], where
    sqsh_files = {p.name.split(".")[0] for p in (root / "cache" / "objects").rglob("*.sqsh")} \
        if (root / "cache" / "objects").is_dir() else set()
    assert sqsh_files == {item["key"] for item in listed}, f"{where}: a .sqsh without its record"
    if listed:
        audit = efabuild(root, "audit", "--all")
        assert audit.returncode == 0, f"{where}: {audit.stdout}{audit.stderr}"


def assert_no_debris(root: Path, where: str) -> None:
    assert tmp_entries(root) == [], f"{where}: left in cache/tmp"
    assert export_containers(root) == [], f"{where}: export containers left"
    report = json.loads(efabuild(root, "gc", "--json", check=True).stdout)
    # containers other workspaces' killed makes left are the engine's, checked above for this one
    debris = [item for item in report["debris"] if item["tier"] != "engine"]
    assert debris == [], f"{where}: gc still finds {debris}"


def test_kill_9_at_every_step_boundary_and_at_random_points(kill_ws):
    print(f"kill -9 seed: {SEED} (EFABUILD_KILL_SEED={SEED} repeats this run)")
    rng = random.Random(SEED)
    points: list[tuple[str, object]] = [("at", step) for step in STEP_BOUNDARIES]
    points += [("after", round(rng.uniform(0.5, 6.0), 2)) for _ in range(RANDOM_POINTS)]
    graph = kill_ws / "graphs" / "tiny.toml"
    for number, (kind, point) in enumerate(points):
        where = f"kill -9 {kind} {point} (seed {SEED})"
        graph.write_text(GRAPH.replace("@RUN@", f"{SEED}-{number}"))  # new keys every round
        if kind == "at":
            proc = start_make(kill_ws, env={"EFABUILD_STOP_AT": point})
            wait_for(lambda: proc.poll() is None and stopped(proc.pid), f"{where}: the make to stop", proc=proc)
        else:
            proc = start_make(kill_ws)
            deadline = time.monotonic() + point
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        children = descendants(proc.pid) if proc.poll() is None else []
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        deadline = time.monotonic() + 10  # the kernel kills them at once; the engine may be loaded
        while [pid for pid in children if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in children if alive(pid)], f"{where}: a child of the make runs on"
        check_store(kill_ws, where)
        if number % 2:  # every other round, gc cleans up before the next make
            efabuild(kill_ws, "gc", "--yes", check=True)
            assert_no_debris(kill_ws, f"{where}, after gc --yes")
        done = efabuild(kill_ws, "make")
        assert done.returncode == 0, f"{where}: the next make failed: {done.stderr}"
        assert_no_debris(kill_ws, f"{where}, after the next make")
    check_store(kill_ws, f"after every kill and make (seed {SEED})")
