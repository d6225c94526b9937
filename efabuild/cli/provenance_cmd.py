"""`efabuild show`, `efabuild audit`, `efabuild diff`: an artifact's manifest, its checks, and the
difference between two artifacts. They work in a workspace and on a bare store (--store PATH or
$EFABUILD_STORE)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from efabuild.cli.common import write_file
from efabuild.cli.output import print_foreign_json, print_json, print_table
from efabuild.display import shown
from efabuild.errors import InputError, NotFound
from efabuild.provenance.audit import DECLARING_BASE, FAIL, WARN, Check
from efabuild.provenance.diff import agreement_verdict, diff_manifests, platform_agreement
from efabuild.provenance.intoto import to_intoto
from efabuild.provenance.junit import to_junit
from efabuild.provenance.manifest import platform_of
from efabuild.provenance.stored import AuditResult, audit_stored, host_facts, load_manifest
from efabuild.settings import COMPONENTS, AuditPolicy
from efabuild.store import Store
from efabuild.store.progress import human_bytes
from efabuild.workspace import find_root, load_workspace


def configure(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = {"show": _configure_show, "audit": _configure_audit}.get(name, _configure_diff)(name, sub, common)
    p.add_argument("--store", metavar="PATH",
                   help="a store directory (default: $EFABUILD_STORE, else the workspace's [store])")
    p.add_argument("--json", action="store_true", help="print JSON")


def _configure_show(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser):
    p = sub.add_parser(
        name, parents=[common],
        description="""
            Shows what an artifact is, what it was built from (base, each layer's Dockerfile
            digest and args, tool versions) and the versions measured inside it.""",
        epilog="""
            examples:
              efabuild show demo:user
              efabuild show 0123abcd --intoto > provenance.json""",
    )
    p.add_argument("ref", metavar="REF", help="graph:layer, key or key prefix (≥ 8 hex)")
    p.add_argument("--intoto", action="store_true",
                   help="print the in-toto Statement v1 with the SLSA provenance v1 predicate (JSON)")
    p.set_defaults(run=run_show)
    return p


def _configure_audit(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser):
    p = sub.add_parser(
        name, parents=[common],
        description="""
            Checks that each artifact is what its manifest says (digests, the .sqsh measured
            again), that declared versions are installed, that the EFA installer matches the
            host, the known NGC + EFA pitfalls and the [audit] policy of BUILD.toml.
            Exit status 1 when any check fails.""",
        epilog="""
            examples:
              efabuild audit demo:user
              efabuild audit --all --host-efa 1.50.0
              EFABUILD_STORE=/fsx/efabuild efabuild audit --all --json
              efabuild audit --all --junit audit.xml   # for the CI's test report""",
    )
    p.add_argument("refs", nargs="*", metavar="REF", help="graph:layer, key or key prefix")
    p.add_argument("--all", action="store_true", help="audit every artifact in the store")
    p.add_argument("--deep", action="store_true",
                   help="read every S3 chunk (or whole object) and check it against its id (default: S3's "
                        "copy is judged by its chunk index and a look at each chunk)")
    p.add_argument("--junit", metavar="FILE",
                   help="also write a JUnit XML report for CI: one testsuite per artifact, one testcase "
                        "per check, a failed check a <failure>")
    p.add_argument("--host-efa", metavar="VERSION",
                   help="the host AMI's EFA installer version (default: this host's "
                        "/opt/amazon/efa_installed_packages, else [audit] host_efa_installer)")
    p.set_defaults(run=run_audit)
    return p


def _configure_diff(name: str, sub: argparse._SubParsersAction, common: argparse.ArgumentParser):
    p = sub.add_parser(
        name, parents=[common],
        description="""
            What differs between two artifacts, A then B, read from their manifests (the
            images are not opened), one row per fact of a KIND:
              input     base ref and digest, export options, and per layer its key,
                        Dockerfile digest, platform, build args and context files
              measured  component versions (every copy, which one loads), Open MPI installs,
                        NCCL/FI env, versions the base declares
              tool      the builder's tool versions (BuildKit, mksquashfs, efabuild)
            Two artifacts of other platforms (NAME@linux/amd64 NAME@linux/arm64) also get a table
            of whether NCCL, libfabric, aws-ofi-nccl, PyTorch and CUDA agree, and a verdict line.""",
        epilog="""
            examples:
              efabuild diff demo:efa demo:user
              efabuild diff demo:user@linux/amd64 demo:user@linux/arm64
              efabuild diff 0123abcd demo:user --exit-code   # exit 1 when they differ""",
    )
    p.add_argument("ref_a", metavar="REF_A", help="the first artifact: graph:layer[@os/arch], key or key prefix")
    p.add_argument("ref_b", metavar="REF_B", help="the second artifact, compared with the first")
    p.add_argument("--exit-code", action="store_true",
                   help="exit 1 when they differ, 0 when they do not (like git diff); without it, 0 either way")
    p.set_defaults(run=run_diff)
    return p


