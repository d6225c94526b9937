"""scripts/example-job.sbatch's lookup line, run by bash as Slurm runs it: a damaged artifact
stops the job there with one line, before any srun."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from efabuild.store.core import Store
from efabuild.store.fs import FilesystemTier
from tests.storekit import REPO, key_for, make_sqsh, record_for

SCRIPT = REPO / "scripts" / "example-job.sbatch"


def _lookup_line() -> str:
    lines = [line for line in SCRIPT.read_text().splitlines() if re.match(r"IMAGE=\$\(efabuild lookup ", line)]
    assert len(lines) == 1, "the job script finds its image with one efabuild lookup"
    return lines[0]


def _run_job_head(store: Path) -> subprocess.CompletedProcess[str]:
    # `efabuild` as this checkout's CLI; the rest is the script's own line under its own `set -euo pipefail`
    script = (f'set -euo pipefail\nefabuild() {{ "{sys.executable}" -m efabuild "$@"; }}\n'
              f'STORE=${{EFABUILD_STORE:-/fsx/efabuild}}\n{_lookup_line()}\necho "image: $IMAGE"\n')
    env = {**os.environ, "EFABUILD_STORE": str(store), "PYTHONPATH": str(REPO)}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=store.parent,
                          timeout=60)


def test_a_damaged_artifact_fails_the_job_at_its_lookup(tmp_path: Path) -> None:
    store_dir = tmp_path / "fsx"
    key = key_for("ngc-efa:user")
    sqsh = make_sqsh(tmp_path, os.urandom(50_000))
    Store([FilesystemTier(store_dir, "shared")], show_progress=False).publish(
        key, sqsh, record_for(key, "ngc-efa:user", sqsh))

    ok = _run_job_head(store_dir)
    path = store_dir / "objects" / key[:2] / f"{key}.sqsh"
    assert ok.returncode == 0 and ok.stdout == f"image: {path}\n", ok.stderr

    os.chmod(path, 0o644)
    with open(path, "r+b") as handle:  # bit rot on the shared filesystem
        handle.seek(8192)
        handle.write(b"\0rot")
    damaged = _run_job_head(store_dir)
    assert damaged.returncode == 1 and "image:" not in damaged.stdout
    assert damaged.stderr.count("\n") == 1 and "corrupt artifact" in damaged.stderr

