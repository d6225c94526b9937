"""The Dockerfile and shell readers lint rests on: instructions and lines, RUN commands, ENV/ARG."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pathlib import Path

from efabuild.lint import lint_workspace
from efabuild.lint.dockerfile import evaluate, parse
from efabuild.lint.shell import lookup_in, split_commands, split_words
from efabuild.model import BaseImage, Graph, Layer, Workspace
from efabuild.settings import Settings

GUIDE = """\
ARG EFA_INSTALLER_VERSION=1.50.0
ARG HYBRID_EP_COMMIT=94a9f8f6b146c07d97ec58f67cd6d303296d6098

# 1. EFA installer
RUN apt-get update \\
 && apt-get install -y --no-install-recommends curl ca-certificates git \\
 && cd /tmp \\
 && curl -fsSL -O https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz \\
 && tar -xf aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz \\
 && cd aws-efa-installer \\
 && ./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify \\
 && cd / && rm -rf /tmp/aws-efa-installer* /var/lib/apt/lists/*

ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${LD_LIBRARY_PATH}
"""


def test_instructions_with_their_lines_and_continuations_joined():
    instructions = parse(GUIDE)
    assert [(i.keyword, i.line, i.end_line) for i in instructions] == [
        ("ARG", 1, 1), ("ARG", 2, 2), ("RUN", 5, 12), ("ENV", 14, 14)]
    assert "\n" not in instructions[2].value and "rm -rf /tmp/aws-efa-installer*" in instructions[2].value


def test_run_commands_split_expanded_and_on_their_own_lines():
    evaluated = evaluate(GUIDE, {"EFA_INSTALLER_VERSION": "1.49.0"})
    runs = [(rc.line, rc.command.argv[:2]) for rc in evaluated.runs]
    assert runs[0] == (5, ("apt-get", "update"))
    assert (8, ("curl", "-fsSL")) in runs
    curl = next(rc for rc in evaluated.runs if rc.command.program == "curl")
    # the graph's build arg wins over the ARG default
    assert curl.command.argv[-1] == "https://efa-installer.amazonaws.com/aws-efa-installer-1.49.0.tar.gz"
    installer = next(rc for rc in evaluated.runs if rc.command.program == "efa_installer.sh")
    assert installer.line == 11 and installer.run_line == 5
    assert [(rc.line, rc.command.program) for rc in evaluated.runs if rc.line == 12] == [(12, "cd"), (12, "rm")]
    assert evaluated.env_after["LD_LIBRARY_PATH"] == \
        "/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:${LD_LIBRARY_PATH}"  # unknown stays visible
    assert [(a.name, a.value, a.from_graph) for a in evaluated.args] == [
        ("EFA_INSTALLER_VERSION", "1.49.0", True),
        ("HYBRID_EP_COMMIT", "94a9f8f6b146c07d97ec58f67cd6d303296d6098", False)]


def test_comments_and_blank_lines_inside_a_continuation_are_dropped():
    text = "RUN apt-get update \\\n# a comment\n\n && echo done\nENV A=1\n"
    instructions = parse(text)
    assert [(i.keyword, i.line) for i in instructions] == [("RUN", 1), ("ENV", 5)]
    assert [(rc.line, rc.command.argv) for rc in evaluate(text).runs] == [
        (1, ("apt-get", "update")), (4, ("echo", "done"))]


def test_heredoc_exec_form_and_run_flags():
    text = ("RUN <<EOF\nset -e\npip install torch\nEOF\n"
            'RUN ["pip", "install", "numpy"]\n'
            "RUN --mount=type=secret,id=tok --network=none make install\n")
    evaluated = evaluate(text)
    assert [(rc.line, rc.command.argv, rc.run_index) for rc in evaluated.runs] == [
        (2, ("set", "-e"), 0), (3, ("pip", "install", "torch"), 0),
        (5, ("pip", "install", "numpy"), 1), (6, ("make", "install"), 2)]


def test_env_forms_quotes_and_docker_expansion_order():
    text = ('ENV A=1 B="two words" C=${A}/x\n'
            "ENV LEGACY some value with spaces\n"
            "ENV D=${A}-${MISSING:-dflt}\n")
    evaluated = evaluate(text, env_before={"A": "0"})
    values = {e.name: e.value for e in evaluated.envs}
    # within one ENV, ${A} is the value from before the instruction (BuildKit semantics)
    assert values == {"A": "1", "B": "two words", "C": "0/x", "LEGACY": "some value with spaces",
                      "D": "1-dflt"}


def test_env_wins_over_arg_and_args_do_not_leak_between_layers():
    evaluated = evaluate("ARG V=arg\nENV V=env\nRUN echo ${V}\n")
    assert evaluated.runs[0].command.argv == ("echo", "env")
    child = evaluate("RUN echo ${V} ${W}\n", env_before=evaluated.env_after)
    assert child.runs[0].command.argv == ("echo", "env", "${W}")


def test_shell_splitting_keeps_quotes_and_redirections_apart():
    script = ("cd /x && (make -j4 2>&1 | tee log) ; if [ -f a ]; then sudo -E env K=v pip install 'a b'; fi "
              "|| echo \"x;y\" > /dev/null")
    commands = split_commands(script)
    assert [c.argv for c in commands] == [
        ("cd", "/x"), ("make", "-j4"), ("tee", "log"), ("[", "-f", "a", "]"), ("pip", "install", "a b"),
        ("echo", "x;y")]
    pip = commands[4]
    assert pip.assigns == (("K", "v"),) and pip.program == "pip"


def test_shell_assignments_carry_to_later_commands():
    commands = split_commands("V=abc; export W=${V}/d && git checkout $W $UNSET",
                              lookup_in({"UNSET_NOT": "x"}))
    assert commands[-1].argv == ("git", "checkout", "abc/d", "$UNSET")


def test_split_words():
    assert split_words('A=1 B="x y" C=\'$A\'', lookup_in({"A": "9"})) == ["A=1", "B=x y", "C=$A"]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("RUNENVARG =$\\{}()'\"&|;#<>\n -abcxyz0123456789[]")), max_size=120))
def test_readers_never_raise_on_any_text(text):
    # lint must answer with findings, never a traceback, whatever the Dockerfile holds
    evaluate(text, {"a": "1"}, {"PATH": "/bin"})
    split_commands(text)
    # and every rule over it, in a layer on an NGC base with a child layer
    base = Layer(graph="g", name="a", source=Path("/nonexistent/g.toml"), dockerfile=text,
                 base=BaseImage("nvcr.io/nvidia/pytorch:26.08-py3"), args=(("a", "1"),))
    child = Layer(graph="g", name="b", source=Path("/nonexistent/g.toml"), dockerfile=text, parent="g:a")
    ws = Workspace(root=Path("/nonexistent"), settings=Settings(), graphs=(Graph("g", Path("g.toml"), layers=(
        base, child)),))
    for finding in lint_workspace(ws, scripts=[]):
        assert finding.severity in ("error", "warning", "info") and finding.message
