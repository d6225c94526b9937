"""The plan: what is to build and, in words, why.

The first part decides from hand-made facts (no files, engine or store: milliseconds); the rest
plans real workspaces through the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
import pytest

from efabuild.make.prepare import prepare
from efabuild.dag import LayerGraph
from efabuild.keys import ContextEntry, LayerInputs
from efabuild.model import BaseImage, Layer
from efabuild.plan import BUILD, COPY, EXPORT, NOTHING, PULL, Availability, BaseResolution, explain, layer_inputs, make_plan
from efabuild.workspace import load_workspace
from tests.kits.inprocess import run_efabuild
from tests.kits.wsfactory import SIMPLE_GRAPH as WITH_ARTIFACTS
from tests.kits.wsfactory import make_workspace

# Image layers only: with no .sqsh to export, a recorded build is all that "available" needs.
SIMPLE_GRAPH = WITH_ARTIFACTS.replace("artifact = true\n", "")


# --- decisions from hand-made facts -------------------------------------------------------------

BASE = BaseResolution("example.com/pytorch:26.08-py3", "sha256:" + "a" * 64, "registry")
APP = (ContextEntry("app/train.py", "644", "1" * 64),)


def stack(efa_artifact: bool = True, user_artifact: bool = True) -> tuple[LayerGraph, list[str]]:
    """stack:efa -> stack:deepep -> stack:user, as the workspace loader would give them."""
    src = Path("graphs/stack.toml")
    layers = [
        Layer("stack", "efa", src, "RUN echo efa\n", base=BaseImage(BASE.ref), args=(("V", "1.50.0"),),
              artifact=efa_artifact),
        Layer("stack", "deepep", src, "RUN echo deepep\n", parent="stack:efa"),
        Layer("stack", "user", src, "COPY app/ /app/\n", parent="stack:deepep", context=("app",),
              artifact=user_artifact),
    ]
    graph = LayerGraph()
    for layer in layers:
        graph.add_node(layer.qualname, layer=layer)
        if layer.parent:
            graph.add_edge(layer.parent, layer.qualname)
    return graph, [layer.qualname for layer in layers]


def decide(graph, order, availability=Availability(), previous=lambda name: None, contexts=None):
    inputs = layer_inputs("linux/amd64", graph, order, {BASE.ref: BASE}, contexts or {"stack:user": APP})
    return make_plan(graph, order, inputs, availability, previous, bases=(BASE,)), inputs


def test_with_nothing_built_every_layer_is_new():
    plan, _ = decide(*stack())
    assert [(lp.qualname, lp.action, lp.reasons) for lp in plan.layers] == [
        (name, BUILD, ("new layer (no earlier build recorded)",)) for name in ("stack:efa", "stack:deepep", "stack:user")]


def test_what_is_available_is_left_alone_and_a_missing_sqsh_is_exported():
    graph, order = stack()
    _, inputs = decide(graph, order)
    keys = {name: inputs[name].key() for name in order}
    everything = Availability(images=frozenset(keys.values()), artifacts=frozenset({keys["stack:efa"]}))
    plan, _ = decide(graph, order, everything)
    assert {lp.qualname: lp.action for lp in plan.layers} == {
        "stack:efa": NOTHING, "stack:deepep": NOTHING, "stack:user": EXPORT}
    assert plan.by_name()["stack:user"].reasons == ("the .sqsh is not in every store tier yet",)
    # deepep's image is gone, but nothing needs it: its child's image and both .sqsh exist
    no_middle = Availability(images=frozenset({keys["stack:efa"], keys["stack:user"]}),
                             artifacts=frozenset({keys["stack:efa"], keys["stack:user"]}))
    assert {lp.action for lp in decide(graph, order, no_middle)[0].layers} == {NOTHING}


def test_a_child_to_build_needs_its_parent_pulled_from_the_registry():
    graph, order = stack()
    _, inputs = decide(graph, order)
    keys = {name: inputs[name].key() for name in order}
    facts = Availability(images=frozenset({keys["stack:efa"]}), registry=frozenset({keys["stack:deepep"]}),
                         artifacts=frozenset({keys["stack:efa"]}))
    plan, _ = decide(graph, order, facts)
    assert [lp.action for lp in plan.layers] == [NOTHING, PULL, BUILD]
    assert plan.by_name()["stack:deepep"].reasons == ("image in the layer-cache registry",)
    assert [lp.qualname for lp in plan.chain("stack:user")] == order


def test_a_sqsh_one_tier_holds_is_copied_not_exported_and_needs_no_image():
    graph, order = stack()
    _, inputs = decide(graph, order)
    keys = {name: inputs[name].key() for name in order}
    # the local tier has efa's .sqsh, a new shared tier does not; no image is left in the engine
    facts = Availability(held=frozenset({keys["stack:efa"], keys["stack:user"]}))
    plan, _ = decide(graph, order, facts)
    assert [(lp.action, lp.state) for lp in plan.layers] == [(COPY, "to copy"), (NOTHING, "available"),
                                                             (COPY, "to copy")]
    assert plan.by_name()["stack:efa"].reasons == ("the .sqsh is in another store tier",)
    # stored means every tier: a make that believed one tier's copy enough would copy it nowhere
    assert not any(lp.stored for lp in plan.layers)
    # a child that builds needs the image itself: a copy of the .sqsh is not enough for that
    changed = Availability(held=frozenset({keys["stack:efa"]}))
    assert [lp.action for lp in decide(graph, order, changed)[0].layers] == [BUILD, BUILD, BUILD]
    # with the image in the engine, the .sqsh is still copied rather than exported again
    both = Availability(images=frozenset(keys.values()), held=frozenset({keys["stack:efa"]}))
    assert [lp.action for lp in decide(graph, order, both)[0].layers] == [COPY, NOTHING, EXPORT]


def test_keys_over_a_base_digest_not_known_for_sure_are_provisional():
    graph, order = stack()
    assert not any(lp.provisional for lp in decide(graph, order)[0].layers)  # a registry digest
    for source in ("recorded", "unresolved"):
        unsure = BaseResolution(BASE.ref, BASE.digest if source == "recorded" else None, source)
        inputs = layer_inputs("linux/amd64", graph, order, {BASE.ref: unsure}, {"stack:user": APP})
        plan = make_plan(graph, order, inputs, Availability(), lambda name: None, bases=(unsure,))
        assert all(lp.provisional for lp in plan.layers), source  # children inherit it


def test_a_top_image_layer_is_wanted_even_without_an_artifact():
    graph, order = stack(efa_artifact=False, user_artifact=False)
    _, inputs = decide(graph, order)
    plan, _ = decide(graph, order, Availability(images=frozenset({inputs["stack:efa"].key()})))
    assert [lp.action for lp in plan.layers] == [NOTHING, BUILD, BUILD]


def test_a_recorded_build_with_other_inputs_is_explained_input_by_input():
    graph, order = stack()
    _, old = decide(graph, order, contexts={"stack:user": APP + (ContextEntry("app/run.sh", "644", "2" * 64),)})
    moved = Layer("stack", "efa", Path("graphs/stack.toml"), "RUN echo efa\nRUN true\n",
                  base=BaseImage(BASE.ref), args=(("V", "1.51.0"), ("W", "1")), secrets=("HF_TOKEN",),
                  artifact=True)
    graph.nodes["stack:efa"]["layer"] = moved
    contexts = {"stack:user": APP + (ContextEntry("app/run.sh", "755", "2" * 64),)}
    plan, _ = decide(graph, order, previous=old.get, contexts=contexts)
    reasons = {lp.qualname: lp.reasons for lp in plan.layers}
    assert reasons["stack:efa"] == ("V 1.50.0 → 1.51.0", "W added: 1", "secret HF_TOKEN added",
                                    "Dockerfile: +1 −0 lines")
    assert reasons["stack:deepep"] == ("parent efa changed",)
    assert reasons["stack:user"] == ("parent deepep changed", "context app/run.sh mode 644 → 755")


def test_explain_names_the_base_digest_and_the_platform():
    old = LayerInputs(dockerfile="RUN x\n", platform="linux/amd64", base_ref=BASE.ref, base_digest=BASE.digest)
    new = LayerInputs(dockerfile="RUN x\n", platform="linux/arm64", base_ref=BASE.ref,
                      base_digest="sha256:" + "b" * 64)
    assert explain(old, new, None, {}) == ("base digest aaaaaaaaaaaa → bbbbbbbbbbbb", "platform linux/amd64 → linux/arm64")
    assert explain(old, LayerInputs(dockerfile="RUN x\n", platform="linux/amd64", base_ref=BASE.ref), None, {}) \
        == ("base digest aaaaaaaaaaaa → unresolved",)
    assert explain(old, old, None, {}) == ("image missing from the engine (same inputs as the last build)",)


def test_many_context_changes_are_summed_up_after_five():
    old = LayerInputs(dockerfile="", platform="p", parent_key="k")
    new = old._replace(context=tuple(ContextEntry(f"f{i}", "644", "0" * 64) for i in range(8)))
    assert explain(old, new, "stack:deepep", {}) == tuple(f"context f{i} added" for i in range(5)) + (
        "… and 3 more context changes",)
    # exactly five are all shown: no "… and 0 more"
    five = old._replace(context=new.context[:5])
    assert explain(old, five, "stack:deepep", {}) == tuple(f"context f{i} added" for i in range(5))


def test_a_changed_exclude_is_a_reason():
    """Slip: explain loses the exclude patterns, and a layer rebuilt for a new one says only that
    its image is missing."""
    old = LayerInputs(dockerfile="COPY app/ /app/\n", platform="p", parent_key="k", exclude=("*.pyc",))
    assert explain(old, old._replace(exclude=("*.pyc", "docs")), "stack:deepep", {}) == (
        "exclude ['*.pyc'] → ['*.pyc', 'docs']",)


# --- plans of real workspaces, through the CLI ----------------------------------------------------


def plan_json(root: Path, *targets: str) -> dict:
    proc = run_efabuild(["-C", str(root), "plan", "--offline", "--json", *targets],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_an_artifact_layer_without_its_sqsh_is_to_export(tmp_path):
    root = make_workspace(tmp_path / "ws", {"stack": WITH_ARTIFACTS})
    record_all(root)
    layers = by_name(plan_json(root))
    assert layers["stack:efa"]["state"] == "to export" and layers["stack:user"]["state"] == "to export"
    assert layers["stack:deepep"]["state"] == "available"
    assert layers["stack:efa"]["reasons"] == ["the .sqsh is not in every store tier yet"]


def record_all(root: Path) -> None:
    """Record every layer as built, as a finished make would."""
    prepared = prepare(load_workspace(root), use_engine=False)
    for lp in prepared.plan.layers:
        prepared.records.record(lp.qualname, lp.key, lp.inputs)


def by_name(data: dict) -> dict[str, dict]:
    return {layer["name"]: layer for layer in data["layers"]}


def age_files(root: Path) -> None:
    """Make context files older than the racy window (with `settled_clock`: their ctime is now)."""
    past = time.time() - 60
    for path in (root / "app").rglob("*"):
        os.utime(path, (past, past))


def test_first_plan_says_new_layers_and_unresolved_digest(tmp_path):
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH})
    data = plan_json(root)
    layers = by_name(data)
    assert list(layers) == ["stack:efa", "stack:deepep", "stack:user"]
    assert all(l["state"] == "to build" and l["reasons"] == ["new layer (no earlier build recorded)"]
               for l in layers.values())
    assert data["bases"] == [{"ref": "example.com/pytorch:26.08-py3", "digest": None, "source": "unresolved"}]
    assert data["format"] == "efabuild.plan/v1"
    assert all(l["provisional"] for l in layers.values())
    text = run_efabuild(["-C", str(root), "plan", "--offline"],
                          capture_output=True, text=True).stdout
    assert "digest unresolved" in text and "3 to build" in text
    # each key is marked, and the mark explained once
    rows = {line.split()[0]: line.split()[1] for line in text.splitlines() if line.startswith("stack:")}
    assert all(key.endswith("*") for key in rows.values())
    assert "* provisional key: may change once the base's digest is known" in text


def test_a_sqsh_in_the_local_tier_only_is_to_copy_to_the_shared_one(tmp_path):
    from efabuild.store.tiered import Store
    from tests.kits.storekit import make_sqsh, record_for

    root = make_workspace(tmp_path / "ws", {"stack": WITH_ARTIFACTS})
    record_all(root)
    efa_key = by_name(plan_json(root))["stack:efa"]["key"]
    sqsh = make_sqsh(tmp_path, os.urandom(4096), "efa")
    Store.locate(cwd=root, show_progress=False).publish(efa_key, sqsh, record_for(efa_key, "stack:efa", sqsh), None)
    assert by_name(plan_json(root))["stack:efa"]["state"] == "available"
    (root / "BUILD.toml").write_text((root / "BUILD.toml").read_text()
                                     + f'[store]\nlocal = "cache"\nshared = "{tmp_path / "fsx"}"\n')
    layers = by_name(plan_json(root))
    assert layers["stack:efa"]["state"] == "to copy" and layers["stack:user"]["state"] == "to export"
    text = run_efabuild(["-C", str(root), "plan", "--offline"]).stdout
    assert "1 to build" not in text and "1 to export, 1 to copy, 1 available" in text


def test_installer_version_change_rebuilds_exactly_that_layer_and_descendants(tmp_path):
    graph = SIMPLE_GRAPH.replace('args = { EFA_INSTALLER_VERSION = "1.50.0" }',
                                 'args = { EFA_INSTALLER_VERSION = "1.49.0" }')
    root = make_workspace(tmp_path / "ws", {"stack": graph, "other": SIMPLE_GRAPH.replace("example.com", "other.example")})
    record_all(root)
    assert {l["state"] for l in plan_json(root)["layers"]} == {"available"}
    (root / "graphs" / "stack.toml").write_text(SIMPLE_GRAPH)
    layers = by_name(plan_json(root))
    assert layers["stack:efa"]["state"] == "to build"
    assert layers["stack:efa"]["reasons"] == ["EFA_INSTALLER_VERSION 1.49.0 → 1.50.0"]
    assert layers["stack:deepep"]["reasons"] == ["parent efa changed"]
    assert layers["stack:user"]["reasons"] == ["parent deepep changed"]
    assert {n for n, l in layers.items() if l["state"] != "available"} == {"stack:efa", "stack:deepep", "stack:user"}


def test_reasons_for_dockerfile_context_and_args(tmp_path):
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH})
    record_all(root)
    text = (root / "graphs" / "stack.toml").read_text()
    text = text.replace("RUN echo deepep ${HYBRID_EP_COMMIT}\n",
                        "RUN echo deepep ${HYBRID_EP_COMMIT}\nRUN a\nRUN b\nRUN c\n")
    text = text.replace("RUN echo installing efa", "RUN echo installing EFA")
    (root / "graphs" / "stack.toml").write_text(text)
    (root / "app" / "train.py").write_text("print('changed')\n")
    (root / "app" / "new.py").write_text("")
    (root / "app" / "lib" / "util.py").unlink()
    layers = by_name(plan_json(root))
    assert layers["stack:efa"]["reasons"] == ["Dockerfile: +1 −1 lines"]
    assert layers["stack:deepep"]["reasons"] == ["parent efa changed", "Dockerfile: +3 −0 lines"]
    assert layers["stack:user"]["reasons"] == [
        "parent deepep changed", "context app/lib/util.py removed", "context app/new.py added",
        "context app/train.py changed"]


def test_only_a_user_file_change_rebuilds_only_the_user_layer(tmp_path):
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH})
    record_all(root)
    (root / "app" / "train.py").write_text("print('v2')\n")
    layers = by_name(plan_json(root))
    assert [n for n, l in layers.items() if l["state"] != "available"] == ["stack:user"]
    assert layers["stack:user"]["reasons"] == ["context app/train.py changed"]


def test_unchanged_plan_reads_no_file_contents(tmp_path, settled_clock):
    files = {f"app/f{i:03d}.py": f"x = {i}\n" for i in range(300)}
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH}, files=files)
    age_files(root)
    first = plan_json(root)
    assert first["context_files_read"] == 300
    second = plan_json(root)
    assert second["context_files_read"] == 0
    assert [l["key"] for l in second["layers"]] == [l["key"] for l in first["layers"]]
    # a touched file with the same content is re-read once, and the key does not move
    path = root / "app" / "f007.py"
    path.write_text(path.read_text())
    os.utime(path, (time.time() - 30, time.time() - 30))
    third = plan_json(root)
    assert third["context_files_read"] == 1 and third["layers"] == second["layers"]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "fifo", "directory"])
def test_a_damaged_or_planted_hash_cache_only_costs_hashing_again(tmp_path, damage, settled_clock):
    """The cache is read whole on every plan: a cut or foreign file, or a FIFO or directory in its
    place, is ignored (no hang, no traceback) and the keys stay; a file is written back after."""
    files = {f"app/f{i:03d}.py": f"x = {i}\n" for i in range(20)}
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH}, files=files)
    age_files(root)
    first = plan_json(root)
    cache = root / "cache" / "state" / "hashes"
    assert cache.is_file() and plan_json(root)["context_files_read"] == 0
    data = cache.read_bytes()
    cache.unlink()
    if damage == "truncated":
        cache.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        cache.write_bytes(os.urandom(4096))
    elif damage == "fifo":
        os.mkfifo(cache)
    else:
        cache.mkdir()
    again = plan_json(root)
    assert again["context_files_read"] == 20 and again["layers"] == first["layers"]
    if damage in ("truncated", "garbage"):  # replaced by a whole one: the next plan reads nothing
        assert plan_json(root)["context_files_read"] == 0


def test_a_hash_cache_save_killed_before_its_rename_leaves_a_temp_the_next_save_removes(tmp_path, settled_clock):
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH})
    age_files(root)
    plan_json(root)
    state = root / "cache" / "state"
    # a writer that made its temp file and died before renaming it (a real process, now gone)
    subprocess.run([sys.executable, "-c", "import sys; from efabuild.host.owner import owned_name; "
                    "open(sys.argv[1] + '/' + owned_name('.hashes', 'tmp'), 'w').write('half')", str(state)],
                   check=True)
    (left,) = [p for p in state.iterdir() if p.name.startswith(".hashes")]
    (root / "app" / "train.py").write_text("print('v3')\n")
    os.utime(root / "app" / "train.py", (time.time() - 30, time.time() - 30))
    assert plan_json(root)["context_files_read"] == 1  # a changed file: the cache is saved again
    assert not left.exists() and [p.name for p in state.iterdir()] == ["hashes"]


def test_freshly_written_files_are_not_trusted_by_the_cache(tmp_path):
    """A file modified within the mtime granularity could change unseen: it is hashed again."""
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH})
    # "just written", however long the plans below take on a loaded machine: an mtime ahead of
    # the clock is inside the racy window at every plan
    ahead = time.time() + 3600
    for path in (root / "app").rglob("*"):
        os.utime(path, (ahead, ahead))
    plan_json(root)
    assert plan_json(root)["context_files_read"] == 2  # both just written: not cached yet


def test_selecting_a_layer_brings_its_ancestors(tmp_path):
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH})
    assert [l["name"] for l in plan_json(root, "stack:deepep")["layers"]] == ["stack:efa", "stack:deepep"]


def test_shipped_graphs_plan_offline():
    repo = Path(__file__).resolve().parents[2]
    data = plan_json(repo)
    names = [l["name"] for l in data["layers"]]
    assert {"demo:efa", "demo:deepep", "demo:user", "ngc-efa:efa", "ngc-efa:deepep", "ngc-efa:user"} <= set(names)


def test_make_lints_first_and_stops_on_errors(tmp_path):
    """No engine is needed to be stopped: lint runs before anything is built."""
    graph = SIMPLE_GRAPH.replace("RUN echo installing efa ${EFA_INSTALLER_VERSION}",
                                 "RUN apt-get update\nRUN ./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify")
    root = make_workspace(tmp_path / "ws", {"stack": graph})
    proc = run_efabuild(["-C", str(root), "make"], capture_output=True, text=True,
                          env={**os.environ, "DOCKER_HOST": "unix:///nonexistent.sock"})
    assert proc.returncode == 2
    assert "EFA001 error stack:efa" in proc.stderr and "EFA004 error stack:efa" in proc.stderr
    assert "fix: start this RUN with `apt-get update &&`" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == \
        "efabuild: lint found 2 error(s): fix them, or build anyway with --no-lint"
    assert not (root / "cache" / "builds").exists()
    # --no-lint goes on to the engine, which is not there
    forced = run_efabuild(["-C", str(root), "make", "--no-lint"],
                            capture_output=True, text=True, env={**os.environ, "DOCKER_HOST": "unix:///nonexistent.sock"})
    assert forced.returncode == 1 and "no Docker engine at unix:///nonexistent.sock" in forced.stderr


def test_secret_build_args_never_reach_plan_output_or_build_records(tmp_path):
    secret_graph = SIMPLE_GRAPH.replace('args = { EFA_INSTALLER_VERSION = "1.50.0" }',
                                        'args = { EFA_INSTALLER_VERSION = "1.50.0", HF_TOKEN = "hf_FirstSecretValue123" }')
    # and a secret default in the Dockerfile itself (lint refuses it; make --no-lint goes ahead)
    secret_graph = secret_graph.replace("ARG EFA_INSTALLER_VERSION=1.50.0\n",
                                        "ARG EFA_INSTALLER_VERSION=1.50.0\nARG SESSION_TOKEN=DefaultSecret456\n")
    root = make_workspace(tmp_path / "ws", {"stack": secret_graph})
    record_all(root)
    assert by_name(plan_json(root))["stack:efa"]["state"] == "available"  # a recorded secret compares equal
    (root / "graphs" / "stack.toml").write_text(secret_graph.replace("hf_FirstSecretValue123", "hf_SecondSecret999"))
    proc = run_efabuild(["-C", str(root), "plan", "--offline"],
                          capture_output=True, text=True)
    data = plan_json(root)
    reasons = by_name(data)["stack:efa"]["reasons"]
    assert len(reasons) == 1 and reasons[0].startswith("HF_TOKEN <redacted ") and " → <redacted " in reasons[0]
    stored = "".join(p.read_text() for p in (root / "cache" / "builds").rglob("*.json"))
    for secret in ("hf_FirstSecretValue123", "hf_SecondSecret999", "DefaultSecret456"):
        assert secret not in proc.stdout + proc.stderr and secret not in json.dumps(data) and secret not in stored


@pytest.mark.slow
def test_an_unreachable_s3_tier_does_not_stop_a_plan(tmp_path):
    build = ('[workspace]\ngraphs = ["graphs/*.toml"]\n[store.s3]\nbucket = "images"\n'
             'endpoint_url = "http://127.0.0.1:9"\n')  # nothing listens on port 9
    root = make_workspace(tmp_path / "ws", {"stack": WITH_ARTIFACTS}, build=build)
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent.sock", "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "never-shown"}
    offline = run_efabuild(["-C", str(root), "plan", "--offline"],
                             capture_output=True, text=True, env=env)
    assert offline.returncode == 0 and "warning" not in offline.stderr  # offline: S3 is not asked
    online = run_efabuild(["-C", str(root), "plan"],
                            capture_output=True, text=True, env=env)
    assert online.returncode == 0, online.stderr
    assert "warning: S3 tier not consulted" in online.stderr and "3 to build" in online.stdout
    assert "never-shown" not in online.stdout + online.stderr


def test_make_of_one_graph_lints_the_ancestors_it_builds_on_in_other_graphs(tmp_path):
    broken = SIMPLE_GRAPH.replace("RUN echo installing efa ${EFA_INSTALLER_VERSION}",
                                  "RUN apt-get update\nRUN ./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify")
    side = "[layers.extra]\nparent = \"stack:deepep\"\ndockerfile = '''\nRUN true\n'''\n"
    root = make_workspace(tmp_path / "ws", {"stack": broken, "side": side})
    proc = run_efabuild(["-C", str(root), "make", "side"], capture_output=True,
                          text=True, env={**os.environ, "DOCKER_HOST": "unix:///nonexistent.sock"})
    assert proc.returncode == 2 and "EFA001 error stack:efa" in proc.stderr


def test_a_chunked_artifact_only_on_s3_is_to_copy_and_a_make_copies_it(tmp_path, moto_server, s3_bucket):
    """Another builder published both artifacts to S3 only: the chunked one is copied from there
    (a fetch downloads only the chunks this node lacks), the whole-object one exported again
    (downloading it costs as much). Offline, S3 is not asked: both are to export."""
    from efabuild.settings import S3Config
    from efabuild.host.digest import file_digest
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.store.tiered import Store
    from tests.kits.storekit import make_sqsh, record_for

    settings = S3Config(bucket=s3_bucket, prefix="images/", region="us-east-1", endpoint_url=moto_server)
    build = ('[workspace]\ngraphs = ["graphs/*.toml"]\n[store.s3]\n'
             f'bucket = "{s3_bucket}"\nprefix = "images/"\nregion = "us-east-1"\nendpoint_url = "{moto_server}"\n')
    root = make_workspace(tmp_path / "ws", {"stack": WITH_ARTIFACTS}, build=build)
    record_all(root)  # the images are there (as recorded: this test has no engine)
    keys = {name: layer["key"] for name, layer in by_name(plan_json(root)).items()}
    sqsh = {name: make_sqsh(tmp_path, os.urandom(64 * 1024), name.split(":")[1]) for name in ("stack:efa", "stack:user")}
    for name, chunked in (("stack:efa", True), ("stack:user", False)):
        elsewhere = Store([FilesystemTier(tmp_path / name.split(":")[1], "local")], settings, show_progress=False,
                          s3_options={"chunked": chunked})
        elsewhere.publish(keys[name], sqsh[name], record_for(keys[name], name, sqsh[name]))

    online = run_efabuild(["-C", str(root), "plan", "--json"])
    assert online.returncode == 0, online.stderr
    layers = by_name(json.loads(online.stdout))
    assert layers["stack:efa"]["state"] == "to copy" and layers["stack:efa"]["reasons"] == [
        "the .sqsh is in another store tier"]
    assert layers["stack:user"]["state"] == "to export"
    assert {layer["state"] for layer in by_name(plan_json(root)).values()} == {"to export", "available"}

    # what a make does for each: the chunked one is copied, verified, with its index beside it
    store = Store.locate(cwd=root, show_progress=False)
    assert store.complete(keys["stack:efa"]) == {"local": "published", "s3": "reused"}
    assert file_digest(store.lookup(keys["stack:efa"], fetch=False)) == file_digest(sqsh["stack:efa"])
    assert store.local_tier.chunk_index(keys["stack:efa"]) is not None
    assert store.complete(keys["stack:user"]) is None  # to export: the make exports it from the image
    assert by_name(json.loads(run_efabuild(["-C", str(root), "plan", "--json"]).stdout))["stack:efa"][
        "state"] == "available"


def test_the_plan_asks_s3_once_whether_it_holds_an_artifact_only_s3_holds(tmp_path, s3_bucket, fault_proxy):
    """Whether every tier holds an artifact and whether a copy can complete the tiers lacking it
    come from one question to S3 per artifact (a HEAD of its record), and for an artifact S3
    holds one GET of its record and of its chunk index and a look at its chunks (that S3 can still
    deliver it): counted at a proxy in front of the S3 server."""
    from efabuild.settings import S3Config
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.store.tiered import Store
    from tests.kits.storekit import make_sqsh, record_for

    settings = S3Config(bucket=s3_bucket, prefix="images/", region="us-east-1", endpoint_url=fault_proxy.endpoint)
    build = ('[workspace]\ngraphs = ["graphs/*.toml"]\n[store.s3]\n'
             f'bucket = "{s3_bucket}"\nprefix = "images/"\nregion = "us-east-1"\n'
             f'endpoint_url = "{fault_proxy.endpoint}"\n')
    root = make_workspace(tmp_path / "ws", {"stack": WITH_ARTIFACTS}, build=build)
    record_all(root)
    keys = {name: layer["key"] for name, layer in by_name(plan_json(root)).items()}
    sqsh = make_sqsh(tmp_path, os.urandom(64 * 1024), "efa")
    elsewhere = Store([FilesystemTier(tmp_path / "elsewhere", "local")], settings, show_progress=False)
    elsewhere.publish(keys["stack:efa"], sqsh, record_for(keys["stack:efa"], "stack:efa", sqsh))
    before = len(fault_proxy.requests)
    online = run_efabuild(["-C", str(root), "plan", "--json"])
    assert online.returncode == 0, online.stderr
    assert by_name(json.loads(online.stdout))["stack:efa"]["state"] == "to copy"
    asked = [(method, path.split("?")[0].rsplit("/", 1)[-1]) for method, path, _ in fault_proxy.requests[before:]]
    only_s3, nowhere = keys["stack:efa"], keys["stack:user"]
    assert asked.count(("HEAD", f"{only_s3}.json")) == 1 and asked.count(("GET", f"{only_s3}.chunks.json")) == 1
    assert asked.count(("GET", f"{only_s3}.json")) == 1
    assert [request for request in asked if nowhere in request[1]] == [("HEAD", f"{nowhere}.json")]


# --- several platforms ---------------------------------------------------------------------------

def _demo_workspace(root: Path, builder: str) -> Path:
    """The shipped demo graph and app/ under `root`, with `builder` as BUILD.toml's [builder]."""
    import shutil

    from tests.kits.wsfactory import REPO

    root.mkdir(parents=True)
    shutil.copytree(REPO / "app", root / "app")
    (root / "graphs").mkdir()
    shutil.copy(REPO / "graphs" / "demo.toml", root / "graphs" / "demo.toml")
    (root / "BUILD.toml").write_text(f'[workspace]\ngraphs = ["graphs/*.toml"]\n[builder]\n{builder}\n')
    return root


