"""exec/ (runtime/src/exec): a bundle opened to run (load.c), sessions
(session.c), their runs with each step's weights read, checked and
prepared, inline or on preparation workers (run.c), and continuous mode
(warmer.c): the first run follows the cold plan, later runs switch to each
layer's warm alternate once its weights are read; outputs equal
onnxruntime's in every mode and on every run."""
import time

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import assert_close, ort_run

import coldbrew
from coldbrew.compiler import compile_graph
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.compiler.tools.cli import main
from coldbrew.schemas.generated import bundle_generated as fb


def test_matches_onnxruntime(small_model, small_bundle):
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    sess = coldbrew.load(small_bundle)
    assert_close(sess.run(None, {"x": x})[0], ort_run(small_model, {"x": x})[0])
    # repeated runs give identical results (the arena is reused)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], sess.run(None, {"x": x})[0])


def test_raw_and_cached_weights_agree_across_thread_counts(tmp_path):
    """A bundle whose layers carry raw weights + transform kernels and one
    that carries the transformed weights give the same results, at any
    thread count; the raw one runs each transform once."""
    from conftest import small_cnn

    from coldbrew.compiler import compile_model
    from coldbrew.compiler.bundle.reader import read_bytes

    model = small_cnn()
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    outs = []
    for form in ("raw", "cached"):
        data = compile_model(model, variants={"conv2d": "winograd_f2"}, weights=form)
        b = read_bytes(data)[0]
        steps = {s.variant.decode(): s for s in b.plan.steps}
        conv = steps["conv2d.winograd_f2"]
        assert bool(conv.transform) == (form == "raw") and (b.plan.preparedSize > 0) == (form == "raw")
        transforms = sum(1 for s in b.plan.steps if s.transform)
        for threads in (1, 2, 3):
            sess = coldbrew.load(data, threads=threads, trace=True)
            for run in range(2):
                outs.append(sess.run(None, {"x": x})[0])
                phases = [e["phase"] for e in sess.trace()]
                assert phases.count("transform") == (transforms if run == 0 else 0)
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=1e-6, atol=1e-6)
    assert_close(outs[0], ort_run(model, {"x": x})[0])


def test_preparation_workers_prepare_ahead_of_execution(tmp_path):
    """Steps placed on preparation queue 1 are read, checked and transformed
    by a worker on another core while the executing thread runs; results
    equal the inline plan's at any thread count, and only the first run
    prepares."""
    from conftest import small_cnn

    from coldbrew.compiler import compile_model
    from coldbrew.compiler.bundle.reader import read_bytes

    model = small_cnn()
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    inline = compile_model(model, variants={"conv2d": "winograd_f2"}, weights="raw")
    ahead = compile_model(model, variants={"conv2d": "winograd_f2"}, weights="raw", queues={"*": 1, "c0": 0})
    steps = read_bytes(ahead)[0].plan.steps
    assert {s.prepQueue for s in steps} == {0, 1}
    ref = coldbrew.load(inline).run(None, {"x": x})[0]
    for threads in (1, 2, 3):
        sess = coldbrew.load(ahead, threads=threads, trace=True)
        for run in range(3):
            np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref)
            events = sess.trace()
            prep = [e for e in events if e["phase"] in ("read", "transform")]
            if run == 0:
                assert {e["step"] for e in prep} == set(range(len(steps)))
                assert any(e["phase"] == "transform" for e in prep)
                # every step executes after its preparation ended
                done = {}
                for e in prep:
                    done[e["step"]] = max(done.get(e["step"], 0), e["end_ns"])
                for e in events:
                    if e["phase"] == "execute":
                        assert e["start_ns"] >= done[e["step"]]
            else:
                assert not prep


def test_outputs_correct_under_a_cpu_hog():
    """A busy process pinned to a preparation worker's core: whoever claims a
    step first prepares it (the executing thread steals what the worker has
    not started), and the outputs do not change."""
    import os
    import subprocess
    import sys

    from conftest import small_cnn

    from coldbrew.compiler import compile_model

    cores = sorted(os.sched_getaffinity(0))
    model = small_cnn()
    x = np.random.default_rng(4).standard_normal((1, 3, 16, 16)).astype(np.float32)
    data = compile_model(model, variants={"conv2d": "winograd_f2"}, weights="raw", queues={"*": 1, "c0": 0})
    ref = coldbrew.load(compile_model(model, variants={"conv2d": "winograd_f2"}, weights="raw")).run(None, {"x": x})[0]
    hog = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cores[-1]}}})\nwhile True: pass"])
    try:
        for threads in (1, 2):
            for _ in range(10):
                sess = coldbrew.load(data, threads=threads, trace=True)
                np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref)
                prepared = [e["step"] for e in sess.trace() if e["phase"] == "read"]
                assert sorted(prepared) == sorted(set(prepared))  # every step prepared exactly once
    finally:
        hog.kill()
        hog.wait()


