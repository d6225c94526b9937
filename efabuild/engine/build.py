"""Build one layer image with `docker buildx build`, and tag it only once the build is complete.

The build itself is untagged (`--load` with `--iidfile`/`--metadata-file`); `docker tag` runs at the
very end, so a failed or interrupted build leaves no image tagged with the layer's key: a tag means
a finished layer.

The buildx process is started here rather than through python-on-whales' `buildx.build(...,
stream_logs=True)`, because that hides the child process: on SIGINT or a cancel the child must be
told to stop, or it keeps building after efabuild has given up. The command line is python-on-whales'
(`Engine.command`), so --host/--context are the same as for every other call.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from efabuild.host import children
from efabuild.engine.buildlog import BuildFailure, BuildLogReader
from efabuild.engine.client import NO_DOCKER_CLI, Engine, EngineUnavailable
from efabuild.engine.images import image_id as lookup_image_id
from efabuild.engine.images import tag_image
from efabuild.errors import EfabuildError
from efabuild.settings import DEFAULT_PLATFORM
from efabuild.redact import Redactor, is_secret_arg
from efabuild.display import shown
from efabuild.host.fsutil import open_dir, relative_parts
from efabuild.host.scratch import scratch_dir

# After SIGINT buildx cancels the build on the engine and exits; it gets this long before SIGKILL.
STOP_GRACE_S = 30.0
# How often a cancel event is looked at while a build runs.
CANCEL_POLL_S = 0.25
STEP_SHOWN_CHARS = 160


def _frozen_dict(value: Mapping[str, str]) -> dict[str, str]:
    return {str(key): str(val) for key, val in dict(value).items()}


@attrs.frozen
class BuildRequest:
    """One layer build. The Dockerfile is complete (with its FROM) and the context is prepared."""

    tag: str  # e.g. efabuild/<layer>:<key>
    dockerfile: str
    context_dir: Path
    build_args: dict[str, str] = attrs.field(factory=dict, converter=_frozen_dict)
    secrets: tuple[str, ...] = ()  # env var names, given to BuildKit as secrets of the same id
    labels: dict[str, str] = attrs.field(factory=dict, converter=_frozen_dict)
    platform: str = DEFAULT_PLATFORM
    source_date_epoch: int = 0
    no_cache: bool = False  # every step runs again (make --check)
    # REGISTRY/efabuild/<layer>:<key>: BuildKit pushes the image there itself (a builder that
    # cannot load into the local engine); nothing is loaded or tagged locally
    push: str = ""
    insecure: bool = False  # the push registry speaks plain HTTP


@attrs.frozen
class BuildResult:
    tag: str
    image_id: str  # sha256:...
    log_path: Path
    seconds: float
    cached: bool  # every instruction came from BuildKit's cache


class BuildFailed(EfabuildError):
    """The build ran and failed. The message names the step and shows its last output lines."""

    def __init__(self, tag: str, failure: BuildFailure, log_path: Path) -> None:
        self.tag = tag
        self.failure = failure
        self.log_path = log_path
        super().__init__(format_failure(tag, failure, log_path))


class BuildInterrupted(EfabuildError):
    """The build was cancelled before it finished; nothing was tagged."""

    exit_code = 130


def format_failure(tag: str, failure: BuildFailure, log_path: Path) -> str:
    """`build of TAG failed at STEP: exit code N (log: PATH)` and the last lines, indented."""
    if failure.step:
        step = shown(failure.step)
        step = step if len(step) <= STEP_SHOWN_CHARS else step[: STEP_SHOWN_CHARS - 1] + "…"
        why = f"exit code {failure.exit_code}" if failure.exit_code is not None else shown(failure.reason)
        head = f"build of {tag} failed at {step}: {why}"
    else:  # BuildKit's reason may quote a registry's answer
        head = f"build of {tag} failed: {shown(failure.reason)}"
    lines = [f"{head} (log: {log_path})"]
    if failure.tail:
        lines.append("last lines:")
        lines.extend(f"  | {shown(line)}" for line in failure.tail)  # the build's output: escapes shown
    return "\n".join(lines)


def builder_name(engine: Engine) -> str:
    """How a builder is named in logs and messages: as BUILD.toml names it."""
    settings = engine.settings
    if engine.buildx_builder:
        return f"buildx:{engine.buildx_builder}"
    return settings.context or settings.host or "the local engine"


def buildx_command(engine: Engine, req: BuildRequest, iidfile: Path, metadata_file: Path) -> list[str]:
    """The `docker buildx build` command line; the Dockerfile comes on stdin.

    No secret is on it, since any user sees a command line in `ps`: a secret-looking build arg
    goes by name (`--build-arg NAME`, buildx reads the value from its environment, see
    `buildx_environment`), and a BuildKit secret by id (`--secret id=NAME,env=NAME`).
    """
    if req.push:
        output = f"type=image,name={req.push},push=true" + (",registry.insecure=true" if req.insecure else "")
        args = ["buildx", "build", "--progress", "plain", "--file", "-", "--output", output]
    else:
        args = ["buildx", "build", "--progress", "plain", "--file", "-", "--load"]
    # a plain single-platform image: attestations would make it an index, which the
    # docker driver's image store and Enroot do not take
    args += ["--provenance=false", "--sbom=false", "--platform", req.platform,
             "--iidfile", str(iidfile), "--metadata-file", str(metadata_file)]
    if engine.buildx_builder:
        args += ["--builder", engine.buildx_builder]
    if req.no_cache:
        args.append("--no-cache")
    build_args = {**req.build_args, "SOURCE_DATE_EPOCH": str(req.source_date_epoch)}
    for key, value in build_args.items():
        args += ["--build-arg", key if is_secret_arg(key, value) else f"{key}={value}"]
    for name in req.secrets:
        args += ["--secret", f"id={name},env={name}"]
    for key, value in req.labels.items():
        args += ["--label", f"{key}={value}"]
    args.append(str(req.context_dir))
    return engine.command(*args)


def buildx_environment(req: BuildRequest, tmpdir: str) -> dict[str, str]:
    """What buildx's environment adds to ours: the values of the args passed by name, and `tmpdir`
    (the build's scratch directory) as TMPDIR: buildx copies a Dockerfile read from stdin into
    $TMPDIR/dockerfileNNN and never removes it, so there it goes with the scratch directory."""
    env = {"SOURCE_DATE_EPOCH": str(req.source_date_epoch), "TMPDIR": tmpdir}
    env.update({key: value for key, value in req.build_args.items() if is_secret_arg(key, value)})
    return env


def build_layer(
    engine: Engine,
    req: BuildRequest,
    log_path: Path,
    on_line: Callable[[str], None] | None = None,
    cancel: threading.Event | None = None,
    redact: Callable[[str], str] | None = None,
    log_root: Path | None = None,
) -> BuildResult:
    """Build `req` on `engine`, then tag the image `req.tag`.

    Every line of BuildKit's plain output goes to `log_path` (kept whole) and to `on_line`.
    Raises BuildFailed when the build fails, BuildInterrupted when `cancel` is set meanwhile, and
    re-raises KeyboardInterrupt after stopping buildx; in all three cases nothing is tagged.
    `redact` hides secret values in every line (by default, those of this request). The log's
    directories are made below `log_root` (the store's root; by default the log's own directory)
    without following a link.
    """
    if not req.context_dir.is_dir():
        raise EfabuildError(f"build of {req.tag}: context directory {req.context_dir} does not exist")
    started = time.monotonic()
    reader = BuildLogReader()
    with scratch_dir("build") as scratch, _fresh_log(log_path, log_root or log_path.parent) as log:
        iidfile, metadata_file = Path(scratch, "iid"), Path(scratch, "metadata.json")
        command = buildx_command(engine, req, iidfile, metadata_file)
        where = f" for {req.push}" if req.push else ""
        log.write(f"# efabuild: building {req.tag}{where} on {builder_name(engine)} "
                  f"(SOURCE_DATE_EPOCH={req.source_date_epoch})\n")
        log.flush()
        missing = [name for name in req.secrets if name not in os.environ]
        if missing:
            raise EfabuildError(f"build of {req.tag}: secret {missing[0]} is not set in the environment")
        # BuildKit expands ARG values into step names, and a RUN may print a secret: every line
        # is redacted before it is logged, parsed for failures or shown
        redact = redact or Redactor.for_build(req.build_args, req.secrets, os.environ)
        returncode = _run_buildx(command, req.dockerfile, buildx_environment(req, scratch), log, reader,
                                 on_line, cancel, redact)
        if cancel is not None and cancel.is_set():
            raise BuildInterrupted(f"build of {req.tag} was cancelled; nothing was tagged")
        if returncode != 0:
            raise BuildFailed(req.tag, reader.failure(), log_path)
        if req.push:
            # the registry holds it under its manifest digest: that is what a child's FROM names
            built = _metadata(metadata_file).get("containerimage.digest")
            if not built:
                raise EfabuildError(f"build of {req.tag} finished but buildx named no pushed digest "
                                    f"(log: {log_path})")
        else:
            built = _built_image_id(engine, iidfile, metadata_file)
            if built is None:
                raise EfabuildError(
                    f"build of {req.tag} finished but its image is not in the engine at {engine.where()} "
                    f"(log: {log_path})"
                )
            # the one step that makes the layer count as built
            tag_image(engine, built, req.tag)
    return BuildResult(
        tag=req.tag, image_id=built, log_path=log_path,
        seconds=time.monotonic() - started, cached=reader.fully_cached,
    )


def _fresh_log(path: Path, root: Path):  # noqa: ANN202 - a text file
    """The build log, created anew: whatever was planted at its name (a link to another file, a
    hard link to one) is removed, never written through, and no directory below `root` is reached
    through a link: logs/ may sit on a shared path."""
    try:
        dir_fd = open_dir(root, relative_parts(root, path.parent), create=True)
    except OSError as exc:
        raise EfabuildError(f"{shown(path.parent)}: cannot create the build log's directory ({exc.strerror})") from None
    try:
        with contextlib.suppress(OSError):  # absent, or a directory: the create below says so
            os.unlink(path.name, dir_fd=dir_fd)
        fd = os.open(path.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=dir_fd)
    except OSError as exc:
        raise EfabuildError(f"{shown(path)}: cannot create the build log ({exc.strerror})") from None
    finally:
        os.close(dir_fd)
    return os.fdopen(fd, "w", encoding="utf-8", errors="replace")


def _run_buildx(command, dockerfile, env, log, reader, on_line, cancel, redact=lambda text: text) -> int:
    try:
        process = children.popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )
    except FileNotFoundError:
        raise EngineUnavailable(NO_DOCKER_CLI) from None
    watcher = None
    if cancel is not None:
        watcher = threading.Thread(target=_watch_cancel, args=(process, cancel), daemon=True)
        watcher.start()
    try:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(dockerfile.encode())
        process.stdin.close()
        for raw in process.stdout:
            line = redact(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
            log.write(line + "\n")
            log.flush()
            reader.feed(line)
            if on_line is not None:
                on_line(line)
        return process.wait()
    except BaseException:
        # KeyboardInterrupt, or an error in on_line: buildx must not go on building alone
        _stop(process, log, redact)
        raise
    finally:
        if watcher is not None:
            watcher.join(timeout=CANCEL_POLL_S * 4)


def _watch_cancel(process: subprocess.Popen, cancel: threading.Event) -> None:
    while process.poll() is None:
        if cancel.wait(CANCEL_POLL_S):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
            return


def _stop(process: subprocess.Popen, log, redact=lambda text: text) -> None:
    """SIGINT (buildx then cancels the build on the engine), SIGKILL if it does not exit."""
    if process.poll() is None:
        try:
            process.send_signal(signal.SIGINT)
        except ProcessLookupError:
            pass
    # keep reading so buildx never blocks on a full pipe while it shuts down
    drain = threading.Thread(target=_drain, args=(process, log, redact), daemon=True)
    drain.start()
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    drain.join(timeout=5)
    try:
        log.write("# efabuild: build stopped before it finished; nothing was tagged\n")
        log.flush()
    except ValueError:  # log already closed
        pass


def _drain(process: subprocess.Popen, log, redact) -> None:
    try:
        for raw in process.stdout:
            log.write(redact(raw.decode("utf-8", errors="replace")))
    except (ValueError, OSError):
        pass


def _built_image_id(engine: Engine, iidfile: Path, metadata_file: Path) -> str | None:
    """The loaded image's ID. The config digest is right for every driver (the iidfile is not
    with docker-container + --load); the iidfile is the fallback."""
    candidates = [_metadata(metadata_file).get("containerimage.config.digest")]
    try:
        candidates.append(iidfile.read_text().strip())
    except OSError:
        pass
    for candidate in candidates:
        if candidate:
            found = lookup_image_id(engine, candidate)
            if found:
                return found
    return None


def build_image(engine: Engine, context_dir: Path, tag: str, labels: Mapping[str, str],
                platform: str | None = None) -> str:
    """Build the Dockerfile in `context_dir` into `tag` in one go, through python-on-whales; returns
    the image ID. For images outside the layer graph (the offline fixtures): nothing to cancel or
    stream, so none of `build_layer`'s reasons to run buildx itself applies. `platform`: build for
    it (under QEMU when the engine's machine is another), None for the engine's own."""
    from python_on_whales.exceptions import DockerException

    more = {"platforms": [platform]} if platform else {}
    try:
        engine.client.buildx.build(context_dir, tags=[tag], labels=dict(labels), load=True, progress=False, **more)
    except DockerException as exc:
        lines = [ln for ln in (exc.stderr or "").splitlines() if ln.strip()]
        raise EfabuildError(f"building {tag} failed: {lines[-1] if lines else exc}") from None
    built = lookup_image_id(engine, tag)
    if built is None:
        raise EfabuildError(f"building {tag} failed: the engine has no image {tag} afterwards")
    return built


def _metadata(metadata_file: Path) -> dict:
    try:
        metadata = json.loads(metadata_file.read_text())
    except (OSError, ValueError):
        return {}
    return metadata if isinstance(metadata, dict) else {}
