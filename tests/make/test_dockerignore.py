"""Context exclusions: Docker's .dockerignore syntax, read the way Docker reads it, and what it
does to layer keys (make/dockerignore.py, through the context hasher)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from efabuild.make.dockerignore import Exclusions, docker_patterns
from tests.core.test_keys import keys_of
from tests.kits.wsfactory import SIMPLE_GRAPH, make_workspace

REPO = Path(__file__).resolve().parents[2]
SCHEMA_FIELDS = {"schema", "parent_key", "base", "dockerfile", "args", "platform", "context"}


def test_patterns_are_read_as_docker_reads_them():
    lines = ["# a comment", "", "  /build/  ", "!./keep.md", "a//b/../c", "/"]
    assert docker_patterns(lines) == ("build", "!keep.md", "a/c")


@pytest.mark.parametrize("pattern, path, left_out", [
    ("*.pyc", "x.pyc", True),
    ("*.pyc", "sub/x.pyc", False),  # anchored at the root, unlike a .gitignore name
    ("**/*.pyc", "sub/deep/x.pyc", True),
    ("**/__pycache__", "__pycache__/x.pyc", True),  # a matched directory covers what is under it
    ("**/__pycache__", "a/b/__pycache__/x.pyc", True),
    ("data", "data/big/file.bin", True),
    ("data", "database.txt", False),
    ("a/*/c", "a/b/c", True),
    ("a/*/c", "a/b/x/c", False),  # `*` stops at a slash
    ("?.txt", "ab.txt", False),
])
def test_docker_pattern_semantics(pattern, path, left_out):
    assert Exclusions([pattern]).excludes(path) is left_out


def test_an_exception_brings_back_a_file_inside_an_excluded_directory():
    rules = Exclusions(["docs", "!docs/keep.md"])
    assert rules.excludes("docs/other.md") and not rules.excludes("docs/keep.md")
    assert not rules.prunes("docs")  # so the walk goes into docs/
    assert Exclusions(["docs"]).prunes("docs")


def test_a_context_roots_patterns_are_relative_to_it():
    rules = Exclusions(["*.md"], "app")
    assert rules.excludes("app/notes.md")
    assert not rules.excludes("app/sub/notes.md") and not rules.excludes("notes.md")
    assert not rules.excludes("application/notes.md")


def test_the_demo_keys_are_made_of_what_they_were_made_of():
    from efabuild import dag
    from efabuild.make.context import ContextHasher, hash_contexts
    from efabuild.make.hashcache import HashState
    from efabuild.plan import BaseResolution, layer_inputs
    from efabuild.workspace import load_workspace

    ws = load_workspace(REPO)
    graph = dag.layer_graph(ws)
    order = dag.select(ws, graph, [])
    bases = {l.base.ref: BaseResolution(l.base.ref, l.base.digest, "pinned") for l in ws.layers.values() if l.base}
    contexts = hash_contexts(ws, graph, order, ContextHasher(ws.root, HashState(None)))
    inputs = layer_inputs(ws.settings.builder.platform, graph, order, bases, contexts)
    for inp in inputs.values():  # no exclude field, no .dockerignore: every shipped key stays
        assert set(json.loads(inp.canonical())) == SCHEMA_FIELDS
    assert not any(e.path.endswith(".dockerignore") for inp in inputs.values() for e in inp.context)


def excluding(patterns: str) -> str:
    return SIMPLE_GRAPH.replace('context = ["app"]', f'context = ["app"]\nexclude = {patterns}')


def test_an_excluded_pyc_does_not_change_the_key(tmp_path):
    plain = make_workspace(tmp_path / "plain")
    excluded = make_workspace(tmp_path / "excluded", {"stack": excluding('["**/__pycache__"]')})
    before_plain, before_excluded = keys_of(plain), keys_of(excluded)
    assert before_excluded["stack:user"] != before_plain["stack:user"]  # the patterns are in the key
    assert before_excluded["stack:efa"] == before_plain["stack:efa"]  # and only in that layer's
    for root in (plain, excluded):
        (root / "app" / "__pycache__").mkdir()
        (root / "app" / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\x00compiled")
    assert keys_of(excluded) == before_excluded
    assert keys_of(plain)["stack:user"] != before_plain["stack:user"]


def test_a_dockerignore_in_the_context_root_leaves_files_out(tmp_path):
    root = make_workspace(tmp_path / "ws")
    (root / "app" / ".dockerignore").write_text("# local runs\n**/__pycache__\n*.log\n!keep.log\n")
    before = keys_of(root)
    (root / "app" / "lib" / "__pycache__").mkdir()
    (root / "app" / "lib" / "__pycache__" / "util.pyc").write_bytes(b"\x00")
    (root / "app" / "run.log").write_text("noise\n")
    assert keys_of(root) == before
    (root / "app" / "keep.log").write_text("wanted\n")  # an exception: back in the context
    assert keys_of(root)["stack:user"] != before["stack:user"]


def test_exclude_that_is_not_a_list_of_strings_is_one_line(tmp_path):
    root = make_workspace(tmp_path / "ws", {"stack": excluding('"**/__pycache__"')})
    proc = subprocess.run([sys.executable, "-m", "efabuild", "-C", str(root), "plan", "--offline"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "graphs/stack.toml" in proc.stderr and "layers.user.exclude" in proc.stderr
