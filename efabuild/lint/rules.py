"""The guide's pitfalls as rules over one layer (its Dockerfile text, args and what it inherits).

Each rule is a function `(LayerFacts) -> Iterable[Finding]`, registered in LAYER_RULES by ID.
Facts the rules rely on, checked against the installer's own script and AWS's documentation:
- `efa_installer.sh` parses `-y/--yes -g/--enable-gdr -k/--skip-kmod -l/--skip-limit-conf
  -n/--no-verify` with getopt, so short flags may be combined (`-ygkln`).
- The installer always installs its own Open MPI under /opt/amazon/openmpi (`--mpi=openmpi4|openmpi5`
  only chooses which; no flag skips it short of `--minimal`, which drops libfabric too). That copy
  is harmless on an NGC base as long as nothing puts it on PATH/LD_LIBRARY_PATH or builds
  against it, so the installer itself is not flagged by EFA005.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

from efabuild.lint.chain import LayerFacts, installer_arguments, is_installer
from efabuild.lint.dockerfile import RunCommand
from efabuild.lint.finding import Finding, finding
from efabuild.lint.shell import Command
from efabuild.nccl import forces_other_network, is_infiniband_setting, is_ofi_plugin
from efabuild.redact import secret_name, secret_value

EFA_LIB_LEAD = "/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib"
HEX40 = re.compile(r"[0-9a-f]{40}")
UNRESOLVED = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
INSTALLER_TARBALL = re.compile(r"aws-efa-installer-([^/\s]+?)\.tar\.gz")

LayerRule = Callable[[LayerFacts], Iterable[Finding]]
LAYER_RULES: dict[str, LayerRule] = {}


def rule(rule_id: str) -> Callable[[LayerRule], LayerRule]:
    def register(fn: LayerRule) -> LayerRule:
        LAYER_RULES[rule_id] = fn
        return fn

    return register


def _at(facts: LayerFacts, rule_id: str, line: int, message: str, fix: str) -> Finding:
    """A finding at a line of the layer's Dockerfile text."""
    file, file_line = facts.locator.text(line)
    return finding(rule_id, file, file_line, facts.layer.qualname, message, fix)


def _at_key(facts: LayerFacts, rule_id: str, key: tuple[str, ...], message: str, fix: str) -> Finding:
    """A finding at a key of the layer's table in the graph TOML."""
    file, line = facts.locator.key(*key)
    return finding(rule_id, file, line, facts.layer.qualname, message, fix)


def _runs(facts: LayerFacts) -> dict[int, list[RunCommand]]:
    by_run: dict[int, list[RunCommand]] = {}
    for rc in facts.evaluated.runs:
        by_run.setdefault(rc.run_index, []).append(rc)
    return by_run


def _installer_commands(facts: LayerFacts) -> Iterator[tuple[RunCommand, list[RunCommand]]]:
    """Each installer command with the commands of its RUN (in order)."""
    for commands in _runs(facts).values():
        for rc in commands:
            if is_installer(rc.command):
                yield rc, commands


# --- EFA001: apt-get update in the installer's RUN ----------------------------------------------


def _is_apt_update(command: Command) -> bool:
    return command.program in ("apt-get", "apt", "aptitude") and "update" in command.argv[1:]


def _uses_rpm_tools(commands: list[RunCommand]) -> bool:
    return any(rc.command.program in ("yum", "dnf", "zypper", "microdnf") for rc in commands)


