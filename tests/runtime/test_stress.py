"""The C runtime under stress (tests/runtime/c/stress.c), built three ways:
plain (memory, fds and mappings flat over 1000 cycles), ASan + UBSan (no
leak, no invalid access, no undefined behaviour; every allocation failure
a clean status) and TSan (many sessions of one bundle on several threads,
the pipelined first run's preparation workers, continuous mode's warmer).
Needs clang (Debian `clang`), installed by .ci/setup.sh."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "runtime"))
import build  # noqa: E402  (runtime/build.py)

from coldbrew.compiler import compile_graph, compile_model  # noqa: E402

SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:abort_on_error=0:allocator_may_return_null=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    "TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1",
}


@pytest.fixture(scope="module")
def stress(tmp_path_factory):
    """Path of the stress program per build: plain, asan, tsan."""
    out = {}
    for name in ("plain", "asan", "tsan"):
        d = str(tmp_path_factory.mktemp(name))
        flags = build.SANITIZERS.get(name, ())
        cc, cxx = ("clang", "clang++") if flags else (None, None)
        build.build(d, cc, cxx, flags=flags)
        out[name] = build.build_program(os.path.join(ROOT, "tests", "runtime", "c", "stress.c"), d, cc, flags)
    return out


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, small_model):
    """The small model three ways: the default plan; raw weights prepared by a
    worker (the pipelined first run); and with warm alternates (continuous)."""
    d = tmp_path_factory.mktemp("stress-bundles")
    paths = {k: str(d / f"{k}.brew") for k in ("default", "pipelined", "continuous")}
    compile_model(small_model, paths["default"])
    compile_model(small_model, paths["pipelined"], weights="raw", queues={"*": 1})
    compile_graph(small_model, paths["continuous"], variants={"conv2d": "conv2d.im2col_gemm"}, weights="raw",
                  queues=1, warm=({"conv2d": "conv2d.winograd_f2"}, 2))
    return paths


def run(program, *args, timeout=600):
    r = subprocess.run([program, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **SANITIZER_ENV})
    assert r.returncode == 0, f"{os.path.basename(os.path.dirname(program))} stress {args}:\n{r.stderr[-4000:]}"
    assert "Sanitizer" not in r.stderr, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["default", "pipelined"])
def test_1000_cycles_leave_memory_fds_and_mappings_flat(stress, bundles, kind):
    r = run(stress["plain"], "cycles", bundles[kind], 1000)
    assert r["fds"][1] == r["fds"][0], r  # the code's memfd closed every time
    assert r["maps"][1] == r["maps"][0], r  # the bundle and its code unmapped every time
    assert r["live_allocations"][1] == r["live_allocations"][0], r
    assert r["rss_kb"][1] - r["rss_kb"][0] < 1024, r  # a leak of even 1 KB per cycle would show


@pytest.mark.parametrize("kind", ["default", "pipelined", "continuous"])
def test_cycles_under_asan_and_ubsan(stress, bundles, kind):
    r = run(stress["asan"], "cycles", bundles[kind], 50)
    assert r["fds"][1] == r["fds"][0] and r["live_allocations"][1] == r["live_allocations"][0], r


@pytest.mark.parametrize("kind,mode", [("default", 0), ("pipelined", 0), ("continuous", 1)])
def test_every_allocation_failure_is_a_clean_status(stress, bundles, kind, mode):
    r = run(stress["asan"], "oom", bundles[kind], mode)
    assert r["allocations"] >= 20 and r["failed_cleanly"] == r["allocations"], r


@pytest.mark.parametrize("sanitizer", ["asan", "tsan"])
@pytest.mark.parametrize("kind,mode", [("pipelined", 0), ("continuous", 1)])
def test_many_sessions_of_one_bundle_on_several_threads(stress, bundles, sanitizer, kind, mode):
    r = run(stress[sanitizer], "threads", bundles[kind], 4, 8, mode)
    assert r["failed"] == 0 and r["threads"] == 4, r


def test_cycles_under_tsan(stress, bundles):
    run(stress["tsan"], "cycles", bundles["continuous"], 20)


@pytest.mark.parametrize("sanitizer", ["asan", "tsan"])
@pytest.mark.parametrize("kind", ["default", "pipelined"])
def test_background_opens_polled_cancelled_run_early_and_waited_for(stress, bundles, sanitizer, kind):
    """cb_bundle_open_async under the sanitizers: progress and readiness
    asked from another thread while the handle's thread opens and reads,
    opens cancelled at once (nothing leaks), run before ready, waited for;
    one callback each."""
    r = run(stress[sanitizer], "async", bundles[kind], 12)
    assert r == {"opens": 12, "ran": 4, "callbacks": 12}, r
