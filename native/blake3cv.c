/* Chaining values of BLAKE3 subtrees, which blake3.h does not expose.
 *
 * A file's BLAKE3 digest is the root of a tree over its 1 KiB chunks, and the chaining value of a
 * subtree depends only on its bytes and where it starts. A file that reuses another's bytes at
 * the same offsets (an incremental export's child) therefore shares that file's subtrees: its
 * digest is a few compressions over the ancestor's chaining values plus the hash of what is new.
 *
 * Compiled by scripts/build-native.sh against the C implementation shipped in Debian's
 * librust-blake3-dev (its blake3.c is included here for the functions it keeps static); loaded
 * with ctypes by efabuild/host/blake3tree.py, which hashes whole files the usual way without it.
 */
#include "blake3.c"

/* The non-root chaining value of the subtree of `len` bytes starting at chunk `counter`: one
 * chunk (of at most 1 KiB), or more, split as BLAKE3 splits them (the largest power of two of
 * chunks on the left). */
void efabuild_subtree_cv(const uint8_t *input, size_t len, uint64_t counter, uint8_t out[BLAKE3_OUT_LEN]) {
  if (len <= BLAKE3_CHUNK_LEN) {
    blake3_chunk_state state;
    chunk_state_init(&state, IV, 0);
    state.chunk_counter = counter;
    chunk_state_update(&state, input, len);
    output_t output = chunk_state_output(&state);
    output_chaining_value(&output, out);
    return;
  }
  uint8_t pair[2 * BLAKE3_OUT_LEN];
  compress_subtree_to_parent_node(input, len, IV, counter, 0, pair);
  output_t output = parent_output(pair, IV, 0);
  output_chaining_value(&output, out);
}

/* The chaining values of `count` consecutive subtrees of `unit` bytes each (a power of two of
 * chunks), the first starting at chunk `counter`. */
void efabuild_unit_cvs(const uint8_t *input, size_t unit, size_t count, uint64_t counter, uint8_t *out) {
  uint64_t chunks = unit / BLAKE3_CHUNK_LEN;
  for (size_t i = 0; i < count; i++) {
    efabuild_subtree_cv(input + i * unit, unit, counter + i * chunks, out + i * BLAKE3_OUT_LEN);
  }
}

/* The parent of two chaining values: a chaining value again, or with `root` the digest. */
void efabuild_parent(const uint8_t left[BLAKE3_OUT_LEN], const uint8_t right[BLAKE3_OUT_LEN], int root,
                     uint8_t out[BLAKE3_OUT_LEN]) {
  uint8_t pair[2 * BLAKE3_OUT_LEN];
  memcpy(pair, left, BLAKE3_OUT_LEN);
  memcpy(pair + BLAKE3_OUT_LEN, right, BLAKE3_OUT_LEN);
  output_t output = parent_output(pair, IV, 0);
  if (root) {
    output_root_bytes(&output, 0, out, BLAKE3_OUT_LEN);
  } else {
    output_chaining_value(&output, out);
  }
}
