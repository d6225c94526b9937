#!/usr/bin/env python3
"""Fetch the pinned real packages the probe is checked against, and lay them out as images hold them.

The packages (PINS): NVIDIA's CUDA wheels from PyPI as pip installs them, and Debian bookworm's
libfabric and Open MPI as apt installs them. Each is fetched with the registry's own client
(`pip download --require-hashes`, `apt-get download`), its sha256 checked against the pin, and kept
in the cache directory ($EFABUILD_REAL_BINARIES, else cache/real-binaries/ in this checkout, which
git ignores); a cached file with the pinned hash is not fetched again.

    python3 scripts/fetch-real-binaries.py            # fetch what is missing, print the cache directory
    python3 scripts/fetch-real-binaries.py --list     # the pins

The layouts are made by the tests (tests/provenance/test_real_binaries.py) with this file's
functions: `install_wheel` unpacks a wheel into a site-packages directory and writes its
dist-info as pip does; `install_deb` unpacks a .deb with `dpkg-deb -x`, and with `records` adds
the dpkg status paragraph and .list file apt leaves. A member bigger than KEEP_BYTES (cuDNN's
engines are hundreds of MB) keeps only its first KEEP_BYTES: the probe reads the names, the
metadata and the first bytes of such libraries, never the rest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
CACHE_ENV = "EFABUILD_REAL_BINARIES"
KEEP_BYTES = 4 << 20
# x86_64 wheels whatever machine fetches them: the tests lay out an amd64 image
WHEEL_PLATFORMS = ("manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@dataclass(frozen=True)
class Pin:
    kind: str  # "wheel" or "deb"
    name: str
    version: str
    filename: str
    sha256: str
    size_mib: int  # about: what a fetch costs


PINS = (
    Pin("wheel", "nvidia-cuda-runtime-cu12", "12.9.79",
        "nvidia_cuda_runtime_cu12-12.9.79-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3", 3),
    Pin("wheel", "nvidia-nccl-cu12", "2.32.3", "nvidia_nccl_cu12-2.32.3-py3-none-manylinux_2_27_x86_64.whl",
        "bb94b2348e4861d5e8aa00b36c3d12d9bdf9c6369b82cbb723de0b582280a21c", 335),
    Pin("wheel", "nvidia-cudnn-cu12", "9.28.0.42", "nvidia_cudnn_cu12-9.28.0.42-py3-none-manylinux_2_27_x86_64.whl",
        "9ff58b7f36dacd0a93e89f8f2957b52466889217963701daa15e577317cfa375", 683),
    Pin("deb", "libfabric1", "1.17.0-3", "libfabric1_1.17.0-3_amd64.deb",
        "1df0b3acb9a55e43152621015f941457fe63cb9866868f2c2df2c20d34604a22", 1),
    Pin("deb", "libopenmpi3", "4.1.4-3+b1", "libopenmpi3_4.1.4-3+b1_amd64.deb",
        "acbb84293aa092a49a457a724d293ff0bcceabf297f2828ef9e8cad08b28fc99", 3),
    Pin("deb", "libopenmpi-dev", "4.1.4-3+b1", "libopenmpi-dev_4.1.4-3+b1_amd64.deb",
        "089c17e74439e53ad6cab5f11d935bc9df93b26da0bd87b2b72eb789b467bea2", 1),
)


class FetchError(Exception):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or HERE / "cache" / "real-binaries")


def cached(pin: Pin, cache: Path | None = None) -> Path | None:
    """The pin's file in the cache when it is there with the pinned hash."""
    path = (cache or cache_dir()) / pin.filename
    return path if path.is_file() and _sha256(path) == pin.sha256 else None


