"""Placeholder until the command lands."""

from __future__ import annotations


def configure(name, sub, common):
    p = sub.add_parser(name, parents=[common], help="(not available yet)")
    p.set_defaults(run=_run)


def _run(args):
    from efabuild.errors import EfabuildError

    raise EfabuildError(f"{args.command}: not available yet")
