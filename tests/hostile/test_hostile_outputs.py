"""Hostile text reaching terminals and other tools: file names, build log lines and names inside
images carry terminal escapes, bytes that are not UTF-8 and characters XML cannot hold. A
terminal must get them escaped (never acted on: a title set, a screen cleared), an SVG or JUnit
file must stay well-formed XML, and printing must never fail on an encoding.
"""

from __future__ import annotations

import pytest

import io
import os
import subprocess
import xml.dom.minidom
from pathlib import Path

import attrs

from efabuild.cli.live import LiveReporter, PlainReporter
from efabuild.engine.build import format_failure
from efabuild.engine.buildlog import BuildLogReader
from efabuild.provenance.checks import FAIL, WARN, Check
from efabuild.provenance.junit import to_junit
from tests.kits.inprocess import run_efabuild
from tests.core.test_plan import record_all
from tests.make.test_make import demo_ws, mini_ngc  # noqa: F401 - fixtures: the demo workspace on its base
from tests.kits.wsfactory import make_workspace

# sets the terminal's title, then clears the screen
ESCAPES = "\x1b]0;owned\x07\x1b[2J"
EVIL = f"app/{ESCAPES}evil.py"


def acted_on(text: str) -> bool:
    """Whether `text` holds an escape sequence a terminal would act on (other than our colours)."""
    return "\x1b]" in text or "\x1b[2J" in text or "\x07" in text


def gone_since_last_build(tmp_path: Path) -> Path:
    """A workspace whose last build had a context file named with escapes, since removed: the plan
    explains the layer with that name."""
    root = make_workspace(tmp_path / "ws", files={"app/train.py": "x\n", EVIL: "y\n"})
    record_all(root)
    (root / EVIL).unlink()
    return root


