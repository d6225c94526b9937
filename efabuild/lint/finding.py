"""What lint reports: findings, and the catalogue of rules they come from."""

from __future__ import annotations

from typing import Any, NamedTuple


SEVERITIES = ("error", "warning", "info")


class Rule(NamedTuple):
    id: str
    severity: str
    title: str  # one line: what the rule looks for


class Finding(NamedTuple):
    rule: str
    severity: str  # "error" | "warning" | "info"
    file: str  # workspace-relative: the graph TOML, the Dockerfile file, or the job script
    line: int | None
    layer: str | None  # qualified layer name; None for job scripts
    message: str
    fix: str

    def sort_key(self) -> tuple[Any, ...]:
        return (self.file, self.line or 0, self.rule, self.layer or "", self.message)

    def to_json(self) -> dict[str, Any]:
        """As --json gives it: the layer as `name` (GRAPH:LAYER), the field every command uses."""
        data = self._asdict()
        data["name"] = data.pop("layer")
        return data


# The catalogue. Severity is the rule's; a finding always carries its rule's severity.
RULES: dict[str, Rule] = {rule.id: rule for rule in (
    Rule("EFA000", "warning", "an ignore = [...] entry names a rule that does not exist"),
    Rule("EFA001", "error", "apt-get update not in the same RUN as efa_installer.sh (before it)"),
    Rule("EFA002", "error", "efa_installer.sh without a container flag (-y -g --skip-kmod --skip-limit-conf "
                            "--no-verify)"),
    Rule("EFA003", "warning", "efa_installer.sh --disable-ngc on an NGC base"),
    Rule("EFA004", "error", "LD_LIBRARY_PATH not led by /opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib after "
                            "the installer (or the plugin's directory of the layer's triplet)"),
    Rule("EFA005", "error", "a second Open MPI on an NGC base (installed, or put on PATH/LD_LIBRARY_PATH)"),
    Rule("EFA006", "error", "NCCL_NET_PLUGIN removed or set to something other than ofi"),
    Rule("EFA007", "error", "NCCL settings that push NCCL off EFA (InfiniBand NCCL_IB_*, NCCL_NET=IB/Socket, "
                            "SHARP/UCX)"),
    Rule("EFA008", "error", "job script mounts host EFA/NCCL libraries into the container"),
    Rule("EFA009", "error", "job script puts host library paths (/opt/amazon/...) on LD_LIBRARY_PATH"),
    Rule("EFA010", "warning", "base image not pinned by digest"),
    Rule("EFA011", "error", "git clone (or pip git+URL) without a pinned 40-hex commit"),
    Rule("EFA012", "warning", "pip install of torch or another large package without a pinned version, or "
                              "replacing the NGC build"),
    Rule("EFA013", "error", "a secret in build args, ARG or ENV (tokens, keys, passwords)"),
    Rule("EFA014", "warning", "EFA installer version differs from the host AMI's, or is not pinned"),
    Rule("EFA015", "info", "job script starts containers without --cpus-per-task"),
    Rule("EFA016", "info", "job script mounts /dev/infiniband (not needed with ENROOT_RESTRICT_DEV n)"),
    Rule("EFA017", "info", "apt-get install without pinned versions: a rebuild may fetch other packages"),
    Rule("EFA018", "warning", "an ARG default differs from the layer's args: the Dockerfile alone builds "
                              "something else"),
    Rule("EFA019", "info", "job script's container start mode: unpacked once per node and reused by name, or "
                           "mounted per step with squashfuse"),
    Rule("EFA020", "warning", "a container start that unpacks where an unnamed one would mount (--container-save, "
                              "or a name no later srun reuses)"),
    Rule("EFA021", "error", "ENV names another machine's triplet directory (…/x86_64-linux-gnu in an arm64 "
                            "layer) without the platform's own"),
    Rule("EFA022", "warning", "a RUN downloads or uses a file of another machine (x86_64/amd64 in an arm64 "
                              "layer's URL or path)"),
    Rule("EFA023", "warning", "TORCH_CUDA_ARCH_LIST names no Grace GPU (9.0 GH200, 10.0 GB200) in a layer built "
                              "only for arm64"),
    Rule("EFA024", "error", "job script gives a fixed --container-name to an image a make changes (a name's "
                            "lookup, efabuild://NAME): a later job starts the previous build's container"),
)}


def finding(rule: str, file: str, line: int | None, layer: str | None, message: str, fix: str) -> Finding:
    return Finding(rule=rule, severity=RULES[rule].severity, file=file, line=line, layer=layer,
                   message=message, fix=fix)
