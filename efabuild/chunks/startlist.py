"""A start list: the chunks of an artifact a job start read first, in the order it read them.

The first lazy mount of an artifact that has none records one (lazy/chunksource.py) and leaves it
on the shared tier beside the chunks it fetched (store/chunked/fschunks.py); every later mount
fetches those chunks ahead, several at a time, before anything else, so a cold node's start waits
on one round of parallel fetches instead of one fetch per read (SOCI and Nydus keep a prefetch
list beside their indexes for the same reason). A list is only ever an order: an id that is not
in the artifact's index is dropped, and each chunk is checked against its id when it is fetched,
so a forged list costs bandwidth, never a wrong byte.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from efabuild.chunks.cdc import ChunkIndex, is_chunk_id

FORMAT = "efabuild.startlist/v1"
MAX_IDS = 16384  # 64 GiB of 4 MiB chunks: far more than a start reads
MAX_BYTES = MAX_IDS * 70 + 512  # each id 64 hex, quoted, with a comma


class BadStartList(ValueError):
    """Not a start list efabuild wrote for this artifact: ignored."""


def encode(key: str, ids: Iterable[str]) -> bytes:
    return json.dumps({"format": FORMAT, "key": key, "chunks": list(ids)[:MAX_IDS]}, separators=(",", ":")).encode()


def decode(data: bytes, key: str, index: ChunkIndex) -> list[str]:
    """The ids of `data`, a start list of `key`, that `index` holds, first occurrence only, in order."""
    if len(data) > MAX_BYTES:
        raise BadStartList(f"larger than {MAX_BYTES} bytes")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise BadStartList("not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("key") != key:
        raise BadStartList(f"not a {FORMAT} list of this artifact")
    chunks = doc.get("chunks")
    if not isinstance(chunks, list) or len(chunks) > MAX_IDS:
        raise BadStartList(f"its chunks are not a list of at most {MAX_IDS} ids")
    held, seen, ids = index.unique(), set(), []
    for cid in chunks:
        if is_chunk_id(cid) and cid in held and cid not in seen:
            seen.add(cid)
            ids.append(cid)
    return ids
