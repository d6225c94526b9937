"""scripts/example-job.sbatch's lookup line, run by bash as Slurm runs it on a compute node: an
artifact that is damaged or unsigned stops the job there with one line, before any srun."""

from __future__ import annotations

import pytest

import os
import re
import subprocess
import sys
from pathlib import Path

from efabuild.signing.keys import PemSigner
from tests.kits.signkit import make_key, object_path, stored_artifact, trust_config
from tests.kits.storekit import REPO, cache_dir

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
           "EFABUILD_TRUST_CONFIG": str(node / "trust.toml"), "EFABUILD_VERIFY_CACHE": str(cache_dir(node / "verified"))}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=node, timeout=60)


@pytest.mark.slow
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


def _sruns(start: str | None, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    """The whole script under bash with `efabuild` and `srun` as stubs: its exit and each srun's words."""
    calls = tmp_path / "sruns"
    calls.unlink(missing_ok=True)
    stubs = (f'efabuild() {{ echo /fsx/efabuild/objects/ab/abc.sqsh; }}\n'
             f'srun() {{ printf "%s\\0" "$@" >> "{calls}"; printf "\\n" >> "{calls}"; }}\n'
             'export -f efabuild srun\n')
    env = {"PATH": os.environ["PATH"], **({"START": start} if start is not None else {})}
    done = subprocess.run(["bash", "-c", stubs + f'exec bash "{SCRIPT}"'], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    words = [line.split("\0")[:-1] for line in calls.read_text().split("\n")[:-1]] if calls.exists() else []
    return done, words


def test_both_start_modes_run_as_described(tmp_path: Path) -> None:
    """unpack (the default): the first srun creates the named container, later ones reuse the name.
    mount: every srun is unnamed and unsaved, as Pyxis's use_squashfuse=1 needs to start it from the .sqsh."""
    image = "--container-image=/fsx/efabuild/objects/ab/abc.sqsh"
    for start in (None, "unpack"):
        done, sruns = _sruns(start, tmp_path)
        assert done.returncode == 0, done.stderr
        assert [[w for w in s if w.startswith("--container-image") or w.startswith("--container-name")]
                for s in sruns] == [[image, "--container-name=train"], ["--container-name=train"]]
    done, sruns = _sruns("mount", tmp_path)
    assert done.returncode == 0 and len(sruns) == 2, done.stderr
    assert all(image in s and not any(w.startswith(("--container-name", "--container-save")) for w in s)
               for s in sruns)
    assert sruns[-1][-2:] == ["python", "/fsx/train/train.py"]
    done, sruns = _sruns("squash", tmp_path)
    assert (done.returncode, sruns) == (2, []) and done.stderr == "START must be unpack or mount, not 'squash'\n"