def _store(args: argparse.Namespace):  # noqa: ANN202 - efabuild.store.Store
    return Store.locate(args.store)


def _policy():  # noqa: ANN202 - AuditPolicy
    """The workspace's [audit] policy; the empty policy outside a workspace (a bare store)."""
    try:
        root = find_root(Path.cwd())
    except InputError:
        return AuditPolicy()
    return load_workspace(root).settings.audit


# ---- show ------------------------------------------------------------------------------------
def run_show(args: argparse.Namespace) -> int:
    found = load_manifest(_store(args), args.ref)
    if not found.verified:
        print(f"efabuild: warning: the manifest of {found.key[:12]} does not match the digest in its record; "
              f"run efabuild audit {found.key[:12]}", file=sys.stderr)
    if args.intoto:
        print_foreign_json(to_intoto(found.manifest))  # an in-toto Statement, as in-toto defines it
    elif args.json:
        data = {"key": found.key, "name": found.name, "platform": found.manifest.get("platform"),
                "verified": found.verified, "manifest": found.manifest}
        print_json("show", data, verbatim=("manifest",))  # the stored manifest as written (its own format)
    else:
        _show_table(found.manifest, found.verified)
    return 0


def _show_table(m: dict, verified: bool) -> None:
    print_table(_summary_rows(m, verified))
    chain = m.get("chain") or []
    if chain:
        print()
        print_table(_chain_rows(chain), ("LAYER", "KEY", "DOCKERFILE", "ARGS"))
    measured = m.get("measured") or {}
    print()
    print_table(_component_rows(measured), ("COMPONENT", "VERSION", "SOURCE"))
    env = measured.get("env") or {}
    print()
    print(shown(f"env (from {env.get('source') or 'nowhere: no /etc/environment'}):"))
    for name, value in sorted((env.get("vars") or {}).items()):
        print(shown(f"  {name}={value}"))
    declared = measured.get("declared_by_base") or {}
    if declared:
        print("declared by base:")
        for name, item in sorted(declared.items()):
            print(shown(f"  {item.get('source', name)}={item.get('value')}"))


def _summary_rows(m: dict, verified: bool) -> list[tuple[str, str]]:
    """What the artifact is and how it was made, one (FIELD, VALUE) row each."""
    artifact = m.get("artifact") or {}
    export = artifact.get("export") or {}
    base = m.get("base") or {}
    times = m.get("times") or {}
    builder = m.get("builder") or {}
    vcs = m.get("vcs") if isinstance(m.get("vcs"), dict) else {}
    return [
        ("name", m.get("name", "")),
        *([("platform", str(m["platform"]))] if m.get("platform") else []),
        ("key", m.get("key", "")),
        ("sqsh", f"{artifact.get('digest', '?')}  {human_bytes(artifact.get('size') or 0)}"),
        ("sha256", artifact.get("sha256") or "- (exported before efabuild recorded it)"),
        ("export", " ".join(f"{k}={_text(v)}" for k, v in sorted(export.items()) if k != "incremental") or "-"),
        ("written", _written(export.get("incremental"))),
        ("base", f"{base.get('ref') or '-'}" + (f" @ {base['digest']}" if base.get("digest") else " (not pinned)")),
        ("machine", _machine(m.get("measured") or {})),
        ("built", "  ".join(f"{k} {v}" for k, v in sorted(times.items())) or "-"),
        ("tools", "  ".join(f"{k} {v}" for k, v in sorted(builder.items())) or "-"),
        ("revision", " ".join(_text(vcs[k]) for k in ("revision", "source") if vcs.get(k))
         or "- (not built from a git checkout)"),
        ("manifest", "verified against the record" if verified else "NOT VERIFIED: differs from the record"),
    ]


