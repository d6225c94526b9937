"""A TCP proxy on loopback in front of the S3 server: real sockets, real resets, counted requests.

The S3 tier talks to the proxy's endpoint as to any S3 endpoint. Rules reset (RST, not FIN) the
client's connection when a request matching a pattern passes: either at once, while its body is
still being sent (a part upload), or after some bytes of the response body have been forwarded
(a ranged GET cut mid-stream), as a flaky network or a load balancer would. Every request's
method, path and range start is recorded, for tests that must show how often a client really
went to the server (S3 GETs of one object, say).
"""

from __future__ import annotations

import re
import socket
import struct
import threading
from collections.abc import Iterator
from urllib.parse import urlparse

import pytest


class Rule:
    def __init__(self, pattern: bytes, times: int, after_response_bytes: int | None) -> None:
        self.pattern = pattern
        self.left = times
        self.after = after_response_bytes  # None: reset while the request is being sent
        self.fired = 0


_REQUEST_LINE = re.compile(rb"^(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP/1\.[01]\r\n", re.M)
_RANGE = re.compile(rb"^range: *bytes=(\d+)-", re.M | re.I)
_HEAD_LIMIT = 16384


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        url = urlparse(upstream)
        self.upstream = (url.hostname, url.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.rules: list[Rule] = []
        self.lock = threading.Lock()
        self.connections = 0
        self.requests: list[tuple[str, str, int | None]] = []  # (method, path, range start)
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def reset_request(self, pattern: bytes, times: int = 1) -> Rule:
        """Reset the connection as soon as a request containing `pattern` starts (its body unsent)."""
        rule = Rule(pattern, times, None)
        self.rules.append(rule)
        return rule

    def reset_response(self, pattern: bytes, after: int, times: int = 1) -> Rule:
        """Reset the connection after `after` bytes of the response to a matching request."""
        rule = Rule(pattern, times, after)
        self.rules.append(rule)
        return rule

    def gets(self, path_suffix: str, range_start: int | None = None) -> int:
        """GET requests seen for paths ending in `path_suffix` (from byte `range_start`, if given)."""
        with self.lock:
            return sum(1 for method, path, start in self.requests
                       if method == "GET" and path.split("?")[0].endswith(path_suffix)
                       and (range_start is None or start == range_start))

    def close(self) -> None:
        self.closed = True
        self.listener.close()

    # ---- plumbing
    def _match(self, data: bytes) -> Rule | None:
        with self.lock:
            for rule in self.rules:
                if rule.left > 0 and rule.pattern in data:
                    rule.left -= 1
                    rule.fired += 1
                    return rule
        return None

    def _note(self, stream: bytes) -> bytes:
        """Record every complete request head in `stream`; return what is left unparsed (its tail:
        a head is far shorter, and a part upload's body must not be rescanned at every read).
        Exact for bodiless requests (GET, HEAD), all that the counts look at."""
        while (end := stream.find(b"\r\n\r\n")) >= 0:
            head, stream = stream[:end + 4], stream[end + 4:]
            line = _REQUEST_LINE.search(head)
            if line:
                start = _RANGE.search(head)
                with self.lock:
                    self.requests.append((line.group(1).decode(), line.group(2).decode(),
                                          int(start.group(1)) if start else None))
        return stream[-_HEAD_LIMIT:]

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            _reset(client)
            return
        armed: list[int | None] = [None]  # response bytes left before a reset, when armed
        done = threading.Event()

        def upstream_to_client() -> None:
            try:
                while True:
                    data = server.recv(65536)
                    if not data:
                        break
                    if armed[0] is not None:
                        if len(data) >= armed[0]:
                            client.sendall(data[: armed[0]])
                            _reset(client)
                            break
                        armed[0] -= len(data)
                    client.sendall(data)
            except OSError:
                pass
            finally:
                done.set()
                _close(client)
                _close(server)

        threading.Thread(target=upstream_to_client, daemon=True).start()
        pending = b""
        try:
            while not done.is_set():
                data = client.recv(65536)
                if not data:
                    break
                pending = self._note(pending + data)
                rule = self._match(data[:4096]) if data[:8].split(b" ")[0] in _METHODS else None
                if rule is not None and rule.after is None:
                    _reset(client)
                    break
                if rule is not None:
                    armed[0] = rule.after
                server.sendall(data)
        except OSError:
            pass
        finally:
            _close(server)


_METHODS = {b"GET", b"PUT", b"POST", b"HEAD", b"DELETE"}


def _reset(sock: socket.socket) -> None:
    """Close with RST: SO_LINGER on, timeout 0. The read side is shut first, which wakes the other
    thread's recv on this socket, so the close really releases it (and sends the RST) now."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


@pytest.fixture
def fault_proxy(moto_server: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(moto_server)
    try:
        yield proxy
    finally:
        proxy.close()
