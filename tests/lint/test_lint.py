"""efabuild lint on whole workspaces: graph-level rules, layer chains, line numbers in the graph
TOML, ignores, the shipped graphs, and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from efabuild.cli import main
from efabuild.errors import InputError
from efabuild.lint import errors_only, lint_workspace, render_text
from efabuild.workspace import load_workspace
from tests.kits.wsfactory import make_workspace

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32

BUILD = """\
[workspace]
graphs = ["graphs/*.toml"]

[audit]
host_efa_installer = "1.50.0"
"""

EFA_LAYER = """\
[layers.efa]
base = "nvcr.io/nvidia/pytorch:26.08-py3"
digest = "{digest}"
dockerfile = '''
ARG EFA_INSTALLER_VERSION
RUN apt-get update \\
 && curl -fsSL -O https://efa-installer.amazonaws.com/aws-efa-installer-${{EFA_INSTALLER_VERSION}}.tar.gz \\
 && tar -xf aws-efa-installer-${{EFA_INSTALLER_VERSION}}.tar.gz \\
 && cd aws-efa-installer \\
 && ./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${{LD_LIBRARY_PATH}}
'''
args = {{ EFA_INSTALLER_VERSION = "{version}" }}
"""


def workspace(tmp_path: Path, graph: str, build: str = BUILD):
    root = make_workspace(tmp_path / "ws", graphs={"g": graph}, build=build, files={})
    return load_workspace(root)


def line_of(ws, text: str) -> int:
    lines = (ws.root / "graphs" / "g.toml").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def rules(findings) -> list[str]:
    return sorted(f.rule for f in findings)


def test_shipped_graphs_have_no_errors_only_the_base_digest_left_to_the_user():
    findings = lint_workspace(load_workspace(REPO))
    assert errors_only(findings) == []
    # the one thing deliberately left to the user: pinning the base by digest once pulled
    noted = {(f.rule, f.layer) for f in findings if f.severity != "info"}
    assert noted <= {("EFA010", "ngc-efa:efa"), ("EFA010", "demo:efa")}
    assert ("EFA010", "ngc-efa:efa") in noted
    # and a note that the installer's RUN takes curl, ca-certificates and git as the mirror has them
    assert {(f.rule, f.layer) for f in findings if f.severity == "info"} == {("EFA017", "ngc-efa:efa"),
                                                                             ("EFA017", "demo:efa"), ("EFA019", None)}
    # the example job's two start modes, each named
    modes = sorted(f.message for f in findings if f.rule == "EFA019")
    assert len(modes) == 2 and modes[0].startswith("start mode: mount per step (unnamed --container-image)")
    assert modes[1].startswith("start mode: unpack once per node and reuse by name (train-${KEY:0:12})")


def test_clean_layer_has_no_findings(tmp_path):
    ws = workspace(tmp_path, EFA_LAYER.format(digest=DIGEST, version="1.50.0"))
    assert lint_workspace(ws) == []


def test_inline_dockerfile_findings_point_at_graph_lines(tmp_path):
    graph = EFA_LAYER.format(digest=DIGEST, version="1.50.0").replace(
        "--skip-limit-conf --no-verify", "--skip-limit-conf")
    ws = workspace(tmp_path, graph)
    [finding] = lint_workspace(ws)
    assert (finding.rule, finding.file, finding.layer) == ("EFA002", "graphs/g.toml", "g:efa")
    assert finding.line == line_of(ws, "./efa_installer.sh")
    assert render_text([finding]).splitlines()[0] == (
        f"graphs/g.toml:{finding.line}: EFA002 error g:efa: {finding.message}")
    assert render_text([finding]).splitlines()[1] == f"  fix: {finding.fix}"


def test_base_without_digest_is_a_warning_at_the_base_line(tmp_path):
    graph = EFA_LAYER.format(digest=DIGEST, version="1.50.0").replace(f'digest = "{DIGEST}"\n', "")
    ws = workspace(tmp_path, graph)
    [finding] = lint_workspace(ws)
    assert (finding.rule, finding.severity) == ("EFA010", "warning")
    assert finding.line == line_of(ws, "base = ")
    assert errors_only([finding]) == []


def test_installer_version_against_the_host_ami(tmp_path):
    ws = workspace(tmp_path, EFA_LAYER.format(digest=DIGEST, version="1.49.0"))
    [finding] = lint_workspace(ws)
    assert (finding.rule, finding.severity) == ("EFA014", "warning")
    assert "1.49.0" in finding.message and "1.50.0" in finding.message
    assert finding.line == line_of(ws, "args = {")  # where the version is set


def test_an_arg_default_other_than_the_layers_args_is_a_warning_at_the_arg(tmp_path):
    layer = EFA_LAYER.format(digest=DIGEST, version="1.50.0")
    differs = layer.replace("ARG EFA_INSTALLER_VERSION\n", "ARG EFA_INSTALLER_VERSION=1.49.0\n")
    ws = workspace(tmp_path / "differs", differs)
    [finding] = lint_workspace(ws)
    assert (finding.rule, finding.severity, finding.layer) == ("EFA018", "warning", "g:efa")
    assert finding.line == line_of(ws, "ARG EFA_INSTALLER_VERSION=")
    assert "'1.49.0'" in finding.message and "'1.50.0'" in finding.message and errors_only([finding]) == []
    same = layer.replace("ARG EFA_INSTALLER_VERSION\n", "ARG EFA_INSTALLER_VERSION=1.50.0\n")
    assert lint_workspace(workspace(tmp_path / "same", same)) == []
    # a default made of an earlier ARG's default is that value, as a plain `docker build` expands it
    derived = layer.replace("ARG EFA_INSTALLER_VERSION\n",
                            "ARG DEFAULT_VERSION=1.50.0\nARG EFA_INSTALLER_VERSION=${DEFAULT_VERSION}\n")
    assert lint_workspace(workspace(tmp_path / "derived", derived)) == []
    older = derived.replace("ARG DEFAULT_VERSION=1.50.0", "ARG DEFAULT_VERSION=1.49.0")
    [finding] = lint_workspace(workspace(tmp_path / "older", older))
    assert finding.rule == "EFA018" and "'1.49.0'" in finding.message
    # an earlier ARG declared without a default is empty in a plain build
    empty = layer.replace("ARG EFA_INSTALLER_VERSION\n", "ARG PREFIX\nARG EFA_INSTALLER_VERSION=${PREFIX}1.50.0\n")
    assert lint_workspace(workspace(tmp_path / "empty", empty)) == []
    # a secret-looking value is EFA013's to refuse; EFA018 then names the ARG without its values
    token = "ghp_" + "a1" * 18
    secret = same.replace("ARG EFA_INSTALLER_VERSION=1.50.0\n", f"ARG EFA_INSTALLER_VERSION=1.50.0 API_TOKEN={token}\n")
    secret = secret.replace('args = { EFA_INSTALLER_VERSION', 'args = { API_TOKEN = "swapped-in", EFA_INSTALLER_VERSION')
    findings = lint_workspace(workspace(tmp_path / "secret", secret))
    [finding] = [f for f in findings if f.rule == "EFA018"]
    assert "API_TOKEN" in finding.message and token not in finding.message and "swapped-in" not in finding.message


def test_installer_version_without_host_policy_is_not_compared(tmp_path):
    build = BUILD.replace('host_efa_installer = "1.50.0"', "")
    ws = workspace(tmp_path, EFA_LAYER.format(digest=DIGEST, version="1.49.0"), build=build)
    assert lint_workspace(ws) == []


def test_installer_latest_or_unset_is_not_pinned(tmp_path):
    latest = EFA_LAYER.format(digest=DIGEST, version="1.50.0").replace(
        "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz \\\n && tar", "aws-efa-installer-latest.tar.gz \\\n && tar")
    [finding] = lint_workspace(workspace(tmp_path / "a", latest))
    assert finding.rule == "EFA014" and "latest" in finding.message
    unset = EFA_LAYER.format(digest=DIGEST, version="1.50.0").replace(
        'args = { EFA_INSTALLER_VERSION = "1.50.0" }\n', "")
    [finding] = lint_workspace(workspace(tmp_path / "b", unset))
    assert finding.rule == "EFA014" and "EFA_INSTALLER_VERSION has no value" in finding.message


def test_secret_build_arg_reported_at_its_line_without_its_value(tmp_path):
    graph = EFA_LAYER.format(digest=DIGEST, version="1.50.0").replace(
        'args = { EFA_INSTALLER_VERSION = "1.50.0" }',
        '[layers.efa.args]\nEFA_INSTALLER_VERSION = "1.50.0"\nNGC_API_KEY = "nvapi-0123456789abcdefghijKLMNOP"\n'
        'PIP_INDEX = "https://pypi.org/simple"')
    ws = workspace(tmp_path, graph)
    [finding] = lint_workspace(ws)
    assert (finding.rule, finding.severity) == ("EFA013", "error")
    assert "NGC_API_KEY" in finding.message and "nvapi-" not in render_text([finding])
    assert finding.line == line_of(ws, "NGC_API_KEY")


def test_env_carries_to_children_and_each_layer_answers_for_its_own_text(tmp_path):
    graph = EFA_LAYER.format(digest=DIGEST, version="1.50.0") + """
