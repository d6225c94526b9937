"""From observations to diagnoses, following the guide's troubleshooting table.

Pure: `Facts` (what the logs showed) in, diagnoses out. Each rule is a small function
`(Seen) -> Iterable[Diagnosis]`, registered in RULES with the diagnosis ids it gives and what it
catches; `diagnose` runs them in registration order, which is the report's order within a severity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import attrs

from efabuild.doctor.facts import Diagnosis, Evidence, Facts
from efabuild.nccl import INFINIBAND_PREFIXES, is_ofi_plugin

LOW_BANDWIDTH_RATIO = 0.5  # the guide sees 1/4-1/10 of baseline; half is already far below
EFA_NETWORKS = ("Libfabric", "AWS Libfabric")
# InfiniBand/SHARP settings NCCL reports from the environment ("NCCL_IB_HCA set by environment to ...")
IB_PREFIXES = INFINIBAND_PREFIXES
PLUGIN_KINDS = ("plugin-missing", "plugin-unsupported", "plugin-init-failed", "plugin-internal")


@attrs.frozen
class Seen:
    """The facts with what several rules ask of them worked out once, and the caller's expectations."""
    facts: Facts
    expect_nics: int | None
    baseline_gbps: float | None
    networks: list[str]
    providers: list[str]
    env: dict[str, str]  # NCCL_* settings NCCL reported from the environment (first value seen)
    ib_settings: list[str]

    @classmethod
    def of(cls, facts: Facts, expect_nics: int | None, baseline_gbps: float | None) -> Seen:
        env: dict[str, str] = {}
        for observation in facts.of("env"):
            env.setdefault(observation.value or "", observation.extra or "")
        ib_settings = sorted(name for name in env if name.startswith(IB_PREFIXES)
                             and not (name in ("NCCL_IB_DISABLE", "NCCL_IBEXT_DISABLE") and env[name] == "1"))
        return cls(facts, expect_nics, baseline_gbps, facts.values("network"), facts.values("provider"), env,
                   ib_settings)

    @property
    def on_efa(self) -> bool:
        return any(n in EFA_NETWORKS for n in self.networks)

    @property
    def on_socket(self) -> bool:
        return "Socket" in self.networks

    @property
    def plugin_env(self) -> str | None:
        return self.env.get("NCCL_NET_PLUGIN")


DiagnosisRule = Callable[[Seen], Iterable[Diagnosis]]


@attrs.frozen
class Rule:
    ids: tuple[str, ...]  # the diagnosis ids it may give
    catches: str
    check: DiagnosisRule


RULES: list[Rule] = []


def rule(*ids: str, catches: str) -> Callable[[DiagnosisRule], DiagnosisRule]:
    def register(fn: DiagnosisRule) -> DiagnosisRule:
        RULES.append(Rule(ids, catches, fn))
        return fn

    return register


def diagnose(facts: Facts, expect_nics: int | None = None, baseline_gbps: float | None = None) -> list[Diagnosis]:
    seen = Seen.of(facts, expect_nics, baseline_gbps)
    out = [d for r in RULES for d in r.check(seen)]
    if not out:
        out.append(Diagnosis(
            "nothing-recognised", "info", "no NCCL, MPI or build lines recognised",
            "The logs hold none of the lines doctor knows (NCCL_DEBUG=INFO output, nccl-tests, build logs).",
            "run the job with NCCL_DEBUG=INFO and pass its output"))
    return out


# --- the network path ----------------------------------------------------------------------------

@rule("efa-path", catches="NCCL over Libfabric: the EFA path works (with its provider and nic count)")
def efa_path(seen: Seen) -> Iterator[Diagnosis]:
    if not seen.on_efa:
        return
    facts, networks, providers = seen.facts, seen.networks, seen.providers
    nics = facts.values("nics")
    nic_text = f", found {' / '.join(nics)} nics" if nics else ""
    provider_text = f"provider {', '.join(providers)}" if providers else "provider not logged"
    yield Diagnosis(
        "efa-path", "ok", "NCCL runs over EFA",
        f"'Using network {networks[0] if networks[0] in EFA_NETWORKS else 'Libfabric'}' with {provider_text}"
        f"{nic_text}: the aws-ofi-nccl plugin carries the inter-node traffic.",
        "nothing to do" + ("" if seen.expect_nics is not None or not nics else
                           "; pass --expect-nics N to check the nic count against the instance's EFA devices"),
        facts.evidence("network", "provider", values=[*EFA_NETWORKS, *providers]))


