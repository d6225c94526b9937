"""A make interrupted (SIGTERM, as `scancel` sends), killed (kill -9) or run eight times at once, on
the real engine and mksquashfs: no waiting out a long export, no leftovers, one build per key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.make.test_make import _remove_images_of, efabuild, outcomes

pytestmark = [pytest.mark.engine]

# the session's busybox image: named by its content, so other test runs never change it under us
BASE = "@BASE@"
NO_DIGEST = '[{ rule = "EFA010", reason = "a local test image" }]'

# An export slow enough to be in progress for minutes: 64 MB of random data, compressed with xz on
# one thread trying five branch filters per block. A test only ever lets it run a few seconds.
SLOW_BUILD = """\
[workspace]
graphs = ["graphs/*.toml"]
[export]
compression = "xz"
compress_data = true
extra_options = ["-processors", "1", "-Xbcj", "x86,arm,armthumb,powerpc,sparc"]
"""
SLOW_GRAPH = f"""\
[layers.data]
base = "{BASE}"
dockerfile = '''
RUN head -c 64000000 /dev/urandom > /data.bin
'''
ignore = {NO_DIGEST}

[layers.slow]
parent = "data"
dockerfile = '''
ARG RUN_ID
RUN sleep 2 && echo ${{RUN_ID}} > /run-id
'''
args = {{ RUN_ID = "@RUN@" }}
artifact = true
"""


def _workspace(root: Path, build: str, graphs: dict[str, str], base: str) -> Path:
    (root / "graphs").mkdir(parents=True)
    (root / "BUILD.toml").write_text(build)
    run = uuid.uuid4().hex[:12]  # new keys for every test run
    for name, text in graphs.items():
        (root / "graphs" / f"{name}.toml").write_text(text.replace("@RUN@", run).replace("@BASE@", base))
    return root


@pytest.fixture
def slow_ws(tmp_path, busybox_image):
    root = _workspace(tmp_path / "ws", SLOW_BUILD, {"big": SLOW_GRAPH}, busybox_image)
    yield root
    # the data layer's image is the same in every run: kept, so the next test needs no rebuild
    tags = subprocess.run(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "efabuild/slow"],
                          capture_output=True, text=True).stdout.split()
    ours = {p.stem for p in (root / "cache" / "builds" / "keys").rglob("*.json")}
    doomed = [t for t in tags if t.rsplit(":", 1)[-1] in ours]
    if doomed:
        subprocess.run(["docker", "image", "rm", "-f", *doomed], capture_output=True)


def start_make(root: Path, *targets: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "efabuild", "-C", str(root), "make", *targets],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def wait_for(condition, what: str, timeout: float = 120.0, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"make ended before {what}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def tmp_entries(root: Path) -> list[Path]:
    tmp = root / "cache" / "tmp"
    return sorted(tmp.iterdir()) if tmp.is_dir() else []


def export_containers(root: Path) -> list[str]:
    """Export containers (by their label) writing into this workspace's store."""
    listed = subprocess.run(
        ["docker", "container", "ls", "--all", "--filter", "label=org.efabuild.export", "--format",
         '{{.Names}}\t{{.Label "org.efabuild.export"}}'], capture_output=True, text=True, check=True).stdout
    return [line.split("\t")[0] for line in listed.splitlines() if f"\t{root}/" in line]


def growing_export(root: Path):
    """The partial .sqsh of a running export, once mksquashfs has written to it twice."""
    sizes: dict[Path, int] = {}

    def check():
        for path in (root / "cache" / "tmp").glob("efatmp.*.export.sqsh.*.tmp"):
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if sizes.get(path, size) < size:
                return path
            sizes[path] = size
        return None
    return check


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rfind(")") + 2] != "Z"


def test_sigterm_during_an_export_stops_it_within_seconds_and_leaves_nothing(slow_ws):
    proc = start_make(slow_ws)
    try:
        partial = wait_for(growing_export(slow_ws), "the export to write its .sqsh", proc=proc)
        children = descendants(proc.pid)
        assert children, "the export runs no child process"
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("make went on exporting for 30 s after SIGTERM")
        elapsed = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # an export of minutes stops at once (the bound leaves room for a loaded machine)
    assert elapsed < 10, f"make took {elapsed:.1f}s to stop after SIGTERM"
    assert proc.returncode == 130 and "interrupted" in err, err
    assert not [pid for pid in children if alive(pid)], "docker export or mksquashfs still runs"
    assert not partial.exists() and tmp_entries(slow_ws) == []
    assert export_containers(slow_ws) == []


def test_leftovers_of_killed_makes_are_removed_by_gc_and_by_the_next_make(slow_ws):
    # killed while building: its build context stays behind, and gc removes it
    proc = start_make(slow_ws)
    context = wait_for(lambda: [p for p in tmp_entries(slow_ws) if p.is_dir()], "a build context", proc=proc)[0]
    proc.kill()
    proc.wait()
    assert context.is_dir()
    dry = efabuild(slow_ws, "gc", check=True).stdout
    assert f"would remove leftover  local  {context}" in dry
    efabuild(slow_ws, "gc", "--yes", check=True)
    assert not context.exists()

    # killed while exporting: the export container and the partial .sqsh stay behind, and the next
    # make (here one with nothing to build) removes them
    proc = start_make(slow_ws)
    partial = wait_for(growing_export(slow_ws), "the export to write its .sqsh", proc=proc)
    containers = export_containers(slow_ws)
    proc.kill()
    proc.wait()
    assert partial.name.startswith("efatmp.") and containers and export_containers(slow_ws) == containers
    efabuild(slow_ws, "make", "big:data", check=True)
    assert export_containers(slow_ws) == []
    assert tmp_entries(slow_ws) == []


