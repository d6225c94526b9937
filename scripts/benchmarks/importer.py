"""importer: the Pyxis importer's `get` with `verify = true` on an artifact it verified before and
unchanged since, against a `get` without verification, each a new process as Pyxis starts it at
every job step.

Without the verification cache every verifying start re-read the whole .sqsh (4.7 s cold for the
bench's 1.44 GB image, against 1.17 s for the whole squashfuse start); with it the second start
costs a few stats more than an unverifying one. The first, full verification is reported too.
"""

from __future__ import annotations

import os
import subprocess
import time

from benchmarks.common import Check, Context, Result, Timing, byte_compile_efabuild, interleaved, python

TARGET = 1.2
NAME = "bench:user"
# what pip's console script efabuild-pyxis-importer runs, with the interpreter efabuild is installed in
IMPORTER = "import sys; from efabuild.cli import pyxis_importer_main; sys.exit(pyxis_importer_main())"


def make_store(root, size: int) -> str:  # noqa: ANN001
    """A store directory holding one artifact of `size` bytes named NAME; returns its key."""
    import secrets

    from efabuild.host.digest import file_digest
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.store.record import ArtifactRecord
    from efabuild.store.tiered import Store

    sqsh = root.parent / "user.sqsh"
    with open(sqsh, "wb") as handle:
        handle.write(b"hsqs")
        for _ in range(size // (1 << 20)):
            handle.write(os.urandom(1 << 20))
    key = secrets.token_hex(32)
    store = Store([FilesystemTier(root, "store")], show_progress=False)
    store.publish(key, sqsh, ArtifactRecord.for_file(key, NAME, sqsh, file_digest(sqsh)))
    sqsh.unlink()
    return key


def scenario(ctx: Context) -> Result:
    from efabuild.signing.verifycache import CACHE_ENV, RACY_SECONDS

    work = ctx.scratch("importer")
    store = work / "store"
    size = ctx.sizes.sign_verify_bytes
    key = make_store(store, size)
    expected = str(store / "objects" / key[:2] / f"{key}.sqsh")
    configs = {}
    for label, extra in (("plain", ""), ("verify", "verify = true\n")):
        configs[label] = work / f"{label}.toml"
        configs[label].write_text(f'store = "{store}"\n{extra}')
    cache = work / "verified"
    cache.mkdir(mode=0o700, exist_ok=True)  # as its user makes it: root never creates the variable's directory
    byte_compile_efabuild()

    def get(label: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "EFABUILD_PYXIS_CONFIG": str(configs[label]), CACHE_ENV: str(cache)}
        env.pop("EFABUILD_STORE", None)
        return subprocess.run([python(), "-c", IMPORTER, "get", f"docker://efabuild://{NAME}"], env=env,
                              capture_output=True, text=True)

    time.sleep(RACY_SECONDS + 0.2)  # a file changed within 2 s of its verification is not remembered
    started = time.perf_counter()
    first = get("verify")
    first_s = time.perf_counter() - started
    if first.returncode != 0 or first.stdout.strip() != expected or not any(cache.iterdir()):
        raise RuntimeError(f"first verifying get: exit {first.returncode}: {first.stdout.strip()} "
                           f"{first.stderr.strip()} (cache: {sorted(p.name for p in cache.iterdir())})")

    def start(label: str):  # noqa: ANN202
        def run() -> None:
            done = get(label)
            if done.returncode != 0 or done.stdout.strip() != expected:
                raise RuntimeError(f"get ({label}): exit {done.returncode}: {done.stderr.strip()}")
        return run

    ctx.log(f"importer: timing {ctx.sizes.lookup_runs} gets of each ({size >> 20} MiB artifact)")
    plain, verified = interleaved(ctx.sizes.lookup_runs, [("get, verify = false", start("plain")),
                                                          ("get, verify = true, verified before", start("verify"))])
    return Result(
        id="importer",
        what="Pyxis importer get, new process: verify = true on a copy verified before and unchanged since",
        checks=(Check("verified-before vs unverified get", verified.median / plain.median, TARGET, "lower",
                      efabuild=f"{verified.median * 1000:.0f} ms",
                      baseline=f"{plain.median * 1000:.0f} ms (verify = false)"),),
        timings=(plain, verified, Timing("first get, verify = true (reads the whole file)", (first_s,))),
        figures={"artifact_bytes": size, "first_verified_ms": round(first_s * 1000, 1),
                 "first_vs_unverified": round(first_s / plain.median, 2)},
        notes=("figure: a verifying get of an unchanged, verified copy ÷ an unverifying get (lower is better)",),
    )
