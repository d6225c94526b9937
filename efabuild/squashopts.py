"""Which mksquashfs options `[export] extra_options` may add: those that only shape the filesystem.

mksquashfs also reads pseudo-file definitions (`-p "/x f 644 0 0 CMD"` runs CMD on the host, as
the user running the export), sort and exclude files, and options that move or rename what goes
into the image. None of those belong in a BUILD.toml setting: the image content comes from the
build alone. So the options are an allow-list, each with the shape of the values it takes.
"""

from __future__ import annotations

import re

# a value is one plain word: never an option (it would shift the pairs) and never a path
_WORD = re.compile(r"[A-Za-z0-9_.,%+]{1,32}")
_NUMBER = re.compile(r"[0-9]{1,9}")
_SIZE = re.compile(r"[0-9]{1,9}[KkMmGg]?")
_BLOCK_SIZES = {str(4096 << i) for i in range(9)} | {f"{4 << i}K" for i in range(9)} | {"1M"}
_LZO_ALGORITHMS = ("lzo1x_1", "lzo1x_1_11", "lzo1x_1_12", "lzo1x_1_15", "lzo1x_999")

# option → a check of its one value (None: the option takes no value)
ALLOWED: dict[str, object] = {
    "-b": lambda v: v in _BLOCK_SIZES or v.upper() in _BLOCK_SIZES,
    "-noI": None, "-noInodeCompression": None,
    "-noId": None, "-noIdTableCompression": None,
    "-noD": None, "-noDataCompression": None,
    "-noF": None, "-noFragmentCompression": None,
    "-noX": None, "-noXattrCompression": None,
    "-no-compression": None,
    "-no-fragments": None, "-always-use-fragments": None,
    "-no-duplicates": None, "-exports": None, "-no-exports": None,
    "-processors": lambda v: bool(_NUMBER.fullmatch(v)),
    "-mem": lambda v: bool(_SIZE.fullmatch(v)),
    "-mem-percent": lambda v: bool(_NUMBER.fullmatch(v)),
    # the compressors' own options
    "-Xalgorithm": lambda v: v in _LZO_ALGORITHMS,
    "-Xcompression-level": lambda v: bool(_NUMBER.fullmatch(v)),
    "-Xwindow-size": lambda v: bool(_NUMBER.fullmatch(v)),
    "-Xstrategy": lambda v: bool(_WORD.fullmatch(v)),
    "-Xbcj": lambda v: bool(_WORD.fullmatch(v)),
    "-Xdict-size": lambda v: bool(_WORD.fullmatch(v)),
    "-Xhc": None,
}

_SET_ELSEWHERE = {
    "-comp": "set `compression` instead",
    "-all-root": "always set", "-no-xattrs": "always set", "-noappend": "always set",
    "-tar": "always set", "-root-mode": "always set", "-root-time": "always set",
    "-mkfs-time": "always set",
}


def extra_options_problem(options: tuple[str, ...] | list[str]) -> str | None:
    """Why `options` may not be given to mksquashfs, or None when every one is allowed."""
    index = 0
    while index < len(options):
        option = options[index]
        shown = option if len(option) <= 40 else option[:37] + "..."
        if option in _SET_ELSEWHERE:
            return f"{shown!r} is not an extra option: {_SET_ELSEWHERE[option]}"
        if option not in ALLOWED:
            return (f"{shown!r} is not allowed: only options that shape the filesystem are "
                    f"(compressor -X… options, -b, -noI/-noD/-noF/-noX, -processors, -mem, fragments)")
        check = ALLOWED[option]
        if check is not None:
            if index + 1 >= len(options):
                return f"{option} needs a value"
            value = options[index + 1]
            if not check(value):
                shown_value = value if len(value) <= 40 else value[:37] + "..."
                return f"{option} {shown_value!r}: not a valid value"
            index += 1
        index += 1
    return None
