"""lint's work grows linearly with the number of layers.

Counted, not timed (timings belong in scripts/bench.py): how often each layer's Dockerfile text
is evaluated, how often a graph file is read and indexed, and how much memory the inherited ENV of
a long chain takes as the chain grows.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from efabuild.lint import dockerfile, locate, lint_workspace
from efabuild.lint import chain as lint_chain
from efabuild.workspace import load_workspace
from tests.kits.wsfactory import make_workspace


def chains_workspace(root: Path, layers: int, chain: int = 10) -> Path:
    """`layers` layers in one graph file, in chains of `chain`, each layer setting its own ENV."""
    tables = []
    for index in range(layers):
        start = 'base = "example.com/pytorch:26.08-py3"' if index % chain == 0 else f'parent = "l{index - 1}"'
        tables.append(f"[layers.l{index}]\n{start}\ndockerfile = '''\nENV V{index}=x\nRUN echo {index}\n'''\n")
    return make_workspace(root, {"g": "".join(tables)})


def count_calls(monkeypatch, module, name: str) -> list[int]:
    calls = [0]
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_each_layer_is_evaluated_once_and_each_graph_file_read_once(tmp_path, monkeypatch):
    ws = load_workspace(chains_workspace(tmp_path / "ws", 400))
    evaluations = count_calls(monkeypatch, lint_chain, "evaluate")
    file_reads = count_calls(monkeypatch, locate, "_read_text")
    findings = lint_workspace(ws, scripts=[])
    assert evaluations[0] == 400
    assert file_reads[0] == 1  # one graph file, whatever the number of its layers
    assert {f.layer for f in findings if f.rule == "EFA010"} == {f"g:l{i}" for i in range(0, 400, 10)}


def _env_memory(layers: int) -> int:
    """Peak bytes allocated while evaluating a chain of `layers` layers that each set a new ENV."""
    tracemalloc.start()
    try:
        env: dict[str, str] = {}
        kept = []
        for index in range(layers):
            evaluated = dockerfile.evaluate(f"ENV V{index}=x\n", {}, env)
            kept.append(evaluated)  # lint keeps every layer's facts until it has checked them all
            env = evaluated.env_after
        assert len(env) == layers and env["V0"] == "x"
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_long_chain_does_not_copy_its_environment_per_layer():
    # linear growth: 4x the layers take about 4x the memory; a copy per layer would take 16x
    small, large = _env_memory(500), _env_memory(2000)
    assert large / small < 8, (small, large)