@rule("not-efa-provider", catches="aws-ofi-nccl on a libfabric provider other than efa (tcp, sockets)")
def not_efa_provider(seen: Seen) -> Iterator[Diagnosis]:
    providers = seen.providers
    if seen.on_efa and providers and any(p != "efa" for p in providers):
        yield Diagnosis(
            "not-efa-provider", "problem", f"libfabric provider {', '.join(providers)}, not efa",
            "aws-ofi-nccl picked a libfabric provider other than efa (e.g. tcp or sockets): traffic does not "
            "use the EFA devices.",
            "check that /dev/infiniband is visible in the container and FI_PROVIDER is unset or efa",
            seen.facts.evidence("provider"))


@rule("nic-count", "nic-count-unknown", catches="a nic count other than --expect-nics, or none logged")
def nic_count(seen: Seen) -> Iterator[Diagnosis]:
    if seen.expect_nics is None:
        return
    nics = seen.facts.values("nics")
    wrong = [n for n in nics if int(n) != seen.expect_nics]
    if wrong:
        yield Diagnosis(
            "nic-count", "problem", f"found {' / '.join(wrong)} nics, expected {seen.expect_nics}",
            "aws-ofi-nccl saw a different number of EFA devices than the instance has: some devices are "
            "not visible in the container, or the job runs on another instance type.",
            "check `ls /dev/infiniband` in the container (Enroot: ENROOT_RESTRICT_DEV n) and the instance "
            "type; compare with `fi_info -p efa -t FI_EP_RDM` on the host",
            seen.facts.evidence("nics", values=wrong))
    elif not nics and seen.on_efa:
        yield Diagnosis(
            "nic-count-unknown", "warning", "the nic count is not in the log",
            "NCCL ran over Libfabric but no 'found N nics' line was logged, so --expect-nics could not be "
            "checked.", "run with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS unset or including INIT,NET)")


def _tcp_causes(seen: Seen) -> list[str]:
    """What the logs say pushed NCCL onto sockets, or the usual suspects when they say nothing."""
    facts, plugin_env, env = seen.facts, seen.plugin_env, seen.env
    causes = []
    if plugin_env is not None and not is_ofi_plugin(plugin_env):
        causes.append(f"NCCL_NET_PLUGIN is '{plugin_env}', not 'ofi'")
    elif plugin_env is None and facts.has("env"):
        causes.append("NCCL_NET_PLUGIN was not reported as set: the default libnccl-net.so is the "
                      "InfiniBand plugin")
    if seen.ib_settings:
        causes.append(f"InfiniBand settings are set ({', '.join(seen.ib_settings)})")
    if facts.has("plugin-missing") or facts.has("plugin-unsupported") or facts.has("plugin-init-failed"):
        causes.append("the aws-ofi-nccl plugin did not load or initialise (see below)")
    if facts.has("no-device"):
        causes.append("no EFA device is visible in the container")
    if env.get("NCCL_NET", "").lower() == "socket":
        causes.append("NCCL_NET=Socket forces TCP")
    return causes or ["NCCL_NET_PLUGIN not 'ofi'", "leftover InfiniBand NCCL_* settings",
                      "the aws-ofi-nccl plugin missing from the library path",
                      "no /dev/infiniband in the container"]


@rule("tcp-fallback", catches="'Using network Socket': NCCL fell back to TCP, with the likely causes")
def tcp_fallback(seen: Seen) -> Iterator[Diagnosis]:
    facts = seen.facts
    if not (seen.on_socket or (facts.has("socket-transport") and not seen.on_efa)):
        return
    causes = _tcp_causes(seen)
    mixed = " on some ranks (others use Libfabric)" if seen.on_efa else ""
    yield Diagnosis(
        "tcp-fallback", "problem", f"NCCL fell back to TCP sockets{mixed}",
        "'Using network Socket' means NCCL did not use EFA; communication is many times slower. "
        f"Likely cause{'s' if len(causes) > 1 else ''}: {'; '.join(causes)}.",
        "keep NCCL_NET_PLUGIN=ofi, remove InfiniBand NCCL_* settings, and check that the image's "
        "/opt/amazon/ofi-nccl/lib leads LD_LIBRARY_PATH (efabuild lint, efabuild audit)",
        facts.evidence("network", "socket-transport", values=["Socket", *facts.values("socket-transport")]))


