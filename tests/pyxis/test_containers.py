"""`efabuild prune-containers`: the containers Pyxis kept for a name's earlier artifacts go, the
current one, other names' and running ones stay.

Enroot is a stand-in here (a script on PATH answering `enroot list --fancy` from a file and logging
each `enroot remove`): the test machine need not have Enroot. tests/scenarios/test_slurm_pyxis.py
runs the real one where it is installed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from efabuild.pyxis.containers import Container, container_name, parse_list, stale
from tests.kits.inprocess import run_efabuild

OLD, NEW = "a" * 64, "b" * 64

LISTING = f"""NAME                       PID    COMM  STATE  STARTED  TIME   MNTNS       USERNS      COMMAND
pyxis_train-{OLD[:12]}
pyxis_train-{"c" * 12}   4242   bash  S+     10:00    00:10  4026532001  4026532002  bash
                           4243   sleep S      10:00    00:10  4026532001  4026532002  sleep 9
pyxis_train-{NEW[:12]}
pyxis_train
pyxis_trainer-{OLD[:12]}
pyxis_17_train-{OLD[:12]}
pyxis_train-{OLD[:12]}x
"""


def test_the_job_scripts_name_is_the_base_and_twelve_hex_of_the_key():
    assert container_name("train", NEW) == "train-" + NEW[:12]


def test_only_a_names_other_keys_are_stale_and_a_running_one_is_marked():
    listed = parse_list(LISTING)
    assert Container(f"pyxis_train-{'c' * 12}", True) in listed
    assert len(listed) == 7  # the second process line of a container is not a container
    assert [c.name for c in stale(listed, "train", NEW)] == [f"pyxis_train-{OLD[:12]}", f"pyxis_train-{'c' * 12}"]
    # job scope: pyxis_<jobid>_NAME (Pyxis's epilog removes those at the job's end anyway)
    assert [c.name for c in stale(listed, "train", NEW, jobid="17")] == [f"pyxis_17_train-{OLD[:12]}"]


def fake_enroot(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "listing").write_text(LISTING)
    script = bin_dir / "enroot"
    script.write_text(f"""#!/bin/sh
echo "$*" >> {tmp_path}/calls
case "$1" in
  list) cat {tmp_path}/listing ;;
  remove) exit 0 ;;
  *) exit 1 ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_prune_removes_the_stopped_old_containers_and_leaves_the_running_one(tmp_path):
    env = fake_enroot(tmp_path)
    result = run_efabuild(["prune-containers", "train", "--keep", NEW.upper()], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"removed pyxis_train-{OLD[:12]}\n"
    assert result.stderr == f"efabuild: pyxis_train-{'c' * 12} is running: left in place\n"
    assert (tmp_path / "calls").read_text().splitlines() == ["list --fancy", f"remove --force -- pyxis_train-{OLD[:12]}"]


def test_dry_run_removes_nothing(tmp_path):
    env = fake_enroot(tmp_path)
    result = run_efabuild(["prune-containers", "train", "--keep", NEW, "--dry-run"], env=env, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == f"would remove pyxis_train-{OLD[:12]}\n"
    assert (tmp_path / "calls").read_text().splitlines() == ["list --fancy"]


def test_bad_names_and_keys_never_reach_enroot(tmp_path):
    env = fake_enroot(tmp_path)
    for args, problem in [(["--keep", NEW, "--", "-rf"], "container name '-rf'"),
                          (["a/b", "--keep", NEW], "container name 'a/b'"),
                          (["train", "--keep", "--force"], "key '--force'"),
                          (["train", "--keep", "xyz"], "key 'xyz'")]:
        result = run_efabuild(["prune-containers", *args], env=env, cwd=tmp_path)
        assert result.returncode == 2, args
        assert problem in result.stderr or "expected one argument" in result.stderr, result.stderr
    assert not (tmp_path / "calls").exists()


def test_no_enroot_is_one_line(tmp_path):
    result = run_efabuild(["prune-containers", "train", "--keep", NEW], cwd=tmp_path,
                          env={**os.environ, "PATH": str(tmp_path)})
    assert result.returncode == 1
    assert result.stderr == "efabuild: enroot is not on PATH: run this on a node with Enroot\n"
