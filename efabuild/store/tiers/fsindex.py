"""The platform indexes of a filesystem tier (efabuild/platforms.py): written atomically under
platforms/, read bounded and never through a link; a mixin of `FilesystemTier` over its `layout`
and `read_refs`."""

from __future__ import annotations

from efabuild.host import fsutil
from efabuild.refs import check_key


class PlatformIndexes:
    def read_platform_index(self, digest: str) -> tuple[bytes | None, bytes | None]:
        return self.layout.read_platform_index(digest)

    def platform_url(self, digest: str) -> str:
        return str(self.layout.platform_index_path(digest))

    def write_platform_index(self, digest: str, data: bytes, envelope: bytes | None) -> None:
        """Store an index and its envelope (the envelope first: an index seen has its signature)."""
        check_key(digest)
        if envelope is not None:
            fsutil.atomic_write_bytes(self.layout.platform_envelope_path(digest), envelope, self.layout.tmp_dir)
        fsutil.atomic_write_bytes(self.layout.platform_index_path(digest), data, self.layout.tmp_dir)
