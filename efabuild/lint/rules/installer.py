"""The EFA installer's RUN: apt lists, container flags, the NGC flavour, the library path after it,
a second Open MPI, and the installer's version (EFA001-005, EFA014).

Facts these rely on, checked against the installer's own script and AWS's documentation:
- `efa_installer.sh` parses `-y/--yes -g/--enable-gdr -k/--skip-kmod -l/--skip-limit-conf
  -n/--no-verify` with getopt, so short flags may be combined (`-ygkln`).
- The installer always installs its own Open MPI under /opt/amazon/openmpi (`--mpi=openmpi4|openmpi5`
  only chooses which; no flag skips it short of `--minimal`, which drops libfabric too). That copy
  is harmless on an NGC base as long as nothing puts it on PATH/LD_LIBRARY_PATH or builds
  against it, so the installer itself is not flagged by EFA005.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from efabuild.lint.chain import LayerFacts, installer_arguments, is_installer
from efabuild.lint.dockerfile import RunCommand
from efabuild.lint.finding import Finding
from efabuild.lint.rules.registry import UNRESOLVED, arg_names, at, at_key, installer_commands, rule
from efabuild.lint.shell import Command
from efabuild.nccl import efa_lead
from efabuild.provenance import elf

EFA_LIB_LEAD = "/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib"
INSTALLER_TARBALL = re.compile(r"aws-efa-installer-([^/\s]+?)\.tar\.gz")


# --- EFA001: apt-get update in the installer's RUN ----------------------------------------------


def _is_apt_update(command: Command) -> bool:
    return command.program in ("apt-get", "apt", "aptitude") and "update" in command.argv[1:]


def _uses_rpm_tools(commands: list[RunCommand]) -> bool:
    return any(rc.command.program in ("yum", "dnf", "zypper", "microdnf") for rc in commands)


@rule("EFA001")
def apt_update_with_installer(facts: LayerFacts) -> Iterator[Finding]:
    for rc, commands in installer_commands(facts):
        before = commands[:commands.index(rc)]
        if any(_is_apt_update(other.command) for other in before) or _uses_rpm_tools(commands):
            continue
        yield at(facts, "EFA001", rc.line,
                  "efa_installer.sh runs without `apt-get update` earlier in the same RUN: the apt lists "
                  "can be empty in that layer and the installer fails with 'Unable to locate package "
                  "environment-modules'",
                  "start this RUN with `apt-get update &&` (an update in an earlier RUN may be cached "
                  "or cleaned away)")


# --- EFA002 / EFA003: installer flags ------------------------------------------------------------

_SHORT_FLAGS = {"y": "--yes", "g": "--enable-gdr", "k": "--skip-kmod", "l": "--skip-limit-conf",
                "n": "--no-verify", "d": "--debug-packages", "u": "--uninstall", "m": "--minimal"}
# (canonical long flag, how the guide writes it, why a container build needs it)
_CONTAINER_FLAGS = (
    ("--yes", "-y", "without it the installer waits for a confirmation no build can give"),
    ("--enable-gdr", "-g", "GPUDirect RDMA between GPUs and EFA (the guide's container recipe passes it)"),
    ("--skip-kmod", "--skip-kmod", "a container has no kernel to build the EFA module for"),
    ("--skip-limit-conf", "--skip-limit-conf", "ulimits (memlock) belong to the host, not the image"),
    ("--no-verify", "--no-verify", "there is no EFA device at build time to verify"),
)


def installer_flags(command: Command) -> set[str]:
    """The installer's options as long flags (`-yg` -> {--yes, --enable-gdr})."""
    flags: set[str] = set()
    for word in installer_arguments(command) or []:
        if word.startswith("--"):
            flags.add(word.split("=", 1)[0])
        elif re.fullmatch(r"-[A-Za-z]+", word):  # combined short options, like -yg
            for letter in word[1:]:
                flags.add(_SHORT_FLAGS.get(letter, f"-{letter}"))
    return flags


@rule("EFA002")
def installer_container_flags(facts: LayerFacts) -> Iterator[Finding]:
    for rc, _ in installer_commands(facts):
        flags = installer_flags(rc.command)
        for long_flag, written, why in _CONTAINER_FLAGS:
            if long_flag not in flags:
                yield at(facts, "EFA002", rc.line,
                          f"efa_installer.sh without {written}: {why}",
                          "run `./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify`")


@rule("EFA003")
def installer_disable_ngc(facts: LayerFacts) -> Iterator[Finding]:
    if not facts.ngc:
        return
    for rc, _ in installer_commands(facts):
        if "--disable-ngc" in installer_flags(rc.command):
            yield at(facts, "EFA003", rc.line,
                      "efa_installer.sh --disable-ngc on an NGC base: the installer detects the NGC image "
                      "and installs the NGC flavour of aws-ofi-nccl (libnccl-ofi-ngc-v3) by itself",
                      "drop --disable-ngc")


# --- EFA004: LD_LIBRARY_PATH after the installer ------------------------------------------------


