"""lookup: `efabuild lookup REF` with a local hit, started as a job script starts it (a new process
each time), against the cost of starting Python at all (`python -c pass`).

Both use the interpreter efabuild is installed in, called directly: a version manager's shim in
front of either would add the same fixed cost to both and hide the difference.
"""

from __future__ import annotations

import subprocess

from benchmarks.common import Check, Context, Result, byte_compile_efabuild, efabuild_command, interleaved, python

TARGET = 1.5
NAME = "bench:user"


def make_store(root) -> str:  # noqa: ANN001
    """A store directory holding one small artifact named NAME; returns its key."""
    import secrets

    from efabuild.host.digest import file_digest
    from efabuild.store.tiered import Store
    from efabuild.store.tiers.fs import FilesystemTier
    from efabuild.store.record import ArtifactRecord

    sqsh = root.parent / "user.sqsh"
    sqsh.write_bytes(b"hsqs" + bytes(4092))
    key = secrets.token_hex(32)
    store = Store([FilesystemTier(root, "store")], show_progress=False)
    store.publish(key, sqsh, ArtifactRecord.for_file(key, NAME, sqsh, file_digest(sqsh)))
    return key


def scenario(ctx: Context) -> Result:
    store = ctx.scratch("lookup") / "store"
    key = make_store(store)
    byte_compile_efabuild()
    efabuild = efabuild_command()
    commands = {
        "python -c pass": [python(), "-c", "pass"],
        "efabuild lookup (console script)": [*efabuild, "lookup", "--store", str(store), NAME],
        "python -m efabuild lookup": [python(), "-m", "efabuild", "lookup", "--store", str(store), NAME],
        "efabuild lookup KEY-PREFIX": [*efabuild, "lookup", "--store", str(store), key[:12]],
    }
    expected = str(store / "objects" / key[:2] / f"{key}.sqsh")
    for label, command in commands.items():
        if label.startswith(("efabuild", "python -m")):
            found = subprocess.run(command, capture_output=True, text=True)
            if found.returncode != 0 or found.stdout.strip() != expected:
                raise RuntimeError(f"{label}: exit {found.returncode}: {found.stdout.strip()} {found.stderr.strip()}")

    def start(command):  # noqa: ANN001, ANN202
        return lambda: subprocess.run(command, stdout=subprocess.DEVNULL, check=True)

    ctx.log(f"lookup: timing {ctx.sizes.lookup_runs} starts of each")
    timings = interleaved(ctx.sizes.lookup_runs, [(label, start(c)) for label, c in commands.items()])
    bare, console, module, prefix = timings
    return Result(
        id="lookup",
        what="efabuild lookup, local hit, new process",
        checks=(Check("vs python -c pass", console.median / bare.median, TARGET, "lower",
                      efabuild=f"{console.median * 1000:.0f} ms",
                      baseline=f"{bare.median * 1000:.0f} ms (python -c pass)"),),
        timings=tuple(timings),
        figures={"python_m_ratio": round(module.median / bare.median, 2),
                 "key_prefix_ratio": round(prefix.median / bare.median, 2),
                 "added_ms": round((console.median - bare.median) * 1000, 1)},
        notes=("figure: efabuild's time ÷ Python's start-up time (lower is better)",),
    )
