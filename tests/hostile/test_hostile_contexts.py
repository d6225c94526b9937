"""Hostile build contexts: what a layer's context directory can hold that no build should take in
or choke on. The key must see exactly what the build gets, no host file outside the workspace may
reach an image, and a name the key cannot hold is one line, not a traceback or a hang.

Real files in a temporary workspace; the context written for the engine is read back from disk.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from efabuild import dag
from efabuild.make.context import ContextHasher, hash_contexts, never_context, write_context
from efabuild.make.hashcache import HashState
from efabuild.errors import EfabuildError
from efabuild.workspace import load_workspace
from tests.kits.fifos import without_blocking_on
from tests.kits.inprocess import run_efabuild
from tests.kits.wsfactory import SIMPLE_GRAPH, make_workspace


def plan(root: Path):
    return run_efabuild(["-C", str(root), "plan", "--offline", "--json"], capture_output=True, text=True)


def one_line_error(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def with_exclude(patterns: list[str]) -> str:
    return SIMPLE_GRAPH.replace('context = ["app"]', f'context = ["app"]\nexclude = {json.dumps(patterns)}')


def test_a_file_name_that_is_not_utf8_is_one_line_naming_it(tmp_path):
    """A key is canonical JSON: it cannot hold a name that is not UTF-8. The plan says which file."""
    root = make_workspace(tmp_path / "ws")
    (root / "app" / os.fsdecode(b"model-\xff.bin")).write_bytes(b"weights")
    line = one_line_error(plan(root))
    assert "graphs/stack.toml" in line and "layers.user.context" in line
    assert "app/model-\\xff.bin" in line, line  # the byte as every message shows one
    assert "UTF-8" in line
    (root / "graphs" / "stack.toml").write_text(with_exclude(["app/model-*.bin"]))  # as the line advises
    assert plan(root).returncode == 0


def test_a_symlink_whose_target_is_not_utf8_is_keyed_and_written_byte_for_byte(tmp_path):
    root = make_workspace(tmp_path / "ws")
    os.symlink(b"lib/\xff", os.fsencode(root / "app" / "odd"))
    entries = hashed(root)
    out = tmp_path / "context"
    out.mkdir()
    write_context(root, out, entries)
    assert os.readlink(os.fsencode(out / "app" / "odd")) == b"lib/\xff"
    assert plan(root).returncode == 0


def hashed(root: Path):
    ws = load_workspace(root)
    graph = dag.layer_graph(ws)
    return hash_contexts(ws, graph, dag.select(ws, graph, []),
                         ContextHasher(ws.root, HashState(None), exclude=never_context(ws)))["stack:user"]


def test_names_with_newlines_and_escapes_are_keyed_and_written_as_they_are(tmp_path):
    """Odd but valid names go into the key and into the build's context byte for byte."""
    odd = ["a\nb.py", "\x1b[31mred.py", "sp ace.py", "é.py"]
    root = make_workspace(tmp_path / "ws", files={f"app/{name}": name for name in odd})
    entries = hashed(root)
    assert sorted(e.path for e in entries) == sorted(f"app/{name}" for name in odd)
    out = tmp_path / "context"
    out.mkdir()
    write_context(root, out, entries)
    assert sorted(os.listdir(out / "app")) == sorted(odd)
    assert all((out / "app" / name).read_text() == name for name in odd)
    assert plan(root).returncode == 0


@pytest.mark.parametrize("pattern", ["app/[z-a].py", "app/\\", "app/[[:alpha:]].py"])
def test_an_exclude_pattern_docker_would_refuse_is_one_line(tmp_path, pattern):
    import subprocess
    import sys

    from tests.kits.wsfactory import REPO

    root = make_workspace(tmp_path / "ws", {"stack": with_exclude([pattern])})
    # a real process: a warning the regex parser prints would be a line of its own
    line = one_line_error(subprocess.run([sys.executable, "-m", "efabuild", "-C", str(root), "plan", "--offline"],
                                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}))
    assert "graphs/stack.toml" in line and "layers.user.exclude" in line and "pattern" in line


def test_a_dockerignore_pattern_docker_would_refuse_is_one_line_naming_the_file(tmp_path):
    root = make_workspace(tmp_path / "ws")
    (root / "app" / ".dockerignore").write_text("*.log\n[z-a]\n")
    line = one_line_error(plan(root))
    assert "app/.dockerignore" in line and "pattern" in line


def test_patterns_that_climb_out_or_are_absolute_never_reach_outside_the_context(tmp_path):
    """`..` and absolute patterns are cleaned as Docker cleans them: they can only leave files
    out, never add any, and none names a file outside the workspace."""
    root = make_workspace(tmp_path / "ws", {"stack": with_exclude(["../secret", "/etc/shadow", "app/../../x"])})
    (tmp_path / "secret").write_text("outside\n")
    proc = plan(root)
    assert proc.returncode == 0, proc.stderr
    entries = hashed(root)
    assert [e.path for e in entries] == ["app/lib/util.py", "app/train.py"]


