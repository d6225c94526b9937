"""One layer build on the real engine: tagged only when complete, failures explained, SIGINT and
cancel stop buildx and tag nothing."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from efabuild.engine.build import BuildFailed, BuildInterrupted, BuildRequest, build_layer
from efabuild.engine.client import connect
from efabuild.engine.images import image_config, image_exists, image_id
from efabuild.errors import EfabuildError
from efabuild.settings import BuilderSettings

pytestmark = pytest.mark.engine

EPOCH = 1700000000  # 2023-11-14T22:13:20Z


@pytest.fixture
def engine(docker_engine):
    return connect(BuilderSettings())


@pytest.fixture
def context_dir(tmp_path):
    directory = tmp_path / "context"
    directory.mkdir()
    (directory / "hello.txt").write_text("hello from the context\n")
    return directory


def request(tag, base, context_dir, body, **extra) -> BuildRequest:
    return BuildRequest(
        tag=tag, dockerfile=f"FROM {base}\n{body}\n", context_dir=context_dir,
        labels={"org.efabuild.key": tag.rsplit(":", 1)[1], "org.efabuild.graph": "demo",
                "org.efabuild.layer": "user"},
        source_date_epoch=EPOCH, **extra,
    )


def test_build_tags_the_image_with_its_labels_and_keeps_the_whole_log(
        engine, busybox_image, image_names, context_dir, tmp_path):
    tag = image_names("user")
    fresh = secrets.token_hex(8)  # not in the engine's build cache yet
    req = request(tag, busybox_image, context_dir,
                  "ARG SOURCE_DATE_EPOCH\nARG GREETING\nCOPY hello.txt /hello.txt\n"
                  f"RUN echo {fresh} && echo \"epoch=$SOURCE_DATE_EPOCH greeting=$GREETING\" && cat /hello.txt",
                  build_args={"GREETING": "hi"})
    seen: list[str] = []
    log_path = tmp_path / "logs" / "user.log"
    result = build_layer(engine, req, log_path, on_line=seen.append)

    assert result.tag == tag and image_exists(engine, tag)
    assert result.image_id == image_id(engine, tag)
    labels = image_config(engine, tag)["Labels"]
    assert labels == {"org.efabuild.key": tag.rsplit(":", 1)[1], "org.efabuild.graph": "demo",
                      "org.efabuild.layer": "user"}
    created = subprocess.run(["docker", "image", "inspect", "--format", "{{.Created}}", tag],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert created.startswith("2023-11-14T22:13:20")  # SOURCE_DATE_EPOCH reached BuildKit
    log = log_path.read_text()
    # the RUN's output lines (not just its header)
    assert f" epoch={EPOCH} greeting=hi\n" in log
    assert " hello from the context\n" in log
    # the live view saw every line the log kept
    assert [line for line in log.splitlines() if not line.startswith("# efabuild")] == seen
    assert not result.cached


def test_same_request_again_comes_from_the_engine_cache(engine, busybox_image, image_names, context_dir, tmp_path):
    req = request(image_names("cached"), busybox_image, context_dir,
                  f"RUN echo {secrets.token_hex(8)} > /marker")
    first = build_layer(engine, req, tmp_path / "first.log")
    second = build_layer(engine, req, tmp_path / "second.log")
    assert not first.cached and second.cached
    assert second.image_id == first.image_id


def test_failing_run_names_the_step_shows_last_lines_and_tags_nothing(
        engine, busybox_image, image_names, context_dir, tmp_path):
    tag = image_names("efa")
    req = request(tag, busybox_image, context_dir,
                  "RUN echo preparing\n"
                  # one stream only: BuildKit does not keep the order between stdout and stderr
                  "RUN exec 1>&2; for i in $(seq 1 20); do echo step $i; done && "
                  "echo 'E: Unable to locate package environment-modules' && exit 100")
    log_path = tmp_path / "efa.log"
    with pytest.raises(BuildFailed) as caught:
        build_layer(engine, req, log_path)
    message = str(caught.value)
    first, *rest = message.splitlines()
    assert first.startswith(f"build of {tag} failed at [3/3] RUN exec 1>&2; for i in $(seq 1 20)")
    assert f"exit code 100 (log: {log_path})" in first
    assert rest[-2:] == ["  | step 20", "  | E: Unable to locate package environment-modules"]
    assert len(rest) == 1 + 15  # "last lines:" and the last 15 lines of the step
    assert caught.value.failure.exit_code == 100
    assert not image_exists(engine, tag)
    assert "E: Unable to locate package environment-modules" in log_path.read_text()


def test_bad_dockerfile_fails_with_buildkits_reason(engine, busybox_image, image_names, context_dir, tmp_path):
    tag = image_names("bad")
    with pytest.raises(BuildFailed) as caught:
        build_layer(engine, request(tag, busybox_image, context_dir, "FOO bar"), tmp_path / "bad.log")
    assert "dockerfile parse error on line 2: unknown instruction: FOO" in str(caught.value).splitlines()[0]
    assert not image_exists(engine, tag)


def test_missing_context_directory_is_a_clear_error(engine, busybox_image, image_names, tmp_path):
    req = request(image_names("ctx"), busybox_image, tmp_path / "nope", "RUN true")
    with pytest.raises(EfabuildError, match=r"context directory .*nope does not exist"):
        build_layer(engine, req, tmp_path / "ctx.log")


# --- stopping a build ------------------------------------------------------------------------

def _processes_mentioning(marker: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in text:
            found.append(text.strip())
    return found


def _gone(marker: str, within_s: float = 60.0) -> bool:
    """Wait until no process mentions `marker` (the engine cleans up asynchronously)."""
    deadline = time.monotonic() + within_s
    while _processes_mentioning(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


BUILD_SCRIPT = """
import signal, sys
from pathlib import Path
from efabuild.engine.build import BuildRequest, build_layer
from efabuild.engine.client import connect
from efabuild.settings import BuilderSettings
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in an interactive efabuild
tag, base, context, log, seconds = sys.argv[1:]
req = BuildRequest(tag=tag, dockerfile=f"FROM {base}\\nRUN echo sleeping-now && sleep {seconds}\\n",
                   context_dir=Path(context), labels={"org.efabuild.key": tag.rsplit(":", 1)[1]})