@rule("ib-network", catches="'Using network IB' on an EFA cluster")
def ib_network(seen: Seen) -> Iterator[Diagnosis]:
    if "IB" in seen.networks:
        yield Diagnosis(
            "ib-network", "problem", "NCCL chose its InfiniBand transport",
            "'Using network IB' on an EFA cluster means the ofi plugin was not used; EFA does not speak IB verbs "
            "to NCCL's internal transport.",
            "keep NCCL_NET_PLUGIN=ofi and remove NCCL_NET=IB and NCCL_IB_* settings",
            seen.facts.evidence("network", values=["IB"]))


# --- plugin and device trouble --------------------------------------------------------------------

@rule("plugin-load-noise", "plugin-load-failed",
      catches="a network plugin that did not load: noise when Libfabric was used anyway, else a problem")
def plugin_load(seen: Seen) -> Iterator[Diagnosis]:
    facts = seen.facts
    if not any(facts.has(k) for k in PLUGIN_KINDS):
        return
    if seen.on_efa and not seen.on_socket:
        yield Diagnosis(
            "plugin-load-noise", "info", "a network plugin name failed to load, but Libfabric was used",
            "NCCL tried a plugin file that is not there before finding aws-ofi-nccl; the EFA path works.",
            "nothing to do", facts.evidence(*PLUGIN_KINDS))
        return
    missing = ", ".join(v for v in facts.values("plugin-missing") if v) or "the net plugin"
    yield Diagnosis(
        "plugin-load-failed", "problem", "the NCCL network plugin did not load",
        f"NCCL could not load or initialise its network plugin ({missing}); without aws-ofi-nccl it "
        "uses its internal IB/Socket transports, which on EFA means TCP.",
        "check that /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so exists in the image, that "
        "NCCL_NET_PLUGIN=ofi, and that /opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib lead LD_LIBRARY_PATH",
        facts.evidence(*PLUGIN_KINDS))


@rule("rdma-protocol-unavailable", "no-efa-device",
      catches="'fi_getinfo() ... No data available': the RDMA probe on an instance without it, or no EFA device")
def no_device(seen: Seen) -> Iterator[Diagnosis]:
    facts = seen.facts
    if not facts.has("no-device"):
        return
    if seen.on_efa and "efa" in seen.providers:
        # aws-ofi-nccl tries its RDMA protocol first; without RDMA (g5, g6, p3dn...) that probe fails
        # and it falls back to SENDRECV on the same EFA devices
        yield Diagnosis(
            "rdma-protocol-unavailable", "info", "the RDMA protocol is not available; SENDRECV is used",
            "aws-ofi-nccl probes its RDMA protocol first; 'fi_getinfo() ... No data available' from that probe "
            "is normal on instances without EFA RDMA, and the job ran over the efa provider anyway.",
            "nothing to do (instances with EFA RDMA, such as p4d/p5/p6, use the RDMA protocol)",
            facts.evidence("no-device"))
        return
    yield Diagnosis(
        "no-efa-device", "problem", "libfabric found no EFA device (fi_getinfo: no data)",
        "'fi_getinfo() call failed: No data available' means libfabric sees no EFA device in the container: "
        "/dev/infiniband is not there (Enroot restricts devices, or the pod lacks the EFA device plugin), or "
        "the instance has no EFA.",
        "set ENROOT_RESTRICT_DEV n in enroot.conf (or request the EFA devices); check `ls /dev/infiniband` "
        "in the container", facts.evidence("no-device"))


