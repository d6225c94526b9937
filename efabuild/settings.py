"""BUILD.toml's settings tables: [builder], [registry], [export], [audit], [sign], [trust]; [store]
is storesettings.py's (read on `efabuild lookup`'s fast path), its names importable from here too.

Stdlib only, as that fast path reads this module: the tables' values are NamedTuples, as frozen
as attrs classes but costing no import. Also the vocabulary [audit] policies use: the measured
components and the pins.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NamedTuple

from efabuild import grammar
from efabuild.configfile import Table, builder_platforms, check_known, platform_list
from efabuild.errors import InputError
from efabuild.grammar import split_farm_entry
from efabuild.storesettings import (  # noqa: F401 - [store]'s, kept importable from here
    BUILD_FILE, DEFAULT_KEEP, DEFAULT_LOCAL, S3Config, StoreConfig, parse_s3_table, parse_store_table, store_dir)

TABLES = ("workspace", "store", "builder", "registry", "export", "audit", "sign", "trust")
VERSION = re.compile(r"[0-9][0-9A-Za-z.+-]*")
VERSION_SPEC = re.compile(r"([a-z0-9-]+)\s*(>=|<=|==|<|>)\s*([0-9][0-9A-Za-z.+-]*)")
BUILDER_KEYS = ("platform", "platforms", "emulate", "jobs", "context", "host", "buildx_builder", "farm")
COMPRESSIONS = ("gzip", "lzo", "lz4", "xz", "zstd", "lzma")


DEFAULT_PLATFORM = "linux/amd64"

# The components an image probe measures, in display order; [audit] policies name them.
COMPONENTS = ("ngc-release", "cuda", "nccl", "cudnn", "cublas", "pytorch", "triton", "libfabric", "aws-ofi-nccl",
              "efa-installer", "deepep")
# What [audit] required_pins may name, besides "arg:NAME".
KNOWN_PINS = ("base-digest", "deepep-commit", "efa-installer")


class BuilderSettings(NamedTuple):
    """Which BuildKit builds: the local engine, a Docker context/host, or a buildx builder; for
    which platforms, and which of them may be built under QEMU emulation."""

    platforms: tuple[str, ...] = (DEFAULT_PLATFORM,)
    jobs: int = 2
    context: str | None = None  # docker context name
    host: str | None = None  # DOCKER_HOST-style URL, e.g. unix:///run/other.sock, ssh://builder
    buildx_builder: str | None = None  # a `docker buildx` builder name
    # several builders, as --builder names them (context, host URL, buildx:NAME): layers are
    # spread across them and reach each other through [registry]
    farm: tuple[str, ...] = ()
    # platforms no builder runs natively that may be built under QEMU (binfmt_misc) all the same
    emulate: tuple[str, ...] = ()

    @property
    def platform(self) -> str:
        """The first platform: a one-platform workspace's only one."""
        return self.platforms[0]

    @property
    def several(self) -> bool:
        """More than one platform: names then carry `@platform` (plan, make, ls)."""
        return len(self.platforms) > 1


class RegistrySettings(NamedTuple):
    """Optional layer cache: built layer images are pushed to and pulled from here."""

    url: str  # host[:port][/path], e.g. 123.dkr.ecr.us-east-1.amazonaws.com or 127.0.0.1:5000
    insecure: bool = False


class ExportSettings(NamedTuple):
    """How an image becomes a .sqsh: mksquashfs options (Enroot's by default)."""

    compression: str = "lzo"
    compress_data: bool = False  # Enroot's -noD: data blocks uncompressed
    extra_options: tuple[str, ...] = ()
    # file times written by a build are clamped to the base's creation time (see export/squash.py)
    clamp_times: bool = True
    incremental: bool = True  # False (or make --full-export): never from the ancestor's .sqsh

    def mksquashfs_options(self) -> tuple[str, ...]:
        opts = ("-comp", self.compression)
        if not self.compress_data:
            opts += ("-noD",)
        return opts + self.extra_options


