"""The tar format as `docker export` writes it and mksquashfs reads it: 512-byte ustar headers,
pax and GNU long-name extensions, GNU base-256 numbers. Pure: bytes in, bytes out.

Hand-written rather than `tarfile`, because the export filter must patch a header and pass it on
byte for byte, never re-encode an entry it keeps.
"""

from __future__ import annotations

from efabuild.errors import EfabuildError

BLOCK = 512


class TarFormatError(EfabuildError):
    pass


def number(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for values that do not fit in octal
        value = int.from_bytes(field, "big") & ~(0x80 << (8 * (len(field) - 1)))
        return value
    text = field.split(b"\0", 1)[0].strip(b" \0")
    return int(text, 8) if text else 0


def checksum(header: bytes | bytearray) -> int:
    return sum(header[:148]) + 8 * 0x20 + sum(header[156:512])


def set_number(header: bytearray, offset: int, width: int, value: int) -> None:
    text = f"{value:0{width - 1}o}".encode()
    if len(text) > width - 1:
        raise TarFormatError(f"value {value} does not fit a {width}-byte tar field")
    header[offset : offset + width] = text + b"\0"


def seal(header: bytearray) -> bytearray:
    header[148:156] = f"{checksum(header):06o}".encode() + b"\0 "
    return header


def padded(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK * BLOCK


def parse_pax(data: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode("utf-8", "surrogateescape")
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return str(length).encode() + body


def header_block(path: str, *, typeflag: bytes, mode: int, size: int = 0, mtime: int = 0,
                 linkname: str = "") -> bytes:
    """A ustar header (with a pax `path` record first when the name is long)."""
    raw = path.encode("utf-8", "surrogateescape")
    out = b""
    if len(raw) > 100:
        pax = pax_record("path", path)
        out = header_block("././@PaxHeader", typeflag=b"x", mode=0o644, size=len(pax))
        out += pax + b"\0" * (padded(len(pax)) - len(pax))
        raw = raw[-100:]
    h = bytearray(BLOCK)
    h[0 : len(raw)] = raw
    set_number(h, 100, 8, mode)
    set_number(h, 108, 8, 0)
    set_number(h, 116, 8, 0)
    set_number(h, 124, 12, size)
    set_number(h, 136, 12, mtime)
    h[156:157] = typeflag
    target = linkname.encode("utf-8", "surrogateescape")[:100]
    h[157 : 157 + len(target)] = target
    h[257:265] = b"ustar\x0000"
    return out + bytes(seal(h))


def ustar_linkname(header: bytearray) -> str:
    return bytes(header[157:257]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def has_body(typeflag: bytes) -> bool:
    """Links, directories, devices and fifos carry no data; regular and unknown types do."""
    return typeflag not in (b"1", b"2", b"3", b"4", b"5", b"6")


def ustar_name(header: bytearray) -> str:
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:263] == b"ustar\0":  # POSIX ustar: a prefix field holds the leading part
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def pax_block(pax: dict[str, str]) -> bytes:
    data = b"".join(pax_record(k, v) for k, v in pax.items())
    head = header_block("././@PaxHeader", typeflag=b"x", mode=0o644, size=len(data))
    return head + data + b"\0" * (padded(len(data)) - len(data))
