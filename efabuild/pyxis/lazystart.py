"""The importer's lazy start (`lazy = true` in its config): an artifact that no filesystem tier
holds is served to the job step from its chunks by `efabuild mount`, instead of downloaded whole
before the step starts.

`get` mounts it at `PYXIS_RUNTIME_PATH/UID/JOB.STEP.lazy` in a process of its own and hands Pyxis
the mounted `.sqsh`; `release` unmounts it lazily (`fusermount3 -u -z`): Pyxis calls it once the
container is created, while squashfuse (`use_squashfuse=1`) may still read the file, and the mount
serves until the last reader closes it, then ends. Only an index the artifact's record names is
used (`--bound-only`), and with `require_signature` only one the signed statement names too: every
chunk is then checked against an id the publisher vouched for before a byte of it reaches the job.
Where a lazy start is not possible (no S3 tier, an index nobody vouched for, no FUSE on the node),
`get` says why in one line on stderr and the importer fetches the file whole, as without `lazy`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from efabuild.errors import EfabuildError
from efabuild.host.mounts import is_mounted
from efabuild.lazy.mount import Unbound, start_in_background
from efabuild.settings import StoreConfig
from efabuild.store.config import locate
from efabuild.store.tiered import Store
from efabuild.store.lookup import find_local
from efabuild.store.platformindex import Wanted

DEFAULT_CACHE_PARENT = "/var/tmp"  # node-local on every distribution; the cache is <it>/efabuild-chunks-<uid>
DEFAULT_CACHE_GIB = 20.0  # the node cache's bound per user (`lazy_cache_gib`)
START_TIMEOUT = 60  # seconds for the mount to serve the file (an S3 round trip for the index and record)


def cache_dir(config: Mapping) -> Path:
    """This user's node cache: `<lazy_cache>/efabuild-chunks-<uid>` (the mount refuses one that is
    not this user's own 0700 directory, so a planted one costs a fallback, never a wrong byte)."""
    return Path(config.get("lazy_cache") or DEFAULT_CACHE_PARENT) / f"efabuild-chunks-{os.getuid()}"


def start(ref: str, store: str | None, config: Mapping, mountpoint: Path, environ: Mapping[str, str]) -> Path | None:
    """The lazily served `.sqsh` of `ref` for this step, or None when the whole file is the way:
    the store has no S3 tier, or a filesystem tier holds it intact (a stat away). EfabuildError with
    the reason when a lazy start is not possible: the caller says it and fetches the file whole."""
    table = locate(store)
    if table.s3 is None:
        return None
    wanted = Wanted.of(ref, None, environ)
    if find_local(table, wanted.ref, wanted=wanted) is not None:
        return None
    if shutil.which("fusermount3", path=environ.get("PATH")) is None or not os.path.exists("/dev/fuse"):
        raise EfabuildError("no FUSE on this node (/dev/fuse and fusermount3 are needed)")
    _names_its_index(table, wanted)  # an older artifact costs no mount process to learn it
    release(mountpoint)  # a get retried within one step starts afresh
    try:
        mountpoint.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        mountpoint.mkdir(mode=0o700)
    except OSError as exc:
        raise EfabuildError(f"{mountpoint}: {exc.strerror or exc}") from None
    argv = ["--cache", str(cache_dir(config)), "--cache-size", str(config.get("lazy_cache_gib", DEFAULT_CACHE_GIB)),
            "--bound-only"]
    argv += ["--store", store] if store else []
    argv += ["--require-signature"] if config.get("require_signature") else []
    argv += ["--", ref, str(mountpoint)]  # after "--": an image string is never an option
    try:
        return start_in_background(argv, mountpoint, log_path(mountpoint), timeout=START_TIMEOUT,
                                   env=dict(environ))
    except EfabuildError:
        release(mountpoint)
        raise


def _names_its_index(table: StoreConfig, wanted: Wanted) -> None:
    """Unbound unless the artifact's record names its chunk index (what `--bound-only` requires)."""
    store = Store.from_config(table)
    key = store.resolve(wanted.ref, platform=wanted.platform)
    record = store.record(key)
    if record is not None and record.chunks is None:
        raise Unbound(f"the record of {key[:12]} names no chunk index (published before lazy mounts could "
                      "trust one)")


def log_path(mountpoint: Path) -> Path:
    return mountpoint.with_name(mountpoint.name + ".log")


def release(mountpoint: Path) -> None:
    """Unmount this step's lazy mount, if any, once nothing holds it (a dead one too: its process
    killed, every stat of it failing), and remove its directory and log; idempotent."""
    try:
        if is_mounted(mountpoint):
            done = subprocess.run(["fusermount3", "-u", "-z", "--", str(mountpoint)], capture_output=True,
                                  text=True, stdin=subprocess.DEVNULL, timeout=30)
            if done.returncode != 0:
                raise EfabuildError(f"{mountpoint}: not unmounted: {(done.stderr or '').strip()[:200]}")
    except (OSError, subprocess.SubprocessError) as exc:
        raise EfabuildError(f"{mountpoint}: not unmounted: {exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            log_path(mountpoint).unlink()
    try:
        mountpoint.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise EfabuildError(f"{mountpoint}: not removed: {exc.strerror}") from None
