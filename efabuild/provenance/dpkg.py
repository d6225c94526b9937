"""The Debian package database inside an image, read from its files (no dpkg run)."""

from __future__ import annotations

import attrs

from efabuild.provenance.fsview import FsView

STATUS_FILE = "/var/lib/dpkg/status"
INFO_DIR = "/var/lib/dpkg/info"
_MAX_STATUS = 64 << 20


@attrs.frozen
class Package:
    name: str
    version: str
    arch: str = ""


def installed_packages(fs: FsView) -> dict[str, Package]:
    """Installed packages by name (status "install ok installed"); {} without a database."""
    text = fs.read_text(STATUS_FILE, max_size=_MAX_STATUS)
    if text is None:
        return {}
    packages: dict[str, Package] = {}
    for paragraph in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in paragraph.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue  # continuation lines of long fields
            name, _, value = line.partition(":")
            fields[name.strip()] = value.strip()
        if "Package" not in fields or "Version" not in fields:
            continue
        if fields.get("Status", "").split()[-1:] != ["installed"]:
            continue
        packages[fields["Package"]] = Package(fields["Package"], fields["Version"], fields.get("Architecture", ""))
    return packages


def owned_files(fs: FsView, package: Package) -> list[str]:
    """Paths the package installed, from its .list file (multi-arch packages add ":<arch>")."""
    names = [f"{INFO_DIR}/{package.name}.list"]
    if package.arch:
        names.insert(0, f"{INFO_DIR}/{package.name}:{package.arch}.list")
    for name in names:
        text = fs.read_text(name, max_size=_MAX_STATUS)
        if text is not None:
            return [line for line in text.splitlines() if line.startswith("/")]
    return []