def test_corrupt_weight_found_by_a_preparation_worker(tmp_path):
    """The worker that reads a corrupt weight reports it; the executing
    thread returns that error, and nothing hangs."""
    from conftest import small_cnn

    from coldbrew.compiler import compile_model

    data = bytearray(compile_model(small_cnn(), variants={"conv2d": "winograd_f2"}, weights="raw", queues=1))
    b = fb.BundleT.InitFromObj(fb.Bundle.GetRootAs(bytes(data[64:]), 0))
    last = max((t for t in b.tensors if t.kind == fb.TensorKind.weight),
               key=lambda t: b.segments[t.segment].offset + t.segmentOffset)
    data[b.segments[last.segment].offset + last.segmentOffset] ^= 0x01
    sess = coldbrew.load(bytes(data), threads=2)
    with pytest.raises(coldbrew.BundleError) as e:
        sess.run(None, {"x": np.zeros((1, 3, 16, 16), np.float32)})
    assert e.value.status == "CORRUPT" and last.name.decode() in str(e.value), str(e.value)


COLD = {"conv2d": "conv2d.im2col_gemm"}


WARM = {"conv2d": "conv2d.winograd_f2"}


@pytest.fixture(scope="module")
def continuous_bundle(tmp_path_factory, small_model):
    path = tmp_path_factory.mktemp("continuous") / "small.brew"
    data, graph = compile_graph(small_model, str(path), variants=COLD, weights="raw", queues=1, warm=(WARM, 2))
    return str(path), data, graph


@pytest.fixture(scope="module")
def feeds():
    return {"x": np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)}


