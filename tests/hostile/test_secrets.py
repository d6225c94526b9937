"""Secrets on the real engine: a layer's BuildKit secret and a secret-looking build arg, attacked
from every place a value could leak to: `ps`, the build log, make's output and --json, failure
messages, build records, the stored manifest, the image config and `docker history`."""

from __future__ import annotations

import json
import os
import secrets as random
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fixtures.builder import MINI_NGC_TAG, build_fixtures
from tests.kits.wsfactory import make_workspace

pytestmark = [pytest.mark.engine]

SECRET_ENV = "EFABUILD_TEST_HF_TOKEN"

GRAPH = """\
[layers.fetch]
base = "{base}"
secrets = ["{secret_env}"]
args = {{ HF_TOKEN = "{arg_value}", RUN_ID = "{run_id}" }}
dockerfile = '''
ARG HF_TOKEN
ARG RUN_ID
RUN --mount=type=secret,id={secret_env} wc -c < /run/secrets/{secret_env} > /secret-length && cat /run/secrets/{secret_env}
RUN echo "token is $HF_TOKEN"
'''
artifact = true
ignore = [{{ rule = "EFA013", reason = "this test leaks on purpose" }}]

[layers.broken]
parent = "fetch"
secrets = ["{secret_env}"]
args = {{ HF_TOKEN = "{arg_value}" }}
dockerfile = '''
ARG HF_TOKEN
ARG SESSION_TOKEN={default_value}
RUN --mount=type=secret,id={secret_env} echo "failing with $(cat /run/secrets/{secret_env}) $HF_TOKEN $SESSION_TOKEN" && exit 3
'''
ignore = [{{ rule = "EFA013", reason = "this test leaks on purpose" }}]
"""


@pytest.fixture(scope="module")
def mini_ngc(docker_engine) -> str:
    build_fixtures()
    return MINI_NGC_TAG


def efabuild(root: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "efabuild", "-C", str(root), *args], capture_output=True,
                          text=True, env=env, stdin=subprocess.DEVNULL, timeout=300)


def _buildx_cmdlines() -> list[str]:
    seen = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"buildx" in words and b"build" in words:
            seen.append(b" ".join(words).decode(errors="replace"))
    return seen


@pytest.fixture
def built_tags():
    tags: list[str] = []
    yield tags
    if tags:
        subprocess.run(["docker", "image", "rm", "-f", *tags], capture_output=True)


def test_secrets_never_leave_the_build(mini_ngc, tmp_path, built_tags):
    secret_value = "hf_" + random.token_hex(17)  # a BuildKit secret of the layer
    arg_value = "hf_" + random.token_hex(17)  # a secret-looking build arg (what EFA013 warns of)
    default_value = random.token_hex(12)  # an ARG default with a secret-looking name
    run_id = uuid.uuid4().hex[:12]
    root = make_workspace(tmp_path / "ws", {"leaky": GRAPH.format(
        base=mini_ngc, secret_env=SECRET_ENV, arg_value=arg_value, default_value=default_value, run_id=run_id)})
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop(SECRET_ENV, None)

    # a secret the environment lacks: one line naming the file and key, before anything is built
    missing = efabuild(root, "make", "--no-lint", "leaky:fetch", env=env)
    assert (missing.returncode, missing.stdout) == (2, ""), missing.stderr
    assert missing.stderr == (f"efabuild: graphs/leaky.toml: layers.fetch.secrets: {SECRET_ENV} is not set: "
                              "export it before make (the build reads it as a BuildKit secret, never stored)\n")

    env[SECRET_ENV] = secret_value
    # the key holds the secret's name only: another value gives the same key
    plan = json.loads(efabuild(root, "plan", "--json", env=env).stdout)
    fetch = next(layer for layer in plan["layers"] if layer["name"] == "leaky:fetch")
    assert fetch["inputs"]["secrets"] == [SECRET_ENV]
    other = json.loads(efabuild(root, "plan", "--json", env={**env, SECRET_ENV: "another value"}).stdout)
    assert [layer["key"] for layer in other["layers"]] == [layer["key"] for layer in plan["layers"]]
    tag = f"efabuild/fetch:{fetch['key']}"
    built_tags.append(tag)

    # make, watching the command line of every buildx process while it runs (`ps` shows them)
    make = subprocess.Popen([sys.executable, "-m", "efabuild", "-C", str(root), "make", "--no-lint", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            stdin=subprocess.DEVNULL)
    cmdlines: set[str] = set()
    while make.poll() is None:
        cmdlines.update(_buildx_cmdlines())
        time.sleep(0.05)
    stdout, stderr = make.communicate(timeout=60)
    assert make.returncode == 1, stderr  # `broken` fails on purpose
    assert any(f"--secret id={SECRET_ENV},env={SECRET_ENV}" in line for line in cmdlines), cmdlines
    assert any("--build-arg HF_TOKEN " in line for line in cmdlines), cmdlines

    outcomes = {o["name"]: o for o in json.loads(stdout)["layers"]}
    assert outcomes["leaky:fetch"]["status"] == "built" and outcomes["leaky:broken"]["status"] == "failed"
    failure = outcomes["leaky:broken"]["error"]
    assert "exit code 3" in failure and "failing with <redacted> <redacted> <redacted>" in failure
    summary = efabuild(root, "make", "--no-lint", env=env)  # the table form of the same failure
    assert summary.returncode == 1 and "leaky:broken" in summary.stdout

    # the secret reached the build: its length was written by the RUN that mounted it
    length = subprocess.run(["docker", "run", "--rm", "--entrypoint", "cat", tag, "/secret-length"], capture_output=True,
                            text=True, check=True).stdout.strip()
    assert length == str(len(secret_value))

    logs = sorted((root / "cache" / "logs").rglob("*.log"))
    fetch_log = next(path for path in logs if path.parent.name == "fetch").read_text()
    assert "token is <redacted>" in fetch_log and "<redacted>" in fetch_log.split("/secret-length", 1)[1]
    history = subprocess.run(["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", tag],
                             capture_output=True, text=True, check=True).stdout
    config = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, text=True, check=True).stdout
    assert f"/run/secrets/{SECRET_ENV}" in history  # the RUN is there, with the secret's name only
    sqsh = Path(efabuild(root, "lookup", "leaky:fetch", env=env).stdout.strip())
    listing = subprocess.run(["unsquashfs", "-lls", "-d", "", str(sqsh)], capture_output=True, text=True,
                             check=True).stdout
    assert "/run/secrets" not in listing or f"/run/secrets/{SECRET_ENV}" not in listing
    stored = [path for path in (root / "cache").rglob("*") if path.is_file() and path.suffix != ".sqsh"]
    assert any(path.suffix == ".json" and "manifest" in path.name for path in stored), stored

    places = {"make stdout": stdout, "make stderr": stderr, "make table": summary.stdout + summary.stderr,
              "plan": json.dumps(plan), **{f"log {p.relative_to(root)}": p.read_text() for p in logs},
              **{f"stored {p.relative_to(root)}": p.read_bytes().decode(errors="replace") for p in stored},
              "buildx command lines": "\n".join(cmdlines)}
    for what, value in (("the secret", secret_value), ("HF_TOKEN", arg_value), ("SESSION_TOKEN", default_value)):
        leaks = [where for where, text in places.items() if value in text]
        assert leaks == [], f"value of {what} in {leaks}"
    # a BuildKit secret is not in the image either (a build arg is, by its nature: EFA013)
    assert secret_value not in history and secret_value not in config
    assert secret_value.encode() not in sqsh.read_bytes()

