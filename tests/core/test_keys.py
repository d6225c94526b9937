"""Layer keys: stable across machines and checkouts, and sensitive to exactly their inputs."""

from __future__ import annotations

import pytest

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
import blake3
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from efabuild import dag
from efabuild.make.context import ContextHasher, hash_contexts
from efabuild.make.hashcache import HashState
from efabuild.keys import ContextEntry, LayerInputs
from efabuild.plan import BaseResolution, layer_inputs
from efabuild.workspace import load_workspace
from tests.kits.wsfactory import SIMPLE_GRAPH, make_workspace


def keys_of(root: Path, cache: Path | None = None) -> dict[str, str]:
    ws = load_workspace(root)
    graph = dag.layer_graph(ws)
    order = dag.select(ws, graph, [])
    bases = {l.base.ref: BaseResolution(l.base.ref, l.base.digest, "pinned" if l.base.digest else "unresolved")
             for l in ws.layers.values() if l.base}
    contexts = hash_contexts(ws, graph, order, ContextHasher(ws.root, HashState(cache)))
    return {n: i.key() for n, i in layer_inputs(ws.settings.builder.platform, graph, order, bases, contexts).items()}


def test_key_is_blake3_of_canonical_inputs():
    inputs = LayerInputs(dockerfile="RUN true\n", platform="linux/amd64", base_ref="b:1", args=(("A", "1"),))
    assert inputs.key() == blake3.blake3(inputs.canonical()).hexdigest()
    assert len(inputs.key()) == 64
    # canonical: sorted keys, versioned
    decoded = json.loads(inputs.canonical())
    assert decoded["schema"] == "efabuild.layer/v1"
    # sorted at every level, whatever order the code builds its dicts in (else every key changes)
    assert list(decoded) == sorted(decoded) and list(decoded["base"]) == sorted(decoded["base"])
    assert LayerInputs.from_dict(decoded) == inputs



def test_every_input_moves_the_key_and_comes_back_from_a_record():
    """Slips: a field left out of the encoding (a layer given a BuildKit secret, or a new exclude
    pattern, would keep its old key and image), or dropped when a build record is read back (every
    later rebuild of the layer would then be explained by a secret or exclude "added" again)."""
    inputs = LayerInputs(dockerfile="RUN true\n", platform="linux/amd64", base_ref="b:1",
                         base_digest="sha256:" + "a" * 64, args=(("A", "1"),),
                         context=(ContextEntry("app/x.py", "644", "1" * 64),), secrets=("HF_TOKEN",),
                         exclude=("*.pyc",))
    changed = {
        "dockerfile": inputs._replace(dockerfile="RUN false\n"),
        "platform": inputs._replace(platform="linux/arm64"),
        "base": inputs._replace(base_ref="b:2"),
        "base digest": inputs._replace(base_digest="sha256:" + "b" * 64),
        "parent": inputs._replace(base_ref=None, base_digest=None, parent_key="c" * 64),
        "args": inputs._replace(args=(("A", "2"),)),
        "context digest": inputs._replace(context=(ContextEntry("app/x.py", "644", "2" * 64),)),
        "context mode": inputs._replace(context=(ContextEntry("app/x.py", "755", "1" * 64),)),
        "secrets": inputs._replace(secrets=("HF_TOKEN", "WANDB_API_KEY")),
        "exclude": inputs._replace(exclude=("*.pyc", "docs")),
    }
    assert len({inputs.key()} | {other.key() for other in changed.values()}) == len(changed) + 1
    for what, other in {"as given": inputs, **changed}.items():
        assert LayerInputs.from_dict(json.loads(other.canonical())) == other, what


def test_same_inputs_same_key_in_another_checkout(tmp_path):
    a = make_workspace(tmp_path / "one")
    b = tmp_path / "elsewhere" / "two"
    shutil.copytree(a, b)
    # different mtimes, inodes, umask-derived modes and absolute paths: same keys
    os.utime(b / "app" / "train.py", (1, 1))
    os.chmod(b / "app" / "train.py", 0o600)
    assert keys_of(a) == keys_of(b)


def test_keys_do_not_depend_on_toml_key_order(tmp_path):
    reordered = SIMPLE_GRAPH.replace(
        'args = { HYBRID_EP_COMMIT = "94a9f8f6b146c07d97ec58f67cd6d303296d6098" }',
        'args = { HYBRID_EP_COMMIT = "94a9f8f6b146c07d97ec58f67cd6d303296d6098", B = "2", A = "1" }')
    flipped = SIMPLE_GRAPH.replace(
        'args = { HYBRID_EP_COMMIT = "94a9f8f6b146c07d97ec58f67cd6d303296d6098" }',
        'args = { A = "1", B = "2", HYBRID_EP_COMMIT = "94a9f8f6b146c07d97ec58f67cd6d303296d6098" }')
    assert keys_of(make_workspace(tmp_path / "a", {"stack": reordered})) == \
        keys_of(make_workspace(tmp_path / "b", {"stack": flipped}))


def test_identical_layers_in_two_graphs_share_keys(tmp_path):
    root = make_workspace(tmp_path / "ws", {"one": SIMPLE_GRAPH, "two": SIMPLE_GRAPH})
    keys = keys_of(root)
    assert keys["one:efa"] == keys["two:efa"] and keys["one:user"] == keys["two:user"]