try:
    build_layer(connect(BuilderSettings()), req, Path(log), on_line=lambda l: print(l, flush=True))
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
    sys.exit(130)
print("FINISHED", flush=True)
"""


def test_sigint_during_a_build_stops_buildx_and_tags_nothing(
        engine, busybox_image, image_names, context_dir, tmp_path):
    tag = image_names("sleepy")
    key = tag.rsplit(":", 1)[1]
    seconds = str(3000 + secrets.randbelow(5000))  # the RUN's `sleep N`, findable in /proc
    process = subprocess.Popen(
        [sys.executable, "-c", BUILD_SCRIPT, tag, busybox_image, str(context_dir),
         str(tmp_path / "sleepy.log"), seconds],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    output = []
    for line in process.stdout:
        output.append(line)
        if line.strip().endswith("sleeping-now"):
            break
    assert any("sleeping-now" in line for line in output), "".join(output)
    assert _processes_mentioning(f"sleep {seconds}"), "the RUN step should be running now"

    process.send_signal(signal.SIGINT)
    output.extend(process.stdout)
    assert process.wait(timeout=120) == 130, "".join(output)
    assert output[-1].strip() == "INTERRUPTED"
    assert _gone(f"org.efabuild.key={key}"), "buildx is still running"
    assert _gone(f"sleep {seconds}"), "the RUN step is still running"
    assert not image_exists(engine, tag)
    assert "nothing was tagged" in (tmp_path / "sleepy.log").read_text()


def test_cancel_event_stops_a_running_build_and_tags_nothing(
        engine, busybox_image, image_names, context_dir, tmp_path):
    tag = image_names("cancelled")
    seconds = str(3000 + secrets.randbelow(5000))
    cancel = threading.Event()

    def on_line(line: str) -> None:
        if line.endswith("sleeping-now"):
            cancel.set()  # what make does for every running build on Ctrl+C

    req = request(tag, busybox_image, context_dir, f"RUN echo sleeping-now && sleep {seconds}")
    with pytest.raises(BuildInterrupted, match="nothing was tagged"):
        build_layer(engine, req, tmp_path / "cancelled.log", on_line=on_line, cancel=cancel)
    assert _gone(f"sleep {seconds}")
    assert not image_exists(engine, tag)


def test_build_log_of_a_build_keeps_no_environment_secrets(
        engine, busybox_image, image_names, context_dir, tmp_path, monkeypatch):
    secret = "AKIA" + secrets.token_hex(8).upper()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    log_path = tmp_path / "secret.log"
    build_layer(engine, request(image_names("env"), busybox_image, context_dir,
                                f"RUN echo {secrets.token_hex(8)} && env"), log_path)
    log = log_path.read_text()
    assert " PATH=/usr/bin:/bin\n" in log  # the RUN's environment was printed
    assert secret not in log


def test_redactor_hides_every_secret_value_and_leaves_short_ones():
    from efabuild.redact import REDACTED, Redactor

    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"
    redact = Redactor.for_build({"HF_TOKEN": "hf_abcdef", "INDEX": "https://u:pw1234@pypi.example/simple",
                                 "VERSION": "1.50.0", "DB_PASSWORD": "ab"}, ["SSH_KEY"], {"SSH_KEY": key})
    text = "#5 [2/3] RUN echo hf_abcdef 1.50.0 https://u:pw1234@pypi.example/simple\nb3BlbnNzaC1rZXktdjEAAAAA ab"
    assert redact(text) == f"#5 [2/3] RUN echo {REDACTED} 1.50.0 {REDACTED}\n{REDACTED} ab"
