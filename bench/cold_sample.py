"""One cold-run sample, in a fresh process (DESIGN.md's protocol): import
coldbrew first (reported apart), evict the bundle from the page cache, then
time load + first result. Prints one JSON line.

    python bench/cold_sample.py BUNDLE [--trace] [--threads N]
"""
import json
import os
import sys
import time

t_import = time.perf_counter()
import numpy as np  # noqa: E402

import coldbrew  # noqa: E402

t_import = time.perf_counter() - t_import


def main():
    path = sys.argv[1]
    trace = "--trace" in sys.argv
    threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 0
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    t0 = time.perf_counter()
    sess = coldbrew.load(path, threads=threads, trace=trace)
    t1 = time.perf_counter()
    feeds = {i.name: np.zeros(i.shape, i.dtype) for i in sess.get_inputs()}
    sess.run(None, feeds)
    t2 = time.perf_counter()
    out = {"import_ms": t_import * 1e3, "load_ms": (t1 - t0) * 1e3, "first_run_ms": (t2 - t1) * 1e3,
           "cold_ms": (t2 - t0) * 1e3, "t0_ns": int(t0 * 1e9)}
    if trace:
        out["events"] = sess.trace()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
