"""The cold-run protocol (compiler/measure/protocol.py): its steps do what
they say, and the profiler's worker and the benchmarks' samplers take their
cold starts from it, not from copies of their own."""
import ast
import ctypes
import mmap
import os
import subprocess

import pytest
from conftest import POPULATE_READ, ROOT

from coldbrew.compiler.measure import protocol

libc = ctypes.CDLL(None, use_errno=True)


def resident_pages(path):
    """How many of `path`'s pages are in the page cache (mmap + mincore,
    which fault nothing in)."""
    size = os.path.getsize(path)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        vec = (ctypes.c_ubyte * ((size + 4095) // 4096))()
        try:
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        finally:
            libc.munmap(addr, size)
        return sum(v & 1 for v in vec)
    finally:
        os.close(fd)


@pytest.fixture
def on_disk(tmp_path):
    """A file on a real file system (tmpfs pages cannot be evicted)."""
    folder = tmp_path
    if subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip() == "tmpfs":
        folder = os.path.join(ROOT, "out", "protocol-test")
        os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "f.bin")
    with open(path, "wb") as f:
        f.write(os.urandom(4 << 20))
    yield path
    os.remove(path)


def test_cold_start_evicts_every_artifact(on_disk, monkeypatch):
    monkeypatch.setenv("CB_SETTLE_MB", "0")
    with open(on_disk, "rb") as f:
        f.read()
    assert resident_pages(on_disk) > 0
    protocol.cold_start([on_disk])
    assert resident_pages(on_disk) == 0


def test_settle_memory_writes_the_size_asked_for(monkeypatch):
    import numpy as np

    written = []
    monkeypatch.setattr(np, "empty", lambda n, dtype: written.append(n * np.dtype(dtype).itemsize) or
                        np.zeros(1, dtype))
    for mb in ("0", "64"):
        monkeypatch.setenv("CB_SETTLE_MB", mb)
        protocol.settle_memory()
    assert written == [64 << 20]


def test_cold_reads_go_the_runtimes_way(on_disk, monkeypatch):
    calls, real = [], protocol.populate_read
    monkeypatch.setattr(protocol, "populate_read", lambda path, size=None: calls.append(path) or real(path, size))
    monkeypatch.setenv("CB_SETTLE_MB", "0")
    ms = protocol.cold_read_ms(on_disk)
    assert calls == [on_disk] and ms > 0
    assert resident_pages(on_disk) > 0  # brought in
    rate = protocol.read_rate([on_disk])
    assert rate > 0 and len(calls) == 2
    if POPULATE_READ:
        assert real(on_disk)


def test_populate_read_brings_the_whole_file_in(on_disk):
    """Mapped and brought in 2 MB at a time, as the runtime's streamer does,
    a file that is not a whole number of 2 MB chunks ends up resident."""
    with open(on_disk, "ab") as f:
        f.write(os.urandom(123))
    protocol.evict(on_disk)
    if not POPULATE_READ:
        assert not protocol.populate_read(on_disk)
        return
    assert resident_pages(on_disk) == 0
    assert protocol.populate_read(on_disk)
    assert resident_pages(on_disk) == (os.path.getsize(on_disk) + 4095) // 4096


def test_the_profilers_worker_starts_cold_through_the_protocol(small_bundle, monkeypatch):
    """The kernel sample's worker (the cost table's source) settles and
    evicts through cold_start before it opens the bundle."""
    seen = []
    monkeypatch.setattr(protocol, "cold_start", lambda paths: seen.append(paths))
    out = protocol._worker({"bundle": small_bundle, "cores": sorted(os.sched_getaffinity(0)), "threads": 1,
                            "warm": 0})
    assert seen == [small_bundle]
    assert out["execute_first"] and "verify" in out["open"]


def imported_from_protocol(path):
    """The names a source file imports from the protocol module."""
    names = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("measure.protocol"):
            names |= {a.name for a in node.names}
    return names


@pytest.mark.parametrize("script", ["bench/harness/cold_sample.py", "bench/harness/peer_engines.py"])
def test_the_benchmarks_samplers_start_cold_through_the_protocol(script):
    assert "cold_start" in imported_from_protocol(os.path.join(ROOT, script))


def test_the_check_sees_a_sampler_with_its_own_eviction(tmp_path):
    p = tmp_path / "s.py"
    p.write_text("import os\ndef evict(path):\n    os.posix_fadvise(0, 0, 0, os.POSIX_FADV_DONTNEED)\n")
    assert "cold_start" not in imported_from_protocol(str(p))


def test_every_cold_figure_names_the_protocol():
    assert protocol.describe().startswith(("cold protocol:", "page cache NOT dropped"))
