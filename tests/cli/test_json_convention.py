"""Every --json output follows one convention (docs/reference/json.md), checked on a store a real
make built: one object naming its format and version, null (never "") for a missing value, and
the same field names for the same things (name, key, path)."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from fixtures.builder import MINI_NGC_TAG, build_fixtures
from tests.kits.inprocess import run_efabuild
from tests.kits.signkit import make_key
from tests.kits.wsfactory import make_workspace

REPO = Path(__file__).resolve().parents[2]
FORMAT = re.compile(r"efabuild\.[a-z]+/v1")
KEY = re.compile(r"[0-9a-f]{64}")
# names other spellings of name, key and path had before the convention
OLD_NAMES = {"qualname", "sqsh", "sqsh_path", "layer_key", "ref_key"}


@pytest.fixture(scope="module")
def built(docker_engine, tmp_path_factory) -> Path:
    build_fixtures()
    run = uuid.uuid4().hex
    graph = (f'[layers.one]\nbase = "{MINI_NGC_TAG}"\nartifact = true\ndockerfile = "RUN echo {run} > /id"\n\n'
             '[layers.two]\nparent = "one"\nartifact = true\ndockerfile = "RUN echo two > /two"\n')
    # signed, so verify has something to verify
    root = make_workspace(tmp_path_factory.mktemp("json") / "ws", {"g": graph}, build=(
        '[workspace]\ngraphs = ["graphs/*.toml"]\n[sign]\nkey = "keys/ec.pem"\n[trust]\nkeys = ["keys/ec.pub.pem"]\n'))
    make_key(root / "keys", "ec")
    first = efabuild(root, "make", "--json")
    assert first.returncode == 0, first.stderr
    yield root
    from tests.make.test_make import _remove_images_of

    _remove_images_of(root)


def efabuild(root: Path, *args: str):
    return run_efabuild(["-C", str(root), *args])


def document(root: Path, *args: str) -> dict:
    """The JSON a command printed, whatever its exit status (an audit may fail: its JSON stands)."""
    done = efabuild(root, *args)
    assert done.returncode in (0, 1), f"{args}: {done.returncode} {done.stderr}"
    assert "Traceback" not in done.stderr
    assert done.stdout.isascii(), f"{args}: not ASCII (\\u escapes)"

    def sorted_object(pairs: list[tuple[str, object]]) -> dict:
        names = [name for name, _ in pairs]
        assert names == sorted(names), f"{args}: keys not sorted: {names}"
        return dict(pairs)

    data = json.loads(done.stdout, object_pairs_hook=sorted_object)
    check_convention(data, args)
    return data


def check_convention(data: dict, args: tuple) -> None:
    """The convention, in every field efabuild writes; show's `manifest` is the stored provenance
    manifest as written (a document of its own, with paths inside the image), so not walked."""
    assert isinstance(data, dict), f"{args}: one object, not a bare list"
    assert FORMAT.fullmatch(data["format"]), f"{args}: format {data['format']!r}"
    data = {name: value for name, value in data.items() if not (args[0] == "show" and name == "manifest")}

    def walk(value, where: str) -> None:
        if isinstance(value, dict):
            for name, item in value.items():
                assert item != "", f"{args}: {where}.{name} is \"\": a missing value is null"
                assert name not in OLD_NAMES, f"{args}: {where}.{name}: the convention says name, key or path"
                if name == "key" and item is not None:
                    assert KEY.fullmatch(item), f"{args}: {where}.key {item!r} is not a whole key"
                if name == "path" and item is not None:
                    assert Path(item).is_absolute() and Path(item).is_file(), f"{args}: {where}.path {item!r}"
                walk(item, f"{where}.{name}")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{where}[{index}]")

    walk(data, "")


def test_every_json_command_follows_the_convention(built: Path, tmp_path: Path):
    root = built
    log = tmp_path / "slurm.out"
    log.write_text((REPO / "tests" / "data" / "logs" / "efa-new.log").read_text())
    formats = {}
    for args in (["plan"], ["plan", "--offline"], ["make", "--dry-run"], ["make"], ["lookup", "g:two"],
                 ["ls"], ["du"], ["gc"], ["show", "g:two"], ["diff", "g:one", "g:two"], ["audit", "--all"],
                 ["verify", "--all"], ["lint"], ["doctor", str(log)], ["make", "--check", "g:two"]):
        formats[" ".join(args)] = document(root, *args, "--json")["format"]
    assert formats == {
        "plan": "efabuild.plan/v1", "plan --offline": "efabuild.plan/v1", "make --dry-run": "efabuild.plan/v1",
        "make": "efabuild.make/v1", "lookup g:two": "efabuild.lookup/v1", "ls": "efabuild.ls/v1",
        "du": "efabuild.du/v1", "gc": "efabuild.gc/v1", "show g:two": "efabuild.show/v1",
        "diff g:one g:two": "efabuild.diff/v1", "audit --all": "efabuild.audit/v1",
        "verify --all": "efabuild.verify/v1", "lint": "efabuild.lint/v1", "doctor " + str(log): "efabuild.doctor/v1",
        "make --check g:two": "efabuild.check/v1"}


def test_make_json_gives_the_path_of_reused_artifacts_too(built: Path):
    again = document(built, "make", "--json")
    layers = {layer["name"]: layer for layer in again["layers"]}
    assert {name: layer["status"] for name, layer in layers.items()} == {"g:one": "reused", "g:two": "reused"}
    for name, layer in layers.items():
        looked_up = json.loads(efabuild(built, "lookup", "--json", name).stdout)
        assert layer["path"] == looked_up["path"] and layer["key"] == looked_up["key"]
        assert layer["error"] is None and layer["log"] is None  # nothing built: null, not ""
    assert again["failed"] is False


def test_json_progress_is_events_on_stderr_and_the_outcome_on_stdout(built: Path):
    done = efabuild(built, "make", "--progress", "json", "--json")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stderr.splitlines()]
    assert {e["format"] for e in events} == {"efabuild.progress/v1"}
    assert events[0]["event"] == "plan" and [layer["name"] for layer in events[0]["layers"]] == ["g:one", "g:two"]
    for event in events:
        check_convention(event, ("make --progress json",))
    assert json.loads(done.stdout)["format"] == "efabuild.make/v1"



def test_a_failure_is_shown_once_with_its_real_time_and_as_one_json_event(built: Path):
    bad = built / "graphs" / "bad.toml"
    bad.write_text('[layers.broken]\nparent = "g:one"\ndockerfile = "RUN sleep 1 && exit 3"\n')
    try:
        events_run = efabuild(built, "make", "--progress", "json", "--json", "bad")
        text_run = efabuild(built, "make", "--progress", "plain", "bad")
    finally:
        bad.unlink()
    assert events_run.returncode == text_run.returncode == 1
    events = [json.loads(line) for line in events_run.stderr.splitlines()]  # every line JSON: no text among them
    [failed] = [e for e in events if e["event"] == "finished" and e["name"] == "bad:broken"]
    assert failed["status"] == "failed" and failed["seconds"] >= 1.0  # it ran a second, not 0.0s
    assert "exit code 3" in failed["error"]
    [layer] = [x for x in json.loads(events_run.stdout)["layers"] if x["name"] == "bad:broken"]
    assert layer["error"] == failed["error"] and layer["path"] is None
    # for a person: the progress line says when it failed, the table says failed and how long,
    # and the message (step, exit code, log lines) comes once, after the table
    assert text_run.stderr.count("exit code 3") == 1
    assert any(line.startswith("[bad:broken] failed after ") for line in text_run.stderr.splitlines())
    assert len([line for line in text_run.stderr.splitlines() if line.startswith("efabuild: bad:broken failed: ")]) == 1
    row = next(line for line in text_run.stdout.splitlines() if line.startswith("bad:broken")).split()
    assert row[2] == "failed" and float(row[3].rstrip("s")) >= 1.0 and len(row) == 4  # no error in ARTIFACT