def _written(incremental: object) -> str:
    """How the .sqsh was made: from its ancestor's (which, and the ancestor's bytes it left unused),
    or whole and why."""
    if not isinstance(incremental, dict):
        return "whole (exported before efabuild recorded how)"
    if "ancestor" in incremental:
        return (f"from ancestor {_text(incremental['ancestor'])} ({_text(incremental.get('ancestor_digest'))}), "
                f"{_text(incremental.get('dead_bytes'))} dead bytes")
    return f"whole: {_text(incremental.get('full'))}"


def _machine(measured: dict) -> str:
    machine = measured.get("machine") if isinstance(measured.get("machine"), dict) else None
    if machine is None:
        return "- (measured before efabuild recorded it)"
    if not machine.get("name"):
        return "unknown (no ELF file read)"
    arch = f" ({_text(machine.get('architecture'))})" if machine.get("architecture") else ""
    return f"{_text(machine['name'])}{arch}, from {_text(machine.get('source'))}"


def _chain_rows(chain: list) -> list[tuple[str, ...]]:
    rows = []
    for entry in chain:
        inputs = entry.get("inputs") or {}
        args = " ".join(f"{k}={v}" for k, v in sorted((inputs.get("args") or {}).items())) or "-"
        dockerfile = (inputs.get("dockerfile_digest") or "-")[:19]
        rows.append((entry.get("layer", "?"), (entry.get("key") or "?")[:12], dockerfile, args))
    return rows


def _component_rows(measured: dict) -> list[tuple[str, ...]]:
    """Each component's version and where it was read (every copy when there are several, and
    which one the loader takes), then each Open MPI install."""
    rows = []
    components = measured.get("components") or {}
    declared = measured.get("declared_by_base") or {}
    for name in [n for n in COMPONENTS if n in components] + sorted(set(components) - set(COMPONENTS)):
        component = components[name]
        version, source = component.get("version"), component.get("source") or "-"
        if version is None:
            version, source = _declared_instead(name, declared, component.get("looked_at") or [])
        if component.get("commit"):
            version += f" @ {component['commit'][:12]}"
        rows.append((name, version, source))
        copies = component.get("copies") or []
        if len(copies) > 1 or (copies and copies[0].get("path") != component.get("source")):
            for copy in copies:
                mark = " (loads)" if _is_loaded(component, copy) else ""
                rows.append((f"  copy{mark}", copy.get("version") or "unknown", copy.get("path") or "-"))
    for install in measured.get("openmpi") or []:
        where = install.get("path", "?")
        if install.get("real_path") not in (None, where):
            where += f" -> {install['real_path']}"
        rows.append(("openmpi", install.get("version") or "unknown", where))
    return rows


def _declared_instead(component: str, declared: dict, looked_at: list) -> tuple[str, str]:
    """(VERSION, SOURCE) of a component no file in the image tells: what the base declares about it,
    marked as declared (e.g. CUDNN_VERSION in an image without cuDNN's header and libraries)."""
    for name, item in sorted(declared.items()):
        if DECLARING_BASE.get(name) == component and item.get("value"):
            return f"{item['value']} (declared)", f"{item.get('source', name)}; {_looked(looked_at)}"
    return "unknown", _looked(looked_at)


MAX_LOOKED_SHOWN = 6  # places named in the table; `show --json` has them all


def _looked(places: list) -> str:
    """Where the probe looked, as the manifest records it (manifests made before say nothing)."""
    shown = [_text(p) for p in places[:MAX_LOOKED_SHOWN] if isinstance(p, str)]
    if not shown:
        return "not found in the image's files"
    more = f" and {len(places) - len(shown)} more" if len(places) > len(shown) else ""
    return "not found in the image's files; looked at " + ", ".join(shown) + more


def _is_loaded(component: dict, copy: dict) -> bool:
    # the loader takes the first copy it reaches by name
    on_path = component.get("on_path") or []
    return bool(component.get("loads")) and bool(on_path) and on_path[0].get("real_path") == copy.get("path")