[layers.fine]
parent = "efa"
dockerfile = '''
RUN echo inherits the EFA library path
'''

[layers.broken]
parent = "fine"
dockerfile = '''
ENV LD_LIBRARY_PATH=/usr/local/lib:${LD_LIBRARY_PATH}
RUN apt-get install -y openmpi-bin
'''
"""
    ws = workspace(tmp_path, graph)
    findings = lint_workspace(ws)
    assert {(f.rule, f.layer) for f in findings if f.rule != "EFA017"} == {("EFA004", "g:broken"),
                                                                           ("EFA005", "g:broken")}
    ld = next(f for f in findings if f.rule == "EFA004")
    assert ld.line == line_of(ws, "ENV LD_LIBRARY_PATH=/usr/local/lib")
    mpi = next(f for f in findings if f.rule == "EFA005")  # NGC comes from the chain's base
    assert mpi.line == line_of(ws, "openmpi-bin")


def test_installer_without_library_path_is_reported_at_the_installer(tmp_path):
    graph = EFA_LAYER.format(digest=DIGEST, version="1.50.0").replace(
        "ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${LD_LIBRARY_PATH}\n", "")
    ws = workspace(tmp_path, graph)
    [finding] = lint_workspace(ws)
    assert finding.rule == "EFA004" and finding.line == line_of(ws, "./efa_installer.sh")


def test_ignore_with_reason_drops_the_rule_for_that_layer_only(tmp_path):
    layer = EFA_LAYER.format(digest=DIGEST, version="1.50.0").replace(f'digest = "{DIGEST}"\n', "")
    other = layer.replace("[layers.efa]", "[layers.other]")
    ignored = layer + 'ignore = [{ rule = "EFA010", reason = "digest pinned by the registry mirror" }]\n'
    ws = workspace(tmp_path, ignored + "\n" + other)
    assert {(f.rule, f.layer) for f in lint_workspace(ws)} == {("EFA010", "g:other")}


def test_ignore_of_an_unknown_rule_is_flagged(tmp_path):
    graph = EFA_LAYER.format(digest=DIGEST, version="1.50.0") + \
        'ignore = [{ rule = "EFA999", reason = "typo for EFA009" }]\n'
    ws = workspace(tmp_path, graph)
    [finding] = lint_workspace(ws)
    assert finding.rule == "EFA000" and "EFA999" in finding.message
    assert finding.line == line_of(ws, "ignore = ")


def test_ignore_without_reason_is_bad_input(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # main -C changes directory; restored after the test
    graph = EFA_LAYER.format(digest=DIGEST, version="1.50.0") + 'ignore = [{ rule = "EFA010" }]\n'
    root = make_workspace(tmp_path / "ws", graphs={"g": graph}, build=BUILD, files={})
    assert main(["-C", str(root), "lint"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "graphs/g.toml" in err and "reason" in err


def test_unknown_graph_name_is_bad_input(tmp_path):
    ws = workspace(tmp_path, EFA_LAYER.format(digest=DIGEST, version="1.50.0"))
    with pytest.raises(InputError, match="unknown graph 'nope'"):
        lint_workspace(ws, ["nope"])


def test_cli_exit_codes_and_json(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = EFA_LAYER.format(digest=DIGEST, version="1.50.0").replace("apt-get update \\\n && ", "")
    root = make_workspace(tmp_path / "ws", graphs={"g": bad, "ok": EFA_LAYER.format(
        digest=DIGEST, version="1.50.0")}, build=BUILD, files={})
    assert main(["-C", str(root), "lint", "ok"]) == 0
    assert capsys.readouterr().out.strip() == "lint: no findings"
    assert main(["-C", str(root), "lint", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["counts"] == {"error": 1, "warning": 0, "info": 0}
    [finding] = data["findings"]
    assert (finding["rule"], finding["name"], finding["file"]) == ("EFA001", "g:efa", "graphs/g.toml")
    assert main(["-C", str(root), "lint", "graphs/g.toml"]) == 1
    out = capsys.readouterr().out
    assert "EFA001 error g:efa" in out and out.strip().endswith("lint: 1 error, 0 warnings, 0 infos")
    assert main(["-C", str(root), "lint", "missing"]) == 2
    assert "missing" in capsys.readouterr().err


def test_cli_on_the_shipped_workspace_exits_0(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert main(["-C", str(REPO), "lint"]) == 0
