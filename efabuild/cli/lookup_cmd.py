"""`efabuild lookup REF`: print the path of an artifact's .sqsh (fast on a local hit)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from efabuild.cli.output import print_json
from efabuild.errors import InputError, NotFound
from efabuild.platforms import MissingPlatform
from efabuild.pyxis.lookup import lookup_path


def configure(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        name, parents=[common],
        description="""
            Print the absolute path of the .sqsh of REF on the shared or local tier, fetching it
            from S3 when only S3 has it. Exit 1 with one line when REF is absent, an ambiguous
            prefix, or a layer that is not an artifact layer. A name built for several platforms
            gives the artifact of the platform NAME@os/arch or --platform names, else
            $EFABUILD_PLATFORM's, else this node's (uname -m: x86_64 is linux/amd64, aarch64
            linux/arm64); a platform it lacks is one line naming those it has, exit 1.""",
        epilog="""
            examples:
              efabuild lookup demo:user
              efabuild lookup demo:user@linux/arm64
              efabuild lookup --store /fsx/efabuild --verify 0123abcd
              KEY=$(efabuild lookup --key --require-signature ngc-efa:user)
              srun --container-image="$(efabuild lookup --require-signature ngc-efa:user)" ...""",
    )
    p.add_argument("ref", metavar="REF",
                   help="a key, a unique key prefix (≥ 8 hex), graph:layer or graph:layer@os/arch")
    p.add_argument("--platform", metavar="OS/ARCH",
                   help="the platform of a name's artifact (default: $EFABUILD_PLATFORM, else this node's)")
    p.add_argument("--store", metavar="PATH",
                   help="a store directory (default: $EFABUILD_STORE, else the workspace's [store])")
    p.add_argument("--no-fetch", action="store_true", help="only look on the filesystem tiers; never fetch from S3")
    p.add_argument("--verify", action="store_true",
                   help="re-hash the .sqsh and compare it with its record; with an S3 tier also check that S3 "
                        "holds its chunk index and every chunk (a look at each)")
    p.add_argument("--deep", action="store_true",
                   help="with --verify: also read every S3 chunk and check it against its id")
    p.add_argument("--require-signature", action="store_true",
                   help="refuse an artifact not signed by a key of the trust policy ([trust] in BUILD.toml, "
                        "else /etc/efabuild/trust.toml); a cached verification costs a few stats")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print path, key, name, platform, size, digest, created as JSON")
    out.add_argument("--key", action="store_true",
                     help="print the artifact's full key instead of its path, after the same checks: a job resolves a "
                          "name once, then looks up and names its container by that key (a later make cannot "
                          "change what the job runs)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.deep and not args.verify:
            raise InputError("--deep goes with --verify")
        path, record = lookup_path(args.ref, args.store, fetch=not args.no_fetch, verify=args.verify,
                                   require_signature=args.require_signature, check_s3=args.verify,
                                   deep=args.deep, platform=args.platform)
    except MissingPlatform:
        raise  # the name is there, on other platforms: its line says which
    except NotFound as exc:
        # only on a miss: is REF a layer that is never exported, or a typo? (reads the workspace's graphs)
        reason = _why_missing(args.ref.partition("@")[0], str(exc))
        if reason is None:
            raise
        raise NotFound(reason) from None
    if args.json:
        fields = ("key", "name", "platform", "size", "digest", "created")
        print_json("lookup", {"path": str(path), **{name: record.get(name) for name in fields}})
    elif args.key:
        sys.stdout.write(f"{path.name[: -len('.sqsh')]}\n")  # the copy handed out is named by its key
    else:
        sys.stdout.write(f"{path}\n")
    sys.stdout.flush()
    return 0


def _why_missing(ref: str, message: str) -> str | None:
    """Why a graph:layer has no .sqsh, when the workspace tells: a layer it declares that is not an
    artifact layer, or a name it does not declare that is close to an artifact layer's (a typo)."""
    import difflib

    from efabuild.workspace import find_root, load_workspace

    if ":" not in ref:
        return None
    try:
        ws = load_workspace(find_root(Path.cwd()))
    except InputError:  # no workspace here (a compute node), or one that does not load
        return None
    layer = ws.layers.get(ref)
    if layer is None:
        hint = difflib.get_close_matches(ref, [name for name, other in ws.layers.items() if other.artifact], n=1)
        return f"{message} (did you mean '{hint[0]}'?)" if hint else None
    if layer.artifact:
        return None
    graph = ref.split(":", 1)[0]
    exported = sorted(name for name, other in ws.layers.items() if other.artifact and other.graph == graph)
    return (f"{ref} is a layer of {ws.relpath(layer.source)} but not an artifact layer, so it has no .sqsh "
            f"(artifact layers of {graph}: {', '.join(exported) or 'none'}; `artifact = true` exports one)")