def _wait_ready(sess, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ready, total = sess.alternates()
        if ready == total:
            return ready
        time.sleep(0.01)
    raise AssertionError(f"warm alternates not ready after {timeout} s: {sess.alternates()}")


def test_bundle_stores_the_warm_alternate_after_the_plans_weights(continuous_bundle):
    from coldbrew.compiler.tools.inspect import describe

    path, data, graph = continuous_bundle
    conv = next(layer for layer in graph.layers if layer.name == "c0")
    assert conv.variant == "conv2d.im2col_gemm" and conv.warm["variant"] == "conv2d.winograd_f2"
    b, _, _ = read_bytes(data)
    step = next(s for s in b.plan.steps if b.layers[s.layer].name == b"c0")
    alt = step.kind.warm
    assert alt.variant == b"conv2d.winograd_f2" and alt.kernel.startswith(b"warm_")
    assert b.plan.warmThreads == 2
    # the warm weights lie behind every weight the plan reads
    plan_ends = [b.segments[t.segment].offset + t.segmentOffset + t.nbytes for s in b.plan.steps
                 for t in (b.tensors[a] for a in list(b.layers[s.layer].args) + list(s.transformArgs if s.transformArgs is not None else []))
                 if t.kind == 3]
    warm = [b.tensors[a] for a in alt.args if b.tensors[a].kind == 3 and b.tensors[a].name.endswith(b".warm")]
    assert warm and min(b.segments[t.segment].offset + t.segmentOffset for t in warm) >= max(plan_ends)
    alternates = [ln for ln in describe(path) if "  warm alternate" in ln]  # the inspector lists each alternate
    assert len(alternates) == len([s for s in b.plan.steps if s.kind.warm]) and "conv2d.winograd_f2" in alternates[0]


def test_continuous_runs_switch_to_the_alternate_and_stay_correct(continuous_bundle, small_model, feeds):
    path, _, _ = continuous_bundle
    ref = ort_run(small_model, feeds)[0]
    sess = coldbrew.load(path, mode="continuous", trace=True)
    assert sess.alternates() == (0, 1)
    assert_close(sess.run(None, feeds)[0], ref)
    first = [e for e in sess.trace() if e["phase"] == "execute"]
    assert not any(e["alternate"] for e in first)
    assert _wait_ready(sess) == 1
    for _ in range(3):
        assert_close(sess.run(None, feeds)[0], ref)
        conv = [e for e in sess.trace() if e["phase"] == "execute" and e["layer"] == "c0"]
        assert conv[0]["alternate"] and conv[0]["variant"] == "conv2d.winograd_f2"
    sess.close()


def test_runs_ready_the_alternates_themselves_without_the_warmer(continuous_bundle, small_model, feeds,
                                                               monkeypatch):
    """With no warmer (COLDBREW_WARMER=off: as with one kept off the cores
    by back-to-back runs, or one that began a step and was then starved),
    the second run finds the alternate's bytes in memory, checks them on
    its own thread and executes the alternate."""
    path, _, _ = continuous_bundle
    monkeypatch.setenv("COLDBREW_WARMER", "off")
    ref = ort_run(small_model, feeds)[0]
    with coldbrew.load(path, mode="continuous", trace=True) as sess:
        assert_close(sess.run(None, feeds)[0], ref)
        time.sleep(0.2)  # a warmer would have readied it by now
        assert sess.alternates() == (0, 1)
        assert_close(sess.run(None, feeds)[0], ref)
        events = sess.trace()
        assert [e["worker"] for e in events if e["phase"] == "read" and e["alternate"]] == [0]
        assert [e["alternate"] for e in events if e["phase"] == "execute" and e["layer"] == "c0"] == [True]
        assert sess.alternates() == (1, 1)


def test_cold_mode_never_uses_the_alternate(continuous_bundle, small_model, feeds):
    path, _, _ = continuous_bundle
    ref = ort_run(small_model, feeds)[0]
    with coldbrew.load(path, trace=True) as sess:
        for _ in range(3):
            assert_close(sess.run(None, feeds)[0], ref)
            assert not any(e["alternate"] for e in sess.trace())
        assert sess.alternates() == (0, 1)


def test_bad_mode_is_a_clear_error(continuous_bundle):
    with pytest.raises(ValueError, match="mode must be one of"):
        coldbrew.load(continuous_bundle[0], mode="turbo")


def test_corrupt_warm_weight_fails_the_next_run(continuous_bundle, feeds):
    _, data, _ = continuous_bundle
    b, _, _ = read_bytes(data)
    step = next(s for s in b.plan.steps if s.kind.warm)
    t = next(b.tensors[a] for a in step.kind.warm.args if b.tensors[a].name.endswith(b".warm"))
    bad = bytearray(data)
    bad[b.segments[t.segment].offset + t.segmentOffset] ^= 0x10
    sess = coldbrew.load(bytes(bad), mode="continuous")
    sess.run(None, feeds)  # the plan's weights are intact
    end = time.monotonic() + 10
    with pytest.raises(coldbrew.BundleError, match="CORRUPT.*warm"):
        while time.monotonic() < end:  # until the warmer has read the damaged tensor
            sess.run(None, feeds)
            time.sleep(0.01)
    # a cold-mode session of the same bytes never reads it
    cold = coldbrew.load(bytes(bad))
    for _ in range(2):
        cold.run(None, feeds)


def test_cli_compile_continuous_and_run(tmp_path, small_model):
    import onnx

    model = tmp_path / "small.onnx"
    onnx.save(small_model, str(model))
    out = tmp_path / "c.brew"
    r = CliRunner().invoke(main, ["compile", str(model), "-o", str(out), "--plan", "cold", "--continuous",
                                  "--no-tune"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["run", str(out), "--mode", "continuous", "--repeat", "3"])
    assert r.exit_code == 0 and "run 2" in r.output, r.output


@pytest.mark.parametrize("mode", ["cold", "continuous"])
def test_later_runs_use_the_cores_the_first_run_kept_for_preparation(tmp_path, small_model, feeds, mode):
    """A cold plan of 1 execution thread and a preparation worker stores 2
    threads for later runs (compile_model does so when the scheduler keeps
    cores for preparation): the first run's parallel loops use 1 thread,
    every later run 2, in either mode, with the same outputs."""
    import ctypes

    from coldbrew.compiler.tools.inspect import describe
    from coldbrew.runtime import _lib

    path = tmp_path / "later.brew"
    compile_graph(small_model, str(path), variants=COLD, weights="raw", queues=1, threads=1, later_threads=2)
    plan = read_bytes(path.read_bytes())[0].plan
    assert (plan.threads, plan.warmThreads) == (1, 2)
    assert "threads 1, later runs on 2" in "\n".join(describe(str(path)))
    active = _lib.cb_backend_active_threads
    active.restype = ctypes.c_int
    sess = coldbrew.load(str(path), mode=mode)
    ref = ort_run(small_model, feeds)
    for run in range(3):
        assert_close(sess.run(None, feeds), ref)
        assert active() == (1 if run == 0 else 2), run
    # a caller's thread count holds for every run
    fixed = coldbrew.load(str(path), threads=1, mode=mode)
    for _ in range(2):
        assert_close(fixed.run(None, feeds), ref)
        assert active() == 1


def _conv_chain(n=8, c=32, hw=24):
    """n 3 x 3 convolutions of c channels in a row (Winograd-able: raw
    weights take a transform each)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(9)
    inits, nodes, x = [], [], "x"
    for i in range(n):
        inits.append(numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.1).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"y{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"))
        x = f"y{i}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, c, hw, hw])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, rng.standard_normal((1, c, hw, hw)).astype(np.float32)


def _overlaps(a, b):
    return a["start_ns"] < b["end_ns"] and b["start_ns"] < a["end_ns"]


def test_preparation_runs_on_the_workers_thread_while_layers_execute():
    """The trace names who prepared each step: the steps of queue 1 are
    read and transformed by preparation worker 1 (not the executing
    thread), and some of that preparation runs while an earlier layer
    executes (the pipeline the plan asked for). Without workers every
    event's worker is 0."""
    from coldbrew.compiler import compile_model

    # layers that execute for milliseconds: on a machine whose cores are
    # taken by other processes the worker still gets a time slice while the
    # executing thread is inside one (with 24 x 24 maps it claimed nothing)
    model, x = _conv_chain(hw=96)
    data = compile_model(model, variants={"conv2d": "winograd_f2"}, weights="raw", queues={"*": 1, "c0": 0})
    ref = coldbrew.load(compile_model(model, variants={"conv2d": "winograd_f2"}, weights="raw")).run(None, {"x": x})[0]
    overlapped, worked = False, False
    for _ in range(20):  # a busy machine (tests in parallel) may leave the worker no core for a run
        sess = coldbrew.load(data, threads=1, trace=True)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-5, atol=1e-5)
        events = sess.trace()
        prep = [e for e in events if e["phase"] in ("read", "transform") and e["step"] >= 0]
        by_worker = [e for e in prep if e["worker"] == 1]
        assert all(e["step"] != 0 for e in by_worker)  # c0 is inline
        assert all(e["worker"] == 0 for e in events if e["phase"] == "execute")
        worked |= bool(by_worker)
        execs = [e for e in events if e["phase"] == "execute"]
        if any(_overlaps(p, e) for p in by_worker for e in execs if e["step"] < p["step"]):
            overlapped = True
            break
    assert worked and overlapped


def test_the_trace_times_thread_starts_and_counts_page_faults():
    """A first run's trace holds the thread starts (the pool's at open,
    with two threads; the preparation workers' at the run) and the page
    faults each phase's thread took; a warm run's trace has no thread
    start. The code's load maps a fresh library, so its thread faults (a
    fresh arena need not: the allocator reuses what earlier sessions freed).
    The account built from it covers the executing thread's span."""
    from coldbrew.compiler import compile_model
    from coldbrew.compiler.tools import trace_export

    model, x = _conv_chain(hw=48)
    data = compile_model(model, weights="raw", queues={"*": 1, "c0": 0})
    sess = coldbrew.load(data, threads=2, trace=True)
    sess.run(None, {"x": x})
    events = sess.trace()
    starts = [e for e in events if e["phase"] == "thread_start"]
    assert len(starts) == 2 and all(e["step"] == -1 and e["end_ns"] >= e["start_ns"] for e in starts)
    assert sum(e["faults"] for e in events if e["phase"] == "code_load") > 0
    a = trace_export.account(events)
    assert sum(a["phase_ms"].values()) + a["wait_ms"] + a["between_ms"] == pytest.approx(a["span_ms"])
    sess.run(None, {"x": x})
    assert not any(e["phase"] == "thread_start" for e in sess.trace())


def test_an_idle_worker_takes_steps_from_a_loaded_ones_queue():
    """Two preparation queues, the second with one step: its worker, done
    with it, takes pending steps of the first queue (worker-to-worker
    stealing), while a busy process holds one core; every step is
    prepared exactly once and the outputs do not change."""
    import os
    import subprocess
    import sys

    from coldbrew.compiler import compile_model
    from coldbrew.compiler.bundle.reader import read_bytes

    model, x = _conv_chain(n=12, c=96, hw=12)
    data = compile_model(model, variants={"conv2d": "winograd_f2"}, weights="raw",
                         queues={"*": 1, "c0": 0, "c1": 2})
    queue = {i: s.prepQueue for i, s in enumerate(read_bytes(data)[0].plan.steps)}
    assert sorted(set(queue.values())) == [0, 1, 2]
    ref = coldbrew.load(compile_model(model, variants={"conv2d": "winograd_f2"}, weights="raw")).run(None, {"x": x})[0]
    cores = sorted(os.sched_getaffinity(0))
    hog = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cores[-1]}}})\nwhile True: pass"])
    stolen = False
    try:
        for _ in range(20):
            sess = coldbrew.load(data, threads=1, trace=True)
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-5, atol=1e-5)
            reads = [e for e in sess.trace() if e["phase"] == "read" and e["step"] >= 0]
            assert sorted(e["step"] for e in reads) == sorted(queue)  # each step prepared once
            if any(e["worker"] == 2 and queue[e["step"]] == 1 for e in reads):
                stolen = True
                break
    finally:
        hog.kill()
        hog.wait()
    assert stolen


