"""The engine that builds: a python-on-whales client for the `[builder]` settings, and its checks.

`[builder] host` and `[builder] context` pick the Docker engine (its images and its embedded
BuildKit); `[builder] buildx_builder` picks a buildx builder for the builds themselves.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from efabuild.engine.api import ApiError, EngineApi, local_socket
from efabuild.errors import EfabuildError, InputError
from efabuild.settings import BuilderSettings

if TYPE_CHECKING:
    import subprocess

    from python_on_whales import DockerClient

DOCKER_CLI = "docker"

DEFAULT_HOST = "unix:///var/run/docker.sock"
# Answers from a healthy engine take well under a second; a dead ssh:// or tcp:// host can hang.
CHECK_TIMEOUT_S = 20.0
NO_DOCKER_CLI = "docker CLI not found on PATH: install it with `bash scripts/setup-host.sh`"
HOW_TO_START = "start one with `bash scripts/setup-host.sh` or set [builder] host/context in BUILD.toml"
# a builder of a farm is named by its entry in [builder] farm, never by host/context/buildx_builder
HOW_TO_START_NODE = "start it, or fix or remove its entry in [builder] farm in BUILD.toml"


class EngineUnavailable(EfabuildError):
    """No engine answers where the settings point, or the CLI/buildx is missing."""


class EngineTimeout(EfabuildError):
    """A docker command that should answer quickly did not."""


class EngineError(EfabuildError):
    """A docker command failed; the message is its first line of error output."""

    @classmethod
    def from_output(cls, what: str, stderr: str | bytes | None) -> EngineError:
        return cls(f"{what}: {first_line(output_text(stderr))}")


class Engine:
    """A connection to one Docker engine (and optionally one buildx builder).

    Checks and inspections run the docker CLI directly; the python-on-whales client (about 0.15 s
    to import) is made only when a build, pull, push or export needs it.
    """

    def __init__(self, settings: BuilderSettings, farm_entry: str | None = None) -> None:
        self.settings = settings
        self.farm_entry = farm_entry  # the [builder] farm entry that named it, when one did

    def __repr__(self) -> str:
        return f"Engine(settings={self.settings!r})"

    @functools.cached_property
    def client(self) -> DockerClient:
        """python-on-whales, bound to the engine the settings name."""
        from python_on_whales import DockerClient

        return DockerClient(host=self.settings.host, context=self.settings.context)

    @functools.cached_property
    def api(self) -> EngineApi | None:
        """The Engine API on its local unix socket, for the plan's inventory; None when the
        engine is reached any other way (ssh://, tcp://, another docker context)."""
        path = local_socket(self.settings.host, self.settings.context)
        return EngineApi(path, CHECK_TIMEOUT_S) if path else None

    @property
    def buildx_builder(self) -> str | None:
        return self.settings.buildx_builder

    def command(self, *args: str) -> list[str]:
        """The docker command line for `args`, with the same --host/--context as the client."""
        target = (["--host", self.settings.host] if self.settings.host
                  else ["--context", self.settings.context] if self.settings.context else [])
        return [DOCKER_CLI, *target, *args]

    def run(
        self,
        *args: str,
        timeout: float | None = None,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a docker command to completion; never raises on a non-zero exit status.

        For the quick queries, each with its time limit (python-on-whales takes none), and for a
        registry push or pull, which must die with efabuild (a child of efabuild.host.children);
        what else acts on the engine goes through `client` (see efabuild.engine)."""
        import subprocess  # with the first docker process: a plan on the local socket starts none

        from efabuild.host import children

        full_env = None if env is None else {**os.environ, **env}
        try:
            return children.run(
                self.command(*args), input=input, capture_output=True, text=True,
                timeout=timeout, env=full_env,
            )
        except FileNotFoundError:
            raise EngineUnavailable(NO_DOCKER_CLI) from None
        except subprocess.TimeoutExpired:
            raise EngineTimeout(
                f"`docker {' '.join(args[:3])}` did not answer within {timeout:g}s at {self.where()}"
            ) from None

    def where(self) -> str:
        """Where this client looks for an engine, and which setting said so."""
        if self.settings.host:
            return f"{self.settings.host} ({'[builder] farm' if self.farm_entry else '[builder] host or --builder'})"
        if self.settings.context:
            named = ", [builder] farm" if self.farm_entry else ""
            return f"{self._context_endpoint(self.settings.context)} (docker context {self.settings.context}{named})"
        if os.environ.get("DOCKER_HOST"):
            return f"{os.environ['DOCKER_HOST']} (DOCKER_HOST)"
        context = os.environ.get("DOCKER_CONTEXT") or self._current_context()
        if context and context != "default":
            return f"{self._context_endpoint(context)} (docker context {context})"
        return f"{DEFAULT_HOST} (DOCKER_HOST unset)"

    def check(self, need_buildx: bool = True) -> None:
        """Raise EngineUnavailable, in one line saying where it looked, unless builds can run.

        `need_buildx=False` (a plan) only asks for the engine."""
        if shutil.which(DOCKER_CLI) is None:
            raise EngineUnavailable(NO_DOCKER_CLI)
        if self.settings.context:
            found = self._bare_run(["context", "inspect", self.settings.context])
            if found.returncode != 0:
                raise EngineUnavailable(
                    f"no docker context named {self.settings.context!r}: create it with "
                    f"`docker context create {self.settings.context} --docker host=...` "
                    f"or fix {self._setting('context')} in BUILD.toml"
                )
        self._check_answers()
        if need_buildx:
            self.check_buildx()
        if self.buildx_builder:
            found = self.run("buildx", "inspect", self.buildx_builder, timeout=CHECK_TIMEOUT_S)
            if found.returncode != 0:
                raise EngineUnavailable(
                    f"no buildx builder named {self.buildx_builder!r} at {self.where()} "
                    f"({first_line(found.stderr)}): create it with `docker buildx create --name "
                    f"{self.buildx_builder} ...` or fix {self._setting('buildx_builder')} in BUILD.toml"
                )
            self._check_builder_runs(found.stdout)

    def check_buildx(self) -> None:
        """The buildx plugin answers: what a build needs beyond the engine (two processes, so a
        make whose plan builds nothing does not ask)."""
        if self.run("buildx", "version", timeout=CHECK_TIMEOUT_S).returncode != 0:
            raise EngineUnavailable(
                "the docker buildx plugin is missing: install it with `bash scripts/setup-host.sh`"
            )

    def _check_answers(self) -> None:
        """An engine answers where the settings point: on its socket when local, else the CLI's
        `docker version`."""
        if self.api is not None:
            try:
                self.api.server_version()
                return
            except ApiError as exc:
                failure = exc.kind
        else:
            try:
                answer = self.run("version", "--format", "{{.Server.Version}}", timeout=CHECK_TIMEOUT_S)
            except EngineTimeout:
                failure = "timeout"
            else:
                failure = ("" if answer.returncode == 0 and answer.stdout.strip() else
                           "denied" if "permission denied" in answer.stderr.lower() else "absent")
        how = HOW_TO_START_NODE if self.farm_entry else HOW_TO_START
        if failure == "timeout":
            raise EngineUnavailable(
                f"no Docker engine answered within {CHECK_TIMEOUT_S:g}s at {self.where()}: {how}")
        if failure == "denied":
            raise EngineUnavailable(
                f"no access to the Docker engine at {self.where()} (permission denied): "
                "run as root or as a member of the docker group"
            )
        if failure:
            raise EngineUnavailable(f"no Docker engine at {self.where()}: {how}")

    def _check_builder_runs(self, inspected: str) -> None:
        """`buildx inspect` exits 0 for a builder none of whose nodes answers (`Status: inactive`):
        a make would fail 20 s later. A stopped docker-container or kubernetes builder is started
        here, as a build would start it; a `remote` one cannot be."""
        driver, nodes = builder_nodes(inspected)
        if any(status == "running" for _, _, status in nodes):
            return
        name = self.buildx_builder
        shown = ", ".join(f"{node} at {endpoint or '?'}: {status or 'no status'}" for node, endpoint, status in nodes)
        if driver != "remote":
            try:
                started = self.run("buildx", "inspect", "--bootstrap", name, timeout=CHECK_TIMEOUT_S)
            except EngineTimeout:
                started = None
            if started is not None and started.returncode == 0 and any(
                    status == "running" for _, _, status in builder_nodes(started.stdout)[1]):
                return
        how = ("start the BuildKit daemon it points at" if driver == "remote"
               else f"start it with `docker buildx inspect --bootstrap {name}`")
        raise EngineUnavailable(
            f"buildx builder {name!r} ({driver or 'unknown driver'}) is not running ({shown or 'no nodes'}): "
            f"{how}, or {'fix or remove ' if self.farm_entry else 'pick another in '}{self._setting('buildx_builder')}"
        )

    def _setting(self, name: str) -> str:
        """The BUILD.toml setting that named this builder, for a message saying what to fix."""
        return f"its entry {self.farm_entry!r} in [builder] farm" if self.farm_entry else f"[builder] {name}"

    def versions(self) -> dict[str, str | None]:
        """Versions of the client, engine, buildx and BuildKit, for build manifests."""
        version = self.client.version()
        server = version.server
        builder = self.client.buildx.inspect(self.buildx_builder)
        buildkit = next((node.version for node in builder.nodes if node.version), None)
        # Debian's engine embeds BuildKit without stamping its version
        if buildkit in ("v0.0.0+unknown", ""):
            buildkit = None
        buildx = self.client.buildx.version().split()
        return {
            "client": version.client.version if version.client else None,
            "engine": server.version if server else None,
            "engine_api": server.api_version if server else None,
            "buildx": buildx[1] if len(buildx) > 1 else None,
            "builder": builder.name,
            "builder_driver": builder.driver,
            "buildkit": buildkit,
        }

    def _bare_run(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """A client-side docker command without --host/--context (contexts are client config)."""
        import subprocess  # deferred with children (ctypes): only a docker context is looked up this way

        from efabuild.host import children

        try:
            return children.run([DOCKER_CLI, *args], capture_output=True, text=True,
                                  timeout=CHECK_TIMEOUT_S)
        except (FileNotFoundError, subprocess.TimeoutExpired):
            return subprocess.CompletedProcess(args, 1, "", "")

    def _context_endpoint(self, name: str) -> str:
        found = self._bare_run(["context", "inspect", name, "--format", "{{.Endpoints.docker.Host}}"])
        return found.stdout.strip() if found.returncode == 0 and found.stdout.strip() else "?"

    def _current_context(self) -> str | None:
        found = self._bare_run(["context", "show"])
        return found.stdout.strip() if found.returncode == 0 else None


def connect(builder: BuilderSettings, farm_entry: str | None = None) -> Engine:
    """A client for the engine `builder` names (`farm_entry`: the [builder] farm entry that did,
    which its messages then name). Cheap: nothing is contacted until `check()`."""
    if builder.host and builder.context:
        raise InputError(
            "set either host or context, not both (a context already names its host)",
            where="BUILD.toml [builder]",
        )
    return Engine(settings=builder, farm_entry=farm_entry)


def output_text(value: str | bytes | None) -> str:
    """A docker command's output as text, however python-on-whales hands it over."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value or ""


def first_line(text: str) -> str:
    """A docker error's first line, without the CLI's `ERROR: ` prefix."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0].removeprefix("ERROR: ") if lines else "no output"


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def builder_nodes(inspected: str) -> tuple[str, list[tuple[str, str, str]]]:
    """`docker buildx inspect` text → (driver, [(node, endpoint, status)])."""
    driver = ""
    nodes: list[tuple[str, str, str]] = []
    in_nodes = False
    for line in inspected.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "Nodes":
            in_nodes = True
        elif not in_nodes and key == "Driver":
            driver = value
        elif in_nodes and key == "Name":
            nodes.append((value, "", ""))
        elif in_nodes and nodes and key == "Endpoint":
            nodes[-1] = (nodes[-1][0], value, nodes[-1][2])
        elif in_nodes and nodes and key == "Status":
            nodes[-1] = (nodes[-1][0], nodes[-1][1], value)
    return driver, nodes
