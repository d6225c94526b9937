"""What the build declared against what the image holds: build args such as EFA_INSTALLER_VERSION
and HYBRID_EP_COMMIT, and the versions the base image's env and labels declare."""

from __future__ import annotations

from collections.abc import Mapping

from efabuild.provenance import versions
from efabuild.provenance.checks import FAIL, PASS, WARN, Check
from efabuild.provenance.measured import Component, Measured

# Build args that declare what a layer installs: arg -> (component, field)
DECLARING_ARGS = {
    "EFA_INSTALLER_VERSION": ("efa-installer", "version"),
    "AWS_OFI_NCCL_VERSION": ("aws-ofi-nccl", "version"),
    "LIBFABRIC_VERSION": ("libfabric", "version"),
    "NCCL_VERSION": ("nccl", "version"),
    "DEEPEP_COMMIT": ("deepep", "commit"),
    "DEEP_EP_COMMIT": ("deepep", "commit"),
    "HYBRID_EP_COMMIT": ("deepep", "commit"),
}
# Base image env vars and labels that declare versions -> component
DECLARING_BASE = {
    "NCCL_VERSION": "nccl",
    "CUDA_VERSION": "cuda",
    "CUDNN_VERSION": "cudnn",
    "CUBLAS_VERSION": "cublas",
    "PYTORCH_VERSION": "pytorch",
    "com.nvidia.nccl.version": "nccl",
    "com.nvidia.cudnn.version": "cudnn",
    "com.nvidia.cuda.version": "cuda",
    "com.nvidia.pytorch.version": "pytorch",
}


def declared_vs_image(args: Mapping[str, tuple[str, str]], image: Measured) -> list[Check]:
    checks = []
    for arg, (component_name, field) in DECLARING_ARGS.items():
        if arg not in args:
            continue
        value, layer = args[arg]
        component = image.component(component_name)
        name = f"declared:{arg}"
        if field == "commit":
            actual = component.commit
            short = _short_commit(component)
            if actual is None and short is None:
                checks.append(Check(name, FAIL, f"{arg}={value} declared in {layer}, but no {component_name} "
                                                f"commit is recorded in the image"))
            elif _commit_matches(value, actual or short):
                checks.append(Check(name, PASS, f"{component_name} at commit {(actual or short)[:12]}"))
            else:
                where = component.commit_source or component.source
                checks.append(Check(name, FAIL, f"{arg}={value[:12]} declared in {layer}, but {component_name} "
                                                f"was built from {(actual or short)[:12]} ({where})"))
            continue
        actual = component.version
        if actual is None:
            checks.append(Check(name, FAIL, f"{arg}={value} declared in {layer}, but no {component_name} "
                                            f"found in the image"))
        elif versions.same_release(value, actual):
            checks.append(Check(name, PASS, f"{component_name} {actual} as declared"))
        else:
            checks.append(Check(name, FAIL, f"{arg}={value} declared in {layer}, but {component_name} {actual} "
                                            f"is installed ({component.source})"))
    for declared in image.declared_by_base:
        component_name = DECLARING_BASE.get(declared.name)
        if component_name is None:
            continue
        actual = image.component(component_name).version
        if actual is not None and versions.consistent(declared.value, actual) is False:
            checks.append(Check(f"base-declared:{declared.name}", WARN,
                                f"{declared.source}={declared.value}, but {component_name} {actual} is installed "
                                f"(a later layer changed it; the base's declaration is stale)"))
    return checks


def _short_commit(component: Component) -> str | None:
    # DeepEP's setup.py appends "+<git rev-parse --short HEAD>" to its version
    if component.version and "+" in component.version:
        label = component.version.split("+", 1)[1]
        if len(label) >= 7 and all(c in "0123456789abcdef" for c in label):
            return label
    return None


def _commit_matches(declared: str, actual: str) -> bool:
    shorter = min(len(declared), len(actual))
    return shorter >= 7 and declared[:shorter].lower() == actual[:shorter].lower()
