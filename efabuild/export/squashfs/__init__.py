"""An incremental `.sqsh`: a child image written from its ancestor's `.sqsh` and the layer diffs
between them, the ancestor's data and fragment blocks kept verbatim at their offsets.

Entry point: `write_incremental` (incremental.py). The modules, one concept each: superblock,
metadata (8 KiB metadata blocks and indexed tables), codec, tree (the inode model), inodes
(their encoding), reader (an ancestor into a tree), layertar (a layer's tar stream), apply
(layer diffs and the export filter's rules onto the tree), data (new blocks and fragments),
writer (the new tables).

Codecs: metadata and fragment blocks are compressed with the ancestor's compressor (lzo through
liblzo2 by ctypes: lzo1x_1 for all of them, where mksquashfs uses lzo1x_999 for metadata; gzip
and xz from Python, zstd from `zstandard`), a block that does not shrink stored as is; data
blocks as the ancestor's flags say (uncompressed under Enroot's default -noD). lz4 and legacy
lzma ancestors get `full_needed`.

Library choice: our own reader and writer, not squashfs-tools-ng's libsquashfs. Debian's
libsquashfs1 1.2.0 is built without lzo (it links zlib, xz, lz4 and zstd), so it cannot read or
write the metadata of an image with Enroot's default `-comp lzo` at all. Measured on a 50,000-file
`.sqsh` (500 directories, files of 0-3 KB, 76 MB): libsquashfs' sqfs_dir_reader_get_full_hierarchy
through ctypes reads the gzip copy in 0.03-0.06 s, our reader in 0.34-0.42 s (gzip) and 0.6-0.7 s
(lzo); a whole one-file-change child of the lzo image takes 1.6 s here, its tables 1.05 MB (the
ancestor's, by mksquashfs: 1.05 MB). A tenth of a second more per 10k files does not pay for
ctypes mirrors of libsquashfs' tree and inode structs (version-specific layouts) beside a codec
it lacks; with `-all-root -no-xattrs` the format is a few hundred lines of struct code.
"""

from efabuild.export.squashfs.incremental import DEFAULT_MAX_DEAD_SHARE, IncrementalResult, write_incremental
from efabuild.export.squashfs.reader import read_ahead

__all__ = ["DEFAULT_MAX_DEAD_SHARE", "IncrementalResult", "read_ahead", "write_incremental"]