@pytest.mark.slow
def test_keys_are_the_same_in_a_fresh_interpreter(tmp_path):
    """No hash randomisation or dict-order effects: another process computes the same keys."""
    root = make_workspace(tmp_path / "ws")
    code = ("import json,sys; from pathlib import Path; from tests.core.test_keys import keys_of; "
            "print(json.dumps(keys_of(Path(sys.argv[1]))))")
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[2], env={**os.environ, "PYTHONHASHSEED": "123"}).stdout
    assert json.loads(out) == keys_of(root)


def test_exec_bit_is_part_of_the_key(tmp_path):
    root = make_workspace(tmp_path / "ws")
    before = keys_of(root)
    os.chmod(root / "app" / "train.py", 0o755)
    after = keys_of(root)
    assert before["stack:user"] != after["stack:user"] and before["stack:efa"] == after["stack:efa"]


# --- property: a change of any input changes that layer's key and its descendants', nothing else ---

LAYERS = ["efa", "deepep", "user"]
CHANGES = st.sampled_from(["arg", "dockerfile", "context", "base", "digest"])
QUOTE = "'" * 3


def graph_text(extra: dict[str, dict[str, str]]) -> str:
    """The three-layer stack, with per-layer overrides: base, digest, arg, line."""

    def block(name: str, origin: str, text: str, args: dict[str, str], tail: str = "") -> str:
        override = extra.get(name, {})
        if "line" in override:
            text += override["line"] + "\n"
        if "arg" in override:
            args = {**args, "X_" + override["arg"]: override["arg"]}
        arg_text = ", ".join(f'{k} = "{v}"' for k, v in args.items())
        return (f"[layers.{name}]\n{origin}\ndockerfile = {QUOTE}\n{text}{QUOTE}\n"
                f"args = {{ {arg_text} }}\n{tail}\n")

    efa = extra.get("efa", {})
    origin = f'base = "example.com/pytorch:{efa.get("base", "26.08-py3")}"'
    if "digest" in efa:
        origin += f'\ndigest = "sha256:{blake3.blake3(efa["digest"].encode()).hexdigest()}"'
    return (block("efa", origin, "RUN echo efa\n", {"EFA_INSTALLER_VERSION": "1.50.0"}, "artifact = true")
            + block("deepep", 'parent = "efa"', "RUN echo deepep\n", {"HYBRID_EP_COMMIT": "94a9f8f6"})
            + block("user", 'parent = "deepep"', "COPY app/ /workspace/app/\n", {}, 'context = ["app"]'))


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layer=st.sampled_from(LAYERS), change=CHANGES, token=st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True))
def test_a_change_moves_exactly_that_layer_and_its_descendants(tmp_path_factory, layer, change, token):
    root = make_workspace(tmp_path_factory.mktemp("ws"), {"stack": graph_text({})})
    before = keys_of(root)
    if change == "context":
        layer = "user"  # only the user layer copies files in
        target = root / "app" / "train.py"
        target.write_text(target.read_text() + f"# {token}\n")
    else:
        if change in ("base", "digest") and layer != "efa":
            change = "line"  # only the root layer has a base
        value = f"LABEL t={token}" if change in ("line", "dockerfile") else token
        (root / "graphs" / "stack.toml").write_text(graph_text({layer: {"line" if change == "dockerfile" else change: value}}))
    after = keys_of(root)
    changed = {name.split(":")[1] for name in before if before[name] != after[name]}
    assert changed == set(LAYERS[LAYERS.index(layer):]), (layer, change, token)


# any text UTF-8 can hold, often what JSON escapes or passes through raw
FIELD = st.text(st.sampled_from('a/.é"\\\n\t\x00\x1f\x7f\u2028') | st.characters(blacklist_categories=("Cs",)),
                max_size=12)


@settings(max_examples=100, deadline=None)
# each kind of escape on its own, always tried: a quote, a backslash, a control character, raw text
@example(entries=[('a"b', "0644", "d")], secrets=[], parent=None)
@example(entries=[("a\\b", "0644", "d")], secrets=[], parent=None)
@example(entries=[("a\x1fb", "0644", "d")], secrets=[], parent=None)
@example(entries=[("é\u2028\x7f", "0644", "d")], secrets=[], parent=None)
@given(entries=st.lists(st.tuples(FIELD, FIELD, FIELD), max_size=6),
       secrets=st.lists(FIELD, max_size=2), parent=st.none() | FIELD)
@pytest.mark.slow
def test_the_canonical_encoding_is_json_dumps_of_the_inputs_byte_for_byte(entries, secrets, parent):
    """canonical() writes the context by joins, not by the JSON encoder: the bytes must be the
    encoder's (quotes, backslashes, control characters and non-ASCII text included), or every
    recorded key would change."""
    inputs = LayerInputs(dockerfile='RUN echo "\\x"\n', platform="linux/amd64", parent_key=parent,
                         base_ref=None if parent else "b:1", args=(("A", "1"),),
                         context=tuple(ContextEntry(*entry) for entry in entries), secrets=tuple(secrets))
    assert inputs.canonical() == json.dumps(inputs.to_dict(), sort_keys=True, separators=(",", ":"),
                                            ensure_ascii=False).encode("utf-8")
