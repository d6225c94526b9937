"""The layer DAG drawn by Graphviz's real `dot`: every layer named, coloured by its plan state or
by what make did, with its short key and why it builds."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from efabuild.cli import graphviz
from efabuild.cli import picture
from efabuild.plan import Availability, make_plan
from efabuild.make.prepare import prepare
from efabuild.workspace import load_workspace
from tests.kits.inprocess import run_efabuild
from tests.kits.wsfactory import SIMPLE_GRAPH, make_workspace

SVG = "{http://www.w3.org/2000/svg}"


def drawn_layers(svg: bytes) -> dict[str, tuple[str, str]]:
    """Layer name -> (fill colour of its box, its label text), read from the SVG as a browser would."""
    root = ET.fromstring(svg)
    layers = {}
    for group in root.iter(f"{SVG}g"):
        if "node" not in (group.get("class") or "").split():
            continue
        name = group.findtext(f"{SVG}title")
        shapes = [*group.iter(f"{SVG}polygon"), *group.iter(f"{SVG}path")]  # boxes; cylinders are paths
        text = " | ".join(t.text or "" for t in group.iter(f"{SVG}text"))
        layers[name] = (shapes[0].get("fill") if shapes else None, text)
    return layers


def efabuild(root: Path, *args: str) -> subprocess.CompletedProcess:
    """`efabuild -C ROOT ARGS` in this process (tests/kits/inprocess.py), output as bytes."""
    return run_efabuild(["-C", str(root), *args], text=False)


def efabuild_process(root: Path, *args: str) -> subprocess.CompletedProcess:
    """The same in a real process: a make builds, and stops on SIGTERM, as its own process."""
    return subprocess.run([sys.executable, "-m", "efabuild", "-C", str(root), *args], capture_output=True,
                          stdin=subprocess.DEVNULL, env={**os.environ})


def test_each_plan_state_has_its_colour_key_and_reason(tmp_path):
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH})
    prepared = prepare(load_workspace(root), use_engine=False)
    keys = {lp.qualname: lp.key for lp in prepared.plan.layers}
    inputs = {lp.qualname: lp.inputs for lp in prepared.plan.layers}
    # the engine has efa's image but no .sqsh; the layer-cache registry has deepep; user is new
    availability = Availability(images=frozenset({keys["stack:efa"]}), registry=frozenset({keys["stack:deepep"]}))
    plan = make_plan(prepared.graph, prepared.order, inputs, availability, previous=lambda name: None)
    svg = graphviz.render(picture.dot_source(prepared.graph, prepared.order, picture.plan_nodes(plan)), "svg")
    layers = drawn_layers(svg)
    assert layers["stack:efa"][0] == picture.STATE_COLOURS["to export"]
    assert layers["stack:deepep"][0] == picture.STATE_COLOURS["to pull"]
    assert layers["stack:user"][0] == picture.STATE_COLOURS["to build"]
    assert len({layers[name][0] for name in keys}) == 3
    for name, key in keys.items():
        assert key[:12] in layers[name][1]
    assert "new layer (no earlier build recorded)" in layers["stack:user"][1]
    assert "image in the layer-cache registry" in layers["stack:deepep"][1]
    assert "[.sqsh]" in layers["stack:efa"][1] and "[.sqsh]" not in layers["stack:deepep"][1]
    # the base is drawn too, and a legend names the states shown
    assert layers["base0"][1] == "example.com/pytorch:26.08-py3"
    legend = layers["legend"][1]
    assert all(state in legend for state in ("to export", "to pull", "to build"))
    assert "provisional" not in legend and not any(text.split(" | ")[1].split()[0].endswith("*")
                                                    for name, (_, text) in layers.items() if name.startswith("stack:"))
    # a filesystem tier holds efa's .sqsh and another lacks it: copied, drawn in its own colour
    copying = make_plan(prepared.graph, prepared.order, inputs, Availability(
        images=frozenset(keys.values()), artifacts=frozenset({keys["stack:user"]}),
        held=frozenset({keys["stack:efa"]})), previous=lambda name: None)
    layers = drawn_layers(graphviz.render(
        picture.dot_source(prepared.graph, prepared.order, picture.plan_nodes(copying)), "svg"))
    assert layers["stack:efa"][0] == picture.STATE_COLOURS["to copy"] != layers["stack:user"][0]
    assert "to copy" in layers["legend"][1]


def test_graph_command_draws_the_offline_plan(tmp_path):
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH})
    done = efabuild(root, "graph", "--format", "svg", "--offline")
    assert done.returncode == 0, done.stderr
    assert {fill for fill, _ in drawn_layers(done.stdout).values() if fill != "none"} >= {
        picture.STATE_COLOURS["to build"]}
    # the base's digest is not known offline: every key is marked provisional, and the mark explained
    drawn = drawn_layers(done.stdout)
    for lp in prepare(load_workspace(root), use_engine=False).plan.layers:
        assert f"{lp.short_key}*  to build" in drawn[lp.qualname][1].replace("\xa0", " ")  # dot's spaces
    assert "* provisional key: may change once the base" in drawn["legend"][1]
    # a recorded build makes deepep available and the artifact layers only to export
    prepared = prepare(load_workspace(root), use_engine=False)
    for lp in prepared.plan.layers:
        prepared.records.record(lp.qualname, lp.key, lp.inputs)
    out = root / "plan.svg"
    assert efabuild(root, "graph", "stack", "--format", "svg", "--offline", "-o", str(out)).returncode == 0
    layers = drawn_layers(out.read_bytes())
    assert layers["stack:deepep"][0] == picture.STATE_COLOURS["available"]
    assert layers["stack:efa"][0] == layers["stack:user"][0] == picture.STATE_COLOURS["to export"]
    png = efabuild(root, "graph", "--format", "png", "--offline")
    assert png.returncode == 0 and png.stdout.startswith(b"\x89PNG\r\n\x1a\n")
    bad = efabuild(root, "graph", "--format", "text", "-o", str(out))
    assert bad.returncode == 2 and bad.stderr.decode().count("\n") == 1


def test_a_temp_file_a_killed_efabuild_left_beside_its_output_goes_with_the_next_write(tmp_path):
    from efabuild.host.owner import Owner

    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH})
    me = Owner.current()
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)
    killed = root / f"efatmp.{me.host}.{dead}.{me.start}.0badc0de.plan.svg.part"
    killed.write_bytes(b"<svg")  # killed before its rename
    live = root / f"efatmp.{me.token}.0badc0de.plan.svg.part"  # a running writer's
    live.write_bytes(b"")
    other = root / f"efatmp.{me.host}.{dead}.{me.start}.0badc0de.other.svg.part"  # another output's
    other.write_bytes(b"")
    done = efabuild(root, "graph", "--format", "svg", "--offline", "-o", str(root / "plan.svg"))
    assert done.returncode == 0, done.stderr
    assert b"<svg" in (root / "plan.svg").read_bytes()
    assert not killed.exists() and live.exists() and other.exists()


@pytest.mark.slow
@pytest.mark.parametrize("planted", ["link", "fifo", "directory", "device"])
def test_an_output_path_that_is_no_regular_file_is_one_line_and_left_as_it_is(tmp_path, planted):
    """`-o /tmp/plan.svg`: whoever can write /tmp may have put a link to another file there, a
    FIFO, or a directory; and a root who writes `-o /dev/null` or `-o /dev/stdout` must not have
    the rename put a regular file in place of the device or the link. Each is one line, exit 2,
    and stays as it was."""
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH})
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    victim = tmp_path / "victim"
    victim.write_text("another user's file\n")
    out = shared / "plan.svg"
    if planted == "device":
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(out, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    else:
        {"link": lambda: out.symlink_to(victim), "fifo": lambda: os.mkfifo(out), "directory": out.mkdir}[planted]()
    before = os.lstat(out)
    done = subprocess.run([sys.executable, "-m", "efabuild", "-C", str(root), "graph", "--format", "svg",
                           "--offline", "-o", str(out)], capture_output=True, text=True, timeout=60)
    kind = {"link": "a symbolic link", "fifo": "a FIFO", "directory": "a directory", "device": "a device"}[planted]
    assert done.returncode == 2 and done.stderr.startswith(f"efabuild: {out}: {kind}, not a file")
    assert done.stderr.count("\n") == 1
    after = os.lstat(out)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert victim.read_text() == "another user's file\n"
    assert sorted(p.name for p in shared.iterdir()) == ["plan.svg"]  # no temp file left


@pytest.mark.engine
def test_make_draws_what_it_did(tmp_path, docker_engine):
    from fixtures.builder import MINI_NGC_TAG, build_fixtures

    build_fixtures()
    run = uuid.uuid4().hex[:12]  # keys new to the engine
    graph = f"""
