/* libFuzzer target `decode`: the CPU code segment's LZ4 decoder
 * (runtime/src/lz4.c) on any bytes. The output buffer is allocated at the
 * exact capacity given (from the input's first byte: 0 to 4x the block and
 * more), so ASan reports any read or write outside the block or the
 * buffer; a result is -1 or a size within the capacity. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  uint64_t n = size - 1, cap = (uint64_t)data[0] * (n + 16) / 64; /* 0 .. ~4x the block */
  uint8_t* src = malloc(n ? n : 1);
  uint8_t* dst = malloc(cap ? cap : 1);
  if (!src || !dst) abort();
  memcpy(src, data + 1, n); /* exact-size copy: a read past the block is reported */
  int64_t got = cb_lz4_decode(src, n, dst, cap);
  if (got < -1 || got > (int64_t)cap) abort();
  free(src);
  free(dst);
  return 0;
}
