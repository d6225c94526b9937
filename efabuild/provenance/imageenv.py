"""The image's env and labels as a probe sees them: from the image config, or from the files
Enroot writes (/etc/environment, /etc/rc); which of them steer EFA, and which declare the base."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from efabuild.provenance.measured import Declared

ENVIRONMENT_FILE = "/etc/environment"  # Enroot writes the image config's Env here
RC_FILE = "/etc/rc"  # Enroot writes the image config's labels here as "# key value" comments

# Env vars that steer NCCL and libfabric onto (or off) EFA.
_ENV_PREFIXES = ("NCCL_", "FI_", "RDMAV_")
_ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "OPAL_PREFIX")
# Env vars and labels by which NGC images declare what they were built with.
DECLARING_ENV = (
    "NVIDIA_PYTORCH_VERSION",
    "PYTORCH_VERSION",
    "PYTORCH_BUILD_VERSION",
    "CUDA_VERSION",
    "CUDA_DRIVER_VERSION",
    "NCCL_VERSION",
    "CUDNN_VERSION",
    "OPENMPI_VERSION",
    "NVIDIA_BUILD_ID",
)
DECLARING_LABEL_PREFIX = "com.nvidia."
_SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "ACCESS_KEY", "PRIVATE")


def env_dict(image_env: Mapping[str, str] | Iterable[str]) -> dict[str, str]:
    if isinstance(image_env, Mapping):
        return {str(k): str(v) for k, v in image_env.items()}
    out = {}
    for item in image_env:
        name, sep, value = str(item).partition("=")
        if sep:
            out[name] = value
    return out


def parse_environment(text: str) -> dict[str, str]:
    """/etc/environment (pam_env style): NAME=value lines, a value may be wrapped in quotes."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        name, _, value = line.partition("=")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[name.strip()] = value
    return out


def parse_rc_labels(text: str) -> dict[str, str]:
    """Labels from the comment block Enroot writes at the top of /etc/rc ("# key value")."""
    labels = {}
    for line in text.splitlines():
        if not line.startswith("# "):
            break
        key, _, value = line[2:].partition(" ")
        if key:
            labels[key] = value
    return labels


def efa_relevant(name: str) -> bool:
    return name in _ENV_NAMES or (name.startswith(_ENV_PREFIXES) and name not in DECLARING_ENV)


def shown_value(name: str, value: str) -> str:
    return "<redacted>" if any(word in name.upper() for word in _SECRET_WORDS) else value


def declared_by_base(env: dict[str, str], labels: dict[str, str]) -> tuple[Declared, ...]:
    found = [Declared(name, env[name], f"env:{name}") for name in DECLARING_ENV if name in env]
    found += [
        Declared(key, value, f"label:{key}")
        for key, value in sorted(labels.items())
        if key.startswith(DECLARING_LABEL_PREFIX) and key.endswith("version")
    ]
    return tuple(sorted(found, key=lambda d: d.name))