_PLACEMENT = """
import json, os, sys
import numpy as np
import coldbrew
data = open(sys.argv[1], "rb").read()
slow, every = int(sys.argv[2]), os.sched_getaffinity(0)
x = np.load(sys.argv[3])
out = []
for k in range(16):  # four runs, more until the worker has started in time to prepare a step
    os.sched_setaffinity(0, {slow})  # the caller starts out on the slow core
    os.sched_setaffinity(0, every)
    sess = coldbrew.load(data, threads=1, trace=True)
    sess.run(None, {"x": x})
    out += [e for e in sess.trace() if e["step"] >= 0]
    if k >= 3 and any(e["worker"] == 1 for e in out):
        break
print(json.dumps(out))
"""


@pytest.mark.parametrize("fast_index", [0, 1])
def test_threads_are_placed_by_core_class(tmp_path, fast_index):
    """A fake sysfs (COLDBREW_SYSFS_CPU) gives the cores two classes: the
    executing thread runs on the fastest core whatever core the caller is
    on, the preparation worker on the other; both ways round. (With the
    placement off the executing thread stays on the caller's core, the
    slow one here.)"""
    import json
    import os
    import subprocess
    import sys

    from coldbrew.compiler import compile_model

    cores = sorted(os.sched_getaffinity(0))
    assert len(cores) >= 2, "needs two cores"
    fast, slow = cores[fast_index], cores[1 - fast_index]
    sysfs = tmp_path / "cpu"
    for c in cores:
        (sysfs / f"cpu{c}").mkdir(parents=True)
        (sysfs / f"cpu{c}" / "cpu_capacity").write_text("1024\n" if c == fast else "430\n" if c == slow else "100\n")
    model, x = _conv_chain(n=8, c=96, hw=12)
    bundle = tmp_path / "m.brew"
    bundle.write_bytes(compile_model(model, variants={"conv2d": "winograd_f2"}, weights="raw",
                                     queues={"*": 1, "c0": 0}))
    np.save(tmp_path / "x.npy", x)
    script = tmp_path / "placed.py"
    script.write_text(_PLACEMENT)
    env = dict(os.environ, COLDBREW_SYSFS_CPU=str(sysfs))
    r = subprocess.run([sys.executable, str(script), str(bundle), str(slow), str(tmp_path / "x.npy")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    events = json.loads(r.stdout)
    execs = [e for e in events if e["phase"] == "execute"]
    prep = [e for e in events if e["worker"] == 1]
    assert execs and prep
    assert {e["cpu"] for e in execs} == {fast}
    assert {e["cpu"] for e in prep} == {slow}