def fetch(pin: Pin, cache: Path) -> Path:
    if (found := cached(pin, cache)) is not None:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp:
        if pin.kind == "wheel":
            requirements = Path(tmp) / "requirements.txt"
            requirements.write_text(f"{pin.name}=={pin.version} --hash=sha256:{pin.sha256}\n")
            platforms = [arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)]
            command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                       *platforms, "--require-hashes", "-r", str(requirements), "-d", tmp]
        else:
            os.chmod(tmp, 0o755)  # apt's _apt user writes the download as root's does not
            command = ["apt-get", "download", "-q", f"{pin.name}={pin.version}"]
        done = subprocess.run(command, cwd=tmp, capture_output=True, text=True)
        got = Path(tmp) / pin.filename
        if done.returncode != 0 or not got.is_file():
            detail = (done.stderr.strip().splitlines() or ["no file"])[-1]
            hint = " (apt-get update first; the pin may have left bookworm's archive)" if pin.kind == "deb" else ""
            raise FetchError(f"{pin.name} {pin.version}: {' '.join(command[:4])}... failed: {detail}{hint}")
        digest = _sha256(got)
        if digest != pin.sha256:
            raise FetchError(f"{pin.filename}: sha256 {digest}, pinned {pin.sha256}: not kept")
        got.replace(cache / pin.filename)
    return cache / pin.filename


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---- layouts ------------------------------------------------------------------------------------
def install_wheel(wheel: Path, site: Path, keep_bytes: int = KEEP_BYTES) -> Path:
    """Unpack `wheel` into the site-packages directory `site` as pip does (purelib and platlib
    alike; no scripts or data in these wheels), then add pip's INSTALLER and REQUESTED to its
    dist-info and RECORD. Returns the dist-info directory."""
    site.mkdir(parents=True, exist_ok=True)
    dist_info = None
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            target = (site / member.filename).resolve()
            if not target.is_relative_to(site.resolve()):
                raise FetchError(f"{wheel.name}: {member.filename} leaves the site directory")
            if member.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as source, open(target, "wb") as out:
                out.write(source.read(keep_bytes))
            if member.external_attr >> 16 & 0o111:
                target.chmod(0o755)
            top = member.filename.split("/", 1)[0]
            if top.endswith(".dist-info"):
                dist_info = site / top
    if dist_info is None:
        raise FetchError(f"{wheel.name}: no .dist-info")
    (dist_info / "INSTALLER").write_text("pip\n")
    (dist_info / "REQUESTED").write_text("")
    with open(dist_info / "RECORD", "a") as record:
        record.write(f"{dist_info.name}/INSTALLER,,\n{dist_info.name}/REQUESTED,,\n")
    return dist_info


def control(deb: Path) -> dict[str, str]:
    """The .deb's control fields (continuation lines left out)."""
    text = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
    fields = {}
    for line in text.splitlines():
        if line[:1] not in (" ", "\t") and ":" in line:
            name, _, value = line.partition(":")
            fields[name] = value.strip()
    return fields


def install_deb(deb: Path, root: Path, records: bool = True) -> dict[str, str]:
    """`dpkg-deb -x` into `root`; with `records`, the status paragraph and .list file dpkg writes
    when apt installs it. Returns the package's control fields."""
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    fields = control(deb)
    if records:
        info = root / "var/lib/dpkg/info"
        info.mkdir(parents=True, exist_ok=True)
        keep = ("Package", "Version", "Architecture", "Multi-Arch", "Source", "Depends", "Section", "Priority")
        paragraph = "".join(f"{k}: {fields[k]}\n" for k in keep if k in fields)
        paragraph = paragraph.replace("Version:", "Status: install ok installed\nVersion:", 1)
        status = root / "var/lib/dpkg/status"
        before = status.read_text() if status.exists() else ""
        status.write_text(before + ("\n" if before else "") + paragraph)
        listing = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], check=True, capture_output=True).stdout
        names = subprocess.run(["tar", "-t"], input=listing, check=True, capture_output=True).stdout.decode()
        paths = ["/." if n in ("./", ".") else "/" + n.removeprefix("./").rstrip("/") for n in names.splitlines()]
        suffix = f":{fields['Architecture']}" if fields.get("Multi-Arch") == "same" else ""
        (info / f"{fields['Package']}{suffix}.list").write_text("".join(p + "\n" for p in paths))
    return fields


def main(argv: list[str]) -> int:
    cache = cache_dir()
    if argv[:1] == ["--list"]:
        for pin in PINS:
            print(f"{pin.kind:5} {pin.name}=={pin.version}  ~{pin.size_mib} MiB  sha256:{pin.sha256}")
        return 0
    if argv:
        print(f"fetch-real-binaries: unknown argument {argv[0]!r} (only --list)", file=sys.stderr)
        return 2
    for pin in PINS:
        try:
            fetch(pin, cache)
        except (FetchError, OSError) as exc:
            print(f"fetch-real-binaries: {exc}", file=sys.stderr)
            return 2
    print(cache)
    return 0


if __name__ == "__main__":
    shutil.which("dpkg-deb") or print("fetch-real-binaries: dpkg-deb is needed to lay out the .debs", file=sys.stderr)
    sys.exit(main(sys.argv[1:]))
