"""The CPU code segment's LZ4 decoder (runtime/src/lz4.c) against the `lz4`
package's encoder, and on damaged blocks (always a size or -1, never a
write past the buffer; tests/fuzz/fuzz.py runs it under ASan)."""
import ctypes

import lz4.block
import numpy as np
import pytest

from coldbrew.runtime import _lib

decode = _lib.cb_lz4_decode
decode.restype = ctypes.c_int64
decode.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64]
GUARD = 64


def run(block, cap):
    """(decoded size or -1, decoded bytes); fails if a byte past `cap` changed."""
    buf = ctypes.create_string_buffer(b"\xa5" * (cap + GUARD), cap + GUARD)
    n = decode(block, len(block), buf, cap)
    assert buf.raw[cap:] == b"\xa5" * GUARD, "wrote past the buffer"
    assert -1 <= n <= cap
    return n, buf.raw[:max(n, 0)]


def samples():
    rng = np.random.default_rng(0)
    yield b""
    yield b"x"
    yield bytes(rng.integers(0, 256, 5000, dtype=np.uint8))  # incompressible: literals only
    yield b"ab" * 3000 + b"abc" * 1000  # offsets under 8 (overlapping matches)
    yield bytes(rng.integers(0, 4, 70000, dtype=np.uint8))  # long literal and match lengths
    words = [bytes(rng.integers(0, 256, k, dtype=np.uint8)) for k in (3, 9, 17, 40)]
    yield b"".join(words[i] for i in rng.integers(0, 4, 4000))  # mixed offsets and lengths


@pytest.mark.parametrize("mode", ["default", "high_compression"])
def test_decodes_what_lz4_encodes(mode):
    for data in samples():
        block = lz4.block.compress(data, mode=mode, store_size=False)
        assert run(block, len(data)) == (len(data), data)
        if data:  # too small a buffer is an error, not a short write
            assert run(block, len(data) - 1)[0] == -1


def test_damaged_blocks_are_errors_within_bounds():
    rng = np.random.default_rng(1)
    data = b"".join(bytes(rng.integers(0, 256, k, dtype=np.uint8)) * 3 for k in rng.integers(1, 40, 300))
    block = lz4.block.compress(data, mode="high_compression", store_size=False)
    for cut in range(1, len(block), max(1, len(block) // 200)):  # truncated: never the full size
        assert run(block[:cut], len(data))[0] < len(data)
    for _ in range(3000):  # flipped bytes: any result, inside the buffer
        bad = bytearray(block)
        for k in rng.integers(0, len(bad), rng.integers(1, 4)):
            bad[k] = int(rng.integers(0, 256))
        run(bytes(bad), len(data))
    for _ in range(300):  # garbage
        run(bytes(rng.integers(0, 256, int(rng.integers(1, 300)), dtype=np.uint8)), 1000)
    assert run(b"\x00\x00\x00", 100)[0] == -1  # a match at offset 0
    assert run(b"\x10a\x05\x00", 100)[0] == -1  # a match reaching before the start