def _offline_plan(root: Path) -> dict:
    proc = run_efabuild(["-C", str(root), "plan", "--offline", "--json"])
    assert proc.returncode == 0, proc.stderr
    return {layer["name"]: layer for layer in json.loads(proc.stdout)["layers"]}


def test_a_one_platform_workspace_keeps_its_keys_and_names(tmp_path):
    """The per-platform plan of a one-platform workspace gives every layer the key the plan gave
    before platforms (its inputs over the layer graph itself), under its own name."""
    from efabuild import dag
    from efabuild.make.context import ContextHasher, hash_contexts
    from efabuild.make.hashcache import HashState

    root = _demo_workspace(tmp_path / "one", 'platform = "linux/amd64"')
    planned = _offline_plan(root)
    ws = load_workspace(root)
    graph = dag.layer_graph(ws)
    order = dag.select(ws, graph, [])
    base = BaseResolution("efabuild-fixtures/pytorch:26.08-py3", None, "unresolved")
    contexts = hash_contexts(ws, graph, order, ContextHasher(ws.root, HashState(None)))
    before = {name: inputs.key() for name, inputs in
              layer_inputs("linux/amd64", graph, order, {base.ref: base}, contexts).items()}
    assert {name: layer["key"] for name, layer in planned.items()} == before
    assert {layer["platform"] for layer in planned.values()} == {"linux/amd64"}


