"""The wheel works outside the repository: built from the sources, installed into a fresh venv,
run from a directory that is not the checkout against a copied workspace.

The venv sees the site-packages of the Python running the tests for efabuild's dependencies, since
the tests install nothing from an index: a `.pth` file adds them, so they are found whether that
Python is the system's or a virtual environment's (`--system-site-packages` would give a venv made
from a venv its base interpreter's, where the dependencies are not). efabuild itself comes from the
wheel alone, which the test checks (no PYTHONPATH, no checkout on the path).
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.kits.storekit import key_for, make_sqsh, record_for

REPO = Path(__file__).resolve().parents[2]
ORIGIN = "git.example.org/hpc/efabuild.git"
TOKEN = "ghp_notarealtoken0123456789"
# the first test builds the wheel and installs it into a venv (each step up to 300 s)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def run(*argv: str | Path, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, timeout=300)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """(venv bin/, environment without the checkout) with the wheel built from a copy of the sources."""
    tmp = tmp_path_factory.mktemp("packaging")
    sources = tmp / "sources"
    sources.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(REPO / name, sources / name)
    # the package alone: the wheel needs nothing of fixtures/ (the demo's images are built from a checkout)
    shutil.copytree(REPO / "efabuild", sources / "efabuild", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EFABUILD_STORE")}
    # a checkout whose origin is a web address, with a token in it as a clone over HTTPS may have
    for git in (("init", "-q"), ("remote", "add", "origin", f"https://builder:{TOKEN}@{ORIGIN}"),
                ("add", "-A"), ("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "sources")):
        done = run("git", *git, cwd=sources, env=env)
        assert done.returncode == 0, done.stderr
    built = run(sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "--no-index",
                "-w", tmp / "dist", cwd=sources, env=env)
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = (tmp / "dist").glob("efabuild-*.whl")
    # --without-pip: the venv runs the test Python's pip (ensurepip would take seconds)
    made = run(sys.executable, "-m", "venv", "--without-pip", tmp / "venv", cwd=tmp)
    assert made.returncode == 0, made.stderr
    bin_dir = tmp / "venv" / "bin"
    [own] = (tmp / "venv" / "lib").glob("python3*/site-packages")
    # addsitedir, not a bare path line: those directories' own .pth files count, as in their Python
    dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
    (own / "zz-test-dependencies.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs) + "\n")
    # --force-reinstall: the shared development install of efabuild is visible through those
    # site-packages; the venv must get its own copy from the wheel
    installed = run(bin_dir / "python", "-m", "pip", "install", "--no-index", "--no-deps", "--force-reinstall",
                    wheel, cwd=tmp, env=env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return bin_dir, {**env, "PATH": f"{bin_dir}:{env['PATH']}"}


@pytest.mark.slow
def test_the_metadata_names_the_license_and_the_console_scripts(installed):
    bin_dir, env = installed
    shown = run(bin_dir / "python", "-m", "pip", "show", "efabuild", cwd=bin_dir, env=env).stdout
    assert "License: Apache-2.0" in shown
    # the checkout the wheel was built from names where its sources are, without the token
    [metadata] = (bin_dir.parent / "lib").glob("python3*/site-packages/efabuild-*.dist-info/METADATA")
    assert f"Project-URL: Source, https://{ORIGIN}" in metadata.read_text().splitlines()
    assert TOKEN not in metadata.read_text()
    # the licence's text travels with the wheel, not only its name
    [licence] = (bin_dir.parent / "lib").glob("python3*/site-packages/efabuild-*.dist-info/LICENSE")
    assert "Apache License" in licence.read_text() and "Version 2.0" in licence.read_text()
    assert (bin_dir / "efabuild").is_file() and (bin_dir / "efabuild-pyxis-importer").is_file()
    checked = run(bin_dir / "python", "-m", "pip", "check", cwd=bin_dir, env=env)
    assert checked.returncode == 0, checked.stdout  # every dependency is there


def test_efabuild_runs_from_the_wheel_outside_the_repository(installed, tmp_path):
    bin_dir, env = installed
    where = run(bin_dir / "python", "-c", "import efabuild; print(efabuild.__file__)", cwd=tmp_path, env=env)
    assert Path(where.stdout.strip()).is_relative_to(bin_dir.parent), where.stdout + where.stderr
    ws = tmp_path / "ws"
    ws.mkdir()
    shutil.copy(REPO / "BUILD.toml", ws / "BUILD.toml")
    shutil.copytree(REPO / "graphs", ws / "graphs")
    shutil.copytree(REPO / "app", ws / "app", ignore=shutil.ignore_patterns("__pycache__"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plan = run("efabuild", "-C", ws, "plan", "--offline", "demo", cwd=elsewhere, env=env)
    assert plan.returncode == 0, plan.stderr
    assert "demo:user" in plan.stdout and "to build" in plan.stdout
    lint = run("efabuild", "-C", ws, "lint", "demo", cwd=elsewhere, env=env)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_pyxis_importer_console_script_from_the_wheel(installed, tmp_path):
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.store.tiered import Store

    bin_dir, env = installed
    store = Store([FilesystemTier(tmp_path / "fsx", "store")], show_progress=False)
    sqsh = make_sqsh(tmp_path, os.urandom(20_000))
    key = key_for("packaged")
    store.publish(key, sqsh, record_for(key, "demo:user", sqsh))
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    job = {**env, "EFABUILD_STORE": str(tmp_path / "fsx"), "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0",
           "PYXIS_RUNTIME_PATH": str(runtime), "HOME": str(tmp_path)}
    got = run("efabuild-pyxis-importer", "get", "docker://efabuild://demo:user", cwd=tmp_path, env=job)
    assert (got.returncode, got.stdout) == (0, f"{store.lookup('demo:user')}\n"), got.stderr
    released = run("efabuild-pyxis-importer", "release", cwd=tmp_path, env=job)
    assert (released.returncode, released.stdout) == (0, "")


def test_the_wheel_holds_no_fixture_builder_and_no_checkout_paths(installed, tmp_path):
    bin_dir, env = installed
    [wheel] = (bin_dir.parents[1] / "dist").glob("efabuild-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    # the demo's stand-in base images are built from a checkout's fixtures/, never by an installed efabuild
    assert not any("fixture" in n for n in names), [n for n in names if "fixture" in n]
    assert not any("__pycache__" in n or n.startswith(("tests/", "scripts/")) for n in names)
    found = run(bin_dir / "python", "-c", "import fixtures.builder", cwd=tmp_path, env=env)
    assert found.returncode != 0 and "No module named 'fixtures'" in found.stderr
