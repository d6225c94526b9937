"""Helpers for the store tests: real small .sqsh files, keys, records, the CLI, and a publisher
process that can be stopped at a named point (run as `python -m tests.kits.storekit PLAN.json`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import blake3

from tests.kits.inprocess import run_efabuild

REPO = Path(__file__).resolve().parents[2]


def shifted_versions(directory: Path, size: int = 1024 * 1024) -> tuple[Path, Path]:
    """Two 'images' that share most bytes at shifted offsets: v2 has 3 KiB inserted near the
    start and one byte changed near the end."""
    rng = random.Random(7)
    body = rng.randbytes(size)
    one = directory / "v1.bin"
    one.write_bytes(body)
    changed = bytearray(body[:100 * 1024] + rng.randbytes(3 * 1024) + body[100 * 1024:])
    changed[-10 * 1024] ^= 0xFF
    two = directory / "v2.bin"
    two.write_bytes(bytes(changed))
    return one, two


def make_sqsh(directory: Path, payload: bytes, name: str = "artifact") -> Path:
    """A real SquashFS image (Enroot's options) holding `payload` as /payload.bin."""
    root = directory / f"{name}-rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "payload.bin").write_bytes(payload)
    (root / "etc" / "environment").write_text("PATH=/usr/local/bin:/usr/bin:/bin\n")
    out = directory / f"{name}.sqsh"
    subprocess.run(
        ["mksquashfs", str(root), str(out), "-noappend", "-all-root", "-comp", "lzo", "-noD",
         "-mkfs-time", "0", "-all-time", "0", "-no-progress", "-quiet"],
        check=True, capture_output=True,
    )
    return out


def collect_warnings(monkeypatch) -> list[str]:  # noqa: ANN001 - pytest's monkeypatch
    """The warnings the library reports (efabuild.notices) from now on, as the CLI would print
    them (without its `efabuild: warning: ` prefix)."""
    from efabuild import notices

    said: list[str] = []
    monkeypatch.setattr(notices, "_printer",
                        lambda kind, message: said.append(message) if kind == notices.WARNING else None)
    return said


def key_for(text: str) -> str:
    """A layer-key-shaped value (64 hex) derived from `text`."""
    return blake3.blake3(text.encode()).hexdigest()


def record_for(key: str, name: str, sqsh: Path):  # noqa: ANN201 - ArtifactRecord
    from efabuild.host.digest import file_digest
    from efabuild.store.record import ArtifactRecord

    return ArtifactRecord.for_file(key, name, sqsh, file_digest(sqsh),
                                   export={"mksquashfs": ["-comp", "lzo", "-noD"]})


# small chunks for a chunked S3 tier, so that a few MiB hold many of them (the defaults suit
# images of gigabytes)
CHUNKED = {"chunking": (8 * 1024, 32 * 1024, 128 * 1024)}


def publish(store, sqsh: Path, name: str = "demo:user") -> str:  # noqa: ANN001 - a Store
    """Publish `sqsh` as `name` under a key of its own (made from both); the key."""
    key = key_for(f"{name}-{sqsh.name}")
    store.publish(key, sqsh, record_for(key, name, sqsh), b'{"m": 1}')
    return key


def efabuild(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
             check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the CLI's main() in this process (tests/kits/inprocess.py: as a fresh interpreter would)."""
    result = run_efabuild(args, env={**os.environ, **(env or {})}, cwd=cwd)
    if check and result.returncode != 0:
        raise AssertionError(f"efabuild {' '.join(args)} -> {result.returncode}\n{result.stderr}")
    return result


def efabuild_process(*args: str, env: dict[str, str] | None = None,
                     cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a fresh interpreter: for what only a process shows (what it imports)."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "efabuild", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd)


def unsquash_list(sqsh: Path) -> list[str]:
    out = subprocess.run(["unsquashfs", "-lls", "-d", "", str(sqsh)], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


# ---- a publisher in its own process ---------------------------------------------------------

def start_publisher(plan: dict, plan_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start `python -m tests.kits.storekit plan.json`; its stdout says which points it reached."""
    plan_path.write_text(json.dumps(plan))
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen([sys.executable, "-m", "tests.kits.storekit", str(plan_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env, cwd=REPO)


def kill_publisher_at(plan: dict, plan_path: Path) -> None:
    """Start a publisher that stops at plan["pause"], and SIGKILL it once it is there."""
    child = start_publisher(plan, plan_path)
    try:
        assert wait_for_line(child, f"at {plan['pause']}")[-1] == f"at {plan['pause']}"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def race_publishers(plans: list[dict], go: Path, tmp_path: Path, timeout: float) -> list[dict]:
    """Start one publisher per plan, let them all go at once; each one's {tier: outcome}."""
    children = [start_publisher(plan, tmp_path / f"plan{index}.json") for index, plan in enumerate(plans)]
    for child in children:
        assert wait_for_line(child, "ready")[-1] == "ready"
    go.touch()
    outcomes = []
    for child in children:
        out, err = child.communicate(timeout=timeout)
        assert child.returncode == 0, err
        outcomes.append(json.loads(out.strip().splitlines()[-1].removeprefix("results ")))
    return outcomes


def wait_for_line(process: subprocess.Popen[str], wanted: str) -> list[str]:
    """Read the child's stdout until a line equals `wanted` (or it exits); the lines read."""
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if lines[-1] == wanted:
            return lines
    return lines


def _pause(point: str) -> None:
    print(f"at {point}", flush=True)
    while True:  # until SIGKILL
        time.sleep(60)


def _install_pause(point: str) -> None:
    """Stop this process at `point` of a publish: the test then kills it with SIGKILL."""
    from efabuild.host import fsutil
    from efabuild.store.tiers import fs
    from efabuild.store.layout import MANIFEST_SUFFIX, RECORD_SUFFIX, SQSH_SUFFIX

    real_atomic = fsutil.atomic_write_bytes
    real_link = os.link

    def atomic(path: Path, data: bytes, tmp_dir: Path, mode: int = 0o644) -> None:
        if point == "before-record" and path.name.endswith(RECORD_SUFFIX) and not path.name.endswith(MANIFEST_SUFFIX):
            _pause(point)
        real_atomic(path, data, tmp_dir, mode)
        if point == "after-manifest" and path.name.endswith(MANIFEST_SUFFIX):
            _pause(point)

    def link(src, dst, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        # the commit point: a link into objects/, by path or relative to the object directory
        by_fd = kwargs.get("dst_dir_fd") is not None and not str(dst).startswith("efatmp.")
        final = str(dst).endswith(SQSH_SUFFIX) and ("/objects/" in str(dst) or by_fd)
        if point == "before-sqsh-link" and final:
            _pause(point)
        real_link(src, dst, *args, **kwargs)
        if point == "after-sqsh-link" and final:
            _pause(point)

    real_copy = fsutil.copy_file

    def copy(source: Path, dest: Path, progress=None) -> None:  # noqa: ANN001
        if point == "mid-copy":  # half the bytes written into the temp file, then stop
            data = Path(source).read_bytes()
            with open(dest, "xb") as handle:
                handle.write(data[: len(data) // 2])
                handle.flush()
                os.fsync(handle.fileno())
            _pause(point)
        real_copy(source, dest, progress)

    fsutil.atomic_write_bytes = atomic
    fs.fsutil.atomic_write_bytes = atomic
    os.link = link
    fsutil.copy_file = copy

    if point.startswith("s3-"):
        from efabuild.store.tiers import s3

        real_call = s3.S3Tier._call
        lock = threading.Lock()

        def call(self, what, operation, **kwargs):  # noqa: ANN001, ANN003, ANN202
            if point == "s3-mid-upload" and operation == "upload_part" and kwargs.get("PartNumber") == 2:
                with lock:
                    _pause(point)
            if point == "s3-before-index" and operation == "put_object" and kwargs["Key"].endswith(".chunks.json"):
                _pause(point)
            if point == "s3-before-record" and operation == "put_object" and kwargs["Key"].endswith(RECORD_SUFFIX) \
                    and not kwargs["Key"].endswith((MANIFEST_SUFFIX, ".chunks.json")):
                _pause(point)
            return real_call(self, what, operation, **kwargs)

        s3.S3Tier._call = call


def _main(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    from efabuild.settings import S3Config
    from efabuild.store.tiered import Store
    from efabuild.store.tiers.fs import FilesystemTier

    if plan.get("pause"):
        _install_pause(plan["pause"])
    tiers = [FilesystemTier(path, name) for name, path in plan["tiers"]]
    s3 = S3Config(**plan["s3"]) if plan.get("s3") else None
    store = Store(tiers, s3, show_progress=False, s3_options=plan.get("s3_options", {"part_size": 5 * 1024 * 1024}))
    sqsh = Path(plan["sqsh"])
    record = record_for(plan["key"], plan["name"], sqsh)
    if plan.get("go"):  # start together with the other publishers
        print("ready", flush=True)
        go = Path(plan["go"])
        while not go.exists():
            time.sleep(0.01)
    manifest = plan.get("manifest", "").encode() or None
    results = store.publish(plan["key"], sqsh, record, manifest)
    print("results " + json.dumps(results, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))


def give_to_another_user(path: Path, monkeypatch) -> None:  # noqa: ANN001 - pytest's MonkeyPatch
    """Make `path` another user's, as a co-tenant's file in a shared tier is: chowned to nobody
    as root, else this process told it runs as someone else (os.geteuid)."""
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
    else:
        monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)


def recalled_tree(path: Path):  # noqa: ANN201 - (digest, values) | None
    """host/treecache.recall of the file at `path`, as a fetch or check asks it: through an open descriptor."""
    from efabuild.host import treecache

    fd = os.open(path, os.O_RDONLY)
    try:
        return treecache.recall(fd)
    finally:
        os.close(fd)


def swap_link_during_writes(monkeypatch, cache_module, link: Path, real: Path, theirs: Path) -> None:  # noqa: ANN001
    """Each write of `cache_module` (its replace_owned) made while `link` points at `theirs`, and
    `link` put back at `real` after it: what a job user whose link lies in root's cache path does
    between the cache's check of its directory and its write."""
    write = cache_module.replace_owned

    def swapped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        link.unlink()
        link.symlink_to(theirs)
        try:
            return write(*args, **kwargs)
        finally:
            link.unlink()
            link.symlink_to(real)

    monkeypatch.setattr(cache_module, "replace_owned", swapped)


def cache_dir(path: Path) -> Path:
    """A verification cache directory made as its user makes one (0700): root, as the suite runs in
    CI, never creates the directory $EFABUILD_VERIFY_CACHE names (host/usercache.py)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path
