"""A Pyxis importer: `--container-image=efabuild://REF` runs the stored .sqsh of REF.

Pyxis (plugstack.conf `importer=`) calls `IMPORTER get IMAGE_URI` and reads the absolute path of a
.sqsh from stdout; diagnostics go to stderr and a non-zero exit fails the job step. It prepends
`docker://` to images that lack a scheme, so `efabuild://REF` arrives as `docker://efabuild://REF`.
`IMPORTER release` (no argument, called twice per step) cleans up, idempotently.

Once `importer=` is set, Pyxis sends every image through it, not only efabuild's: any other URI
is imported with `enroot import` into PYXIS_RUNTIME_PATH, as Pyxis itself would, and removed
again on release. efabuild artifacts are handed out in place, from the store.

The store is `$EFABUILD_STORE`, else `store = "..."` in the importer's config file
(`$EFABUILD_PYXIS_CONFIG`, default /etc/efabuild/pyxis.toml), else the workspace around the
job's working directory. The config may also say `verify = true` to re-hash before every start (a
copy this user verified before, unchanged since, costs a few stats: signing/verifycache.py), and
`require_signature = true` to start only artifacts signed by a key of the node's trust policy
(/etc/efabuild/trust.toml; a cached verification costs a few stats).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from efabuild.configfile import load_toml
from efabuild.host import children
from efabuild.host.mounts import is_mounted
from efabuild.errors import EfabuildError, InputError
from efabuild.store.config import STORE_ENV

SCHEME = "efabuild://"
PYXIS_PREFIXES = ("docker://",)
CONFIG_ENV = "EFABUILD_PYXIS_CONFIG"
DEFAULT_CONFIG = Path("/etc/efabuild/pyxis.toml")
CONFIG_KEYS = ("store", "verify", "require_signature", "lazy", "lazy_cache", "lazy_cache_gib")
CONFIG_MAX_BYTES = 64 * 1024
# Slurm's job and step ids are 32-bit unsigned numbers; its special steps also go by these names
ID_PATTERN = re.compile(r"[0-9]{1,10}")
STEP_NAMES = ("batch", "extern", "interactive")
LAZY_SUFFIX = ".lazy"  # RUNTIME/UID/JOB.STEP.lazy: where a lazy start is mounted (pyxis/lazystart.py)


def is_efabuild_uri(uri: str) -> bool:
    text = uri.strip()
    return text.startswith(SCHEME) or any(text.startswith(p + SCHEME) for p in PYXIS_PREFIXES)


def parse_image_uri(uri: str) -> str:
    """'docker://efabuild://ngc-efa:user' or 'efabuild://ngc-efa:user' -> 'ngc-efa:user' (a name may
    end in @os/arch: that platform's artifact)."""
    text = uri.strip()
    for prefix in PYXIS_PREFIXES:
        if text.startswith(prefix + SCHEME):
            text = text[len(prefix):]
    if not text.startswith(SCHEME):
        raise InputError(f"not an efabuild image {uri!r}: expected efabuild://REF (a key, key prefix or graph:layer)")
    ref = text[len(SCHEME):]
    if not ref:
        raise InputError(f"no REF in {uri!r}: expected efabuild://REF")
    return ref


def read_config(environ: dict[str, str] | None = None) -> dict:
    """The importer's config file as a dict ({} when there is none).

    Read bounded: a regular file of at most CONFIG_MAX_BYTES, UTF-8 TOML, not nested deeper than
    a config needs; anything else is one line naming the file.
    """
    environ = os.environ if environ is None else environ
    path = Path(environ.get(CONFIG_ENV) or DEFAULT_CONFIG)
    if not os.path.lexists(path):
        if environ.get(CONFIG_ENV):
            raise InputError("no such file", f"{CONFIG_ENV}={path}")
        return {}
    config = load_toml(path, str(path), limit=CONFIG_MAX_BYTES)
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise InputError(f"unknown key {unknown[0][:40]!r} (known: {', '.join(CONFIG_KEYS)})", str(path))
    if "store" in config and (not isinstance(config["store"], str) or not config["store"]):
        raise InputError(f"must be a store directory path, not {_short(config['store'])}", f"{path}: store")
    for name in ("verify", "require_signature", "lazy"):
        if name in config and not isinstance(config[name], bool):
            raise InputError(f"must be true or false, not {_short(config[name])}", f"{path}: {name}")
    cache = config.get("lazy_cache")
    if cache is not None and not (isinstance(cache, str) and cache.startswith("/") and "\0" not in cache):
        raise InputError(f"must be an absolute directory path, not {_short(cache)}", f"{path}: lazy_cache")
    size = config.get("lazy_cache_gib")
    if size is not None and not (isinstance(size, (int, float)) and not isinstance(size, bool) and 0 < size <= 1 << 20):
        raise InputError(f"must be a number of GiB above 0, not {_short(size)}", f"{path}: lazy_cache_gib")
    return config


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def get(uri: str, environ: dict[str, str] | None = None) -> Path:
    """The .sqsh path Pyxis should start for IMAGE_URI (fetched from S3 if only S3 has it)."""
    from efabuild.pyxis.lookup import lookup_path  # deferred: `release` looks nothing up

    environ = os.environ if environ is None else environ
    if not is_efabuild_uri(uri):
        return _enroot_import(uri, environ)
    ref = parse_image_uri(uri)
    config = read_config(environ)
    store = environ.get(STORE_ENV) or config.get("store")
    if config.get("lazy"):
        served = _lazy(ref, store, config, environ)
        if served is not None:
            return served
    # verify = true on every step start: a copy verified before and unchanged since is not read again
    path, _ = lookup_path(ref, store, fetch=True, verify=bool(config.get("verify", False)),
                          require_signature=bool(config.get("require_signature", False)), verify_cache=True,
                          environ=environ)  # $EFABUILD_PLATFORM of the job, checked by the platform grammar
    return path


def _lazy(ref: str, store: str | None, config: dict, environ: Mapping[str, str]) -> Path | None:
    """The lazily mounted .sqsh of `ref` (pyxis/lazystart.py), or None: then the file is fetched
    whole, after one line on stderr when a lazy start was tried and failed."""
    from efabuild.pyxis import lazystart  # deferred: only a lazy importer mounts

    try:
        return lazystart.start(ref, store, config, _step_path(environ, LAZY_SUFFIX), environ)
    except (EfabuildError, OSError) as exc:
        print(f"efabuild-pyxis-importer: {ref}: no lazy start ({exc}); fetching it whole", file=sys.stderr)
        return None


def release(environ: dict[str, str] | None = None) -> None:
    """Idempotent clean-up after a step: removes what `get` imported with enroot, if anything,
    and unmounts what it mounted lazily once nothing reads it."""
    environ = os.environ if environ is None else environ
    staged = _step_path(environ, required=False)
    if staged is not None:
        staged.unlink(missing_ok=True)
        mounted = _step_path(environ, LAZY_SUFFIX, required=False)
        # a dead FUSE mount fails every stat (ENOTCONN): the mount table and its log tell
        if mounted is not None and (os.path.lexists(mounted) or os.path.lexists(f"{mounted}.log")
                                    or is_mounted(mounted)):
            from efabuild.pyxis import lazystart

            lazystart.release(mounted)


def _step_path(environ: Mapping[str, str], suffix: str = ".squashfs", required: bool = True) -> Path | None:
    """Where a non-efabuild image of this job step is imported (Pyxis' own convention:
    RUNTIME/UID/JOB.STEP.squashfs), or with `suffix` ".lazy" where a lazy start is mounted, after
    checking every part; None for `release` outside a step.

    The variables come from the job's environment, which its user controls: each must be what
    Slurm and Pyxis set (digits, or a step name), and the result must stay inside the runtime
    directory, or `release` would delete whatever file a crafted value points at.
    """
    names = ("PYXIS_RUNTIME_PATH", "SLURM_JOB_ID", "SLURM_STEP_ID")
    missing = [name for name in names if not environ.get(name)]
    if missing:
        if required:
            raise EfabuildError(f"cannot import a non-efabuild image outside a Pyxis job step: {', '.join(missing)} unset")
        return None
    runtime_text = environ["PYXIS_RUNTIME_PATH"]
    if "\0" in runtime_text or not runtime_text.startswith("/") or ".." in runtime_text.split("/"):
        raise InputError(f"must be an absolute path without '..', not {_short(runtime_text)}", "PYXIS_RUNTIME_PATH")
    runtime = Path(os.path.realpath(runtime_text))
    if not runtime.is_dir():
        raise InputError(f"{runtime_text}: not a directory", "PYXIS_RUNTIME_PATH")
    own_uid = str(os.getuid())
    uid = environ.get("SLURM_JOB_UID") or own_uid
    _check_id(uid, "SLURM_JOB_UID", ())
    if own_uid != "0" and uid != own_uid:  # Pyxis runs the importer as the job's user
        raise InputError(f"must be the importer's own uid {own_uid}, not {_short(uid)}", "SLURM_JOB_UID")
    _check_id(environ["SLURM_JOB_ID"], "SLURM_JOB_ID", ())
    _check_id(environ["SLURM_STEP_ID"], "SLURM_STEP_ID", STEP_NAMES)
    staged = runtime / uid / f"{environ['SLURM_JOB_ID']}.{environ['SLURM_STEP_ID']}{suffix}"
    # the user's directory is theirs: a link in it must not lead the path out of the runtime directory
    if not Path(os.path.realpath(staged)).is_relative_to(runtime):
        raise InputError(f"{staged} resolves outside {runtime}: refusing to touch it", "PYXIS_RUNTIME_PATH")
    return staged


def _check_id(value: str, name: str, names: tuple[str, ...]) -> None:
    if not (ID_PATTERN.fullmatch(value) or value in names):
        allowed = "digits" + (f" or one of {', '.join(names)}" if names else "")
        raise InputError(f"must be {allowed}, not {_short(value)}", name)


def _enroot_import(uri: str, environ) -> Path:
    staged = _step_path(environ)
    staged.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    staged.unlink(missing_ok=True)  # enroot refuses to overwrite; a retried step starts afresh
    try:
        # enroot's progress goes to stderr: stdout carries only the path Pyxis reads
        done = children.run(["enroot", "import", "--output", str(staged), uri], stdout=sys.stderr,
                              env=dict(environ))
    except FileNotFoundError:
        raise EfabuildError(f"{uri}: not an efabuild:// image, and enroot is not on PATH to import it") from None
    if done.returncode != 0:
        raise EfabuildError(f"enroot import {uri} failed (exit status {done.returncode})")
    return staged
