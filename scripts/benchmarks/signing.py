"""sign: what signed artifacts cost.

- verify: the first (full) verification of a stored artifact — blake3 of the .sqsh, the signature,
  record and statement — against only reading the file (`cat FILE > /dev/null`), both cold: the
  page cache is dropped before every run (`echo 3 > /proc/sys/vm/drop_caches` when root may, in
  the full run; else, and always with --quick so a test run leaves other work's caches alone, the
  file's own pages with posix_fadvise(DONTNEED)).
- cached lookup: `efabuild lookup --require-signature` answered from the verification cache, a
  new process each time as a job starts it, against `python -c pass`.
- export + publish: export_image, manifest, publish, as make runs them for one artifact, with
  the sha256 pass and the signature against without both (blake3 only, unsigned).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
import uuid
from pathlib import Path

from benchmarks import fixtures
from benchmarks.common import (
    Check,
    Context,
    Result,
    efabuild_command,
    human_bytes,
    interleaved,
    python,
    write_random_file,
)

TARGET_VERIFY_VS_READ = 0.5
TARGET_LOOKUP = 1.5
TARGET_OVERHEAD_PERCENT = 5.0
NAME = "bench:user"


def scenario(ctx: Context) -> Result:
    from efabuild.signing.keys import PemSigner

    scratch = ctx.scratch("sign")
    private, public = _key(scratch)
    signer = PemSigner(private)
    trust = scratch / "trust.toml"
    trust.write_text(f'[trust]\nkeys = ["{public}"]\n')
    (scratch / "verified").mkdir(mode=0o700, exist_ok=True)  # root never creates the variable's directory
    env = {**os.environ, "EFABUILD_TRUST_CONFIG": str(trust), "EFABUILD_VERIFY_CACHE": str(scratch / "verified")}
    verify_check, verify_timings, verify_figures = _first_verification(ctx, scratch, signer, env)
    lookup_check, lookup_timings = _cached_lookup(ctx, scratch, signer, env)
    export_check, export_timings, export_figures = _export_and_publish(ctx, scratch, signer)
    return Result(
        id="sign",
        what="signed artifacts: first verification, cached lookup, signing at export",
        checks=(verify_check, lookup_check, export_check),
        timings=(*verify_timings, *lookup_timings, *export_timings),
        figures={**verify_figures, **export_figures},
        notes=("verify: cold read ÷ first verification (higher is better); lookup: ÷ python -c pass; "
               "export: % added by the sha256 pass and the signature",),
    )


def _key(scratch: Path) -> tuple[Path, Path]:
    private, public = scratch / "release.pem", scratch / "release.pub"
    subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-out", str(private)], check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(public)], check=True,
                   capture_output=True)
    return private, public


def _signed_store(root: Path, sqsh: Path, signer) -> str:  # noqa: ANN001
    """Publish `sqsh` (any bytes) with its record and a signed statement; returns its key."""
    from efabuild.signing import dsse
    from efabuild.host.digest import file_digests
    from efabuild.provenance.intoto import PREDICATE_TYPE, STATEMENT_TYPE
    from efabuild.store.tiered import Store
    from efabuild.store.record import ArtifactRecord

    key = hashlib.sha256(uuid.uuid4().bytes).hexdigest()
    blake3, sha256 = file_digests(sqsh)
    statement = {"_type": STATEMENT_TYPE, "predicateType": PREDICATE_TYPE, "predicate": {},
                 "subject": [{"name": f"{key}.sqsh", "digest": {"blake3": blake3.split(":")[1], "sha256": sha256}}]}
    envelope = dsse.Envelope(dsse.statement_bytes(statement))
    envelope = envelope.with_signature(signer.sign(envelope.pae()))
    Store.at(root, show_progress=False).publish(key, sqsh, ArtifactRecord.for_file(key, NAME, sqsh, blake3,
                                                                                  sha256=sha256),
                                                envelope=dsse.encode(envelope))
    return key


def _drop_cache(path: Path, global_drop: bool) -> str:
    """Make the next read of `path` come from disk; says how."""
    os.sync()
    if global_drop:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as handle:
                handle.write("3\n")
            return "drop_caches"
        except OSError:
            pass
    with open(path, "rb") as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return "fadvise"


def _first_verification(ctx: Context, scratch: Path, signer, env: dict) -> tuple:  # noqa: ANN001
    from efabuild.store.layout import Layout
    from efabuild.signing.trust import node_policy
    from efabuild.signing.verify import verify

    size = ctx.sizes.sign_verify_bytes
    source = scratch / "big.sqsh"
    ctx.log(f"sign: writing a {human_bytes(size)} artifact")
    write_random_file(source, size, seed=7)
    store = scratch / "verify-store"
    key = _signed_store(store, source, signer)
    source.unlink()
    layout = Layout(store)
    sqsh = layout.sqsh_path(key)
    policy = node_policy({"EFABUILD_TRUST_CONFIG": env["EFABUILD_TRUST_CONFIG"]})
    how: list[str] = []

    def cold() -> None:
        how.append(_drop_cache(sqsh, global_drop=not ctx.quick))

    def full_verification() -> None:
        problems = verify(layout, key, policy)
        if problems:
            raise RuntimeError(f"verification failed: {problems}")

    ctx.log("sign: timing first verifications and cold reads")
    ours, read = interleaved(ctx.repeats, [
        ("first verification (blake3 + signature), cold", full_verification),
        ("cat > /dev/null, cold", lambda: subprocess.run(["cat", str(sqsh)], stdout=subprocess.DEVNULL, check=True)),
    ], before=cold)
    sqsh.unlink()
    check = Check("first verify vs cold read", read.median / ours.median, TARGET_VERIFY_VS_READ, "higher",
                  efabuild=f"{ours.median:.2f} s", baseline=f"{read.median:.2f} s (cat, cold)")
    figures = {"verify_bytes": size, "cache_dropped_by": sorted(set(how)),
               "verify_GB_per_s": round(size / ours.median / 1e9, 2),
               "cold_read_GB_per_s": round(size / read.median / 1e9, 2)}
    return check, (ours, read), figures


def _cached_lookup(ctx: Context, scratch: Path, signer, env: dict) -> tuple:  # noqa: ANN001
    store = scratch / "lookup-store"
    small = scratch / "small.sqsh"
    small.write_bytes(b"hsqs" + os.urandom(1 << 20))
    key = _signed_store(store, small, signer)
    time.sleep(2.1)  # the racy rule: a verification right after a write is not cached
    efabuild = efabuild_command()
    command = [*efabuild, "lookup", "--require-signature", "--store", str(store), NAME]
    first = subprocess.run(command, capture_output=True, text=True, env=env)
    expected = str(store / "objects" / key[:2] / f"{key}.sqsh")
    if first.returncode != 0 or first.stdout.strip() != expected:
        raise RuntimeError(f"lookup --require-signature: {first.returncode} {first.stdout} {first.stderr}")
    if not any(Path(env["EFABUILD_VERIFY_CACHE"]).iterdir()):
        raise RuntimeError("the first lookup left no verification cache entry")

    def start(argv):  # noqa: ANN001, ANN202
        return lambda: subprocess.run(argv, stdout=subprocess.DEVNULL, check=True, env=env)

    ctx.log(f"sign: timing {ctx.sizes.lookup_runs} cached lookups")
    bare, cached = interleaved(ctx.sizes.lookup_runs, [
        ("python -c pass", start([python(), "-c", "pass"])),
        ("efabuild lookup --require-signature (cached)", start(command)),
    ])
    check = Check("cached lookup --require-signature vs python -c pass", cached.median / bare.median,
                  TARGET_LOOKUP, "lower", efabuild=f"{cached.median * 1000:.0f} ms",
                  baseline=f"{bare.median * 1000:.0f} ms (python -c pass)")
    return check, (bare, cached)


def _export_and_publish(ctx: Context, scratch: Path, signer) -> tuple:  # noqa: ANN001
    from efabuild.engine.client import connect
    from efabuild.signing.attest import signed
    from efabuild.host.digest import Sha256Pass
    from efabuild.settings import BuilderSettings, ExportSettings
    from efabuild.provenance.stored import describe_sqsh
    from efabuild.store.tiered import Store
    from efabuild.store.record import ArtifactRecord

    sizes = ctx.sizes
    image, _ = fixtures.export_image(sizes.export_small_files, sizes.export_large_files, sizes.export_large_bytes)
    engine = connect(BuilderSettings())
    out = scratch / "export.sqsh"
    sizes_out: dict[str, int] = {}

    def pipeline(with_signing: bool) -> None:
        from efabuild.export.squash import export_image

        key = hashlib.sha256(uuid.uuid4().bytes).hexdigest()
        # as artifacts.export_and_publish does: sha256 in a thread while the probe runs
        result = export_image(image, out, options=ExportSettings(), engine=engine, sha256=False)
        sha256 = Sha256Pass(result.path) if with_signing else None
        manifest = describe_sqsh(result.path, key=key, name=NAME, sqsh_digest=result.digest,
                                 sqsh_sha256=sha256.result if sha256 else None, export_options={}, base=None,
                                 chain=[], builder={}, times={})
        record = ArtifactRecord.for_file(key, NAME, result.path, result.digest,
                                         sha256=sha256.result() if sha256 else None)
        envelope = signed(manifest, signer) if with_signing else None
        store = Store.at(scratch / f"export-store-{key[:8]}", show_progress=False)
        store.publish(key, result.path, record, manifest, envelope=envelope)
        sizes_out["sqsh"] = result.size
        out.unlink(missing_ok=True)
        import shutil

        shutil.rmtree(store.local_tier.root, ignore_errors=True)

    ctx.log("sign: timing export + publish with and without signing")
    plain, signing = interleaved(ctx.repeats, [
        ("export + manifest + publish (blake3 only, unsigned)", lambda: pipeline(False)),
        ("export + manifest + publish (blake3 + sha256, signed)", lambda: pipeline(True)),
    ])
    # a ratio, not a difference: noise can make the signed runs the faster, and a ratio stays positive
    ratio = signing.median / plain.median
    check = Check("export-and-publish signed ÷ unsigned", ratio, 1 + TARGET_OVERHEAD_PERCENT / 100, "lower",
                  efabuild=f"{signing.median:.2f} s", baseline=f"{plain.median:.2f} s (unsigned)")
    return check, (plain, signing), {"export_sqsh_bytes": sizes_out.get("sqsh"),
                                     "sha256_and_sign_seconds": round(signing.median - plain.median, 3)}
