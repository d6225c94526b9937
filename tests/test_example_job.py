"""scripts/example-job.sbatch's lookup line, run by bash as Slurm runs it on a compute node: an
artifact that is damaged or unsigned stops the job there with one line, before any srun."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from efabuild.signing.keys import PemSigner
from tests.signkit import make_key, object_path, stored_artifact, trust_config
from tests.storekit import REPO

SCRIPT = REPO / "scripts" / "example-job.sbatch"
NAME = "ngc-efa:user"


def _lookup_line() -> str:
    lines = [line for line in SCRIPT.read_text().splitlines() if re.match(r"IMAGE=\$\(efabuild lookup ", line)]
    assert len(lines) == 1, "the job script finds its image with one efabuild lookup"
    return lines[0]


def _run_job_head(store: Path, node: Path) -> subprocess.CompletedProcess[str]:
    # `efabuild` as this checkout's CLI; the rest is the script's own line under its own `set -euo pipefail`
    script = (f'set -euo pipefail\nefabuild() {{ "{sys.executable}" -m efabuild "$@"; }}\n'
              f'STORE=${{EFABUILD_STORE:-/fsx/efabuild}}\n{_lookup_line()}\necho "image: $IMAGE"\n')
    env = {**os.environ, "EFABUILD_STORE": str(store), "PYTHONPATH": str(REPO),
           "EFABUILD_TRUST_CONFIG": str(node / "trust.toml"), "EFABUILD_VERIFY_CACHE": str(node / "verified")}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=node, timeout=60)


def test_a_damaged_or_unsigned_artifact_fails_the_job_at_its_lookup(tmp_path: Path) -> None:
    private, public = make_key(tmp_path / "keys", "ec")
    node = tmp_path / "node"
    node.mkdir()
    trust_config(node / "trust.toml", public)
    store, key = stored_artifact(tmp_path / "signed", PemSigner(private), name=NAME)

    ok = _run_job_head(store, node)
    assert ok.returncode == 0 and ok.stdout == f"image: {object_path(store, key, '.sqsh')}\n", ok.stderr

    sqsh = object_path(store, key, ".sqsh")
    os.chmod(sqsh, 0o644)
    with open(sqsh, "r+b") as handle:  # bit rot on the shared filesystem
        handle.seek(8192)
        handle.write(b"\0rot")
    damaged = _run_job_head(store, node)
    assert damaged.returncode == 1 and "image:" not in damaged.stdout
    assert damaged.stderr.count("\n") == 1

    unsigned_store, _ = stored_artifact(tmp_path / "unsigned", None, name=NAME)
    unsigned = _run_job_head(unsigned_store, node)
    assert unsigned.returncode == 1 and "image:" not in unsigned.stdout and unsigned.stderr.count("\n") == 1
