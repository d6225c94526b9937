"""A hostile layer-cache registry: a loopback HTTP server written here answers the requests a
farm export and a plan make (the image config read by `buildx imagetools inspect`, the manifest
asked for by the plan) with a config whose digest does not match, JSON nested past any parser,
a redirect to another host, a body dripped a byte a second, or a status line carrying terminal
escapes. Each is one line naming the image, bounded in time, never a hang or a raw escape.

The docker CLI's buildx talks to the server (imagetools needs no engine); the plan's test asks
the real engine which layers it has, then this registry for the rest.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from efabuild.engine.client import connect
from efabuild.export.remote import registry_config
from efabuild.engine.registry import RegistryError
from efabuild.settings import BuilderSettings
from tests.kits.inprocess import run_efabuild
from tests.kits.wsfactory import SIMPLE_GRAPH, make_workspace

CONFIG = json.dumps({
    "architecture": "amd64", "os": "linux", "config": {"Env": ["A=1"], "WorkingDir": "/w"},
    "rootfs": {"type": "layers", "diff_ids": []}, "created": "2026-01-01T00:00:00Z",
    "history": [{"created": "2026-01-01T00:00:00Z"}]}).encode()
DEEP = (b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},"x":'
        + b"[" * 100_000 + b"]" * 100_000 + b"}")
ESCAPES = "\x1b]0;owned\x07\x1b[2J"


def _handler(mode: str) -> type[BaseHTTPRequestHandler]:
    config = DEEP if mode == "deep" else CONFIG
    served = config.replace(b"A=1", b"A=2") if mode == "mismatch" else config
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "layers": [],
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": "sha256:" + hashlib.sha256(config).hexdigest(), "size": len(config)}}).encode()

    class Registry(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _empty(self, status: int, reason: str | None = None, **headers: str) -> None:
            self.send_response(status, reason)
            for name, value in {"Content-Length": "0", **headers}.items():
                self.send_header(name, value)
            self.end_headers()

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
            self.do_GET(body=False)

        def do_GET(self, body: bool = True) -> None:  # noqa: N802
            if self.path == "/v2/":
                return self._empty(200)
            if mode == "refuse":
                return self._empty(403, f"Forbidden {ESCAPES}")
            if "/manifests/" in self.path and mode == "redirect":
                return self._empty(307, Location="http://127.0.0.2:9/v2/elsewhere")
            if "/manifests/" in self.path:
                data, kind = manifest, "application/vnd.oci.image.manifest.v1+json"
            elif "/blobs/" in self.path:
                data, kind = served, "application/octet-stream"
            else:
                return self._empty(404)
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if not body:
                return
            if mode == "drip" and "/blobs/" in self.path:
                try:
                    for i in range(len(data)):
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                        time.sleep(1)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # buildx was stopped: what the test waits for
                return
            self.wfile.write(data)

    return Registry


@pytest.fixture
def hostile_registry(request) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(request.param))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("hostile_registry", ["plain"], indirect=True)
def test_the_loopback_registry_serves_a_config_buildx_reads(hostile_registry):
    config, created = registry_config(connect(BuilderSettings()), f"{hostile_registry}/efabuild/x:k")
    assert config.workdir == "/w" and created == ["2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"]


@pytest.mark.parametrize(("hostile_registry", "said"), [
    ("mismatch", "unexpected digest"),
    ("deep", "exceeded max depth"),
    ("redirect", "127.0.0.2:9"),
], indirect=["hostile_registry"])
def test_a_config_the_registry_gets_wrong_is_one_line_naming_the_image(hostile_registry, said):
    ref = f"{hostile_registry}/efabuild/x:k"
    with pytest.raises(RegistryError) as caught:
        registry_config(connect(BuilderSettings()), ref)
    message = str(caught.value)
    assert message.startswith(f"cannot read the config of {ref}: ") and said in message
    assert "\n" not in message


@pytest.mark.slow
@pytest.mark.parametrize("hostile_registry", ["drip"], indirect=True)
def test_a_config_dripped_a_byte_a_second_is_given_up_after_the_timeout(hostile_registry, monkeypatch):
    # the config drips for minutes; a limit shorter than the real one keeps the test short
    monkeypatch.setattr("efabuild.export.remote.REMOTE_TIMEOUT_S", 1.0)
    started = time.monotonic()
    with pytest.raises(RegistryError, match="did not give the config of .* within 1s"):
        registry_config(connect(BuilderSettings()), f"{hostile_registry}/efabuild/x:k")
    assert time.monotonic() - started < 1.0 + 10


@pytest.mark.parametrize("hostile_registry", ["refuse"], indirect=True)
def test_a_refusal_carrying_terminal_escapes_is_one_warning_shown_escaped(hostile_registry, tmp_path, docker_engine):
    build = f'[workspace]\ngraphs = ["graphs/*.toml"]\n\n[registry]\nurl = "{hostile_registry}"\n'
    root = make_workspace(tmp_path / "ws", {"stack": SIMPLE_GRAPH}, build=build)
    proc = run_efabuild(["-C", str(root), "plan"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "registry" in line]
    assert len(warnings) == 1 and warnings[0].startswith("efabuild: warning: layer-cache registry not used:")
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr
    assert "403 Forbidden \\x1b]0;owned\\x07\\x1b[2J" in warnings[0]
