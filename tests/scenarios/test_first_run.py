"""The first run on a fresh machine: a Python whose site-packages is empty, first on PATH.

From the checkout's root `python3 -c 'import efabuild'` succeeds even there (the package directory
is on the path), so setup-host.sh must judge an installation by what it provides, and
build-fixtures.py must say what to run rather than die on a missing dependency.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SETUP_HOST = REPO / "scripts" / "setup-host.sh"


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> dict[str, str]:
    """An environment whose first python3 is a fresh venv without efabuild or its dependencies."""
    venv = tmp_path_factory.mktemp("first-run") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PATH": f"{venv / 'bin'}:{env['PATH']}"}


def python_ready(env: dict[str, str]) -> int:
    """setup-host.sh's own python_ready, run as the script runs it (its $0 is the script)."""
    function = subprocess.run(["sed", "-n", "/^python_ready() {/,/^}/p", str(SETUP_HOST)],
                              capture_output=True, text=True, check=True).stdout
    assert function.startswith("python_ready() {"), "setup-host.sh has no python_ready function"
    return subprocess.run(["bash", "-c", function + "\npython_ready", str(SETUP_HOST)], cwd=REPO, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=120).returncode


def test_a_bare_python_imports_the_package_from_the_checkout_root_yet_is_not_ready(bare_python):
    imported = subprocess.run(["python3", "-c", "import efabuild"], cwd=REPO, env=bare_python, timeout=60)
    assert imported.returncode == 0, "the trap this guards against: the checkout itself is importable"
    assert python_ready(bare_python) != 0


def test_a_python_with_the_requirements_this_checkout_and_the_console_scripts_is_ready():
    # this checkout importable from outside it, as an editable install of it makes it; the test's
    # Python and its console scripts first on PATH, as they are once a venv is activated
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{sysconfig.get_path('scripts')}:{os.environ['PATH']}"}
    python = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], env=env,
                            capture_output=True, text=True, check=True).stdout.strip()
    assert Path(python).resolve() == Path(sys.executable).resolve(), "python3 on PATH is not the test's Python"
    assert python_ready(env) == 0


def test_build_fixtures_on_a_bare_python_is_one_line_saying_what_to_run(bare_python):
    done = subprocess.run(["python3", str(REPO / "scripts" / "build-fixtures.py")], cwd=REPO, env=bare_python,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("build-fixtures: missing Python module ") and "scripts/setup-host.sh" in line
