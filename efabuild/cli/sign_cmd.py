"""`efabuild sign`, `efabuild trust`: another signature on stored statements; the trusted keys."""

from __future__ import annotations

import argparse
from pathlib import Path

from efabuild.cli.common import write_file
from efabuild.cli.verify_cmd import STORE_HELP
from efabuild.errors import InputError
from efabuild.grammar import endpoint_url_problem
from efabuild.refs import short
from efabuild.signing.attest import sign_stored
from efabuild.signing.keys import keyid_of, load_public_key, signer_for
from efabuild.signing.trust import node_config_text, resolve_workspace_keys
from efabuild.store.config import find_build_toml, load_build_store
from efabuild.store.tiered import Store
from efabuild.workspace import load_workspace


def configure(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    if name == "sign":
        p = sub.add_parser(
            name, parents=[common],
            description="""
                Signs the stored in-toto statement of each REF, unchanged, with another key
                and stores the envelope (one line, all signatures) on every tier holding the
                artifact. An artifact exported before signing was configured gets its
                statement made from its manifest.""",
            epilog="""
                examples:
                  efabuild sign demo:user --key ops.pem
                  efabuild sign 0123abcd --key arn:aws:kms:us-east-1:123456789012:key/…""",
        )
        p.add_argument("refs", nargs="+", metavar="REF", help="a key, a unique key prefix (≥ 8 hex) or graph:layer")
        p.add_argument("--key", metavar="PEM|ARN",
                       help="a PEM private key file or a KMS key ARN (default: [sign] key in BUILD.toml)")
        p.add_argument("--endpoint-url", metavar="URL", help="a KMS-compatible endpoint (KMS keys only)")
        p.set_defaults(run=run_sign)
    else:
        p = sub.add_parser(
            name, parents=[common],
            description="""
                Reads [trust] keys of BUILD.toml, asks KMS once for the public key of every
                KMS key ARN and keeps it under the local store's state/trust/ (lookups never
                ask KMS), then lists the trusted keys. --write PATH writes them, PEM inline,
                as a node config (/etc/efabuild/trust.toml on compute nodes).""",
            epilog="""
                examples:
                  efabuild trust                                   # the trusted keys
                  efabuild trust --write /etc/efabuild/trust.toml  # a compute node's policy""",
        )
        p.add_argument("--write", metavar="PATH", help="write the policy as a node config to PATH")
        p.set_defaults(run=run_trust)
    p.add_argument("--store", metavar="PATH", help=STORE_HELP)


# ---- sign


def run_sign(args: argparse.Namespace) -> int:
    key, region, endpoint_url, root = args.key, None, args.endpoint_url, Path.cwd()
    problem = endpoint_url is not None and endpoint_url_problem(endpoint_url)
    if problem:
        raise InputError(problem, "--endpoint-url")
    if key is None:
        build_toml = find_build_toml(Path.cwd())
        if build_toml is None:
            raise InputError("no key: give --key PEM|ARN (no BUILD.toml with [sign] here)")
        sign = load_workspace(build_toml.parent).settings.sign
        if sign is None:
            raise InputError(f"no key: give --key PEM|ARN or set [sign] key in {build_toml}")
        key, region, endpoint_url, root = sign.key, sign.region, endpoint_url or sign.endpoint_url, build_toml.parent
    signer = signer_for(key, root=root, region=region, endpoint_url=endpoint_url)
    store = Store.locate(args.store, show_progress=False)
    for ref in args.refs:
        full, tiers, added = sign_stored(store, ref, signer)
        if added:
            print(f"{short(full)} {ref}: signed by {signer.description} ({signer.keyid[:12]}); stored on "
                  f"{', '.join(tiers)}")
        else:
            print(f"{short(full)} {ref}: already signed by {signer.description} ({signer.keyid[:12]})")
    return 0


# ---- trust


def run_trust(args: argparse.Namespace) -> int:
    build_toml = find_build_toml(Path.cwd())
    if build_toml is None:
        raise InputError("efabuild trust reads [trust] of a workspace: no BUILD.toml here or above")
    table = load_build_store(build_toml)
    policy = resolve_workspace_keys(build_toml, table.local)

    for source, pem in policy.keys:
        print(f"{keyid_of(load_public_key(pem, source))[:12]}  {source}")
    if args.write:
        write_file(args.write, node_config_text(policy).encode())
        print(f"wrote {args.write} ({len(policy.keys)} keys)")
    return 0