def test_two_platforms_give_each_layer_a_key_per_platform(tmp_path):
    one = _offline_plan(_demo_workspace(tmp_path / "one", 'platform = "linux/amd64"'))
    two = _offline_plan(_demo_workspace(tmp_path / "two", 'platforms = ["linux/amd64", "linux/arm64"]'))
    assert sorted(two) == sorted(f"{name}@{p}" for name in one for p in ("linux/amd64", "linux/arm64"))
    for name in one:
        amd, arm = two[f"{name}@linux/amd64"], two[f"{name}@linux/arm64"]
        assert amd["key"] == one[name]["key"]  # adding arm64 rebuilds no amd64 layer
        assert arm["key"] != amd["key"] and arm["inputs"]["platform"] == "linux/arm64"
        assert (arm["layer"], arm["platform"]) == (name, "linux/arm64")
    # a child's key on arm64 is built over its parent's arm64 key
    assert two["demo:user@linux/arm64"]["inputs"]["parent_key"] == two["demo:deepep@linux/arm64"]["key"]
    text = run_efabuild(["-C", str(tmp_path / "two"), "plan", "--offline"]).stdout
    assert "demo:user@linux/arm64" in text and "demo:user@linux/amd64" in text


def test_a_target_on_one_platform_plans_that_platform_only(tmp_path):
    root = _demo_workspace(tmp_path / "two", 'platforms = ["linux/amd64", "linux/arm64"]')
    proc = run_efabuild(["-C", str(root), "plan", "--offline", "--json", "demo:user@linux/arm64"])
    assert proc.returncode == 0, proc.stderr
    assert [layer["name"] for layer in json.loads(proc.stdout)["layers"]] == [
        "demo:efa@linux/arm64", "demo:deepep@linux/arm64", "demo:user@linux/arm64"]
    bad = run_efabuild(["-C", str(root), "plan", "--offline", "demo:user@linux/s390x"])
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "linux/s390x" in bad.stderr, bad.stderr


