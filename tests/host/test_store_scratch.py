"""Scratch directories in the system temp dir: named by their owner, swept once it is gone."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from efabuild.host import scratch
from efabuild.host.owner import Owner
from tests.kits.storekit import efabuild


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)


def test_a_dead_processes_scratch_directory_is_found_and_a_live_ones_is_not(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the system temp dir, for this test
    me = Owner.current()
    dead = tmp_path / f"efabuild-{me.host}.{_dead_pid()}.{me.start}-0badc0de-build-x1y2z3"
    (dead / "iid").parent.mkdir()
    (dead / "iid").write_text("sha256:...")
    reused = tmp_path / f"efabuild-{me.host}.{me.pid}.{me.start + 1}-0badc0de-build-a1b2c3"
    reused.mkdir()  # this pid, another start time: an earlier process that had the pid
    other_host = tmp_path / f"efabuild-elsewhere.{_dead_pid()}.1-0badc0de-build-q"
    other_host.mkdir()
    not_ours = tmp_path / "efabuild-build-abc123"  # the unnamed kind: nobody to ask
    not_ours.mkdir()
    with scratch.scratch_dir("build") as live:
        assert Path(live).parent == tmp_path and Path(live).name.startswith(f"efabuild-{me.token}-")
        assert scratch.dead_scratch_dirs() == sorted([dead, reused])
        out = efabuild("gc", "--yes", "--store", str(tmp_path / "store"), check=True).stdout
        assert f"removed leftover  host  {dead}" in out and f"removed leftover  host  {reused}" in out
        assert Path(live).is_dir()
    assert not dead.exists() and not reused.exists()
    assert other_host.is_dir() and not_ours.is_dir()


def test_a_tmpdir_that_is_no_writable_directory_is_one_line_before_any_build(tmp_path):
    """docker buildx and mksquashfs write into $TMPDIR: a make names a bad one once and builds
    nothing (this test has no engine: without the check, the make would stop on that instead)."""
    from tests.kits.wsfactory import make_workspace

    root = make_workspace(tmp_path / "ws")
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o555)
    cases = {tmp_path / "missing": "no such file or directory", not_a_dir: "not a directory",
             tmp_path / "bad\nname": "no such file or directory"}
    if os.geteuid() != 0:  # root may write anywhere
        cases[read_only] = "permission denied (not writable)"
    for path, problem in cases.items():
        for args in (["make"], ["make", "--check", "stack:efa"]):
            result = efabuild("-C", str(root), *args, env={"TMPDIR": str(path)})
            assert result.returncode == 2, result.stderr
            shown = str(path).replace("\n", "\\n")
            assert result.stderr.splitlines() == [f"efabuild: TMPDIR: {shown}: {problem}"]
            assert not (root / "cache" / "logs").exists()
    assert efabuild("-C", str(root), "make", "--dry-run", env={"TMPDIR": str(tmp_path / "missing")}).returncode == 0


def test_a_make_leaves_nothing_of_buildx_in_tmpdir(tmp_path, busybox_image):
    """buildx copies the Dockerfile it reads from stdin (`--file -`) into $TMPDIR/dockerfileNNN and
    never removes it: one directory per build, for ever, in a shared /tmp."""
    import uuid

    from tests.kits.storekit import efabuild_process

    root = tmp_path / "ws"
    (root / "graphs").mkdir(parents=True)
    (root / "BUILD.toml").write_text('[workspace]\ngraphs = ["graphs/*.toml"]\n')
    (root / "graphs" / "g.toml").write_text(
        f'[layers.one]\nbase = "{busybox_image}"\ndockerfile = "RUN echo {uuid.uuid4().hex} > /run-id"\n'
        'artifact = true\nignore = [{ rule = "EFA010", reason = "a local test image" }]\n')
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    made = efabuild_process("-C", str(root), "make", "--no-lint", env={"TMPDIR": str(tmp)})
    assert made.returncode == 0, made.stderr
    assert "built" in made.stdout + made.stderr
    assert sorted(os.listdir(tmp)) == []