@rule("EFA004")
def ld_library_path_after_installer(facts: LayerFacts) -> Iterator[Finding]:
    if not (facts.installer_before or facts.installer_here):
        return
    final = facts.evaluated.env_after.get("LD_LIBRARY_PATH")
    # the plugin's directory of the layer's own triplet (newer installers) leads as well
    platforms = facts.layer.platforms or (facts.settings.builder.platform,)
    if any(efa_lead(final, elf.triplet(elf.machine_of_platform(p))) is not None for p in platforms):
        return
    fix = f"add `ENV LD_LIBRARY_PATH={EFA_LIB_LEAD}:${{LD_LIBRARY_PATH}}` after the installer's RUN"
    own = [env for env in facts.evaluated.envs if env.name == "LD_LIBRARY_PATH"]
    if own:
        yield at(facts, "EFA004", own[-1].line,
                  f"LD_LIBRARY_PATH is set to '{own[-1].raw}', which does not start with {EFA_LIB_LEAD}: "
                  "the base image's older libfabric/aws-ofi-nccl can win over the installed ones",
                  f"keep {EFA_LIB_LEAD} first, e.g. `ENV LD_LIBRARY_PATH={EFA_LIB_LEAD}:${{LD_LIBRARY_PATH}}`")
    elif facts.installer_here:
        rc = next(rc for rc in facts.evaluated.runs if is_installer(rc.command))
        yield at(facts, "EFA004", rc.line,
                  "no `ENV LD_LIBRARY_PATH` leading with the installed EFA libraries after efa_installer.sh: "
                  "the base image's older libfabric/aws-ofi-nccl can win over the installed ones", fix)


# --- EFA005: a second Open MPI on an NGC base -----------------------------------------------------

_MPI_PACKAGE = re.compile(r"^(lib)?openmpi[\w.+-]*$|^mpi-default-(bin|dev)$|^openmpi$")
_PACKAGE_TOOLS = {"apt-get", "apt", "aptitude", "yum", "dnf", "microdnf", "zypper", "conda", "mamba",
                  "micromamba", "spack"}
_OPENMPI_SOURCE = re.compile(r"openmpi-\d[\w.]*\.tar|github\.com/open-mpi/ompi")
_AMAZON_MPI = "/opt/amazon/openmpi"


@rule("EFA005")
def second_open_mpi(facts: LayerFacts) -> Iterator[Finding]:
    if not facts.ngc:
        return
    why = ("the NGC image already has Open MPI in /usr/local/mpi; mixing two Open MPIs fails with "
           "'opal_shmem_base_select failed' ... 'MPI_INIT failed'")
    fix = ("keep the NGC Open MPI; check communication with a PyTorch-based measurement instead of an "
           "MPI benchmark")
    for rc in facts.evaluated.runs:
        cmd = rc.command
        if cmd.program in _PACKAGE_TOOLS and "install" in cmd.argv[1:]:
            packages = [w for w in cmd.argv[cmd.argv.index("install") + 1:] if not w.startswith("-")]
            clashing = [p for p in packages if _MPI_PACKAGE.match(p.split("=", 1)[0].lower())]
            if clashing:
                yield at(facts, "EFA005", rc.line,
                          f"installs a second Open MPI ({', '.join(clashing)}): {why}", fix)
        elif cmd.program in ("curl", "wget", "git") and any(_OPENMPI_SOURCE.search(w) for w in cmd.argv):
            yield at(facts, "EFA005", rc.line, f"fetches Open MPI sources to build a second one: {why}", fix)
        elif _AMAZON_MPI in cmd.text and "ld.so.conf" in cmd.text:
            yield at(facts, "EFA005", rc.line,
                      f"registers the EFA installer's Open MPI ({_AMAZON_MPI}) with the dynamic linker: {why}",
                      fix)
    for env in facts.evaluated.envs:
        if _AMAZON_MPI in env.value:
            yield at(facts, "EFA005", env.line,
                      f"{env.name} points at the EFA installer's Open MPI ({_AMAZON_MPI}): {why}",
                      f"leave {_AMAZON_MPI} off {env.name}; {fix}")


# --- EFA014: installer version -------------------------------------------------------------------


@rule("EFA014")
def installer_version(facts: LayerFacts) -> Iterator[Finding]:
    host = facts.settings.audit.host_efa_installer
    for rc, commands in installer_commands(facts):
        versions = [m.group(1) for other in commands for w in other.command.argv
                    for m in [INSTALLER_TARBALL.search(w)] if m]
        if not versions:
            continue
        version = versions[0]
        if UNRESOLVED.search(version):
            names = ", ".join(arg_names(version))
            yield _version_finding(facts, rc, f"the EFA installer version is unknown: {names} has no value",
                                   "set EFA_INSTALLER_VERSION in the layer's args to the host AMI's version")
        elif version == "latest":
            yield _version_finding(facts, rc, "aws-efa-installer-latest is not a pinned version: each build "
                                   "may install another",
                                   "download aws-efa-installer-<version>.tar.gz with the host AMI's version")
        elif host and version != host:
            yield _version_finding(facts, rc, f"EFA installer {version} in the image, {host} on the host AMI "
                                   "(audit policy): mixed versions make EFA problems harder to trace",
                                   f"install {host} (EFA_INSTALLER_VERSION = \"{host}\"), or update "
                                   "audit.host_efa_installer in BUILD.toml when the AMI changes")


def _version_finding(facts: LayerFacts, rc: RunCommand, message: str, fix: str) -> Finding:
    """At the EFA_INSTALLER_VERSION value: the graph's args, else the ARG line, else the download."""
    arg = facts.evaluated.arg("EFA_INSTALLER_VERSION")
    if arg is not None and arg.from_graph:
        return at_key(facts, "EFA014", ("args", "EFA_INSTALLER_VERSION"), message, fix)
    return at(facts, "EFA014", arg.line if arg is not None else rc.line, message, fix)
