"""base/ (runtime/src/base): the LZ4 decoder of the CPU code segment
(lz4.c) against the `lz4` package's encoder, and on damaged blocks (always
a size or -1, never a write past the buffer; tests/fuzz/fuzz.py runs it
under ASan); the checksum, the status names, the thread's error message and
the trace's clock (base.c); allocation failures on demand and the count of
live allocations (alloc.c)."""
import ctypes
import gc
import threading
import time

import lz4.block
import numpy as np
import pytest

import coldbrew
from coldbrew.runtime import _STATUS, _lib

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


def test_checksum_is_the_compilers():
    """cb_checksum64 (base.c) and the compiler's checksum64 agree at every
    length (whole words and a zero-padded tail); a flipped bit and a swap of
    two words each change it."""
    from coldbrew.compiler.bundle.checksum import checksum64

    checksum = _lib.cb_checksum64
    checksum.argtypes, checksum.restype = [ctypes.c_char_p, ctypes.c_uint64], ctypes.c_uint64
    rng = np.random.default_rng(2)
    for n in [*range(41), 4095, 4096, 100_003]:
        data = bytes(rng.integers(0, 256, n, dtype=np.uint8))
        assert checksum(data, n) == checksum64(data), n
    data = bytes(rng.integers(0, 256, 64, dtype=np.uint8))
    flipped, swapped = bytes([data[0] ^ 1]) + data[1:], data[8:16] + data[:8] + data[16:]
    assert len({checksum(data, 64), checksum(flipped, 64), checksum(swapped, 64)}) == 3


def test_status_names_are_the_bindings():
    name = _lib.cb_status_name
    name.argtypes, name.restype = [ctypes.c_int], ctypes.c_char_p
    assert [name(s).decode() for s in range(len(_STATUS))] == _STATUS
    assert name(len(_STATUS)) == name(-1) == b"UNKNOWN"


def test_each_thread_keeps_its_own_error_message(tmp_path):
    """cb_fail sets the calling thread's message (cb_last_error): a failure on
    another thread leaves this thread's as it was."""
    with pytest.raises(coldbrew.BundleError, match="cannot open"):
        coldbrew.load(str(tmp_path / "missing.brew"))
    mine, theirs = _lib.cb_last_error(), []

    def fail_elsewhere():
        try:
            coldbrew.load(b"\x7fELF" + bytes(100))
        except coldbrew.BundleError as e:
            theirs.append((e.status, _lib.cb_last_error()))

    t = threading.Thread(target=fail_elsewhere)
    t.start()
    t.join()
    assert theirs and theirs[0][0] == "BAD_MAGIC" and b"not a coldbrew bundle" in theirs[0][1], theirs
    assert _lib.cb_last_error() == mine and b"missing.brew" in mine


def test_trace_times_are_the_monotonic_clock_in_nanoseconds(small_bundle):
    """cb_now_ns (base.c) is CLOCK_MONOTONIC in nanoseconds, as Python's
    time.monotonic_ns: every event of an open and its first run lies between
    two readings taken around them, and ends no earlier than it starts."""
    before = time.monotonic_ns()
    sess = coldbrew.load(small_bundle, trace=True)
    sess.run(None, {"x": np.zeros((1, 3, 16, 16), np.float32)})
    after = time.monotonic_ns()
    events = sess.trace()
    assert {"verify", "code_load", "session", "execute"} <= {e["phase"] for e in events}
    for e in events:
        assert before <= e["start_ns"] <= e["end_ns"] <= after, e


def test_every_allocation_of_an_open_made_to_fail_is_a_clean_error(small_bundle):
    """cb_debug_fail_allocation(n) (alloc.c) fails the n-th allocation from
    then on. For each n in turn, opening a bundle and its session either
    raises a BundleError with a message (OUT_OF_MEMORY at the very first
    allocation) or does without that allocation, and leaves nothing allocated
    (cb_debug_allocations' live count is back where it was); past its last
    allocation, the open succeeds."""
    arm, counts = _lib.cb_debug_fail_allocation, _lib.cb_debug_allocations
    arm.argtypes, arm.restype = [ctypes.c_uint64], None
    counts.argtypes, counts.restype = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int64)], None
    made, live = ctypes.c_uint64(), ctypes.c_int64()
    data = open(small_bundle, "rb").read()
    coldbrew.load(data).run(None, {"x": np.zeros((1, 3, 16, 16), np.float32)})  # the pool's threads and caches
    gc.collect()  # no other test's sessions are freed while this one counts
    gc.disable()
    try:
        counts(None, ctypes.byref(live))
        start, failures = live.value, []
        for n in range(1, 10_000):
            arm(n)
            try:
                coldbrew.load(data).close()
                failed = None
            except coldbrew.BundleError as e:
                failed = (e.status, str(e))
            counts(ctypes.byref(made), None)
            arm(0)
            counts(None, ctypes.byref(live))
            assert live.value == start, (n, live.value - start, failed)
            if failed:
                assert failed[1] != f"[{failed[0]}] ", (n, failed)  # a message names what failed
                failures.append(failed[0])
            elif made.value < n:
                break
    finally:
        arm(0)
        gc.enable()
    assert n > 10 and failures and failures[0] == "OUT_OF_MEMORY", (n, failures)
