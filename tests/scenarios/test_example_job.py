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
KEY = "0123456789abcdef" * 4


def job_head() -> str:
    """The job script's lines that find what it runs: the key (one lookup of the name), the image
    (a lookup of that key) and the container's name (from the key)."""
    lines = SCRIPT.read_text().splitlines()
    found = [next((line for line in lines if re.match(rf"{var}=", line)), None) for var in ("KEY", "IMAGE", "NAME")]
    assert None not in found, "the job script sets KEY, IMAGE and NAME"
    assert found[0].startswith("KEY=$(efabuild lookup --key --require-signature ") and found[0].endswith(" ngc-efa:user)")
    assert found[1].startswith("IMAGE=$(efabuild lookup --require-signature ") and found[1].endswith(' "$KEY")')
    assert found[2] == 'NAME="train-${KEY:0:12}"'
    return "\n".join(found)


def _run_job_head(store: Path, node: Path) -> subprocess.CompletedProcess[str]:
    # `efabuild` as this checkout's CLI; the rest is the script's own line under its own `set -euo pipefail`
    script = (f'set -euo pipefail\nefabuild() {{ "{sys.executable}" -m efabuild "$@"; }}\n'
              f'STORE=${{EFABUILD_STORE:-/fsx/efabuild}}\n{job_head()}\necho "image: $IMAGE"\n')
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
    stubs = (f'efabuild() {{ if [ "$2" = --key ]; then echo {KEY}; else echo /fsx/efabuild/objects/ab/abc.sqsh; fi; }}\n'
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
    named = f"--container-name=train-{KEY[:12]}"  # by the key: a new build never starts an old container
    for start in (None, "unpack"):
        done, sruns = _sruns(start, tmp_path)
        assert done.returncode == 0, done.stderr
        assert [[w for w in s if w.startswith("--container-image") or w.startswith("--container-name")]
                for s in sruns] == [[image, named], [image, named], []]
        assert sruns[1][-2:] == ["python", "/workspace/app/train.py"]  # the image's own code trains
        assert sruns[2] == ["--ntasks-per-node=1", "efabuild", "prune-containers", "train", "--keep", KEY]
    done, sruns = _sruns("mount", tmp_path)
    assert done.returncode == 0 and len(sruns) == 2, done.stderr
    assert all(image in s and not any(w.startswith(("--container-name", "--container-save")) for w in s)
               for s in sruns)
    assert sruns[-1][-2:] == ["python", "/workspace/app/train.py"]
    done, sruns = _sruns("squash", tmp_path)
    assert (done.returncode, sruns) == (2, []) and done.stderr == "START must be unpack or mount, not 'squash'\n"


def test_the_guide_gives_the_job_scripts_own_commands() -> None:
    """docs/guides/slurm-pyxis.md and scripts/example-job.sbatch say the same: the key looked up
    once, the image by that key, the container named by it, the image's own code, the plugin's real
    file name with use_squashfuse=1 on the importer's line."""
    guide = (REPO / "docs" / "guides" / "slurm-pyxis.md").read_text()
    for line in job_head().replace('"$STORE"', "/fsx/efabuild").splitlines()[:2]:
        assert line in guide, line
    assert 'srun --container-image="$IMAGE" --container-name="train-${KEY:0:12}" python /workspace/app/train.py' in guide
    script = SCRIPT.read_text()
    assert '--container-image="$IMAGE" --container-name="$NAME"' in script and "python /workspace/app/train.py" in script
    plugin = [line for line in guide.splitlines() if line.startswith("required ")]
    assert plugin == ["required /usr/local/lib/slurm/spank_pyxis.so use_squashfuse=1 "
                      "importer=/usr/local/bin/efabuild-pyxis-importer"]
    # the plugin's file name wherever a page or the script names it, the importer's reference giving the guide's line
    reference = (REPO / "docs" / "reference" / "commands" / "pyxis-importer.md").read_text()
    for text in (guide, script, reference):
        assert "pyxis.so" not in text.replace("spank_pyxis.so", "")
    assert [line.rsplit("=", 1)[0] for line in reference.splitlines() if line.startswith("required ")] \
        == [plugin[0].rsplit("=", 1)[0]]
    assert "/usr/lib/<triplet>/slurm/spank_pyxis.so" in guide  # Debian's and Ubuntu's package
    assert "efabuild prune-containers train --keep" in guide and "prune-containers train --keep" in script