class AuditPolicy(NamedTuple):
    host_efa_installer: str | None = None  # the host AMI's EFA installer version
    min_versions: tuple[tuple[str, str], ...] = ()  # (component, minimum version)
    required_pins: tuple[str, ...] = ()  # e.g. "base-digest", "deepep-commit"
    # (component, version spec, component, version spec, why): a combination known to break
    known_bad: tuple[tuple[str, str, str, str, str], ...] = ()


class SignSettings(NamedTuple):
    """[sign]: the key make signs every exported artifact's statement with."""

    key: str  # a PEM private key file (relative to the workspace) or a KMS key ARN
    region: str | None = None  # KMS only; default: the ARN's region
    endpoint_url: str | None = None  # KMS-compatible endpoints only


class Settings(NamedTuple):
    graph_files: tuple[str, ...] = ("graphs/*.toml",)
    store: StoreConfig = StoreConfig(local=Path("cache"))
    builder: BuilderSettings = BuilderSettings()
    registry: RegistrySettings | None = None
    export: ExportSettings = ExportSettings()
    audit: AuditPolicy = AuditPolicy()
    sign: SignSettings | None = None
    trust_keys: tuple[str, ...] = ()  # [trust] keys: checked by settings.py, read by efabuild.signing.trust


def parse_settings(data: dict[str, Any], file: str, root: Path) -> Settings:
    """Every settings table of BUILD.toml's `data`; `file` names BUILD.toml in messages."""
    top = Table(data, file, "", TABLES)
    ws = top.table("workspace", ("graphs",))
    default_graphs = Settings().graph_files
    return Settings(
        graph_files=ws.str_list("graphs", default_graphs) if ws else default_graphs,
        store=parse_store_table(data.get("store"), root, file),
        builder=_builder(top.table("builder", BUILDER_KEYS)),
        registry=_registry(top.table("registry", ("url", "insecure"))),
        export=_export(top.table("export", ("compression", "compress_data", "extra_options", "clamp_times", "incremental"))),
        audit=_audit(top.table("audit", ("host_efa_installer", "min_versions", "required_pins", "known_bad"))),
        sign=_sign(top.table("sign", ("key", "region", "endpoint_url"))),
        trust_keys=_trust(top.table("trust", ("keys", "endpoint_url"))),
    )


# --- [builder], [registry], [export] ------------------------------------------------------------


def _builder(t: Table | None) -> BuilderSettings:
    if t is None:
        return BuilderSettings()
    jobs = t.get("jobs", int, 2)
    if jobs < 1:
        raise InputError("must be at least 1", t.where("jobs"))
    chosen = [k for k in ("context", "host", "buildx_builder", "farm") if k in t.data]
    if len(chosen) > 1:
        raise InputError(f"set only one of {', '.join(chosen)}", t.where(chosen[1]))
    checks = {"context": grammar.tool_name_problem, "host": grammar.host_problem, "buildx_builder": grammar.tool_name_problem}
    values = {key: t.get(key, str) for key in checks}
    for key, value in values.items():
        problem = value is not None and checks[key](value)
        if problem:
            raise InputError(problem, t.where(key))
    farm = t.str_list("farm")
    if "farm" in t.data and not farm:
        raise InputError("an empty list: name the builders (contexts, host URLs or buildx:NAME)", t.where("farm"))
    platforms = builder_platforms(t, DEFAULT_PLATFORM)
    for entry in farm:
        builder, declared = split_farm_entry(entry)
        problem = grammar.builder_problem(builder) or next(
            (f"{p}: not in [builder] platforms ({', '.join(platforms)})" for p in declared if p not in platforms),
            None)
        if problem:
            from efabuild.redact import shown_value  # here: lookup's fast path imports no blake3

            raise InputError(f"{shown_value('farm', entry)!r}: {problem}", t.where("farm"))
    emulate = platform_list(t, "emulate", allowed=platforms) if "emulate" in t.data else ()
    return BuilderSettings(
        platforms=platforms, jobs=jobs, context=values["context"], host=values["host"],
        buildx_builder=values["buildx_builder"], farm=tuple(dict.fromkeys(farm)), emulate=emulate,
    )


def _registry(t: Table | None) -> RegistrySettings | None:
    if t is None:
        return None
    url = t.get("url", str)
    if not url:
        raise InputError("missing: the layer-cache registry needs a url", t.where("url"))
    problem = grammar.registry_problem(url.rstrip("/"))
    if problem:
        raise InputError(problem, t.where("url"))
    return RegistrySettings(url=url.rstrip("/"), insecure=t.get("insecure", bool, False))


