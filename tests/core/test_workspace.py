"""Reading workspaces: the shipped graphs load, and every kind of bad input gives one clear line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from efabuild.cli import main
from efabuild.errors import InputError
from efabuild.workspace import find_root, load_workspace
from tests.kits.inprocess import run_efabuild
from tests.kits.wsfactory import SIMPLE_GRAPH, make_workspace

REPO = Path(__file__).resolve().parents[2]


def test_shipped_workspace_loads_both_graphs():
    ws = load_workspace(REPO)
    assert {g.name for g in ws.graphs} == {"demo", "ngc-efa"}
    demo, real = (next(g for g in ws.graphs if g.name == n) for n in ("demo", "ngc-efa"))
    assert [layer.name for layer in real.layers] == ["efa", "deepep", "user"]
    # the demo runs exactly the Dockerfile text users copy from ngc-efa.toml
    assert [layer.dockerfile for layer in demo.layers] == [layer.dockerfile for layer in real.layers]
    efa = real.layers[0]
    assert efa.base.ref == "nvcr.io/nvidia/pytorch:26.08-py3"
    assert efa.args_dict == {"EFA_INSTALLER_VERSION": "1.50.0"}
    assert "efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify" in efa.dockerfile
    assert real.layers[1].args_dict["HYBRID_EP_COMMIT"] == "94a9f8f6b146c07d97ec58f67cd6d303296d6098"
    assert real.layers[2].context == ("app",)
    # backslash continuations survive TOML (literal strings): the RUN is one instruction
    assert "apt-get update \\\n && apt-get install" in efa.dockerfile


def test_find_root_walks_up(tmp_path):
    root = make_workspace(tmp_path / "ws")
    deep = root / "app" / "lib"
    assert find_root(deep) == root.resolve()
    with pytest.raises(InputError, match="no BUILD.toml"):
        find_root(tmp_path)


def test_dockerfile_line_points_into_the_graph_file():
    ws = load_workspace(REPO)
    efa = ws.layers["ngc-efa:efa"]
    lines = efa.source.read_text().splitlines()
    assert lines[efa.dockerfile_line - 1] == efa.dockerfile.splitlines()[0]
    assert lines[efa.line - 1].strip() == "[layers.efa]"


def test_layer_lines_are_exact_after_blank_lines(tmp_path):
    graph = '[graph]\ndescription = "x"\n\n[layers.efa]\nbase = "b:1"\n\ndockerfile = \'\'\'\nRUN true\n\'\'\'\n'
    root = make_workspace(tmp_path / "ws", {"stack": graph})
    efa = load_workspace(root).layers["stack:efa"]
    assert (efa.line, efa.dockerfile_line) == (4, 8)


def run_cli(root: Path, *args: str) -> tuple[int, str]:
    """Run efabuild (in this process, as a fresh one would): what the user sees, traceback or not."""
    proc = run_efabuild(["-C", str(root), *args], env={**os.environ, "DOCKER_HOST": "unix:///nonexistent.sock"})
    return proc.returncode, proc.stderr + proc.stdout


BAD_INPUTS = [
    # (description, graph text or None, BUILD.toml or None, files, expected message parts)
    ("malformed TOML", "[layers.efa\nbase = 1\n", None, None, ["graphs/stack.toml:1", "invalid TOML"]),
    ("unknown key", SIMPLE_GRAPH.replace("artifact = true\n\n[layers.deepep]", "artefact = true\n\n[layers.deepep]"),
     None, None, ["layers.efa.artefact", "did you mean 'artifact'"]),
    # each settings table's refusals: test_settings
    ("unknown key in BUILD.toml", None, '[builder]\njbos = 2\n', None, ["BUILD.toml: builder.jbos", "did you mean 'jobs'"]),
    ("cycle", SIMPLE_GRAPH.replace('base = "example.com/pytorch:26.08-py3"', 'parent = "user"'), None, None,
     ["cycle:", "stack:efa", "stack:user"]),
    ("unknown parent", SIMPLE_GRAPH.replace('parent = "deepep"', 'parent = "deepp"'), None, None,
     ["layers.user.parent", "unknown layer 'deepp'", "did you mean 'deepep'"]),
    ("duplicate layer", SIMPLE_GRAPH + '\n[layers.efa]\nparent = "user"\n', None, None,
     ["graphs/stack.toml:", "invalid TOML", "efa"]),
    ("both base and parent", SIMPLE_GRAPH.replace('parent = "efa"', 'parent = "efa"\nbase = "x:1"'), None, None,
     ["layers.deepep", "both base and parent"]),
    ("neither base nor parent", SIMPLE_GRAPH.replace('parent = "efa"\n', ''), None, None,
     ["layers.deepep", "neither base nor parent"]),
    ("empty Dockerfile", SIMPLE_GRAPH.replace("COPY app/ /workspace/app/\n", "  \n"), None, None,
     ["layers.user.dockerfile", "empty Dockerfile"]),
    ("missing context file", SIMPLE_GRAPH.replace('context = ["app"]', 'context = ["app", "missing.txt"]'),
     None, None, ["layers.user.context", "'missing.txt' does not exist"]),
    ("context escapes with ..", SIMPLE_GRAPH.replace('context = ["app"]', 'context = ["../etc"]'), None, None,
     ["layers.user.context", "leaves the workspace"]),
    ("absolute context", SIMPLE_GRAPH.replace('context = ["app"]', 'context = ["/etc/passwd"]'), None, None,
     ["layers.user.context", "must be relative"]),
    ("unsafe layer name", SIMPLE_GRAPH.replace("[layers.user]", '[layers."User Code"]'), None, None,
     ["layers.User Code", "not a safe name"]),
    ("bad digest", SIMPLE_GRAPH.replace('artifact = true\n\n[layers.deepep]', 'digest = "sha256:abc"\n\n[layers.deepep]'),
     None, None, ["layers.efa.digest", "64 lowercase hex"]),
    ("FROM in text", SIMPLE_GRAPH.replace("COPY app/", "FROM busybox\nCOPY app/"), None, None,
     ["layers.user.dockerfile", "starts with FROM"]),
    ("ignore without reason", SIMPLE_GRAPH + 'ignore = [{ rule = "EFA001" }]\n', None, None,
     ["layers.user.ignore[0].reason", "needs a reason"]),
    ("wrong type", SIMPLE_GRAPH.replace('artifact = true\n\n[layers.deepep]', 'artifact = "yes"\n\n[layers.deepep]'),
     None, None, ["layers.efa.artifact", "must be a boolean, not a string"]),
    ("secret not a name", SIMPLE_GRAPH + 'secrets = ["HF TOKEN"]\n', None, None,
     ["layers.user.secrets", "'HF TOKEN' is not an environment variable name"]),
    ("secret also an arg", SIMPLE_GRAPH.replace('artifact = true\n\n[layers.deepep]',
                                                'artifact = true\nsecrets = ["EFA_INSTALLER_VERSION"]\n\n[layers.deepep]'),
     None, None, ["layers.efa.secrets", "EFA_INSTALLER_VERSION is also a build arg"]),
    ("secret twice", SIMPLE_GRAPH + 'secrets = ["HF_TOKEN", "HF_TOKEN"]\n', None, None,
     ["layers.user.secrets", "names a secret twice"]),
]


@pytest.mark.parametrize("description,graph,build,files,expected", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_one_clear_line(tmp_path, description, graph, build, files, expected):
    root = make_workspace(tmp_path / "ws", {"stack": graph or SIMPLE_GRAPH},
                          build=build or "[workspace]\ngraphs = [\"graphs/*.toml\"]\n", files=files)
    code, output = run_cli(root, "plan", "--offline")
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert "Traceback" not in output
    for part in expected:
        assert part in lines[0], lines[0]


def test_symlink_leading_out_of_the_workspace_is_refused(tmp_path):
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "key").write_text("x")
    root = make_workspace(tmp_path / "ws")
    os.symlink(outside, root / "app" / "escape")
    code, output = run_cli(root, "plan", "--offline")
    assert code == 2 and "outside the workspace" in output and len(output.strip().splitlines()) == 1


def test_symlinked_context_entry_leading_out_is_refused(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH.replace('context = ["app"]', 'context = ["link"]')})
    os.symlink(outside, root / "link")
    code, output = run_cli(root, "plan", "--offline")
    assert code == 2 and "layers.user.context" in output and "outside the workspace" in output


def test_unknown_target_suggests(tmp_path):
    root = make_workspace(tmp_path / "ws")
    code, output = run_cli(root, "plan", "--offline", "stack:usr")
    assert code == 2 and "unknown layer 'stack:usr'" in output and "did you mean 'stack:user'" in output


def test_version_and_usage_errors(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and "efabuild" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--no-such-flag"])
    assert exc.value.code == 2


def test_files_that_are_not_utf8_are_one_line_errors(tmp_path):
    root = make_workspace(tmp_path / "ws")
    (root / "graphs" / "binary.toml").write_bytes(b"\xff\xfe[layers]")
    code, output = run_cli(root, "plan", "--offline")
    assert code == 2 and output.strip() == "efabuild: graphs/binary.toml: not UTF-8 text (byte 0)"
    (root / "graphs" / "binary.toml").unlink()
    (root / "BUILD.toml").write_bytes(b'[store]\nlocal = "\xff"\n')
    for command in (["plan", "--offline"], ["lookup", "stack:user"], ["ls"]):
        code, output = run_cli(root, *command)
        assert code == 2 and len(output.strip().splitlines()) == 1 and "BUILD.toml" in output, (command, output)
