"""The compressors a squashfs names by id: metadata blocks, fragment blocks and (without -noD) data.

zlib and xz come with Python, zstd with `zstandard` (already a dependency), lzo (Enroot's
default) from liblzo2 through ctypes; lz4 and the legacy lzma format have no codec here, so an
ancestor using them is exported in full. Every decompression is bounded by the caller's limit: a
forged block cannot make it allocate more than one block.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import lzma
import zlib

import attrs

from efabuild.errors import InputError

GZIP, LZMA, LZO, XZ, LZ4, ZSTD = 1, 2, 3, 4, 5, 6
NAMES = {GZIP: "gzip", LZMA: "lzma", LZO: "lzo", XZ: "xz", LZ4: "lz4", ZSTD: "zstd"}


class CodecError(InputError):
    """A block that does not decompress (a corrupt or hostile image)."""


@attrs.frozen
class Codec:
    """One compressor: `compress` returns None when the result would not be smaller (the block is
    then stored as is, as mksquashfs does); `decompress` gives at most `limit` bytes."""

    name: str
    _compress: object
    _decompress: object

    def compress(self, data: bytes) -> bytes | None:
        out = self._compress(data)  # type: ignore[operator]
        return out if len(out) < len(data) else None

    def compress_metadata(self, data: bytes) -> bytes | None:
        out = self._compress(data)  # type: ignore[operator]
        return out if len(out) < len(data) else None

    def decompress(self, data: bytes, limit: int) -> bytes:
        try:
            out = self._decompress(data, limit)  # type: ignore[operator]
        except CodecError:
            raise
        except Exception as exc:  # each library raises its own kind
            raise CodecError(f"a {self.name} block does not decompress ({type(exc).__name__})") from None
        if len(out) > limit:
            raise CodecError(f"a {self.name} block expands past {limit} bytes")
        return out


def codec_for(comp_id: int, *, block_size: int, xz_dict: int | None = None) -> Codec | str:
    """The codec of compressor `comp_id`, or why there is none here."""
    if comp_id == GZIP:
        return Codec("gzip", lambda d: zlib.compress(d, 9), _zlib_decompress)
    if comp_id == XZ:
        filters = [{"id": lzma.FILTER_LZMA2, "preset": 6, "dict_size": xz_dict or block_size}]
        return Codec("xz", lambda d: lzma.compress(d, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32,
                                                   filters=filters), _xz_decompress)
    if comp_id == ZSTD:
        try:
            import zstandard
        except ImportError:
            return "zstd: the zstandard module is not installed"
        return Codec("zstd", zstandard.ZstdCompressor(level=15).compress,
                     lambda d, limit: zstandard.ZstdDecompressor().decompress(d, max_output_size=limit))
    if comp_id == LZO:
        lib = _liblzo()
        if lib is None:
            return "lzo: liblzo2 is not installed"
        # lzo1x_1 for data and metadata alike. mksquashfs's lzo1x_999 makes a 50k-file child's
        # tables 11 % smaller (1.05 MB, against 1.16), but on the bench's 20k-file image it took
        # 0.15 s of an incremental export's 0.55 s on XFS: a child is the edit loop's latency,
        # its tables a few tens of kilobytes more on the wire
        return Codec("lzo", functools.partial(_lzo_compress, lib, lib.lzo1x_1_compress, _LZO_WORK),
                     functools.partial(_lzo_decompress, lib))
    return f"{NAMES.get(comp_id, f'compressor {comp_id}')}: no codec here"


def _zlib_decompress(data: bytes, limit: int) -> bytes:
    obj = zlib.decompressobj()
    out = obj.decompress(data, limit)
    if obj.unconsumed_tail:
        raise CodecError(f"a gzip block expands past {limit} bytes")
    return out


def _xz_decompress(data: bytes, limit: int) -> bytes:
    obj = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    out = obj.decompress(data, max_length=limit)
    if not obj.eof and not obj.needs_input:
        raise CodecError(f"an xz block expands past {limit} bytes")
    return out


@functools.cache
def _liblzo() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("lzo2") or "liblzo2.so.2"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    size_p = ctypes.POINTER(ctypes.c_size_t)
    for fn in (lib.lzo1x_1_compress, lib.lzo1x_decompress_safe):
        fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p, size_p, ctypes.c_void_p]
        fn.restype = ctypes.c_int
    return lib


_LZO_WORK = 1 << 17  # LZO1X_1_MEM_COMPRESS: 16384 dictionary entries of a pointer's size


def _lzo_compress(lib: ctypes.CDLL, fn: object, work_size: int, data: bytes) -> bytes:
    out = ctypes.create_string_buffer(len(data) + len(data) // 16 + 64 + 3)  # lzo's worst case
    out_len = ctypes.c_size_t(len(out))
    work = ctypes.create_string_buffer(work_size)
    if fn(data, len(data), out, ctypes.byref(out_len), work) != 0:  # type: ignore[operator]
        raise CodecError("lzo could not compress a block")
    return out.raw[: out_len.value]


def _lzo_decompress(lib: ctypes.CDLL, data: bytes, limit: int) -> bytes:
    out = ctypes.create_string_buffer(max(limit, 1))
    out_len = ctypes.c_size_t(limit)
    if lib.lzo1x_decompress_safe(data, len(data), out, ctypes.byref(out_len), None) != 0:
        raise CodecError("an lzo block does not decompress")
    return out.raw[: out_len.value]