@rule("EFA001")
def apt_update_with_installer(facts: LayerFacts) -> Iterator[Finding]:
    for rc, commands in _installer_commands(facts):
        before = commands[:commands.index(rc)]
        if any(_is_apt_update(other.command) for other in before) or _uses_rpm_tools(commands):
            continue
        yield _at(facts, "EFA001", rc.line,
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
    for rc, _ in _installer_commands(facts):
        flags = installer_flags(rc.command)
        for long_flag, written, why in _CONTAINER_FLAGS:
            if long_flag not in flags:
                yield _at(facts, "EFA002", rc.line,
                          f"efa_installer.sh without {written}: {why}",
                          "run `./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify`")


@rule("EFA003")
def installer_disable_ngc(facts: LayerFacts) -> Iterator[Finding]:
    if not facts.ngc:
        return
    for rc, _ in _installer_commands(facts):
        if "--disable-ngc" in installer_flags(rc.command):
            yield _at(facts, "EFA003", rc.line,
                      "efa_installer.sh --disable-ngc on an NGC base: the installer detects the NGC image "
                      "and installs the NGC flavour of aws-ofi-nccl (libnccl-ofi-ngc-v3) by itself",
                      "drop --disable-ngc")


# --- EFA004: LD_LIBRARY_PATH after the installer ------------------------------------------------


def _led_by_efa(value: str | None) -> bool:
    return value is not None and (value == EFA_LIB_LEAD or value.startswith(EFA_LIB_LEAD + ":"))


@rule("EFA004")
def ld_library_path_after_installer(facts: LayerFacts) -> Iterator[Finding]:
    if not (facts.installer_before or facts.installer_here):
        return
    final = facts.evaluated.env_after.get("LD_LIBRARY_PATH")
    if _led_by_efa(final):
        return
    fix = f"add `ENV LD_LIBRARY_PATH={EFA_LIB_LEAD}:${{LD_LIBRARY_PATH}}` after the installer's RUN"
    own = [env for env in facts.evaluated.envs if env.name == "LD_LIBRARY_PATH"]
    if own:
        yield _at(facts, "EFA004", own[-1].line,
                  f"LD_LIBRARY_PATH is set to '{own[-1].raw}', which does not start with {EFA_LIB_LEAD}: "
                  "the base image's older libfabric/aws-ofi-nccl can win over the installed ones",
                  f"keep {EFA_LIB_LEAD} first, e.g. `ENV LD_LIBRARY_PATH={EFA_LIB_LEAD}:${{LD_LIBRARY_PATH}}`")
    elif facts.installer_here:
        rc = next(rc for rc in facts.evaluated.runs if is_installer(rc.command))
        yield _at(facts, "EFA004", rc.line,
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
                yield _at(facts, "EFA005", rc.line,
                          f"installs a second Open MPI ({', '.join(clashing)}): {why}", fix)
        elif cmd.program in ("curl", "wget", "git") and any(_OPENMPI_SOURCE.search(w) for w in cmd.argv):
            yield _at(facts, "EFA005", rc.line, f"fetches Open MPI sources to build a second one: {why}", fix)
        elif _AMAZON_MPI in cmd.text and "ld.so.conf" in cmd.text:
            yield _at(facts, "EFA005", rc.line,
                      f"registers the EFA installer's Open MPI ({_AMAZON_MPI}) with the dynamic linker: {why}",
                      fix)
    for env in facts.evaluated.envs:
        if _AMAZON_MPI in env.value:
            yield _at(facts, "EFA005", env.line,
                      f"{env.name} points at the EFA installer's Open MPI ({_AMAZON_MPI}): {why}",
                      f"leave {_AMAZON_MPI} off {env.name}; {fix}")


# --- EFA006 / EFA007: NCCL environment ------------------------------------------------------------



def nccl_env_problems(name: str, value: str) -> tuple[str, str, str] | None:
    """(rule, message, fix) when an NCCL setting pushes NCCL off the EFA path; None when fine.

    Used for image ENV and for variables exported by job scripts. Never echoes anything but the
    variable's own value, and only for NCCL_* names.
    """
    if name == "NCCL_NET_PLUGIN" and not is_ofi_plugin(value):
        what = "removes NCCL_NET_PLUGIN" if not value else f"sets NCCL_NET_PLUGIN={value}"
        return ("EFA006",
                f"{what}: the default libnccl-net.so in the image is the InfiniBand plugin; only 'ofi' "
                "selects aws-ofi-nccl and the EFA path (else NCCL falls back to TCP sockets)",
                "keep NCCL_NET_PLUGIN=ofi (the NGC base sets it)")
    if forces_other_network(name, value):
        return ("EFA007", f"NCCL_NET={value} forces a network other than EFA's Libfabric",
                "remove NCCL_NET (or set it to Libfabric)")
    if is_infiniband_setting(name, value):
        return ("EFA007",
                f"{name} is an InfiniBand/SHARP setting: leftovers like it push NCCL off EFA or do nothing",
                f"remove {name}")
    return None


@rule("EFA006")
def nccl_net_plugin(facts: LayerFacts) -> Iterator[Finding]:
    for env in facts.evaluated.envs:
        problem = nccl_env_problems(env.name, env.value)
        if problem and problem[0] == "EFA006":
            yield _at(facts, "EFA006", env.line, problem[1], problem[2])


@rule("EFA007")
def infiniband_nccl_settings(facts: LayerFacts) -> Iterator[Finding]:
    for env in facts.evaluated.envs:
        problem = nccl_env_problems(env.name, env.value)
        if problem and problem[0] == "EFA007":
            yield _at(facts, "EFA007", env.line, problem[1], problem[2])


# --- EFA010: base pinned by digest ----------------------------------------------------------------


@rule("EFA010")
def base_digest(facts: LayerFacts) -> Iterator[Finding]:
    base = facts.layer.base
    if base is None or base.digest or "@sha256:" in base.ref:
        return
    yield _at_key(facts, "EFA010", ("base",),
                  f"base image {base.ref} is not pinned by digest: a tag can be re-pushed, and the same "
                  "graph then builds something else",
                  f"add `digest = \"sha256:…\"` (from `docker buildx imagetools inspect {base.ref}`)")


# --- EFA011: git clone pinned to a commit ---------------------------------------------------------


def _git_subcommand(command: Command) -> tuple[str, list[str]]:
    """('clone', [args]) for `git clone ...`, skipping `-C dir` and `-c k=v` before it."""
    if command.program != "git":
        return "", []
    words = list(command.argv[1:])
    while words and words[0].startswith("-"):
        option = words.pop(0)
        if option in ("-C", "-c", "--git-dir", "--work-tree") and words:
            words.pop(0)
    return (words[0], words[1:]) if words else ("", [])


def _revision_of(command: Command) -> str | None:
    """The revision a `git checkout/switch/reset --hard` moves to, or None for other commands."""
    sub, args = _git_subcommand(command)
    positional = [a for a in args if not a.startswith("-")]
    if sub in ("checkout", "switch", "reset") and positional:
        return positional[0]
    return None


def _arg_names(text: str) -> list[str]:
    return UNRESOLVED.findall(text)


_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redact_url(url: str) -> str:
    """A URL without its user:password/token part (`https://***@github.com/...`)."""
    return _URL_USERINFO.sub("***@", url)


@rule("EFA011")
def pinned_git(facts: LayerFacts) -> Iterator[Finding]:
    for commands in _runs(facts).values():
        clones = [i for i, rc in enumerate(commands) if _git_subcommand(rc.command)[0] == "clone"]
        for position, index in enumerate(clones):
            clone = commands[index]
            following = commands[index + 1:clones[position + 1] if position + 1 < len(clones) else None]
            fetched = {w for rc in following if _git_subcommand(rc.command)[0] == "fetch"
                       for w in _git_subcommand(rc.command)[1]}
            revisions = [(rc, _revision_of(rc.command)) for rc in following if _revision_of(rc.command)]
            url = next((redact_url(w) for w in _git_subcommand(clone.command)[1]
                        if "://" in w or w.startswith("git@")), "the repository")
            fix = ("follow the clone with `git checkout <40-hex commit>` in the same RUN, e.g. "
                   "`git checkout ${COMMIT}` with the commit in the layer's args")
            if not revisions:
                yield _at(facts, "EFA011", clone.line,
                          f"git clone of {url} without checking out a pinned commit: the build changes "
                          "whenever the branch moves", fix)
                continue
            rc, revision = revisions[0]
            if HEX40.fullmatch(revision) or (revision == "FETCH_HEAD" and any(HEX40.fullmatch(w) for w in fetched)):
                continue
            names = _arg_names(rc.command.text)
            if UNRESOLVED.search(revision):
                missing = ", ".join(names) or revision
                yield _at(facts, "EFA011", rc.line,
                          f"git checkout {revision}: {missing} has no value, so the commit is not pinned",
                          f"give {missing} a 40-hex commit in the layer's args or the ARG default")
            else:
                via = f" (from {', '.join(names)})" if names else ""
                yield _at(facts, "EFA011", rc.line,
                          f"git checkout '{revision}'{via} is not a 40-hex commit: branches and tags move",
                          "check out the full commit hash")
    for rc in facts.evaluated.runs:
        if not _is_pip_install(rc.command):
            continue
        for requirement in _pip_requirements(rc.command):
            if requirement.startswith("git+"):
                ref = requirement.split("#", 1)[0].rsplit("@", 1)
                if len(ref) < 2 or not HEX40.fullmatch(ref[1]) or ref[0].endswith(":"):
                    yield _at(facts, "EFA011", rc.line,
                              f"pip installs {redact_url(requirement.split('#', 1)[0])} without a pinned commit",
                              "append @<40-hex commit> to the git URL")


# --- EFA017: unpinned apt-get install ------------------------------------------------------------

_APT_OPTIONS_WITH_VALUE = {"-o", "--option", "-c", "--config-file", "-t", "--target-release",
                           "--default-release"}


def _apt_packages(command: Command) -> list[str]:
    """The package arguments of `apt-get install` / `apt install` (empty for anything else)."""
    words = list(command.argv)
    if command.program not in ("apt-get", "apt") or "install" not in words[1:]:
        return []
    out, skip = [], False
    for word in words[words.index("install") + 1:]:
        if skip:
            skip = False
        elif word in _APT_OPTIONS_WITH_VALUE:
            skip = True
        elif not word.startswith("-"):
            out.append(word)
    return out


@rule("EFA017")
def pinned_apt(facts: LayerFacts) -> Iterator[Finding]:
    for rc in facts.evaluated.runs:
        unpinned = [p for p in _apt_packages(rc.command)
                    if "=" not in p and "/" not in p and not p.endswith(".deb")]
        if unpinned:
            yield _at(facts, "EFA017", rc.line,
                      f"apt-get installs {', '.join(unpinned)} without a version: a rebuild gets whatever "
                      "the mirror has that day, so the same key can give other bytes (make --check shows it)",
                      "pin them (`curl=7.88.1-10+deb12u8`), or accept that this layer is reproducible only "
                      "against a snapshot of the mirror")


# --- EFA012: pinned pip installs ----------------------------------------------------------------

LARGE_PACKAGES = {
    "torch", "torchvision", "torchaudio", "tensorflow", "tensorflow-gpu", "jax", "jaxlib", "flash-attn",
    "deepspeed", "transformer-engine", "apex", "xformers", "vllm", "triton", "megatron-core",
    "nemo-toolkit", "tensorrt", "onnxruntime-gpu", "mxnet", "paddlepaddle-gpu", "bitsandbytes",
}
LARGE_PREFIXES = ("nvidia-", "cupy", "jax-cuda", "transformer-engine-")
# packages whose NGC build a pip install replaces (and with it the NCCL the NGC image was tested with)
NGC_OWNED = {"torch", "torchvision", "torchaudio", "triton", "transformer-engine", "apex"}
NGC_OWNED_PREFIXES = ("nvidia-nccl",)
_PIP_OPTIONS_WITH_VALUE = {
    "-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-i", "--index-url", "--extra-index-url",
    "-f", "--find-links", "-t", "--target", "--prefix", "--root", "--upgrade-strategy", "--platform",
    "--python-version", "--implementation", "--abi", "--no-binary", "--only-binary", "-C",
    "--config-settings", "--global-option", "--progress-bar", "--cache-dir", "--src", "--log", "--timeout",
    "--retries", "--proxy", "--trusted-host", "--report", "--python",
}
_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)$")


def _is_pip_install(command: Command) -> bool:
    argv = list(command.argv)
    if argv[:1] and re.match(r"^python[0-9.]*$", command.program) and argv[1:3] == ["-m", "pip"]:
        argv = argv[2:]
    elif command.program == "uv" and argv[1:2] == ["pip"]:
        argv = argv[1:]
    return bool(argv) and re.match(r"^pip[0-9.]*$", argv[0].rsplit("/", 1)[-1]) is not None \
        and "install" in argv[1:2]


def _pip_requirements(command: Command) -> list[str]:
    words = list(command.argv)
    start = words.index("install") + 1
    out: list[str] = []
    skip = False
    for word in words[start:]:
        if skip:
            skip = False
            continue
        if word.startswith("-"):
            skip = word in _PIP_OPTIONS_WITH_VALUE
            continue
        out.append(word)
    return out


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pinned(spec: str) -> bool:
    spec = spec.strip()
    return (spec.startswith("==") and "*" not in spec and "," not in spec) or spec.startswith("===") \
        or spec.startswith("@")


@rule("EFA012")
def pinned_pip(facts: LayerFacts) -> Iterator[Finding]:
    for rc in facts.evaluated.runs:
        if not _is_pip_install(rc.command):
            continue
        upgrade = any(w in ("-U", "--upgrade") for w in rc.command.argv)
        for requirement in _pip_requirements(rc.command):
            match = _REQUIREMENT.match(requirement)
            if not match or "/" in requirement or requirement in (".", ".."):
                continue  # a path, URL or local project
            name, spec = _normalize(match.group(1)), match.group(3)
            large = name in LARGE_PACKAGES or name.startswith(LARGE_PREFIXES)
            if facts.ngc and (name in NGC_OWNED or name.startswith(NGC_OWNED_PREFIXES)):
                yield _at(facts, "EFA012", rc.line,
                          f"pip installs {requirement} on an NGC base: it replaces NVIDIA's build of "
                          f"{match.group(1)} (tested with the image's CUDA and NCCL) with a PyPI one",
                          "use the NGC release that carries the version you need, or install with "
                          "--no-deps only what the NGC image lacks")
            elif large and (not _pinned(spec) or upgrade):
                yield _at(facts, "EFA012", rc.line,
                          f"pip installs {requirement} without a pinned version: the next build may pull a "
                          "different multi-GB wheel (and a different NCCL/CUDA)",
                          f"pin it: `{match.group(1)}==<version>`")


# --- EFA013: secrets --------------------------------------------------------------------------------

_ONLY_A_VARIABLE = re.compile(r"^\$\{?[A-Za-z_][A-Za-z0-9_]*\}?$")
_SECRET_FIX = ("declare `secrets = [\"NAME\"]` in the layer and read it in a `RUN --mount=type=secret,id=NAME` "
               "(or pass it at run time); literals, build args and ENV are stored in the image and its history")


def _secret_fix(name: str) -> str:
    return (f"declare `secrets = [\"{name}\"]` in the layer, set {name} in make's environment, and read it "
            f"in the RUN that needs it: `RUN --mount=type=secret,id={name} ... $(cat /run/secrets/{name})`; "
            "a secret is never in the key, the image, its history or the registry (build args and ENV are)")


@rule("EFA013")
def secrets(facts: LayerFacts) -> Iterator[Finding]:
    declared = {arg.name: arg for arg in facts.evaluated.args}
    for name, value in facts.layer.args:
        if value and (secret_name(name) or secret_value(value)):
            yield _at_key(facts, "EFA013", ("args", name),
                          f"build arg {name} carries a secret (value not shown)", _secret_fix(name))
    for arg in facts.evaluated.args:
        if arg.from_graph or not arg.value:
            continue  # graph values are reported above, at the graph's line
        if secret_name(arg.name) or secret_value(arg.value):
            yield _at(facts, "EFA013", arg.line,
                      f"ARG {arg.name} has a default that looks like a secret (value not shown)",
                      _secret_fix(arg.name))
    for env in facts.evaluated.envs:
        if not env.value or _ONLY_A_VARIABLE.match(env.value):
            continue  # `ENV X=${X}` with X unset: nothing is stored
        via_arg = any(name in declared for name in _arg_names(env.raw))
        if secret_name(env.name) or secret_value(env.value):
            what = "copies a build arg that looks like a secret" if via_arg else "looks like a secret"
            yield _at(facts, "EFA013", env.line,
                      f"ENV {env.name} {what} (value not shown): it stays in the image config",
                      _secret_fix(env.name))
    for rc in facts.evaluated.runs:
        if any(secret_value(word) for word in rc.command.words):
            yield _at(facts, "EFA013", rc.line,
                      f"a RUN command ({rc.command.program}) contains a literal credential (value not shown)",
                      _SECRET_FIX)


# --- EFA014: installer version -------------------------------------------------------------------


@rule("EFA014")
def installer_version(facts: LayerFacts) -> Iterator[Finding]:
    host = facts.settings.audit.host_efa_installer
    for rc, commands in _installer_commands(facts):
        versions = [m.group(1) for other in commands for w in other.command.argv
                    for m in [INSTALLER_TARBALL.search(w)] if m]
        if not versions:
            continue
        version = versions[0]
        if UNRESOLVED.search(version):
            names = ", ".join(_arg_names(version))
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
        return _at_key(facts, "EFA014", ("args", "EFA_INSTALLER_VERSION"), message, fix)
    return _at(facts, "EFA014", arg.line if arg is not None else rc.line, message, fix)