def _export(t: Table | None) -> ExportSettings:
    if t is None:
        return ExportSettings()
    compression = t.get("compression", str, "lzo")
    if compression not in COMPRESSIONS:
        raise InputError(f"unknown compression '{compression}' (one of {', '.join(COMPRESSIONS)})",
                         t.where("compression"))
    extra = t.str_list("extra_options")
    problem = grammar.extra_options_problem(extra)
    if problem:
        raise InputError(problem, t.where("extra_options"))
    return ExportSettings(compression=compression, compress_data=t.get("compress_data", bool, False),
                          extra_options=extra, clamp_times=t.get("clamp_times", bool, True),
                          incremental=t.get("incremental", bool, True))


# --- [audit], [sign], [trust] -------------------------------------------------------------------


def _audit(t: Table | None) -> AuditPolicy:
    if t is None:
        return AuditPolicy()
    components = (*COMPONENTS, "openmpi")
    minimums = t.get("min_versions", dict, {})
    for component, version in minimums.items():
        check_known(component, components, t.where(f"min_versions.{component}"), "component")
        if not isinstance(version, str) or not VERSION.fullmatch(version):
            raise InputError("must be a version string like \"1.19.0\"", t.where(f"min_versions.{component}"))
    for pin in t.str_list("required_pins"):
        if not (pin.startswith("arg:") and grammar.ARG_NAME.fullmatch(pin[4:])):
            check_known(pin, KNOWN_PINS, t.where("required_pins"), "pin (or arg:NAME)")
    known_bad = tuple(_known_bad(Table(entry, t.file, f"audit.known_bad[{index}]", ("when", "and", "why")),
                                 components) for index, entry in enumerate(t.get("known_bad", list, [])))
    host_efa_installer = t.get("host_efa_installer", str)
    if host_efa_installer is not None and not VERSION.fullmatch(host_efa_installer):
        raise InputError("must be a version string like \"1.50.0\"", t.where("host_efa_installer"))
    return AuditPolicy(
        host_efa_installer=host_efa_installer,
        min_versions=tuple(sorted(minimums.items())),
        required_pins=t.str_list("required_pins"),
        known_bad=known_bad,
    )


def _known_bad(item: Table, components: tuple[str, ...]) -> tuple[str, str, str, str, str]:
    """One [[audit.known_bad]] entry: (component, spec, component, spec, why)."""
    parts: list[str] = []
    for key in ("when", "and"):
        match = VERSION_SPEC.fullmatch(item.get(key, str) or "")
        if not match:
            raise InputError("must look like 'nccl>=2.19'", item.where(key))
        check_known(match.group(1), components, item.where(key), "component")
        parts += [match.group(1), match.group(2) + match.group(3)]
    return (parts[0], parts[1], parts[2], parts[3], item.get("why", str, ""))


def _sign(t: Table | None) -> SignSettings | None:
    if t is None:
        return None
    key = t.get("key", str)
    if not key:
        raise InputError("missing: a PEM private key file or a KMS key ARN to sign with", t.where("key"))
    region, endpoint_url = t.get("region", str), t.get("endpoint_url", str)
    # boto3 would raise a traceback, or repeat a password in its messages
    for name, value, check in (("region", region, grammar.region_problem),
                               ("endpoint_url", endpoint_url, grammar.endpoint_url_problem)):
        problem = value is not None and check(value)
        if problem:
            raise InputError(problem, t.where(name))
    return SignSettings(key=key, region=region, endpoint_url=endpoint_url)


def _trust(t: Table | None) -> tuple[str, ...]:
    if t is None:
        return ()
    endpoint_url = t.get("endpoint_url", str)
    problem = endpoint_url is not None and grammar.endpoint_url_problem(endpoint_url)
    if problem:
        raise InputError(problem, t.where("endpoint_url"))
    keys = t.str_list("keys")
    if not all(k.strip() for k in keys):
        raise InputError("an empty entry: give PEM public key files, PEM keys or KMS key ARNs", t.where("keys"))
    return keys
