"""`efabuild mount REF DIR`: serve an artifact's .sqsh from its chunks through FUSE."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

from efabuild.errors import EfabuildError, InputError
from efabuild.lazy.mount import PREFETCH_ALL, PREFETCH_NONE, PREFETCH_START, serve, start_in_background
from efabuild.signing.trust import policy_for
from efabuild.store.config import locate


def configure(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        name, parents=[common],
        description="""
            Mount REF (a key, a key prefix or graph:layer, as lookup resolves it) at DIR as one
            read-only file, DIR/<key>.sqsh, whose reads are served chunk by chunk: the node cache,
            then a filesystem tier's copy, then S3, each chunk checked against its id before any of
            it is served (a chunk no source gives is an I/O error and one line on stderr). In the
            background the chunks of the start list the shared tier keeps for the artifact (what
            the first start read first) are fetched ahead, 8 at a time, then every chunk, so the
            node ends with a full copy in its cache, and the whole file is then checked against
            the record's digest; a mount that finds no start list leaves what its start read as one. Runs until unmounted
            (`efabuild mount --unmount DIR`, or `fusermount3 -u DIR`); --background returns once
            the file is there.""",
        epilog="""
            examples:
              efabuild mount --background demo:user /tmp/demo-user
              squashfuse /tmp/demo-user/*.sqsh /mnt/rootfs
              efabuild mount --unmount /tmp/demo-user""",
    )
    p.add_argument("ref", metavar="REF", nargs="?", help="the artifact (omit with --unmount)")
    p.add_argument("dir", metavar="DIR", help="an empty directory to mount at")
    p.add_argument("--store", metavar="PATH", help="a store directory (default: $EFABUILD_STORE, else the workspace's)")
    p.add_argument("--platform", metavar="OS/ARCH", help="the platform of a name's artifact (default: this node's)")
    p.add_argument("--cache", metavar="DIR",
                   help="the node's chunk cache (default: $XDG_CACHE_HOME/efabuild/chunks; root's "
                        "/var/cache/efabuild/chunks); this user's, mode 0700")
    p.add_argument("--cache-size", metavar="GiB", type=float, default=20.0,
                   help="bytes the cache keeps, least recently used first out (default 20)")
    p.add_argument("--prefetch", choices=(PREFETCH_ALL, PREFETCH_START, PREFETCH_NONE), default=PREFETCH_ALL,
                   help="what to read ahead: the start list the shared tier keeps for the artifact, then every "
                        "chunk and the whole-file check (all, the default); the start list only (start); nothing")
    p.add_argument("--no-prefetch", action="store_const", dest="prefetch", const=PREFETCH_NONE,
                   help="--prefetch none: read only what is asked for; no whole-file check")
    p.add_argument("--bound-only", action="store_true",
                   help="refuse a chunk index the artifact's record does not name (records made before "
                        "lazy mounts name none): what a job start uses")
    p.add_argument("--require-signature", action="store_true",
                   help="serve only an artifact whose statement, signed by a key of the trust policy, "
                        "names its chunk index")
    p.add_argument("--background", action="store_true", help="return once the file is served")
    p.add_argument("--unmount", action="store_true", help="unmount DIR (fusermount3 -u)")
    p.set_defaults(run=run)


def default_cache() -> Path:
    if os.geteuid() == 0:
        return Path("/var/cache/efabuild/chunks")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "efabuild" / "chunks"


def run(args: argparse.Namespace) -> int:
    mountpoint = Path(args.dir).absolute()
    if args.unmount:
        done = subprocess.run(["fusermount3", "-u", "--", str(mountpoint)], capture_output=True, text=True)
        if done.returncode != 0:
            raise EfabuildError(f"{mountpoint}: not unmounted: {(done.stderr or '').strip()[:200]}")
        return 0
    if not args.ref:
        raise InputError("give REF and DIR (or --unmount DIR)", "mount")
    if not mountpoint.is_dir() or os.path.ismount(mountpoint):
        raise InputError(f"{mountpoint}: not a directory, or something is mounted there already", "mount")
    if not 0 < args.cache_size <= 1 << 20:
        raise InputError(f"--cache-size {args.cache_size:g}: give GiB above 0", "mount")
    cache = Path(args.cache).absolute() if args.cache else default_cache()
    if args.background:
        return _background(args, mountpoint, cache)

    table = locate(args.store)
    policy = policy_for(table) if args.require_signature else None  # no policy: one line, before mounting
    serve(table, args.ref, mountpoint, cache_dir=cache, cache_bytes=int(args.cache_size * (1 << 30)),
          platform=args.platform, prefetch=args.prefetch, bound_only=args.bound_only, policy=policy)
    return 0


def _background(args: argparse.Namespace, mountpoint: Path, cache: Path) -> int:
    """The mount in a process of its own; this one returns when the file is served, or with the
    child's last line when it stopped first."""
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    argv = ["--cache", str(cache), "--cache-size", str(args.cache_size)]
    argv += ["--store", args.store] if args.store else []
    argv += ["--platform", args.platform] if args.platform else []
    argv += ["--prefetch", args.prefetch]
    argv += ["--bound-only"] if args.bound_only else []
    argv += ["--require-signature"] if args.require_signature else []
    argv += ["--", args.ref, str(mountpoint)]  # after "--": a REF is never taken for an option
    print(start_in_background(argv, mountpoint, cache / f"mount-{os.getpid()}.log"))
    return 0
