"""A registry's HTTP API v2, asked without credentials: manifests and blobs by digest, each
checked against it, every read bounded, redirects to blob storage followed (the digest, not the
host, vouches for the bytes; a token is never sent to another host).

Credentials stay with the docker CLI (see engine/registry.py): this client asks anonymously, and
takes an anonymous bearer token when the registry offers one; a registry that wants a login is a
reason (LayerSourceUnavailable), never a prompt.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
from urllib.parse import urlencode, urljoin, urlparse

from efabuild.export.layerdiff import LayerSourceUnavailable

TIMEOUT_S = 60.0  # per connection and per read: a registry that stalls is a reason, not a hang
MAX_TOKEN = 1 << 20
_MAX_REDIRECTS = 3
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def split_ref(ref: str) -> tuple[str, str, str]:
    """`HOST[:PORT]/REPO[:TAG][@sha256:…]` → (host, repository, digest or tag)."""
    name, _, digest = ref.partition("@")
    host, _, path = name.partition("/")
    if not path or not ("." in host or ":" in host or host == "localhost"):
        raise LayerSourceUnavailable(f"{ref} names no registry host")
    last = path.rsplit("/", 1)[-1]
    tag = ""
    if ":" in last:
        path, _, tag = path.rpartition(":")
    if digest and not DIGEST.match(digest):
        raise LayerSourceUnavailable(f"{ref}: not a sha256 digest")
    return host, path, digest or tag or "latest"


class Registry:
    """One registry's HTTP API v2, asked without credentials."""

    def __init__(self, host: str, *, insecure: bool = False, timeout: float = TIMEOUT_S) -> None:
        bare = host.rsplit(":", 1)[0].strip("[]") if host.count(":") <= 1 or host.startswith("[") else host
        # as dockerd: a loopback registry, or one [registry] marks insecure, speaks plain HTTP
        loopback = bare == "localhost" or bare.startswith("127.") or bare == "::1"
        self.base = f"{'http' if insecure or loopback else 'https'}://{host}"
        self.host, self.timeout = host, timeout
        self._tokens: dict[str, str] = {}

    def get(self, repository: str, path: str, accept: tuple[str, ...] = ()) -> http.client.HTTPResponse:
        """GET /v2/REPOSITORY/PATH: the open response (status 200), its body not read yet."""
        url = f"{self.base}/v2/{repository}/{path}"
        headers = {"Accept": ", ".join(accept)} if accept else {}
        token = self._tokens.get(repository)
        for attempt in range(2):
            if token:
                headers["Authorization"] = f"Bearer {token}"
            response = self._open(url, headers)
            if response.status != 401 or attempt:
                break
            challenge = response.getheader("WWW-Authenticate") or ""
            response.close()
            token = self._anonymous_token(challenge, repository)
            self._tokens[repository] = token
        if response.status == 401:
            response.close()
            raise LayerSourceUnavailable(f"the registry {self.host} asks for credentials to read {repository}, "
                                         "which efabuild leaves to the docker CLI")
        if response.status != 200:
            response.close()
            raise LayerSourceUnavailable(f"the registry {self.host} answered {response.status} for "
                                         f"{repository}/{path}")
        return response

    def _open(self, url: str, headers: dict[str, str]) -> http.client.HTTPResponse:
        origin = urlparse(url).netloc
        for _ in range(_MAX_REDIRECTS + 1):
            parsed = urlparse(url)
            kind = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
            conn = kind(parsed.netloc, timeout=self.timeout)
            sent = headers if parsed.netloc == origin else {k: v for k, v in headers.items() if k != "Authorization"}
            try:
                conn.request("GET", parsed.path + (f"?{parsed.query}" if parsed.query else ""), headers=sent)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise LayerSourceUnavailable(f"cannot reach the registry {self.host}: {exc}") from None
            if response.status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                url = urljoin(url, response.getheader("Location"))  # blob storage elsewhere: the digest tells
                response.close()
                conn.close()
                continue
            return response
        raise LayerSourceUnavailable(f"the registry {self.host} redirected more than {_MAX_REDIRECTS} times")

    def _anonymous_token(self, challenge: str, repository: str) -> str:
        scheme, _, params = challenge.partition(" ")
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        if scheme.lower() != "bearer" or "realm" not in fields:
            raise LayerSourceUnavailable(f"the registry {self.host} asks for credentials to read {repository}, "
                                         "which efabuild leaves to the docker CLI")
        query = {k: v for k, v in fields.items() if k in ("service", "scope")}
        query.setdefault("scope", f"repository:{repository}:pull")
        response = self._open(f"{fields['realm']}?{urlencode(query)}", {})
        try:
            body = bounded(response, MAX_TOKEN, "its token") if response.status == 200 else b""
        finally:
            response.close()
        try:
            found = json.loads(body) if body else {}
        except ValueError:
            found = {}
        token = found.get("token") or found.get("access_token") if isinstance(found, dict) else None
        if not isinstance(token, str) or not token:
            raise LayerSourceUnavailable(f"the registry {self.host} gives no anonymous token for {repository}: "
                                         "it wants a login, which efabuild leaves to the docker CLI")
        return token

    def checked(self, repository: str, kind: str, digest: str, limit: int, accept: tuple[str, ...] = ()) -> bytes:
        """A manifest or blob by `digest`, at most `limit` bytes, which must hash to it."""
        response = self.get(repository, f"{kind}/{digest}", accept)
        try:
            body = bounded(response, limit, f"{repository}@{digest}")
        finally:
            response.close()
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise LayerSourceUnavailable(f"the registry's {kind[:-1]} {repository}@{digest} is other bytes than its "
                                         "digest names")
        return body


def bounded(response: http.client.HTTPResponse, limit: int, what: str) -> bytes:
    try:
        body = response.read(limit + 1)
    except (OSError, http.client.HTTPException) as exc:
        raise LayerSourceUnavailable(f"{what}: the registry's answer broke off: {exc}") from None
    if len(body) > limit:
        raise LayerSourceUnavailable(f"{what} is larger than {limit} bytes")
    return body
