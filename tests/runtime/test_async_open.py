"""Opening in the background (coldbrew.load(..., wait=False), exec/async.c):
the call returns while the open is blocked; ready, wait, progress and the
callback at the end; a run made early gives the eager run's result; a
failed open reported by wait and session; cancellation at once. Under the
sanitizers: tests/runtime/test_stress.py (stress async)."""
import os
import threading

import numpy as np
import pytest
from conftest import assert_close

import coldbrew


def _feeds(sess):
    i = sess.get_inputs()[0]
    return {i.name: np.random.default_rng(3).standard_normal(i.shape).astype(np.float32)}


def test_load_returns_while_the_open_is_blocked(tmp_path):
    """The opening thread waits on a FIFO no one writes yet: load has
    returned, nothing is ready; once a writer comes and goes, the open fails
    (a FIFO is no bundle) and the failure is the handle's."""
    fifo = str(tmp_path / "pipe.brew")
    os.mkfifo(fifo)
    pending = coldbrew.load(fifo, wait=False)
    assert not pending.ready() and not pending.wait(0.05)
    assert pending.progress()["opened"] is False
    open(fifo, "wb").close()  # the open's reader gets its file (a FIFO, no bundle)
    assert pending.wait(10)
    with pytest.raises(coldbrew.BundleError):
        pending.session()
    pending.close()


def test_ready_wait_progress_and_the_callback(small_bundle):
    heard, done = [], threading.Event()
    with coldbrew.load(small_bundle, wait=False, on_ready=lambda p: (heard.append(p.progress()), done.set())) as pending:
        assert pending.wait(30) and pending.ready() and done.wait(30)
        p = pending.progress()
        assert p["opened"] and p["layers_ready"] == p["layers_total"] > 0
        assert p["bytes_read"] == p["bytes_total"] == os.path.getsize(small_bundle)  # in the page cache or not
        assert len(heard) == 1 and heard[0]["layers_ready"] == heard[0]["layers_total"]
        eager = coldbrew.load(small_bundle)
        feeds = _feeds(eager)
        assert_close(pending.run(None, feeds), eager.run(None, feeds))


def test_a_handle_with_a_callback_goes_when_dropped_and_is_not_closed_from_it(small_bundle):
    """The callback's thread holds its PendingSession weakly: dropped, the
    handle is released as soon as that thread lets go of it (no cycle waits
    for the garbage collector, which is off here); closing it from its own
    callback is refused; no Python runs on the runtime's opening thread."""
    import gc
    import time
    import weakref

    errors, done, threads = [], threading.Event(), []

    def close_here(p):
        threads.append(threading.current_thread().name)
        try:
            p.close()
        except RuntimeError as e:
            errors.append(str(e))
        done.set()

    gc.disable()
    try:
        pending = coldbrew.load(small_bundle, wait=False, on_ready=close_here)
        assert done.wait(30) and errors and "on_ready" in errors[0] and threads == ["coldbrew-on-ready"]
        gone = weakref.ref(pending)
        del pending
        for _ in range(2000):  # the callback's thread drops its reference as it returns
            if gone() is None:
                break
            time.sleep(0.005)
        assert gone() is None
    finally:
        gc.enable()


def test_a_run_made_at_once_waits_for_what_it_needs(small_bundle):
    eager = coldbrew.load(small_bundle)
    feeds = _feeds(eager)
    pending = coldbrew.load(small_bundle, wait=False, threads=1)
    assert_close(pending.run(None, feeds), eager.run(None, feeds))  # before ready, most likely
    assert pending.wait(30)
    pending.close()


def test_cancelled_at_once_and_a_path_required(small_bundle):
    for _ in range(20):
        coldbrew.load(small_bundle, wait=False).cancel()
    with pytest.raises(TypeError, match="give its path"):
        coldbrew.load(open(small_bundle, "rb").read(), wait=False)


def test_a_multi_target_bundle_opened_in_the_background_names_its_section(small_model, tmp_path):
    from coldbrew.compiler import compile_model

    path = str(tmp_path / "multi.brew")
    compile_model(small_model, path, target="host,x86_64-avx2")
    with coldbrew.load(path, wait=False, target="x86_64-avx2") as pending:
        assert pending.target == "x86_64-avx2"
