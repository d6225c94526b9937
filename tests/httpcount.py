"""A loopback TCP proxy that counts the HTTP requests passing through it, for tests that must
show how often a client really went to the server (S3 GETs of one object, say)."""

from __future__ import annotations

import re
import socket
import threading
from urllib.parse import urlsplit

_REQUEST_LINE = re.compile(rb"^(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP/1\.[01]\r\n", re.M)
_RANGE = re.compile(rb"^range: *bytes=(\d+)-", re.M | re.I)


class CountingProxy:
    """Forwards 127.0.0.1:<port> to `upstream` (http://host:port) and records each request's
    method, path and range start. Requests are read from the client's stream as it flows, which is
    exact for bodiless requests (GET, HEAD) — all that the counts below look at."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname, parts.port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.requests: list[tuple[str, str, int | None]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def gets(self, path_suffix: str, range_start: int | None = None) -> int:
        with self._lock:
            return sum(1 for method, path, start in self.requests
                       if method == "GET" and path.split("?")[0].endswith(path_suffix)
                       and (range_start is None or start == range_start))

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        pending = b""
        try:
            while data := source.recv(65536):
                if requests:
                    pending = self._note(pending + data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _note(self, stream: bytes) -> bytes:
        """Record every complete request head in `stream`; return what is left unparsed."""
        while (end := stream.find(b"\r\n\r\n")) >= 0:
            head, stream = stream[:end + 4], stream[end + 4:]
            line = _REQUEST_LINE.search(head)
            if line:
                start = _RANGE.search(head)
                with self._lock:
                    self.requests.append((line.group(1).decode(), line.group(2).decode(),
                                          int(start.group(1)) if start else None))
        return stream
