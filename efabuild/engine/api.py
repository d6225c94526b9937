"""The Engine's HTTP API over its local unix socket: what a plan asks, without a CLI process each.

A no-op plan asks the engine three things (does it answer, which efabuild/* tags it has, the base's
ID and repository digests), a make one more (its leftover export containers); each `docker` process costs tens of milliseconds, one request on the
socket well under one. Only for a local `unix://` engine: ssh:// and TLS tcp:// hosts, and docker
contexts that name another endpoint, keep the docker CLI, which knows how to reach them.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from pathlib import Path
from urllib.parse import quote

DEFAULT_SOCKET = "/var/run/docker.sock"
# The inventory is a few kilobytes per image; a reply larger than this is not an engine's.
MAX_REPLY_BYTES = 64 << 20


class ApiError(Exception):
    """The socket did not answer as an engine does; `kind` is "absent", "denied", "timeout" or "reply"."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def local_socket(host: str | None, context: str | None) -> str | None:
    """The unix socket the docker CLI would use for `host`/`context`, None when it would use
    anything else (another context, ssh://, tcp://): those keep the CLI."""
    if context:
        return None
    if host is None:
        if os.environ.get("DOCKER_CONTEXT", "default") != "default" or _current_context() != "default":
            return None
        host = os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"
    return host.removeprefix("unix://") if host.startswith("unix://") else None


def _current_context() -> str:
    """The CLI's current context from its config file: the cheap part of `docker context show`."""
    config = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    try:
        return json.loads(config.read_text()).get("currentContext") or "default"
    except FileNotFoundError:
        return "default"
    except (OSError, ValueError, AttributeError):
        return "unknown"  # let the CLI read what this cannot


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class EngineApi:
    """Read-only requests to one engine's socket, each within `timeout` seconds."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout

    def get(self, url: str) -> tuple[int, object]:
        """(status, decoded JSON body) of GET `url`; ApiError when no engine answers in time."""
        connection = _UnixConnection(self.path, self.timeout)
        try:
            connection.request("GET", url, headers={"Host": "docker"})
            reply = connection.getresponse()
            body = reply.read(MAX_REPLY_BYTES + 1)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise ApiError("absent", f"nothing listens on {self.path} ({exc.strerror})") from None
        except PermissionError:
            raise ApiError("denied", f"permission denied on {self.path}") from None
        except TimeoutError:
            raise ApiError("timeout", f"{self.path} did not answer within {self.timeout:g}s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise ApiError("reply", f"{self.path}: {exc or type(exc).__name__}") from None
        finally:
            connection.close()
        if len(body) > MAX_REPLY_BYTES:
            raise ApiError("reply", f"{self.path}: reply to {url} larger than {MAX_REPLY_BYTES >> 20} MiB")
        try:
            return reply.status, json.loads(body or b"null")
        except ValueError:
            raise ApiError("reply", f"{self.path}: {url} did not answer JSON (HTTP {reply.status})") from None

    def server_version(self) -> str:
        status, data = self.get("/version")
        if status != 200 or not isinstance(data, dict) or not data.get("Version"):
            raise ApiError("reply", f"{self.path}: /version answered HTTP {status}")
        return str(data["Version"])

    def repo_tags(self) -> list[str]:
        """Every `repo:tag` of every image, as `docker image ls` lists them."""
        status, data = self.get("/images/json")
        if status != 200 or not isinstance(data, list):
            raise ApiError("reply", f"{self.path}: /images/json answered HTTP {status}: {_message(data)}")
        return [tag for image in data if isinstance(image, dict)
                for tag in image.get("RepoTags") or [] if isinstance(tag, str)]

    def inspect(self, ref: str) -> dict | None:
        """An image's inspect document (`Id`, `RepoDigests`, ...), None when the engine has no
        image of that name."""
        status, data = self.get(f"/images/{quote(ref, safe='/:@')}/json")
        if status == 404:
            return None
        if status != 200 or not isinstance(data, dict):
            raise ApiError("reply", f"{self.path}: cannot inspect {ref} (HTTP {status}): {_message(data)}")
        return data


    def labelled_containers(self, label: str) -> list[tuple[str, dict[str, str]]]:
        """(name, labels) of every container, running or not, that carries `label`."""
        filters = quote(json.dumps({"label": [label]}), safe="")
        status, data = self.get(f"/containers/json?all=1&filters={filters}")
        if status != 200 or not isinstance(data, list):
            raise ApiError("reply", f"{self.path}: /containers/json answered HTTP {status}: {_message(data)}")
        found = []
        for container in data:
            if isinstance(container, dict) and container.get("Names"):
                labels = container.get("Labels") or {}
                found.append((str(container["Names"][0]).lstrip("/"),
                              {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}))
        return found


def _message(data: object) -> str:
    return str(data.get("message", "")) if isinstance(data, dict) else ""
