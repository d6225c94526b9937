"""An incremental `.sqsh`: a child image written from its ancestor's `.sqsh` and the layer diffs
between them, the ancestor's data and fragment blocks kept verbatim at their offsets.

Entry point: `write_incremental` (incremental.py). The modules, one concept each: superblock,
metadata (8 KiB metadata blocks and indexed tables), codec, tree (the inode model), inodes
(their encoding), reader (an ancestor into a tree), layertar (a layer's tar stream), apply
(layer diffs and the export filter's rules onto the tree), data (new blocks and fragments),
writer (the new tables).

Codecs: metadata and fragment blocks are compressed with the ancestor's compressor (lzo through
liblzo2 by ctypes, gzip and xz from Python, zstd from `zstandard`); data blocks are stored as
the ancestor's flags say (uncompressed under Enroot's default -noD). lz4 and legacy lzma
ancestors get `full_needed`.

Library choice: FIGURES
"""

from efabuild.export.squashfs.incremental import DEFAULT_MAX_DEAD_SHARE, IncrementalResult, write_incremental

__all__ = ["DEFAULT_MAX_DEAD_SHARE", "IncrementalResult", "write_incremental"]