def _named(pids: list[int]) -> dict[int, str]:
    names = {}
    for pid in pids:
        try:
            names[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
    return names


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2] == "T"


def test_kill_9_leaves_no_buildx_docker_export_or_mksquashfs_running(slow_ws):
    """A make killed outright takes its children with it: neither `docker buildx build` nor the
    `docker export` stream nor mksquashfs runs on; the next make removes what the kill left."""
    # the make stops itself where a step begins, goes on, and is killed once that step's programs run
    # (at export, mksquashfs: `docker export` may have sent its last bytes and ended before it)
    for step, programs in (("build", {"docker"}), ("export", {"mksquashfs"})):
        proc = start_make(slow_ws, env={"EFABUILD_STOP_AT": step})
        wait_for(lambda: _stopped(proc.pid), f"the make to stop at {step}", proc=proc)
        os.kill(proc.pid, signal.SIGCONT)
        if step == "export":
            wait_for(growing_export(slow_ws), "the export to write its .sqsh", proc=proc)
        running = wait_for(lambda: (lambda kids: kids if programs <= set(kids.values()) else None)(
            _named(descendants(proc.pid))), f"{sorted(programs)} to run", proc=proc)
        proc.kill()
        _, err = proc.communicate()
        # killed by us, not ended by itself on the way (that would clean up as a failure does)
        assert proc.returncode == -signal.SIGKILL, f"make ended by itself at {step}: {err[-2000:]}"
        deadline = time.monotonic() + 10
        while [pid for pid in running if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = {pid: name for pid, name in running.items() if alive(pid)}
        assert not survivors, f"killed at {step}, its children run on: {survivors}"
    # what the kill at export left: the export container always; the partial .sqsh only if the
    # kernel's SIGKILL reached mksquashfs before the end of its input did (on a truncated tar it
    # ends and deletes its own output first, which is a race the machine's load decides)
    assert export_containers(slow_ws)
    efabuild(slow_ws, "make", "big:data", check=True)
    assert export_containers(slow_ws) == []
    assert tmp_entries(slow_ws) == []


def test_a_live_makes_context_and_container_are_not_leftovers(slow_ws):
    """gc and other makes leave a running make's things alone."""
    proc = start_make(slow_ws)
    try:
        partial = wait_for(growing_export(slow_ws), "the export to write its .sqsh", proc=proc)
        contexts_and_partial = tmp_entries(slow_ws)
        containers = export_containers(slow_ws)
        report = json.loads(efabuild(slow_ws, "gc", "--yes", "--json", check=True).stdout)
        assert report["debris"] == []
        assert partial.exists() and tmp_entries(slow_ws) == contexts_and_partial
        assert containers and export_containers(slow_ws) == containers
    finally:
        proc.kill()
        proc.wait()
    # once killed, they are leftovers: gc removes them (nothing stays in the engine after the test)
    efabuild(slow_ws, "gc", "--yes", check=True)
    assert export_containers(slow_ws) == []


TINY_GRAPH = f"""\
[layers.one]
base = "{BASE}"
dockerfile = '''
ARG RUN_ID
RUN echo ${{RUN_ID}} > /run-id
'''
args = {{ RUN_ID = "@RUN@" }}
artifact = true
ignore = {NO_DIGEST}
"""


@pytest.fixture
def tiny_ws(tmp_path, busybox_image):
    root = _workspace(tmp_path / "ws", '[workspace]\ngraphs = ["graphs/*.toml"]\n', {"tiny": TINY_GRAPH},
                      busybox_image)
    yield root
    _remove_images_of(root)


def test_eight_concurrent_makes_of_one_key_build_and_export_it_once(tiny_ws):
    since = time.time()
    makes = [start_make(tiny_ws) for _ in range(8)]
    results = [(proc.communicate(timeout=300), proc.returncode) for proc in makes]
    for (out, err), code in results:
        assert code == 0, err
    statuses = sorted(outcomes(subprocess.CompletedProcess([], 0, out, ""))["tiny:one"] for (out, _), _ in results)
    assert statuses == ["built"] + ["reused"] * 7
    events = subprocess.run(
        ["docker", "events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}",
         "--filter", "type=container", "--filter", "event=create", "--filter", "label=org.efabuild.export",
         "--format", '{{index .Actor.Attributes "org.efabuild.export"}}'],
        capture_output=True, text=True, check=True).stdout.split()
    assert len([e for e in events if e.startswith(f"{tiny_ws}/")]) == 1, "the artifact was exported more than once"
    assert len(list((tiny_ws / "cache" / "logs").rglob("*.log"))) == 1
    assert efabuild(tiny_ws, "lookup", "--verify", "tiny:one").returncode == 0
