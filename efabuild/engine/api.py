"""The Engine's HTTP API over its local unix socket: what a plan asks, without a CLI process each.

A no-op plan asks the engine three things (does it answer, which efabuild/* tags it has, the
base's ID and repository digests), a make one more (its leftover export containers); each
`docker` process costs tens of milliseconds, one request on the socket well under one. Only for a
local `unix://` engine: ssh:// and TLS tcp:// hosts, and docker contexts that name another
endpoint, keep the docker CLI, which knows how to reach them.
"""

from __future__ import annotations

import json
import os
import time
# the socket type itself: the socket module around it converts four IntEnums at import, 13 M
# instructions (a tenth of a no-op plan's imports) for names this module does not use
from _socket import AF_UNIX, SOCK_STREAM, socket as unix_socket
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


class EngineApi:
    """Read-only requests to one engine's socket, each within `timeout` seconds in all.

    HTTP/1.0 by hand, a request per connection: the engine then sends the body whole and closes,
    and http.client would bring email and ssl along (about a sixth of a no-op plan's imports)."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout

    def get(self, url: str) -> tuple[int, object]:
        """(status, decoded JSON body) of GET `url`; ApiError when no engine answers in time."""
        try:
            reply = self._exchange(f"GET {url} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise ApiError("absent", f"nothing listens on {self.path} ({exc.strerror})") from None
        except PermissionError:
            raise ApiError("denied", f"permission denied on {self.path}") from None
        except TimeoutError:
            raise ApiError("timeout", f"{self.path} did not answer within {self.timeout:g}s") from None
        except OSError as exc:
            raise ApiError("reply", f"{self.path}: {exc.strerror or exc}") from None
        status, body = _parse_reply(reply, self.path)
        try:
            return status, json.loads(body or b"null")
        except ValueError:
            raise ApiError("reply", f"{self.path}: {url} did not answer JSON (HTTP {status})") from None

    def _exchange(self, request: bytes) -> bytes:
        deadline = time.monotonic() + self.timeout
        sock = unix_socket(AF_UNIX, SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.path)
            sock.sendall(request)
            reply = bytearray()
            while chunk := sock.recv(1 << 16):
                reply += chunk
                if len(reply) > MAX_REPLY_BYTES:
                    raise ApiError("reply", f"{self.path}: a reply larger than {MAX_REPLY_BYTES >> 20} MiB")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
        finally:
            sock.close()
        return bytes(reply)

    def server_version(self) -> str:
        status, data = self.get("/version")
        if status != 200 or not isinstance(data, dict) or not data.get("Version"):
            raise ApiError("reply", f"{self.path}: /version answered HTTP {status}")
        return str(data["Version"])

    def server_platform(self) -> str | None:
        """os/arch of the engine's machine, as /version says (linux/amd64), None when it does not."""
        status, data = self.get("/version")
        if status != 200 or not isinstance(data, dict) or not data.get("Os") or not data.get("Arch"):
            return None
        return f"{data['Os']}/{data['Arch']}"

    def repo_tags(self, reference: str | None = None) -> list[str]:
        """Every `repo:tag` of every image (whose name matches the `reference` pattern, when given),
        as `docker image ls` lists them."""
        query = "" if reference is None else "?filters=" + quote(json.dumps({"reference": [reference]}), safe="")
        status, data = self.get(f"/images/json{query}")
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


def _parse_reply(reply: bytes, path: str) -> tuple[int, bytes]:
    """(status, body) of an HTTP reply read to its end."""
    head, separator, body = reply.partition(b"\r\n\r\n")
    fields = head.split(b"\r\n")
    status = fields[0].split(b" ", 2)
    if not separator or len(status) < 2 or not status[0].startswith(b"HTTP/") or not status[1].isdigit():
        raise ApiError("reply", f"{path}: not an HTTP reply")
    headers = {name.strip().lower(): value.strip() for name, _, value in (f.partition(b":") for f in fields[1:])}
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = _unchunked(body, path)
    return int(status[1]), body


def _unchunked(body: bytes, path: str) -> bytes:
    parts, at = [], 0
    while True:
        line_end = body.find(b"\r\n", at)
        try:
            size = int(body[at:line_end].split(b";")[0], 16) if line_end >= 0 else -1
        except ValueError:
            size = -1
        if size < 0:
            raise ApiError("reply", f"{path}: a chunked reply cut short")
        if size == 0:
            return b"".join(parts)
        parts.append(body[line_end + 2:line_end + 2 + size])
        at = line_end + 2 + size + 2


def _message(data: object) -> str:
    return str(data.get("message", "")) if isinstance(data, dict) else ""
