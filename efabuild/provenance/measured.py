"""What a probe found in an image, as frozen values with a stable JSON form.

Every value says where it was read from (`source`: an image path, `env:NAME` or `label:NAME`).
A value that could not be read is None: unknown, never a guess.
"""

from __future__ import annotations

from typing import Any

import attrs

from efabuild.provenance import elf


@attrs.frozen
class Copy:
    """One installed copy of a library or package found in the image."""

    path: str
    version: str | None
    source: str | None  # where the version was read (the file itself, a .pc file, dpkg...)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "version": self.version, "source": self.source}


@attrs.frozen
class Hit:
    """A file the dynamic loader finds under a library's name in one search directory."""

    path: str  # <dir>/<name>, e.g. /opt/amazon/efa/lib/libfabric.so.1
    real_path: str  # after symlinks: which copy it is
    version: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "real_path": self.real_path, "version": self.version}


@attrs.frozen
class Component:
    name: str
    version: str | None = None
    source: str | None = None
    loads: str | None = None  # the file the dynamic loader picks, for libraries
    copies: tuple[Copy, ...] = ()
    on_path: tuple[Hit, ...] = ()  # every copy the loader can reach by name, in search order
    commit: str | None = None
    commit_source: str | None = None
    packages: tuple[str, ...] = ()  # the EFA installer's package list
    looked_at: tuple[str, ...] = ()  # where the probe looked, for a version it could not read

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "source": self.source}
        if self.version is None and self.looked_at:
            out["looked_at"] = list(self.looked_at)
        if self.loads is not None:
            out["loads"] = self.loads
        if self.copies:
            out["copies"] = [c.to_dict() for c in self.copies]
        if self.on_path:
            out["on_path"] = [h.to_dict() for h in self.on_path]
        if self.commit is not None or self.name == "deepep":
            out["commit"] = self.commit
            out["commit_source"] = self.commit_source
        if self.packages:
            out["packages"] = list(self.packages)
        return out

    @classmethod
    def from_dict(cls, name: str, data: dict[str, Any]) -> Component:
        return cls(
            name=name,
            version=data.get("version"),
            source=data.get("source"),
            loads=data.get("loads"),
            copies=tuple(Copy(c.get("path"), c.get("version"), c.get("source")) for c in data.get("copies", [])),
            on_path=tuple(Hit(h.get("path"), h.get("real_path"), h.get("version")) for h in data.get("on_path", [])),
            commit=data.get("commit"),
            commit_source=data.get("commit_source"),
            packages=tuple(data.get("packages", [])),
            looked_at=tuple(p for p in data.get("looked_at") or [] if isinstance(p, str)),
        )


@attrs.frozen
class MpiInstall:
    path: str  # where it was found, e.g. /usr/local/mpi
    real_path: str  # after symlinks: two paths to one installation are one installation
    version: str | None
    source: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "real_path": self.real_path, "version": self.version, "source": self.source}


@attrs.frozen
class LibDir:
    """One directory of the dynamic loader's search order, and what put it there."""

    dir: str
    source: str  # env:LD_LIBRARY_PATH, an ld.so.conf file, or "default"

    def to_dict(self) -> dict[str, Any]:
        return {"dir": self.dir, "source": self.source}


@attrs.frozen
class Declared:
    """A version an image declares about itself (base image env or label), not measured."""

    name: str  # NCCL_VERSION, com.nvidia.nccl.version...
    value: str
    source: str  # env:NAME or label:NAME

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source}


@attrs.frozen
class Measured:
    components: tuple[Component, ...]
    openmpi: tuple[MpiInstall, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # the EFA-relevant variables, sorted
    env_source: str | None = None  # "image config", "/etc/environment" or None (not known)
    declared_by_base: tuple[Declared, ...] = ()
    library_path: tuple[LibDir, ...] = ()
    packages: tuple[tuple[str, str], ...] = ()  # relevant Debian packages: name, version
    machine: str | None = None  # x86_64, aarch64: the image's machine (None: no ELF file found)
    machine_source: str | None = None  # "platform linux/arm64" or "ELF headers"
    elf: tuple[tuple[str, str], ...] = ()  # path -> machine of the programs, libraries and plugins read

    def component(self, name: str) -> Component:
        for component in self.components:
            if component.name == name:
                return component
        return Component(name)

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def to_dict(self) -> dict[str, Any]:
        return {
            "components": {c.name: c.to_dict() for c in self.components},
            "openmpi": [m.to_dict() for m in self.openmpi],
            "env": {"source": self.env_source, "vars": dict(self.env)},
            "declared_by_base": {d.name: d.to_dict() for d in self.declared_by_base},
            "library_path": [d.to_dict() for d in self.library_path],
            "packages": dict(self.packages),
            # added within v1: absent from manifests made before, read as unknown
            "machine": {"name": self.machine, "architecture": elf.architecture(self.machine),
                        "source": self.machine_source},
            "elf": dict(self.elf),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measured:
        env = data.get("env") or {}
        machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
        elf_files = data.get("elf") if isinstance(data.get("elf"), dict) else {}
        return cls(
            components=tuple(
                Component.from_dict(name, value) for name, value in (data.get("components") or {}).items()
            ),
            openmpi=tuple(
                MpiInstall(m.get("path"), m.get("real_path"), m.get("version"), m.get("source"))
                for m in data.get("openmpi", [])
            ),
            env=tuple(sorted((env.get("vars") or {}).items())),
            env_source=env.get("source"),
            declared_by_base=tuple(
                Declared(name, d.get("value"), d.get("source"))
                for name, d in sorted((data.get("declared_by_base") or {}).items())
            ),
            library_path=tuple(LibDir(d.get("dir"), d.get("source")) for d in data.get("library_path", [])),
            packages=tuple(sorted((data.get("packages") or {}).items())),
            machine=_text(machine.get("name")),
            machine_source=_text(machine.get("source")),
            elf=tuple(sorted((str(k), str(v)) for k, v in elf_files.items())),
        )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
