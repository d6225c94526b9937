"""What keeps a rebuild from building the same thing: the base pinned by digest, git and pip
sources pinned to commits, pip and apt packages pinned to versions, ARG defaults agreeing with the args (EFA010, EFA011,
EFA012, EFA017, EFA018)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from efabuild.lint.chain import LayerFacts
from efabuild.lint.finding import Finding
from efabuild.lint.rules.registry import HEX40, UNRESOLVED, arg_names, at, at_key, rule, runs
from efabuild.lint.shell import Command, lookup_in, split_words
from efabuild.redact import is_secret_arg


# --- EFA010: base pinned by digest ----------------------------------------------------------------


@rule("EFA010")
def base_digest(facts: LayerFacts) -> Iterator[Finding]:
    base = facts.layer.base
    if base is None or base.digest or "@sha256:" in base.ref:
        return
    yield at_key(facts, "EFA010", ("base",),
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


_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def redact_url(url: str) -> str:
    """A URL without its user:password/token part (`https://***@github.com/...`)."""
    return _URL_USERINFO.sub("***@", url)


@rule("EFA011")
def pinned_git(facts: LayerFacts) -> Iterator[Finding]:
    for commands in runs(facts).values():
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
                yield at(facts, "EFA011", clone.line,
                          f"git clone of {url} without checking out a pinned commit: the build changes "
                          "whenever the branch moves", fix)
                continue
            rc, revision = revisions[0]
            if HEX40.fullmatch(revision) or (revision == "FETCH_HEAD" and any(HEX40.fullmatch(w) for w in fetched)):
                continue
            names = arg_names(rc.command.text)
            if UNRESOLVED.search(revision):
                missing = ", ".join(names) or revision
                yield at(facts, "EFA011", rc.line,
                          f"git checkout {revision}: {missing} has no value, so the commit is not pinned",
                          f"give {missing} a 40-hex commit in the layer's args or the ARG default")
            else:
                via = f" (from {', '.join(names)})" if names else ""
                yield at(facts, "EFA011", rc.line,
                          f"git checkout '{revision}'{via} is not a 40-hex commit: branches and tags move",
                          "check out the full commit hash")
    for rc in facts.evaluated.runs:
        if not _is_pip_install(rc.command):
            continue
        for requirement in _pip_requirements(rc.command):
            if requirement.startswith("git+"):
                ref = requirement.split("#", 1)[0].rsplit("@", 1)
                if len(ref) < 2 or not HEX40.fullmatch(ref[1]) or ref[0].endswith(":"):
                    yield at(facts, "EFA011", rc.line,
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
            yield at(facts, "EFA017", rc.line,
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
                yield at(facts, "EFA012", rc.line,
                          f"pip installs {requirement} on an NGC base: it replaces NVIDIA's build of "
                          f"{match.group(1)} (tested with the image's CUDA and NCCL) with a PyPI one",
                          "use the NGC release that carries the version you need, or install with "
                          "--no-deps only what the NGC image lacks")
            elif large and (not _pinned(spec) or upgrade):
                yield at(facts, "EFA012", rc.line,
                          f"pip installs {requirement} without a pinned version: the next build may pull a "
                          "different multi-GB wheel (and a different NCCL/CUDA)",
                          f"pin it: `{match.group(1)}==<version>`")


# --- EFA018: ARG default differs from the layer's args ---------------------------------------------


@rule("EFA018")
def arg_defaults(facts: LayerFacts) -> Iterator[Finding]:
    args = facts.layer.args_dict
    plain: dict[str, str] = {}  # what a plain `docker build` of the text has: the defaults alone
    for ins in facts.evaluated.instructions:
        if ins.keyword != "ARG":
            continue
        for word in split_words(ins.value, lookup_in(plain)):  # `ARG B=${A}` is A's default
            name, has_default, default = word.partition("=")
            if has_default:
                plain[name] = default
            else:  # declared without a default: empty in a plain build, unless declared with one before
                plain.setdefault(name, "")
            if not has_default or name not in args or args[name] == default:
                continue
            shown = ("" if is_secret_arg(name, default) or is_secret_arg(name, args[name])
                     else f" ({default!r}, the args {args[name]!r})")
            yield at(facts, "EFA018", ins.line,
                     f"ARG {name} defaults to another value than the layer's args{shown}: the build uses the "
                     "args, a reader or a plain `docker build` of this text the default",
                     f"make the default the args' value, or drop the default (`ARG {name}`)")