def test_the_plan_says_which_layers_build_under_emulation(tmp_path):
    root = _demo_workspace(tmp_path / "two", 'platforms = ["linux/amd64", "linux/arm64"]\nemulate = ["linux/arm64"]')
    planned = _offline_plan(root)
    assert planned["demo:efa@linux/arm64"]["emulated"] and not planned["demo:efa@linux/amd64"]["emulated"]
    assert planned["demo:efa@linux/arm64"]["reasons"][0] == "emulated (QEMU, many times slower)"
    text = run_efabuild(["-C", str(root), "plan", "--offline"]).stdout
    line = next(line for line in text.splitlines() if line.startswith("demo:efa@linux/arm64"))
    assert "emulated (QEMU, many times slower)" in line


def test_one_platforms_unresolved_base_leaves_the_others_keys_sure():
    """Slip: provisional judged by the base's ref alone, so an arm64 digest no registry gave made
    the amd64 keys provisional too, though the amd64 digest was known."""
    src = Path("graphs/stack.toml")
    efa = Layer("stack", "efa", src, "RUN true\n", base=BaseImage(BASE.ref), platforms=("linux/amd64", "linux/arm64"))
    graph = LayerGraph()
    for platform in efa.platforms:
        graph.add_node(f"stack:efa@{platform}", layer=efa, platform=platform, parent=None)
    order = list(graph.nodes)
    bases = {(BASE.ref, "linux/amd64"): BASE._replace(platform="linux/amd64"),
             (BASE.ref, "linux/arm64"): BaseResolution(BASE.ref, None, "unresolved", platform="linux/arm64")}
    inputs = layer_inputs("linux/amd64", graph, order, bases, {})
    plan = make_plan(graph, order, inputs, Availability(), lambda name: None, bases=tuple(bases.values()))
    assert {lp.qualname: lp.provisional for lp in plan.layers} == {
        "stack:efa@linux/amd64": False, "stack:efa@linux/arm64": True}
    assert inputs["stack:efa@linux/amd64"].base_digest == BASE.digest
