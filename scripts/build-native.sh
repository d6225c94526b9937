#!/usr/bin/env bash
# Builds efabuild's one native helper, native/blake3cv.c (chaining values of BLAKE3 subtrees: an
# incremental export's child is hashed from its ancestor's), against the BLAKE3 C sources Debian
# ships in librust-blake3-dev. Without it efabuild hashes every file whole, as before.
#   scripts/build-native.sh [OUT]   (default: /usr/local/lib/efabuild/libblake3cv.so)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-/usr/local/lib/efabuild/libblake3cv.so}
src=$(ls -d /usr/share/cargo/registry/blake3-*/c 2>/dev/null | sort -V | tail -n 1)
if [ -z "$src" ] || [ ! -f "$src/blake3.c" ]; then
    echo "build-native: no BLAKE3 C sources (apt-get install librust-blake3-dev)" >&2
    exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-O3 -fPIC -I"$src")
objects=("$work/blake3cv.o" "$work/dispatch.o" "$work/portable.o")
cc "${flags[@]}" -c "$here/native/blake3cv.c" -o "$work/blake3cv.o"
case "$(uname -m)" in
    x86_64)
        cc "${flags[@]}" -c "$src/blake3_dispatch.c" -o "$work/dispatch.o"
        cc "${flags[@]}" -c "$src/blake3_portable.c" -o "$work/portable.o"
        cc "${flags[@]}" -msse2 -c "$src/blake3_sse2.c" -o "$work/sse2.o"
        cc "${flags[@]}" -msse4.1 -c "$src/blake3_sse41.c" -o "$work/sse41.o"
        cc "${flags[@]}" -mavx2 -c "$src/blake3_avx2.c" -o "$work/avx2.o"
        cc "${flags[@]}" -mavx512f -mavx512vl -c "$src/blake3_avx512.c" -o "$work/avx512.o"
        objects+=("$work/sse2.o" "$work/sse41.o" "$work/avx2.o" "$work/avx512.o")
        ;;
    aarch64)
        flags+=(-DBLAKE3_USE_NEON=1)
        cc "${flags[@]}" -c "$src/blake3_dispatch.c" -o "$work/dispatch.o"
        cc "${flags[@]}" -c "$src/blake3_portable.c" -o "$work/portable.o"
        cc "${flags[@]}" -c "$src/blake3_neon.c" -o "$work/neon.o"
        objects+=("$work/neon.o")
        ;;
    *)
        flags+=(-DBLAKE3_NO_SSE2 -DBLAKE3_NO_SSE41 -DBLAKE3_NO_AVX2 -DBLAKE3_NO_AVX512)
        cc "${flags[@]}" -c "$src/blake3_dispatch.c" -o "$work/dispatch.o"
        cc "${flags[@]}" -c "$src/blake3_portable.c" -o "$work/portable.o"
        ;;
esac
mkdir -p "$(dirname "$out")"
cc -shared -o "$out.$$.tmp" "${objects[@]}"
mv "$out.$$.tmp" "$out"  # whole or not at all: a process loading it never sees half a library
echo "build-native: $out"
