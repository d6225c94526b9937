"""From observations to diagnoses, following the guide's troubleshooting table.

Pure: `Facts` (what the logs showed, counted, with the first few lines of each) in, diagnoses out.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from efabuild.doctor.scan import LogLine, Observation
from efabuild.nccl import INFINIBAND_PREFIXES, is_ofi_plugin

SEVERITIES = ("problem", "warning", "ok", "info", "harmless")
EVIDENCE_PER_DIAGNOSIS = 3
LOW_BANDWIDTH_RATIO = 0.5  # the guide sees 1/4-1/10 of baseline; half is already far below
EFA_NETWORKS = ("Libfabric", "AWS Libfabric")
# InfiniBand/SHARP settings NCCL reports from the environment ("NCCL_IB_HCA set by environment to ...")
IB_PREFIXES = INFINIBAND_PREFIXES


@attrs.frozen
class Evidence:
    file: str
    line: int
    text: str

    @classmethod
    def of(cls, line: LogLine) -> Evidence:
        return cls(file=line.file, line=line.number, text=line.text)


@attrs.frozen
class Diagnosis:
    id: str
    severity: str  # problem | warning | ok | info | harmless
    title: str
    explanation: str
    fix: str
    evidence: tuple[Evidence, ...] = ()

    def to_json(self) -> dict:
        return attrs.asdict(self)


class Facts:
    """Observations grouped by kind and value, keeping counts and the first lines of each."""

    def __init__(self, observations: Iterable[Observation] = ()) -> None:
        self.groups: dict[tuple[str, str | None], list[Observation]] = {}
        self.counts: dict[tuple[str, str | None], int] = {}
        self.busbw: list[tuple[float, LogLine]] = []
        for observation in observations:
            self.add(observation)

    def add(self, observation: Observation) -> None:
        if observation.kind in ("busbw-row", "busbw", "busbw-avg"):
            values = [observation.value, observation.extra] if observation.kind == "busbw-row" else \
                [observation.value]
            for value in values:
                if value:
                    self.busbw.append((float(value), observation.line))
            key = (observation.kind, None)
        else:
            key = (observation.kind, observation.value)
        self.counts[key] = self.counts.get(key, 0) + 1
        group = self.groups.setdefault(key, [])
        if len(group) < EVIDENCE_PER_DIAGNOSIS:
            group.append(observation)

    def of(self, kind: str) -> list[Observation]:
        return [o for (k, _), group in self.groups.items() if k == kind for o in group]

    def values(self, kind: str) -> list[str]:
        """Distinct values seen for a kind, in first-seen order."""
        return [v for (k, v) in self.groups if k == kind and v is not None]

    def has(self, kind: str) -> bool:
        return any(k == kind for k, _ in self.groups)

    def count(self, kind: str) -> int:
        return sum(n for (k, _), n in self.counts.items() if k == kind)

    def evidence(self, *kinds: str, values: Iterable[str] | None = None) -> tuple[Evidence, ...]:
        wanted = set(values) if values is not None else None
        found = [Evidence.of(o.line) for kind in kinds for o in self.of(kind)
                 if wanted is None or o.value in wanted]
        unique = sorted(set(found), key=lambda e: (e.file, e.line))
        return tuple(unique[:EVIDENCE_PER_DIAGNOSIS])

    def peak_busbw(self) -> tuple[float, LogLine] | None:
        rows = [(v, line) for v, line in self.busbw]
        return max(rows, key=lambda item: item[0]) if rows else None


def _env(facts: Facts) -> dict[str, str]:
    """NCCL_* settings NCCL reported from the environment (first value seen)."""
    out: dict[str, str] = {}
    for observation in facts.of("env"):
        out.setdefault(observation.value or "", observation.extra or "")
    return out


def diagnose(facts: Facts, expect_nics: int | None = None, baseline_gbps: float | None = None) -> list[Diagnosis]:
    out: list[Diagnosis] = []
    networks = facts.values("network")
    on_efa = any(n in EFA_NETWORKS for n in networks)
    providers = facts.values("provider")
    env = _env(facts)
    ib_settings = sorted(name for name in env if name.startswith(IB_PREFIXES)
                         and not (name in ("NCCL_IB_DISABLE", "NCCL_IBEXT_DISABLE") and env[name] == "1"))
    plugin_env = env.get("NCCL_NET_PLUGIN")

    # --- the network path ------------------------------------------------------------------------
    if on_efa:
        nics = facts.values("nics")
        nic_text = f", found {' / '.join(nics)} nics" if nics else ""
        provider_text = f"provider {', '.join(providers)}" if providers else "provider not logged"
        out.append(Diagnosis(
            "efa-path", "ok", "NCCL runs over EFA",
            f"'Using network {networks[0] if networks[0] in EFA_NETWORKS else 'Libfabric'}' with {provider_text}"
            f"{nic_text}: the aws-ofi-nccl plugin carries the inter-node traffic.",
            "nothing to do" + ("" if expect_nics is not None or not nics else
                               "; pass --expect-nics N to check the nic count against the instance's EFA devices"),
            facts.evidence("network", "provider", values=[*EFA_NETWORKS, *providers])))
        if providers and any(p != "efa" for p in providers):
            out.append(Diagnosis(
                "not-efa-provider", "problem", f"libfabric provider {', '.join(providers)}, not efa",
                "aws-ofi-nccl picked a libfabric provider other than efa (e.g. tcp or sockets): traffic does not "
                "use the EFA devices.",
                "check that /dev/infiniband is visible in the container and FI_PROVIDER is unset or efa",
                facts.evidence("provider")))
    if expect_nics is not None:
        nics = facts.values("nics")
        wrong = [n for n in nics if int(n) != expect_nics]
        if wrong:
            out.append(Diagnosis(
                "nic-count", "problem", f"found {' / '.join(wrong)} nics, expected {expect_nics}",
                "aws-ofi-nccl saw a different number of EFA devices than the instance has: some devices are "
                "not visible in the container, or the job runs on another instance type.",
                "check `ls /dev/infiniband` in the container (Enroot: ENROOT_RESTRICT_DEV n) and the instance "
                "type; compare with `fi_info -p efa -t FI_EP_RDM` on the host",
                facts.evidence("nics", values=wrong)))
        elif not nics and on_efa:
            out.append(Diagnosis(
                "nic-count-unknown", "warning", "the nic count is not in the log",
                "NCCL ran over Libfabric but no 'found N nics' line was logged, so --expect-nics could not be "
                "checked.", "run with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS unset or including INIT,NET)"))
    socket = [n for n in networks if n == "Socket"]
    if socket or (facts.has("socket-transport") and not on_efa):
        causes = []
        if plugin_env is not None and not is_ofi_plugin(plugin_env):
            causes.append(f"NCCL_NET_PLUGIN is '{plugin_env}', not 'ofi'")
        elif plugin_env is None and facts.has("env"):
            causes.append("NCCL_NET_PLUGIN was not reported as set: the default libnccl-net.so is the "
                          "InfiniBand plugin")
        if ib_settings:
            causes.append(f"InfiniBand settings are set ({', '.join(ib_settings)})")
        if facts.has("plugin-missing") or facts.has("plugin-unsupported") or facts.has("plugin-init-failed"):
            causes.append("the aws-ofi-nccl plugin did not load or initialise (see below)")
        if facts.has("no-device"):
            causes.append("no EFA device is visible in the container")
        if env.get("NCCL_NET", "").lower() == "socket":
            causes.append("NCCL_NET=Socket forces TCP")
        if not causes:
            causes = ["NCCL_NET_PLUGIN not 'ofi'", "leftover InfiniBand NCCL_* settings",
                      "the aws-ofi-nccl plugin missing from the library path",
                      "no /dev/infiniband in the container"]
        mixed = " on some ranks (others use Libfabric)" if on_efa else ""
        out.append(Diagnosis(
            "tcp-fallback", "problem", f"NCCL fell back to TCP sockets{mixed}",
            "'Using network Socket' means NCCL did not use EFA; communication is many times slower. "
            f"Likely cause{'s' if len(causes) > 1 else ''}: {'; '.join(causes)}.",
            "keep NCCL_NET_PLUGIN=ofi, remove InfiniBand NCCL_* settings, and check that the image's "
            "/opt/amazon/ofi-nccl/lib leads LD_LIBRARY_PATH (efabuild lint, efabuild audit)",
            facts.evidence("network", "socket-transport", values=["Socket", *facts.values("socket-transport")])))
    if "IB" in networks:
        out.append(Diagnosis(
            "ib-network", "problem", "NCCL chose its InfiniBand transport",
            "'Using network IB' on an EFA cluster means the ofi plugin was not used; EFA does not speak IB verbs "
            "to NCCL's internal transport.",
            "keep NCCL_NET_PLUGIN=ofi and remove NCCL_NET=IB and NCCL_IB_* settings",
            facts.evidence("network", values=["IB"])))

    # --- plugin and device trouble ----------------------------------------------------------------
    plugin_kinds = ("plugin-missing", "plugin-unsupported", "plugin-init-failed", "plugin-internal")
    if any(facts.has(k) for k in plugin_kinds):
        if on_efa and not socket:
            out.append(Diagnosis(
                "plugin-load-noise", "info", "a network plugin name failed to load, but Libfabric was used",
                "NCCL tried a plugin file that is not there before finding aws-ofi-nccl; the EFA path works.",
                "nothing to do", facts.evidence(*plugin_kinds)))
        else:
            missing = ", ".join(v for v in facts.values("plugin-missing") if v) or "the net plugin"
            out.append(Diagnosis(
                "plugin-load-failed", "problem", "the NCCL network plugin did not load",
                f"NCCL could not load or initialise its network plugin ({missing}); without aws-ofi-nccl it "
                "uses its internal IB/Socket transports, which on EFA means TCP.",
                "check that /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so exists in the image, that "
                "NCCL_NET_PLUGIN=ofi, and that /opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib lead LD_LIBRARY_PATH",
                facts.evidence(*plugin_kinds)))
    if facts.has("no-device") and on_efa and "efa" in providers:
        # aws-ofi-nccl tries its RDMA protocol first; without RDMA (g5, g6, p3dn...) that probe fails
        # and it falls back to SENDRECV on the same EFA devices
        out.append(Diagnosis(
            "rdma-protocol-unavailable", "info", "the RDMA protocol is not available; SENDRECV is used",
            "aws-ofi-nccl probes its RDMA protocol first; 'fi_getinfo() ... No data available' from that probe "
            "is normal on instances without EFA RDMA, and the job ran over the efa provider anyway.",
            "nothing to do (instances with EFA RDMA, such as p4d/p5/p6, use the RDMA protocol)",
            facts.evidence("no-device")))
    elif facts.has("no-device"):
        out.append(Diagnosis(
            "no-efa-device", "problem", "libfabric found no EFA device (fi_getinfo: no data)",
            "'fi_getinfo() call failed: No data available' means libfabric sees no EFA device in the container: "
            "/dev/infiniband is not there (Enroot restricts devices, or the pod lacks the EFA device plugin), or "
            "the instance has no EFA.",
            "set ENROOT_RESTRICT_DEV n in enroot.conf (or request the EFA devices); check `ls /dev/infiniband` "
            "in the container", facts.evidence("no-device")))
    if facts.has("libfabric-too-old"):
        out.append(Diagnosis(
            "libfabric-too-old", "problem", "the libfabric in use is too old for this aws-ofi-nccl",
            "aws-ofi-nccl refused the EFA provider because the libfabric it loaded is older than it needs: an "
            "older copy (the base image's, or a host mount) comes first on the library path.",
            "put /opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib first on LD_LIBRARY_PATH and drop host library "
            "mounts", facts.evidence("libfabric-too-old")))
    if facts.has("tuner-missing"):
        out.append(Diagnosis(
            "tuner-missing", "info", "the NCCL tuner plugin was not found",
            "NCCL_TUNER_PLUGIN names a plugin that is not on the library path; NCCL uses its internal tuner. "
            "Communication works, collectives may pick less tuned algorithms.",
            "keep /opt/amazon/ofi-nccl/lib on LD_LIBRARY_PATH (it carries the ofi tuner)",
            facts.evidence("tuner-missing")))

    # --- environment left over from InfiniBand clusters ---------------------------------------------
    if plugin_env is not None and not is_ofi_plugin(plugin_env) and not socket:
        out.append(Diagnosis(
            "net-plugin-env", "warning", f"NCCL_NET_PLUGIN={plugin_env}",
            "Only NCCL_NET_PLUGIN=ofi selects aws-ofi-nccl; the default libnccl-net.so is the InfiniBand plugin.",
            "keep NCCL_NET_PLUGIN=ofi", facts.evidence("env", values=["NCCL_NET_PLUGIN"])))
    if ib_settings and not socket:
        out.append(Diagnosis(
            "ib-settings", "warning", f"InfiniBand NCCL settings in the environment: {', '.join(ib_settings)}",
            "Leftover InfiniBand settings do nothing useful on EFA and can push NCCL off it.",
            f"unset {' '.join(ib_settings)}", facts.evidence("env", values=ib_settings)))

    # --- MPI, build and container start ---------------------------------------------------------------
    if facts.has("mpi-clash"):
        out.append(Diagnosis(
            "mpi-clash", "problem", "two Open MPI installations mixed (opal_shmem_base_select / MPI_INIT failed)",
            "A program built against one Open MPI loaded another's components: on an NGC image, the EFA "
            "installer's Open MPI (/opt/amazon/openmpi) was put on PATH/LD_LIBRARY_PATH next to NGC's "
            "/usr/local/mpi.",
            "keep only the NGC Open MPI on the paths; check communication inside the container with a "
            "PyTorch-based measurement, not an MPI benchmark", facts.evidence("mpi-clash")))
    if facts.has("apt-lists-empty"):
        out.append(Diagnosis(
            "apt-lists-empty", "problem", "the EFA installer could not find its apt dependencies",
            "'Unable to locate package environment-modules' / 'failed to install third-party dependencies': the "
            "apt lists were empty in the layer that ran efa_installer.sh.",
            "run `apt-get update` in the same RUN as efa_installer.sh, before it (efabuild lint: EFA001)",
            facts.evidence("apt-lists-empty")))
    if facts.has("cuda-forward-compat"):
        out.append(Diagnosis(
            "cuda-forward-compat", "info", "CUDA Forward Compatibility mode ENABLED: normal",
            "The container's CUDA is newer than the host driver's; the forward-compatibility libraries bridge "
            "the gap. GPU work, NCCL/EFA and training run normally.",
            "nothing to do; test custom CUDA kernels in this setting", facts.evidence("cuda-forward-compat")))

    # --- bandwidth ------------------------------------------------------------------------------------
    peak = facts.peak_busbw()
    if peak is not None:
        value, line = peak
        if baseline_gbps and value < LOW_BANDWIDTH_RATIO * baseline_gbps and not socket:
            out.append(Diagnosis(
                "low-bandwidth", "problem",
                f"bus bandwidth {value:g} GB/s is {value / baseline_gbps:.0%} of the {baseline_gbps:g} GB/s baseline",
                ("On the EFA path (Libfabric) " if on_efa else "") + "bandwidth at 1/4-1/10 of baseline usually "
                "means too few CPU cores per rank: the plugin's progress threads starve.",
                "give each rank more cores, e.g. `--cpus-per-task=24` (required in the validated 2-node run)",
                (Evidence.of(line),)))
        else:
            versus = f" ({value / baseline_gbps:.0%} of the {baseline_gbps:g} GB/s baseline)" if baseline_gbps else ""
            out.append(Diagnosis(
                "bandwidth", "info", f"peak bus bandwidth {value:g} GB/s{versus}",
                "The highest bus bandwidth in the log (nccl-tests rows or busbw lines).",
                "pass --baseline-gbps X to compare with a known-good run" if not baseline_gbps else "nothing to do",
                (Evidence.of(line),)))

    # --- lines that alarm people but are fine ----------------------------------------------------------
    if facts.has("harmless-collnet"):
        out.append(Diagnosis(
            "collnet-symbol", "harmless", "'Failed to find ncclCollNetPlugin symbol': harmless",
            "aws-ofi-nccl provides no CollNet (SHARP) interface; NCCL notes it and carries on.",
            "nothing to do", facts.evidence("harmless-collnet")))
    if facts.has("optional-plugin-missing"):
        kinds = "/".join(facts.values("optional-plugin-missing"))
        out.append(Diagnosis(
            "optional-plugin", "harmless", f"'{kinds}/Plugin: Could not find': harmless",
            "NCCL looks for optional profiler/GIN/env plugins; none is installed and none is needed.",
            "nothing to do", facts.evidence("optional-plugin-missing")))
    if facts.has("bootstrap") and not socket:
        out.append(Diagnosis(
            "bootstrap-socket", "harmless", "'Bootstrap : Using eth0': harmless",
            "NCCL always bootstraps over a TCP socket; that is not the data path and not a TCP fallback.",
            "nothing to do", facts.evidence("bootstrap")))

    if not out:
        out.append(Diagnosis(
            "nothing-recognised", "info", "no NCCL, MPI or build lines recognised",
            "The logs hold none of the lines doctor knows (NCCL_DEBUG=INFO output, nccl-tests, build logs).",
            "run the job with NCCL_DEBUG=INFO and pass its output"))
    return out


def versions_seen(facts: Facts) -> dict[str, list[tuple[str, Evidence]]]:
    """component -> [(version, first line showing it)] for nccl, aws-ofi-nccl and libfabric."""
    out: dict[str, list[tuple[str, Evidence]]] = {}
    for component, kind in (("nccl", "nccl-version"), ("aws-ofi-nccl", "ofi-version"),
                            ("libfabric", "libfabric-version")):
        seen = [(o.value, Evidence.of(o.line)) for o in facts.of(kind) if o.value]
        first: dict[str, Evidence] = {}
        for version, evidence in seen:
            first.setdefault(version, evidence)
        if first:
            out[component] = list(first.items())
    return out


def mixed_versions(seen: dict[str, list[tuple[str, Evidence]]]) -> list[Diagnosis]:
    out = []
    for component, versions in seen.items():
        distinct = {normal_version(component, v) for v, _ in versions}
        if len(distinct) > 1:
            out.append(Diagnosis(
                "mixed-versions", "warning", f"{component}: {' and '.join(v for v, _ in versions)} in one job",
                "Ranks loaded different versions: nodes run different images, or a host library shadows the "
                "image's on some nodes.",
                "run every node from the same .sqsh and drop host library mounts",
                tuple(e for _, e in versions[:EVIDENCE_PER_DIAGNOSIS])))
    return out


def normal_version(component: str, version: str) -> str:
    """Comparable form: aws-ofi-nccl without '-aws'; libfabric as major.minor (all NCCL logs show)."""
    version = version.strip().removeprefix("v")
    if component == "aws-ofi-nccl":
        return version.removesuffix("-aws")
    if component == "libfabric":
        return ".".join(version.split(".")[:2])
    return version