@rule("libfabric-too-old", catches="aws-ofi-nccl refusing the efa provider of an older libfabric")
def libfabric_too_old(seen: Seen) -> Iterator[Diagnosis]:
    if seen.facts.has("libfabric-too-old"):
        yield Diagnosis(
            "libfabric-too-old", "problem", "the libfabric in use is too old for this aws-ofi-nccl",
            "aws-ofi-nccl refused the EFA provider because the libfabric it loaded is older than it needs: an "
            "older copy (the base image's, or a host mount) comes first on the library path.",
            "put /opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib first on LD_LIBRARY_PATH and drop host library "
            "mounts", seen.facts.evidence("libfabric-too-old"))


@rule("tuner-missing", catches="a NCCL_TUNER_PLUGIN not on the library path")
def tuner_missing(seen: Seen) -> Iterator[Diagnosis]:
    if seen.facts.has("tuner-missing"):
        yield Diagnosis(
            "tuner-missing", "info", "the NCCL tuner plugin was not found",
            "NCCL_TUNER_PLUGIN names a plugin that is not on the library path; NCCL uses its internal tuner. "
            "Communication works, collectives may pick less tuned algorithms.",
            "keep /opt/amazon/ofi-nccl/lib on LD_LIBRARY_PATH (it carries the ofi tuner)",
            seen.facts.evidence("tuner-missing"))


# --- environment left over from InfiniBand clusters -----------------------------------------------

@rule("net-plugin-env", catches="NCCL_NET_PLUGIN set to something other than ofi (no TCP fallback seen)")
def net_plugin_env(seen: Seen) -> Iterator[Diagnosis]:
    plugin_env = seen.plugin_env
    if plugin_env is not None and not is_ofi_plugin(plugin_env) and not seen.on_socket:
        yield Diagnosis(
            "net-plugin-env", "warning", f"NCCL_NET_PLUGIN={plugin_env}",
            "Only NCCL_NET_PLUGIN=ofi selects aws-ofi-nccl; the default libnccl-net.so is the InfiniBand plugin.",
            "keep NCCL_NET_PLUGIN=ofi", seen.facts.evidence("env", values=["NCCL_NET_PLUGIN"]))


@rule("ib-settings", catches="InfiniBand NCCL_* settings in the environment (no TCP fallback seen)")
def ib_settings(seen: Seen) -> Iterator[Diagnosis]:
    names = seen.ib_settings
    if names and not seen.on_socket:
        yield Diagnosis(
            "ib-settings", "warning", f"InfiniBand NCCL settings in the environment: {', '.join(names)}",
            "Leftover InfiniBand settings do nothing useful on EFA and can push NCCL off it.",
            f"unset {' '.join(names)}", seen.facts.evidence("env", values=names))


# --- MPI, build and container start ---------------------------------------------------------------

@rule("mpi-clash", catches="opal_shmem_base_select / MPI_INIT failed: two Open MPIs mixed")
def mpi_clash(seen: Seen) -> Iterator[Diagnosis]:
    if seen.facts.has("mpi-clash"):
        yield Diagnosis(
            "mpi-clash", "problem", "two Open MPI installations mixed (opal_shmem_base_select / MPI_INIT failed)",
            "A program built against one Open MPI loaded another's components: on an NGC image, the EFA "
            "installer's Open MPI (/opt/amazon/openmpi) was put on PATH/LD_LIBRARY_PATH next to NGC's "
            "/usr/local/mpi.",
            "keep only the NGC Open MPI on the paths; check communication inside the container with a "
            "PyTorch-based measurement, not an MPI benchmark", seen.facts.evidence("mpi-clash"))


@rule("apt-lists-empty", catches="the EFA installer's apt dependencies not found (no apt-get update in its RUN)")
def apt_lists_empty(seen: Seen) -> Iterator[Diagnosis]:
    if seen.facts.has("apt-lists-empty"):
        yield Diagnosis(
            "apt-lists-empty", "problem", "the EFA installer could not find its apt dependencies",
            "'Unable to locate package environment-modules' / 'failed to install third-party dependencies': the "
            "apt lists were empty in the layer that ran efa_installer.sh.",
            "run `apt-get update` in the same RUN as efa_installer.sh, before it (efabuild lint: EFA001)",
            seen.facts.evidence("apt-lists-empty"))


