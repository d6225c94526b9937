"""Many nodes, one download: nodes that start one new artifact at the same instant, each with its
own node cache and all with one shared directory (FSx here is a directory of this machine), pull
each chunk from S3 about once (moto's S3 server, the real chunk store, the mount's chunk source)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from efabuild.lazy.chunksource import ChunkSource
from efabuild.lazy.nodecache import NodeCache
from efabuild.store.chunked.fschunks import FsChunks
from efabuild.store.tiered import Store
from efabuild.store.tiers.fs import FilesystemTier
from efabuild.store.tiers.s3 import S3Tier
from tests.kits.storekit import CHUNKED, key_for, make_sqsh, record_for

pytestmark = [pytest.mark.s3, pytest.mark.timeout(180)]
NODES = 8


@pytest.mark.parametrize("shared_tier", [True, False], ids=["shared-tier", "no-shared-tier"])
def test_nodes_starting_one_artifact_together_pull_each_chunk_from_s3_once(tmp_path, settings, shared_tier):
    key = key_for(f"many nodes {tmp_path}")
    sqsh = make_sqsh(tmp_path, os.urandom(6 << 20))
    builder = Store([FilesystemTier(tmp_path / "builder", "local")], settings, show_progress=False,
                    s3_options=CHUNKED)
    builder.publish(key, sqsh, record_for(key, "demo:user", sqsh))
    index = builder.s3.chunk_index(key)
    expected = sqsh.read_bytes()
    (tmp_path / "fsx").mkdir()
    barrier = threading.Barrier(NODES)
    read: dict[int, bytes] = {}
    sources: list[ChunkSource] = []

    def node(n: int) -> None:
        s3 = S3Tier(settings, show_progress=False)  # a client of the node's own

        def fetch(cid: str, length: int) -> bytes:
            return s3.chunks.fetch(cid, length)[0]

        cache = NodeCache(tmp_path / f"node{n}-cache", 1 << 30)
        shared = [FsChunks(FilesystemTier(tmp_path / "fsx", "shared"))] if shared_tier else []
        source = ChunkSource(index, cache, [], fetch, shared=shared)
        sources.append(source)
        barrier.wait()  # srun starts every node's job at once: they all read chunk 0 first
        read[n] = source.read(0, index.size)
        cache.close()

    threads = [threading.Thread(target=node, args=(n,)) for n in range(NODES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(read[n] == expected for n in range(NODES))
    fetched = sum(source.fetched_bytes for source in sources)
    if shared_tier:
        assert fetched <= 1.10 * index.size, f"{fetched / index.size:.2f}× the artifact from S3"
        assert sorted(p.name for p in (tmp_path / "fsx" / "chunks").glob("*/*")) == sorted(set(index.unique()))
    else:  # the case the shared tier is for: every node pulls the whole artifact
        assert fetched == NODES * index.size
