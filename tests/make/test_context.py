"""A layer's build context: what is hashed into its key is exactly what the build gets.

Real files in a temporary workspace; no engine is needed to check what a context holds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from efabuild import dag
from efabuild.make.context import SOURCE_DATE_EPOCH, ContextHasher, hash_contexts, never_context, write_context
from efabuild.make.hashcache import HashState
from efabuild.errors import EfabuildError
from efabuild.workspace import load_workspace
from tests.kits.wsfactory import SIMPLE_GRAPH, make_workspace


def hashed(root: Path):
    ws = load_workspace(root)
    graph = dag.layer_graph(ws)
    order = dag.select(ws, graph, [])
    return hash_contexts(ws, graph, order, ContextHasher(ws.root, HashState(None), exclude=never_context(ws)))


@pytest.fixture
def workspace(tmp_path) -> Path:
    root = make_workspace(tmp_path / "ws", files={"app/train.py": "print('train')\n", "app/run.sh": "#!/bin/sh\n"})
    os.chmod(root / "app" / "train.py", 0o600)
    os.chmod(root / "app" / "run.sh", 0o750)
    os.symlink("train.py", root / "app" / "latest.py")
    os.mkfifo(root / "app" / "pipe")  # cannot go into an image: left out, as Docker does
    return root


def test_the_written_context_holds_the_hashed_files_normalised_like_the_key(workspace, tmp_path):
    entries = hashed(workspace)["stack:user"]
    assert [(e.path, e.mode) for e in entries] == [
        ("app/latest.py", "symlink"), ("app/run.sh", "755"), ("app/train.py", "644")]
    out = tmp_path / "context"
    out.mkdir()
    write_context(workspace, out, entries)
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert written == ["app", "app/latest.py", "app/run.sh", "app/train.py"]
    assert os.readlink(out / "app" / "latest.py") == "train.py"
    assert (out / "app" / "train.py").read_text() == "print('train')\n"
    for rel, mode in (("app", 0o755), ("app/run.sh", 0o755), ("app/train.py", 0o644)):
        st = (out / rel).stat()
        assert (st.st_mode & 0o777, st.st_mtime) == (mode, SOURCE_DATE_EPOCH), rel
    assert os.lstat(out / "app" / "latest.py").st_mtime == SOURCE_DATE_EPOCH


@pytest.mark.parametrize("change", ["content", "link"])
def test_a_file_changed_after_its_key_was_computed_stops_the_build(workspace, tmp_path, change):
    entries = hashed(workspace)["stack:user"]
    if change == "content":
        (workspace / "app" / "train.py").write_text("print('edited meanwhile')\n")
        changed = "app/train.py"
    else:
        os.unlink(workspace / "app" / "latest.py")
        os.symlink("run.sh", workspace / "app" / "latest.py")
        changed = "app/latest.py"
    out = tmp_path / "context"
    out.mkdir()
    with pytest.raises(EfabuildError, match=f"context file {changed} changed after its key was computed"):
        write_context(workspace, out, entries)


def test_a_context_of_the_whole_workspace_leaves_out_the_store_and_git(tmp_path):
    graph = SIMPLE_GRAPH.replace('context = ["app"]', 'context = ["."]')
    root = make_workspace(tmp_path / "ws", {"stack": graph})
    for rel in ("cache/objects/ab/x.sqsh", ".git/HEAD"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("not context\n")
    paths = {e.path for e in hashed(root)["stack:user"]}
    assert "app/train.py" in paths and "BUILD.toml" in paths
    assert not any(p.startswith(("cache/", ".git/")) for p in paths)
