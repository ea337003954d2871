/* The CPU code segment's codec (segment kind cpu_code_lz4): an LZ4 block
 * (the format of the LZ4 project's block specification, written by the
 * compiler with the `lz4` package's high-compression mode). Kernel code is
 * repetitive (unrolled tiles), so it shrinks about 2.8x, and decoding it
 * runs at several GB/s, faster than storage delivers the bytes it saves.
 *
 * A block is a run of sequences: a token (high nibble: literal count, low
 * nibble: match length - 4; 15 means more length bytes follow, each added,
 * until one is not 255), the literals, then a 2-byte little-endian offset
 * back into the output and the match. The last sequence has literals only.
 * Every read and write is bounds-checked: a damaged block is an error,
 * never a read or write outside the buffers. */
#include <stdint.h>
#include <string.h>

#include "base/base.h"

/* A length's extra bytes from `*i`; -1 when they run past the end. */
static int64_t more_length(const uint8_t* src, uint64_t n, uint64_t* i) {
  int64_t len = 0;
  for (;;) {
    if (*i >= n) return -1;
    uint8_t b = src[(*i)++];
    len += b;
    if (len > (int64_t)1 << 40) return -1; /* no real block is that long */
    if (b != 255) return len;
  }
}

/* Copy `len` bytes forward 16 (else 8) at a time, writing up to 15 past
 * the end (the caller leaves that much room): overlapping is fine once the
 * source lies at least a chunk behind. */
static void copy8(uint8_t* d, const uint8_t* from, int64_t len) {
  for (int64_t k = 0; k < len; k += 8) memcpy(d + k, from + k, 8);
}

static void copy16(uint8_t* d, const uint8_t* from, int64_t len) {
  for (int64_t k = 0; k < len; k += 16) memcpy(d + k, from + k, 16);
}

int64_t cb_lz4_decode(const uint8_t* src, uint64_t n, uint8_t* dst, uint64_t cap) {
  uint64_t i = 0, o = 0;
  while (i < n) {
    uint8_t token = src[i++];
    int64_t lit = token >> 4;
    if (lit == 15) {
      int64_t more = more_length(src, n, &i);
      if (more < 0) return -1;
      lit += more;
    }
    if ((uint64_t)lit > n - i || (uint64_t)lit > cap - o) return -1;
    if ((uint64_t)lit + 16 <= n - i && (uint64_t)lit + 16 <= cap - o)
      copy16(dst + o, src + i, lit); /* room to over-copy on both sides */
    else
      memcpy(dst + o, src + i, (size_t)lit);
    i += (uint64_t)lit, o += (uint64_t)lit;
    if (i == n) return (int64_t)o; /* the last sequence: literals only */
    if (n - i < 2) return -1;
    uint64_t off = (uint64_t)src[i] | (uint64_t)src[i + 1] << 8;
    i += 2;
    if (off == 0 || off > o) return -1;
    int64_t len = token & 15;
    if (len == 15) {
      int64_t more = more_length(src, n, &i);
      if (more < 0) return -1;
      len += more;
    }
    len += 4;
    if ((uint64_t)len > cap - o) return -1;
    uint8_t* d = dst + o;
    const uint8_t* from = d - off;
    if (off >= 16 && (uint64_t)len + 16 <= cap - o) {
      copy16(d, from, len);
    } else if (off >= 8 && (uint64_t)len + 8 <= cap - o) {
      copy8(d, from, len);
    } else { /* short offsets repeat their last `off` bytes; near the end, exact */
      for (int64_t k = 0; k < len; k++) d[k] = from[k];
    }
    o += (uint64_t)len;
  }
  return n ? -1 : 0; /* a block ends with literals; an empty one is empty */
}