def _text(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


# ---- audit -----------------------------------------------------------------------------------
def run_audit(args: argparse.Namespace) -> int:
    if args.all and args.refs:
        raise InputError("give REF... or --all, not both")
    store = _store(args)
    results = []
    if args.all:
        listings, unreadable = store.inventory()
        refs = [listing.record.key for listing in listings]
        # an artifact that cannot be read is a failed audit, not one left out
        results += [AuditResult(key, key, "?", (Check("artifact", FAIL, f"{tier} tier: unreadable: {problem}"),))
                    for tier, key, problem in unreadable]
    else:
        refs = list(args.refs)
    if not refs and not results:
        if args.all:
            print("no artifacts", file=sys.stderr)
            _junit(args.junit, [])  # an empty report, so the CI step that reads it finds one
            if args.json:
                print_json("audit", {"ok": True, "artifacts": []})
            return 0
        raise InputError("give one or more REF (graph:layer, key or key prefix), or --all")
    policy = _policy()
    host = host_facts(args.host_efa, policy)
    for ref in refs:
        try:
            results.append(audit_stored(store, ref, policy, host, deep=args.deep))
        except NotFound as exc:
            results.append(AuditResult(ref, "", ref, (Check("artifact", FAIL, str(exc)),)))
    _junit(args.junit, results)
    if args.json:
        print_json("audit", {"ok": not any(r.failed for r in results), "artifacts": [
            {"ref": r.ref, "key": r.key, "name": r.name, "ok": not r.failed, "checks": [c.to_dict() for c in r.checks]}
            for r in results]})
    else:
        for index, result in enumerate(results):
            if index:
                print()
            _audit_table(result)
    return 1 if any(r.failed for r in results) else 0


def _junit(name: str | None, results: list) -> None:
    if name:
        write_file(name, to_junit(results))


def _audit_table(result) -> None:  # noqa: ANN001 - AuditResult
    print(f"{result.name} {result.key[:12]}".strip())
    print_table([(c.name, c.status, c.message) for c in result.checks], ("CHECK", "STATUS", "DETAIL"), indent="  ")
    failures = sum(c.status == FAIL for c in result.checks)
    warnings = sum(c.status == WARN for c in result.checks)
    verdict = f"{failures} failed" if failures else "passed"
    print(f"  {verdict}, {warnings} warning{'s' if warnings != 1 else ''}, {len(result.checks)} checks")


# ---- diff ------------------------------------------------------------------------------------
def run_diff(args: argparse.Namespace) -> int:
    store = _store(args)
    a, b = load_manifest(store, args.ref_a), load_manifest(store, args.ref_b)
    for found in (a, b):
        if not found.verified:
            print(f"efabuild: warning: the manifest of {found.key[:12]} does not match the digest in its record",
                  file=sys.stderr)
    differences = diff_manifests(a.manifest, b.manifest)
    platforms = (platform_of(a.manifest), platform_of(b.manifest))
    across = platform_agreement(a.manifest, b.manifest) if None not in platforms and len(set(platforms)) == 2 else None
    if args.json:
        print_json("diff", {"a": {"ref": args.ref_a, "key": a.key, "name": a.name, "platform": platforms[0]},
                            "b": {"ref": args.ref_b, "key": b.key, "name": b.name, "platform": platforms[1]},
                            "differences": [d.to_dict() for d in differences],
                            "across_platforms": None if across is None else {
                                "components": [row.to_dict() for row in across],
                                "agree": all(row.agrees for row in across)}})
    else:
        print(f"A  {a.name} {a.key[:12]}" + (f" {platforms[0]}" if across is not None else ""))
        print(f"B  {b.name} {b.key[:12]}" + (f" {platforms[1]}" if across is not None else ""))
        if not differences:
            print("no differences in declared inputs or measured versions")
        else:
            print()
            print_table([(d.kind, d.what, "-" if d.a is None else d.a, "-" if d.b is None else d.b)
                         for d in differences], ("KIND", "WHAT", "A", "B"))
        if across is not None:
            print()
            print_table([(row.component, row.a or "-", row.b or "-", "yes" if row.agrees else "NO") for row in across],
                        ("ACROSS PLATFORMS", platforms[0], platforms[1], "AGREE"))
            print(agreement_verdict(across, *platforms))
    return 1 if args.exit_code and differences else 0
