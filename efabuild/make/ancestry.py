"""The ancestor copy an artifact layer's export may write from (export.incremental): found by the
graph's rule, taken from the store and checked against its record, held open while the export
reads it. Every way it is not usable is a reason, which the export records and make shows.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from efabuild.errors import EfabuildError
from efabuild.export.incremental import (FULL_ASKED, NO_ANCESTOR, NOT_ON_THIS_HOST, REMOTE_BUILDER, Ancestor,
                                         ancestor_layer)
from efabuild.make.prepare import Prepared
from efabuild.refs import image_tag, short
from efabuild.signing.trust import TrustPolicy
from efabuild.signing.verify import signed_problems
from efabuild.store.layout import ENVELOPE_SUFFIX
from efabuild.store.transfer import DamagedCopy, open_checked_stamped


@contextlib.contextmanager
def export_ancestor(prepared: Prepared, qualname: str, *, remote: bool,
                    signer=None) -> Iterator[tuple[Ancestor | None, str]]:  # noqa: ANN001 - a signing.Signer
    """ancestor_copy() for a make's export, unless it can read no layer diffs: then the ancestor is
    neither fetched nor re-hashed for nothing. `remote`: a farm builder's image, whose diffs are
    the [registry]'s blobs; else the engine's directories, which an engine on another host hides."""
    if not prepared.ws.settings.export.incremental and ancestor_layer(prepared.plan, qualname) is not None:
        yield None, FULL_ASKED
    elif remote and prepared.ws.settings.registry is None:
        yield None, REMOTE_BUILDER
    elif not remote and (prepared.engine is None or prepared.engine.api is None):
        yield None, NOT_ON_THIS_HOST
    else:
        with ancestor_copy(prepared, qualname, signer=signer) as found:
            yield found


@contextlib.contextmanager
def ancestor_copy(prepared: Prepared, qualname: str, key: str | None = None, *, digest: str | None = None,
                  signer=None) -> Iterator[tuple[Ancestor | None, str]]:  # noqa: ANN001 - a signing.Signer
    """(the checked ancestor, '') or (None, why there is none) for the artifact layer `qualname`;
    `key` and `digest`: this ancestor key and copy (make --check: those the stored artifact was
    written from); `signer`: the key the child is signed with, which must have signed the copy."""
    below = ancestor_layer(prepared.plan, qualname)
    if below is None:
        yield None, NO_ANCESTOR
        return
    if key is not None and key != below.key:
        yield None, f"its ancestor is now {short(below.key)}, it was written from {short(key)}"
        return
    store = prepared.store
    try:
        # a copy on S3 alone is fetched: the ancestor is in the store (of the platform it was built for)
        store.lookup(below.key, platform=below.platform or None)
        hit = store.local_hit(below.key)
        record = hit[0].record(below.key) if hit is not None else None
    except EfabuildError as exc:
        yield None, f"ancestor {short(below.key)} not in the store ({exc})"
        return
    if hit is None or record is None:
        yield None, f"ancestor {short(below.key)} not in the store"
        return
    if digest is not None and record.digest != digest:
        yield None, f"ancestor {short(below.key)} is stored as other bytes than the child was written from"
        return
    # whoever writes a shared tier can put any record and .sqsh under a key: this make's signature
    # on the child must not vouch for blocks it never wrote nor saw signed
    if signer is not None and not _signed_by(signer, hit[0], below.key, record):
        yield None, f"ancestor {short(below.key)} has no signature by [sign]'s key over its bytes"
        return
    try:
        fd, stamp, tree = open_checked_stamped(hit[0].name, hit[1], record, with_tree=True)
    except DamagedCopy:  # the digests are `audit`'s to show: make's line stays short
        damaged = f"ancestor copy damaged: {hit[1]} is not the bytes its record names"
        store.withdraw_damaged(below.key, hit[0], damaged)  # never built on again, nor handed out
        yield None, damaged
        return
    layer = prepared.graph.nodes[below.qualname]["layer"]
    try:
        # its kept chunk index lends the child the chunks of the bytes it reuses (each re-hashed)
        yield Ancestor(below.key, image_tag(layer.name, below.key), _by_descriptor(fd), record.digest,
                       dict(record.export), stamp=stamp, index=hit[0].chunk_index(below.key), tree=tree), ""
    finally:
        os.close(fd)


def _signed_by(signer, tier, key: str, record) -> bool:  # noqa: ANN001 - a Signer, a FilesystemTier, a record
    policy = TrustPolicy(((signer.description, signer.public_pem),), "[sign]")
    return not signed_problems(tier.sidecar(key, ENVELOPE_SUFFIX), key, record, policy, record.digest, None,
                               sqsh=str(tier.sqsh_path(key)), where=str(tier.layout.envelope_path(key)))


def _by_descriptor(fd: int) -> Path:
    """A path to the very file open as `fd` that this process and its children (unsquashfs) can
    open, whatever is renamed over its store name meanwhile."""
    return Path(f"/proc/{os.getpid()}/fd/{fd}")