@pytest.mark.parametrize("target", ["/etc/shadow", "/", "../../outside"])
def test_a_symlink_out_of_the_workspace_is_refused(tmp_path, target):
    root = make_workspace(tmp_path / "ws")
    os.symlink(target, root / "app" / "x")
    line = one_line_error(plan(root))
    assert "'app/x' is a symlink leading outside the workspace" in line


@pytest.mark.parametrize("target", ["..", ".", "lib"])
def test_a_symlink_back_up_the_tree_is_one_entry_not_an_endless_walk(tmp_path, target):
    """A link to a directory that holds it is a loop only for a walk that follows links: the
    context keeps the link itself, as BuildKit sends it."""
    root = make_workspace(tmp_path / "ws")
    os.symlink(target, root / "app" / "up")
    proc = plan(root)
    assert proc.returncode == 0, proc.stderr
    entries = hashed(root)
    assert [(e.path, e.mode) for e in entries if e.path.startswith("app/up")] == [("app/up", "symlink")]


def test_a_file_swapped_for_a_fifo_after_hashing_stops_the_build_without_hanging(tmp_path):
    """Between the plan and the build the workspace may change: a context file replaced by a
    FIFO must not block the copy (nothing would ever write to it)."""
    root = make_workspace(tmp_path / "ws")
    entries = hashed(root)
    (root / "app" / "train.py").unlink()
    os.mkfifo(root / "app" / "train.py")
    out = tmp_path / "context"
    out.mkdir()
    with pytest.raises(EfabuildError) as failure:
        without_blocking_on(root / "app" / "train.py", lambda: write_context(root, out, entries))
    assert "app/train.py changed after its key was computed" in str(failure.value)


def test_a_file_swapped_for_a_fifo_between_the_walks_stat_and_its_read_is_one_line_not_a_hang(tmp_path,
                                                                                               monkeypatch):
    """The walk lstat()s a file, then opens it to hash it: a FIFO swapped in between must not block
    the plan (nothing would ever write to it)."""
    root = make_workspace(tmp_path / "ws")
    read_digest = ContextHasher._read_digest

    def swap_then_read(self, rel, path, st):
        if rel == "app/train.py":
            os.unlink(path)
            os.mkfifo(path)
        return read_digest(self, rel, path, st)

    monkeypatch.setattr(ContextHasher, "_read_digest", swap_then_read)
    with pytest.raises(EfabuildError) as failure:
        without_blocking_on(root / "app" / "train.py", lambda: hashed(root))
    assert str(failure.value).startswith("context file app/train.py changed while it was read")


def test_the_workspace_s_dockerignore_taken_in_as_a_file_leaves_out_what_buildkit_leaves_out(tmp_path):
    """`context = [".dockerignore", "app"]` puts the workspace's .dockerignore at the root of the
    build context, where BuildKit reads it (with the Dockerfile on stdin) and leaves out what it
    names: the key must not count a file the image will not hold."""
    graph = SIMPLE_GRAPH.replace('context = ["app"]', 'context = [".dockerignore", "app"]')
    root = make_workspace(tmp_path / "ws", {"stack": graph})
    (root / ".dockerignore").write_text("app/lib\n")
    assert [e.path for e in hashed(root)] == [".dockerignore", "app/train.py"]
    before = plan(root)
    (root / "app" / "lib" / "util.py").write_text("X = 2\n")  # left out: the key stays
    assert json.loads(plan(root).stdout)["layers"] == json.loads(before.stdout)["layers"]


def test_a_pattern_built_to_backtrack_does_not_hang_the_plan(tmp_path):
    """`*a*a*…*b` against a long name of a's takes exponential time in a backtracking regex engine
    (Python's re hung here); BuildKit's Go regexps, and RE2 here, match in linear time. A real
    process with a timeout: a hang fails the test instead of stalling the suite."""
    import subprocess
    import sys

    from tests.kits.wsfactory import REPO

    root = make_workspace(tmp_path / "ws", {"stack": with_exclude(["app/" + "*a" * 16 + "*b"])})
    (root / "app" / ("a" * 200)).write_text("x\n")
    (root / "app" / ".dockerignore").write_text("*a" * 16 + "*b\n")
    proc = subprocess.run([sys.executable, "-m", "efabuild", "-C", str(root), "plan", "--offline"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr


def test_a_root_through_a_link_another_root_holds_is_one_line_and_nothing_is_written_through_it(tmp_path):
    """`context = ["app", "app/link/y/z"]` with app/link a symlink elsewhere in the workspace: the
    build context would hold the link, and make's writing z there went through it (chmod and
    mtime 1980 on the workspace's own directory, a file created in it, or a traceback when z was
    there). The plan refuses it first."""
    graph = SIMPLE_GRAPH.replace('context = ["app"]', 'context = ["app", "app/link/y/z"]')
    root = make_workspace(tmp_path / "ws", {"stack": graph})
    (root / "elsewhere" / "y").mkdir(parents=True)
    (root / "elsewhere" / "y" / "z").write_text("z\n")
    os.symlink("../elsewhere", root / "app" / "link")
    line = one_line_error(plan(root))
    assert "'app/link/y/z' is under 'app/link', a symlink the context also holds" in line
