"""moto's S3 server on loopback, in its own process, for the publish and fetch scenarios.

    python scripts/benchmarks/s3server.py PORT      prints "ready" once it serves

One change to moto, for benchmarking only: moto answers a ranged GET by reading the whole object
into memory and slicing it, so fetching a 2 GiB object in 16 MiB ranges would copy 256 GiB (and
ten parallel ranges would hold 20 GiB at once). Here a ranged GET of a plain `bytes=A-B` range
reads only those bytes from moto's object buffer, as S3 itself does. Nothing else changes: both
efabuild and the boto3 baseline talk to the same server over HTTP.
"""

from __future__ import annotations

import sys
import threading
import time


class _RangeReader:
    """Stands in for an object's bytes in a GET response: len() and slicing read only what's asked."""

    def __init__(self, key) -> None:  # noqa: ANN001 - moto's FakeKey
        self.key = key

    def __len__(self) -> int:
        return self.key.size

    def __bool__(self) -> bool:
        return self.key.size > 0

    def __getitem__(self, item: slice) -> bytes:
        start, stop, _ = item.indices(self.key.size)
        with self.key.lock:
            self.key._value_buffer.seek(start)
            return self.key._value_buffer.read(max(0, stop - start))


def _patch_ranged_gets() -> None:
    import re

    from moto.s3 import models, responses

    lazy = threading.local()
    simple_range = re.compile(r"^bytes=\d+-\d+$")
    original_value = models.FakeKey.value
    original_get_object = responses.S3Response.get_object

    def value(self):  # noqa: ANN001, ANN202
        if getattr(lazy, "on", False):
            return _RangeReader(self)
        return original_value.fget(self)

    def get_object(self):  # noqa: ANN001, ANN202
        lazy.on = bool(simple_range.match(self.headers.get("range") or ""))
        try:
            return original_get_object(self)
        finally:
            lazy.on = False

    models.FakeKey.value = property(value, original_value.fset)
    responses.S3Response.get_object = get_object


def main() -> int:
    from moto.server import ThreadedMotoServer

    port = int(sys.argv[1])
    _patch_ranged_gets()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    print("ready", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