@rule("cuda-forward-compat", catches="'CUDA Forward Compatibility mode ENABLED', which is normal")
def cuda_forward_compat(seen: Seen) -> Iterator[Diagnosis]:
    if seen.facts.has("cuda-forward-compat"):
        yield Diagnosis(
            "cuda-forward-compat", "info", "CUDA Forward Compatibility mode ENABLED: normal",
            "The container's CUDA is newer than the host driver's; the forward-compatibility libraries bridge "
            "the gap. GPU work, NCCL/EFA and training run normally.",
            "nothing to do; test custom CUDA kernels in this setting", seen.facts.evidence("cuda-forward-compat"))


# --- bandwidth ------------------------------------------------------------------------------------

@rule("low-bandwidth", "bandwidth",
      catches="the peak bus bandwidth, a problem below half of --baseline-gbps (too few cores per rank)")
def bandwidth(seen: Seen) -> Iterator[Diagnosis]:
    peak = seen.facts.peak_busbw()
    if peak is None:
        return
    value, line = peak
    baseline_gbps = seen.baseline_gbps
    if baseline_gbps and value < LOW_BANDWIDTH_RATIO * baseline_gbps and not seen.on_socket:
        yield Diagnosis(
            "low-bandwidth", "problem",
            f"bus bandwidth {value:g} GB/s is {value / baseline_gbps:.0%} of the {baseline_gbps:g} GB/s baseline",
            ("On the EFA path (Libfabric) " if seen.on_efa else "") + "bandwidth at 1/4-1/10 of baseline usually "
            "means too few CPU cores per rank: the plugin's progress threads starve.",
            "give each rank more cores, e.g. `--cpus-per-task=24` (required in the validated 2-node run)",
            (Evidence.of(line),))
        return
    versus = f" ({value / baseline_gbps:.0%} of the {baseline_gbps:g} GB/s baseline)" if baseline_gbps else ""
    yield Diagnosis(
        "bandwidth", "info", f"peak bus bandwidth {value:g} GB/s{versus}",
        "The highest bus bandwidth in the log (nccl-tests rows or busbw lines).",
        "pass --baseline-gbps X to compare with a known-good run" if not baseline_gbps else "nothing to do",
        (Evidence.of(line),))


# --- lines that alarm people but are fine ---------------------------------------------------------

@rule("collnet-symbol", catches="'Failed to find ncclCollNetPlugin symbol', which is harmless")
def collnet_symbol(seen: Seen) -> Iterator[Diagnosis]:
    if seen.facts.has("harmless-collnet"):
        yield Diagnosis(
            "collnet-symbol", "harmless", "'Failed to find ncclCollNetPlugin symbol': harmless",
            "aws-ofi-nccl provides no CollNet (SHARP) interface; NCCL notes it and carries on.",
            "nothing to do", seen.facts.evidence("harmless-collnet"))


@rule("optional-plugin", catches="optional profiler/GIN/env plugins not found, which is harmless")
def optional_plugin(seen: Seen) -> Iterator[Diagnosis]:
    if seen.facts.has("optional-plugin-missing"):
        kinds = "/".join(seen.facts.values("optional-plugin-missing"))
        yield Diagnosis(
            "optional-plugin", "harmless", f"'{kinds}/Plugin: Could not find': harmless",
            "NCCL looks for optional profiler/GIN/env plugins; none is installed and none is needed.",
            "nothing to do", seen.facts.evidence("optional-plugin-missing"))


@rule("bootstrap-socket", catches="'Bootstrap : Using eth0', the TCP bootstrap, not a fallback")
def bootstrap_socket(seen: Seen) -> Iterator[Diagnosis]:
    if seen.facts.has("bootstrap") and not seen.on_socket:
        yield Diagnosis(
            "bootstrap-socket", "harmless", "'Bootstrap : Using eth0': harmless",
            "NCCL always bootstraps over a TCP socket; that is not the data path and not a TCP fallback.",
            "nothing to do", seen.facts.evidence("bootstrap"))


# the container start's rules (Pyxis and Enroot), registered after these: a module of their own
from efabuild.doctor import start as _start  # noqa: E402,F401