[layers.base]
base = "{MINI_NGC_TAG}"
dockerfile = '''
ARG RUN_ID={run}
RUN echo $RUN_ID > /run-id
'''
artifact = true
ignore = [{{ rule = "EFA010", reason = "a local fixture image" }}]

[layers.broken]
parent = "base"
dockerfile = '''
RUN echo compiling && exit 3
'''

[layers.after]
parent = "broken"
dockerfile = '''
RUN true
'''
"""
    root = make_workspace(tmp_path / "ws", {"pic": graph})
    out = tmp_path / "make.svg"
    try:
        done = efabuild_process(root, "make", "--graph", str(out))
        assert done.returncode == 1, done.stderr
        layers = drawn_layers(out.read_bytes())
        assert layers["pic:base"][0] == picture.STATE_COLOURS["built"]
        assert layers["pic:broken"][0] == picture.STATE_COLOURS["failed"]
        assert layers["pic:after"][0] == picture.STATE_COLOURS["skipped"]
        assert "RUN echo compiling && exit 3 | exit code 3" in layers["pic:broken"][1]
        assert "parent pic:broken did not finish" in layers["pic:after"][1]
        # a name Graphviz cannot draw is bad input, refused before anything builds
        bad = efabuild_process(root, "make", "--graph", str(tmp_path / "make.pdf"))
        assert bad.returncode == 2 and "must end in .svg or .png" in bad.stderr.decode()
    finally:
        tags = subprocess.run(["docker", "image", "ls", "--filter", "label=org.efabuild.graph=pic", "--format",
                               "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True).stdout.split()
        if tags:
            subprocess.run(["docker", "image", "rm", "-f", *tags], capture_output=True)
