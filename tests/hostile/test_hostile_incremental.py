"""Hostile inputs to the incremental export: what a build can leave in its overlay2 layer
directories, and what a shared tier can hold under an ancestor's key. A child written from its
ancestor never carries other files than the full export of its image would have: when the layer
diffs cannot say the same thing, the export is a full one with the reason.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from efabuild.export.layerdiff import LayerSourceUnavailable, layer_tar, stream_layers


@pytest.mark.parametrize("kind", ["file", "whiteout"])
def test_a_builds_own_wh_name_ends_the_layer_stream_rather_than_deleting_a_file(tmp_path: Path, kind: str):
    # `RUN touch /opt/.wh.keep` is a plain file on overlay2 and in `docker export`; as a layer tar
    # entry it deletes /opt/keep; `rm /opt/.wh.keep` over it would read as an AUFS entry
    if kind == "whiteout" and os.geteuid() != 0:
        pytest.skip("overlay whiteouts (char devices 0:0) need root, as dockerd does")
    root = tmp_path / "diff"
    (root / "opt").mkdir(parents=True)
    (root / "opt" / "other").write_text("x")
    if kind == "file":
        (root / "opt" / ".wh.keep").write_text("a build's file\n")
    else:
        os.mknod(root / "opt" / ".wh.keep", 0o600 | 0o020000, os.makedev(0, 0))
    with pytest.raises(LayerSourceUnavailable, match=r"opt/\.wh\.keep: a name starting with \.wh\."):
        layer_tar(str(root), io.BytesIO())
    (stream,) = stream_layers([str(root)])
    stream.read()
    stream.close()
    # what export_incremental reads to fall back to a full export, naming the entry
    assert "opt/.wh.keep" in stream.errors_seen[0]
