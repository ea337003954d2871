"""Every zoo model (or those named) compiled for aarch64 and sd855, run under
qemu-aarch64 and compared with onnxruntime: a table of max errors.

    .venv/bin/python tests/aarch64_zoo.py [models...]

Exit status 1 when any model fails. Pass means tests/conftest.py's
assert_close (max |diff| <= 1e-3 * max(1, output scale)).
"""
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "examples")]
import qemu  # noqa: E402
import zoo  # noqa: E402
from conftest import assert_close  # noqa: E402

TARGETS = ("aarch64", "sd855")


def check(runner, name, target):
    """(max abs error, output scale, seconds, failure or "")."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            pairs = qemu.compile_and_run(runner, zoo.build(name), target, tmp)
        except Exception as e:  # a compile or run failure is a row of the table, not the end of the run
            return float("nan"), float("nan"), time.perf_counter() - t0, f"{type(e).__name__}: {e}"
    err = scale = 0.0
    failure = ""
    for ours, ref in pairs:
        err = max(err, float(np.max(np.abs(ours.astype(np.float64) - ref.astype(np.float64)))))
        scale = max(scale, float(np.max(np.abs(ref))))
        try:
            assert_close(ours, ref)
        except AssertionError as e:
            failure = str(e)
    return err, scale, time.perf_counter() - t0, failure


def main(names):
    unknown = [n for n in names if n not in zoo.MODELS]
    if unknown:
        sys.exit(f"unknown zoo models {unknown}; known: {', '.join(zoo.MODELS)}")
    with tempfile.TemporaryDirectory() as tmp:
        runner = qemu.build_runner(tmp)
        print(f"{'model':<16} {'target':<8} {'max |err|':>10} {'scale':>8} {'seconds':>8}  result")
        failed = 0
        for name in names or list(zoo.MODELS):
            for target in TARGETS:
                err, scale, secs, failure = check(runner, name, target)
                failed += bool(failure)
                print(f"{name:<16} {target:<8} {err:>10.2e} {scale:>8.2f} {secs:>8.1f}  "
                      f"{'FAIL ' + failure if failure else 'pass'}", flush=True)
    print(f"{failed} failed" if failed else "all passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