def test_plan_names_a_changed_file_with_its_escapes_shown_not_sent(tmp_path):
    root = gone_since_last_build(tmp_path)
    proc = run_efabuild(["-C", str(root), "plan", "--offline"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert not acted_on(proc.stdout)
    assert "context app/\\x1b]0;owned\\x07\\x1b[2Jevil.py removed" in proc.stdout


def test_graph_svg_of_names_with_control_characters_is_well_formed_xml(tmp_path):
    root = gone_since_last_build(tmp_path)
    out = tmp_path / "plan.svg"
    proc = run_efabuild(["-C", str(root), "graph", "--offline", "--format", "svg", "-o", str(out)],
                        capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    document = xml.dom.minidom.parse(str(out))  # raises on a character XML cannot hold
    texts = " ".join(node.firstChild.data for node in document.getElementsByTagName("text") if node.firstChild)
    assert "evil.py" in texts and "\x1b" not in texts


def test_graph_dot_text_keeps_quotes_and_backslashes_inside_their_label(tmp_path):
    """A name with `"`, `\\l` and an HTML-like `<...>` is one label: dot reads the file back."""
    root = make_workspace(tmp_path / "ws", files={"app/train.py": "x\n", 'app/a"b\\l<B>c</B>.py': "y\n"})
    record_all(root)
    (root / 'app/a"b\\l<B>c</B>.py').unlink()
    out = tmp_path / "plan.svg"
    proc = run_efabuild(["-C", str(root), "graph", "--offline", "--format", "svg", "-o", str(out)],
                        capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    document = xml.dom.minidom.parse(str(out))
    texts = [node.firstChild.data for node in document.getElementsByTagName("text") if node.firstChild]
    assert any('app/a"b\\l<B>c</B>.py' in text for text in texts), texts


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_live_view_shows_a_build_log_line_s_escapes_instead_of_sending_them():
    out = Terminal()
    reporter = LiveReporter(out)
    try:
        reporter.started("demo:user", "build", f"context {EVIL} changed")
        reporter.line("demo:user", f"#7 0.412 {ESCAPES}pwned")
        reporter._redraw()
    finally:
        reporter.close()
    assert not acted_on(out.getvalue())
    assert "pwned" in out.getvalue() and "\\x1b]0;owned" in out.getvalue()


def test_plain_progress_shows_a_reason_s_escapes_instead_of_sending_them():
    out = io.StringIO()
    PlainReporter(out).started("demo:user", "build", f"context {EVIL} changed")
    assert not acted_on(out.getvalue()) and "evil.py changed" in out.getvalue()


def test_a_failed_build_s_last_lines_are_shown_escaped():
    reader = BuildLogReader()
    for line in ["#5 [2/2] RUN printf '\\033]0;owned\\007' && exit 3",
                 f"#5 0.130 {ESCAPES}pwned", "#5 ERROR: process did not complete successfully: exit code: 3"]:
        reader.feed(line)
    message = format_failure("efabuild/user:0123abcd", reader.failure(), Path("cache/logs/x.log"))
    assert not acted_on(message)
    assert message.splitlines()[-1] == "  | \\x1b]0;owned\\x07\\x1b[2Jpwned"
    # a base pulled from a registry that answers with escapes: BuildKit quotes its answer
    reader = BuildLogReader()
    reader.feed(f"ERROR: failed to solve: registry.example/base:1: unexpected status: 403 Forbidden {ESCAPES}")
    message = format_failure("efabuild/user:0123abcd", reader.failure(), Path("cache/logs/x.log"))
    assert not acted_on(message) and "403 Forbidden \\x1b]0;owned" in message.splitlines()[0]


@attrs.frozen
class AuditResult:
    name: str
    key: str
    ref: str
    checks: tuple


def test_junit_of_messages_holding_surrogates_and_control_characters_is_well_formed():
    """Check messages quote names read from an image: bytes that are not UTF-8 come as surrogates."""
    message = "library /opt/lib" + os.fsdecode(b"\xff\xfe") + "\x1b[31m ]]> <x/> & done"
    report = to_junit([AuditResult("demo:user", "ab" * 32, "demo:user",
                                   (Check("nccl", FAIL, message), Check("env", WARN, message)))])
    document = xml.dom.minidom.parseString(report)
    failure = document.getElementsByTagName("failure")[0]
    assert failure.getAttribute("message").startswith("library /opt/lib")
    assert failure.getAttribute("message").endswith(" ]]> <x/> & done")


def _sqsh(tree: Path, out: Path) -> Path:
    subprocess.run(["mksquashfs", str(tree), str(out), "-all-root", "-noappend", "-quiet", "-no-progress"],
                   check=True, capture_output=True)
    return out


def test_make_check_names_files_in_images_with_escapes_and_odd_bytes_printably(tmp_path):
    """make --check prints the paths that differ between the stored and the rebuilt image."""
    from efabuild.make.check import CheckResult, render
    from efabuild.export.sqshdiff import compare, read_sqsh

    stored, rebuilt = tmp_path / "stored", tmp_path / "rebuilt"
    names = [f"{ESCAPES}stamp", os.fsdecode(b"bad-\xff-name"), "line\nbreak"]
    for tree, text in ((stored, "one"), (rebuilt, "two")):
        tree.mkdir()
        for name in names:
            (tree / name).write_text(text)
        os.symlink(f"/{ESCAPES}{text}", tree / "link")
    differences = compare(read_sqsh(_sqsh(stored, tmp_path / "a.sqsh")), read_sqsh(_sqsh(rebuilt, tmp_path / "b.sqsh")))
    text = render(CheckResult("demo:user", "ab" * 32, tmp_path / "a.sqsh", "blake3:1", "blake3:2", tuple(differences)))
    text.encode("utf-8")  # what print does with it: no surrogate left to fail on
    assert not acted_on(text)
    assert "content  /\\x1b]0;owned\\x07\\x1b[2Jstamp" in text
    assert "content  /bad-\\xff-name" in text and "content  /line\\nbreak" in text
    assert len([line for line in text.splitlines() if line.startswith("  content")]) == 4


@pytest.mark.slow
def test_show_prints_an_image_s_env_and_labels_with_their_escapes_shown(tmp_path):
    """`ENV FI_PROVIDER=...` and `LABEL` values are the Dockerfile's: show lists them."""
    from tests.data.rootfs import mini_ngc as ngc

    key = "5a" * 32
    env = ngc.full_image(tmp_path / "image")
    env["FI_PROVIDER"] = f"efa{ESCAPES}"
    ngc.write_config(tmp_path / "image", env, {**ngc.base_labels(), "com.nvidia.nccl.version": f"2.30{ESCAPES}"})
    ngc.publish(tmp_path / "store", tmp_path / "image", tmp_path / "work", key)
    proc = run_efabuild(["show", key[:12], "--store", str(tmp_path / "store")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert not acted_on(proc.stdout)
    assert "  FI_PROVIDER=efa\\x1b]0;owned\\x07\\x1b[2J" in proc.stdout.splitlines()


def test_doctor_quotes_a_log_line_with_its_escapes_shown(tmp_path):
    """A job's output is anyone's text; doctor quotes the lines it judges by."""
    log = tmp_path / "slurm-1.out"
    log.write_text(f"node1:2:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0{ESCAPES}\n")
    proc = run_efabuild(["doctor", str(log)], capture_output=True, text=True)
    assert "Traceback" not in proc.stderr and "via NET/Socket/0\\x1b]0;owned" in proc.stdout, proc.stdout
    assert not acted_on(proc.stdout)


def test_lint_quotes_a_dockerfile_s_escapes_shown_not_sent(tmp_path):
    """A Dockerfile file (TOML refuses raw control characters, a dockerfile_file does not) from a
    pull request, linted in CI and read on a terminal."""
    from tests.kits.wsfactory import SIMPLE_GRAPH

    graph = SIMPLE_GRAPH.replace("dockerfile = '''\nARG HYBRID_EP_COMMIT\nRUN echo deepep ${HYBRID_EP_COMMIT}\n'''",
                                 'dockerfile_file = "deepep.Dockerfile"')
    root = make_workspace(tmp_path / "ws", {"stack": graph})
    (root / "deepep.Dockerfile").write_text(f"ARG HYBRID_EP_COMMIT\nRUN pip install torch{ESCAPES}\n")
    proc = run_efabuild(["-C", str(root), "lint"], capture_output=True, text=True)
    assert "Traceback" not in proc.stderr and "pip installs torch\\x1b]0 on" in proc.stdout, proc.stdout
    assert not acted_on(proc.stdout)


def test_a_failing_build_s_escapes_reach_the_terminal_shown_not_sent(demo_ws):
    """The whole path on the engine: a RUN step prints escapes, then fails; make's progress and
    its failure message (the step and the last lines of the log) show them escaped."""
    from tests.make.test_make import efabuild, outcomes

    graph = demo_ws / "graphs" / "demo.toml"
    graph.write_text(graph.read_text().replace(
        "WORKDIR /workspace\n", "RUN printf 'compiling \\033]0;owned\\007\\033[2J\\n' && false\nWORKDIR /workspace\n"))
    failed = efabuild(demo_ws, "make", "demo")
    assert failed.returncode == 1 and outcomes(failed)["demo:user"] == "failed", failed.stderr
    assert not acted_on(failed.stderr) and "\x1b" not in failed.stderr
    assert "  | compiling \\x1b]0;owned\\x07\\x1b[2J" in failed.stderr.splitlines()
