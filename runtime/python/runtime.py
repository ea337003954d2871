"""Python binding of the C runtime (ctypes; no TVM involved).

Shaped like onnxruntime: `sess = coldbrew.load(path)`,
`sess.run(None, {"x": arr})` -> list of numpy arrays, plus
`get_inputs()` / `get_outputs()` metadata. Status codes map to exceptions in
one place, `_check`.
"""
import ctypes
import math
import os
import re
import threading
import weakref

import numpy as np

_DTYPES = [np.float32, np.float16, np.float64, np.int8, np.int16, np.int32, np.int64,
           np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]
_STATUS = ["OK", "INVALID_ARGUMENT", "IO", "BAD_MAGIC", "VERSION", "CORRUPT", "TARGET", "LOAD",
           "KERNEL", "OUT_OF_MEMORY", "GPU", "SIGNATURE"]
SKIP_WEIGHT_CHECKSUMS = 1
CPU_ONLY = 2  # coldbrew.h CB_OPEN_CPU_ONLY
_PHASES = {1: "transform", 2: "execute", 3: "read", 4: "verify", 5: "code_load", 6: "session",
           7: "upload", 8: "gpu_execute", 9: "gpu_context", 10: "pipeline", 11: "thread_start"}  # cb_phase
_PHASE_PIPELINE, _PHASE_VERIFY, _PHASE_GPU_EXECUTE = 10, 4, 8
GPU_LANE = -1  # the cpu of events that ran on the GPU (gpu_execute)
_STEP_BUNDLE = 0xFFFFFFFF
MODES = ("cold", "continuous")  # cb_mode


class BundleError(RuntimeError):
    """A bundle failed to open or run; `.status` names the runtime status."""

    def __init__(self, status, message):
        self.status = _STATUS[status] if 0 <= status < len(_STATUS) else str(status)
        super().__init__(f"[{self.status}] {message}")


class _TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("nbytes", ctypes.c_uint64)]


class _Options(ctypes.Structure):
    _fields_ = [("threads", ctypes.c_uint32), ("trace", ctypes.c_uint32), ("mode", ctypes.c_uint32),
                ("exec_share_count", ctypes.c_uint32), ("exec_shares", ctypes.POINTER(ctypes.c_uint8))]


class _Progress(ctypes.Structure):
    _fields_ = [("bytes_read", ctypes.c_uint64), ("bytes_total", ctypes.c_uint64), ("layers_ready", ctypes.c_uint32),
                ("layers_total", ctypes.c_uint32), ("opened", ctypes.c_int32)]


class _OpenOptions(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint32), ("public_key", ctypes.c_char_p), ("target", ctypes.c_char_p)]


class _TraceEvent(ctypes.Structure):
    _fields_ = [("step", ctypes.c_uint32), ("phase", ctypes.c_uint32), ("cpu", ctypes.c_int32),
                ("alternate", ctypes.c_uint32), ("start_ns", ctypes.c_uint64), ("end_ns", ctypes.c_uint64),
                ("worker", ctypes.c_uint32), ("faults", ctypes.c_uint32)]


_memory = ctypes.pythonapi.PyMemoryView_FromMemory  # (char* mem, Py_ssize_t size, int flags) -> memoryview
_memory.restype, _memory.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_PYBUF_WRITE = 0x200

_OBSERVER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint64)


def _load_library():
    path = os.environ.get("COLDBREW_LIB") or os.path.join(os.path.dirname(__file__), "libcoldbrew.so")
    if not os.path.exists(path):
        raise ImportError(f"coldbrew runtime library not found at {path}; install the package "
                          "(pip install -e .) to build it")
    # RTLD_GLOBAL: kernels loaded from bundles resolve the runtime's error hook.
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    vp, sz, u32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32
    sigs = {
        "cb_last_error": ([], ctypes.c_char_p),
        "cb_bundle_open_file": ([ctypes.c_char_p, u32, ctypes.POINTER(vp)], ctypes.c_int),
        "cb_bundle_open_memory": ([vp, sz, u32, ctypes.POINTER(vp)], ctypes.c_int),
        "cb_bundle_open_file_with": ([ctypes.c_char_p, ctypes.POINTER(_OpenOptions), ctypes.POINTER(vp)], ctypes.c_int),
        "cb_bundle_open_memory_with": ([vp, sz, ctypes.POINTER(_OpenOptions), ctypes.POINTER(vp)], ctypes.c_int),
        "cb_bundle_target": ([vp], ctypes.c_char_p),
        "cb_bundle_open_async": ([ctypes.c_char_p, ctypes.POINTER(_OpenOptions), vp, vp, ctypes.POINTER(vp)],
                                 ctypes.c_int),
        "cb_open_ready": ([vp], ctypes.c_int),
        "cb_open_wait": ([vp, ctypes.c_int64], ctypes.c_int),
        "cb_open_bundle": ([vp, ctypes.POINTER(vp)], ctypes.c_int),
        "cb_open_get_progress": ([vp, ctypes.POINTER(_Progress)], None),
        "cb_open_cancel": ([vp], None),
        "cb_open_release": ([vp], None),
        "cb_bundle_release": ([vp], None),
        "cb_bundle_check_memory": ([ctypes.c_char_p, sz], ctypes.c_int),
        "cb_bundle_verify_weights": ([vp], ctypes.c_int),
        "cb_bundle_input_count": ([vp], sz),
        "cb_bundle_output_count": ([vp], sz),
        "cb_bundle_input_info": ([vp, sz, ctypes.POINTER(_TensorInfo)], ctypes.c_int),
        "cb_bundle_output_info": ([vp, sz, ctypes.POINTER(_TensorInfo)], ctypes.c_int),
        "cb_session_create": ([vp, ctypes.POINTER(_Options), ctypes.POINTER(vp)], ctypes.c_int),
        "cb_session_release": ([vp], None),
        "cb_session_set_input": ([vp, sz, vp, sz], ctypes.c_int),
        "cb_session_set_input_shape": ([vp, sz, ctypes.POINTER(ctypes.c_int64), ctypes.c_int32], ctypes.c_int),
        "cb_session_input_info": ([vp, sz, ctypes.POINTER(_TensorInfo)], ctypes.c_int),
        "cb_session_output_info": ([vp, sz, ctypes.POINTER(_TensorInfo)], ctypes.c_int),
        "cb_bundle_input_range": ([vp, sz, ctypes.c_int32] + [ctypes.POINTER(ctypes.c_int64)] * 3, ctypes.c_int),
        "cb_bundle_output_range": ([vp, sz, ctypes.c_int32] + [ctypes.POINTER(ctypes.c_int64)] * 3, ctypes.c_int),
        "cb_session_run": ([vp], ctypes.c_int),
        "cb_session_get_output": ([vp, sz, ctypes.POINTER(vp), ctypes.POINTER(sz)], ctypes.c_int),
        "cb_session_input_buffer": ([vp, sz, ctypes.POINTER(vp), ctypes.POINTER(sz)], ctypes.c_int),
        "cb_session_trace": ([vp, ctypes.POINTER(ctypes.POINTER(_TraceEvent)), ctypes.POINTER(sz)], ctypes.c_int),
        "cb_bundle_step_info": ([vp, sz, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p)],
                                ctypes.c_int),
        "cb_bundle_step_alternate": ([vp, sz, ctypes.POINTER(ctypes.c_char_p)], ctypes.c_int),
        "cb_session_alternates": ([vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], ctypes.c_int),
        "cb_session_run_observed": ([vp, _OBSERVER, vp], ctypes.c_int),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


_lib = _load_library()


def _check(status):
    if status != 0:
        raise BundleError(status, _lib.cb_last_error().decode("utf-8", "replace"))


def check_bundle(data):
    """The runtime's checks of a bundle's structure (bytes), not those of this machine (its CPU,
    code, GPU): BundleError where an open would refuse it on any machine."""
    _check(_lib.cb_bundle_check_memory(bytes(data), len(data)))


def testing_function(name, restype, *argtypes):
    """coldbrew_testing.h's function `name` with its ctypes types (for tools that time the runtime's pieces)."""
    fn = getattr(_lib, name)
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


def read_public_key(value):
    """32 Ed25519 public key bytes from bytes, 64 hex digits, or a .pub file
    (coldbrew keygen) holding them."""
    if isinstance(value, (bytes, bytearray)) and len(value) == 32:
        return bytes(value)
    text = os.fsdecode(value) if isinstance(value, (bytes, os.PathLike)) else str(value)
    if os.path.isfile(text):
        with open(text) as f:
            text = f.read().strip()
    key = bytes.fromhex(text) if re.fullmatch(r"[0-9a-fA-F]{64}", text) else b""
    if len(key) != 32:
        raise ValueError("public_key must be 32 bytes, 64 hex digits or a .pub file from coldbrew keygen")
    return key


class NodeArg:
    """Input/output metadata, as onnxruntime's NodeArg: its largest shape
    (the bundle's memory is planned for it); its `ranges`, per axis
    (min, max, step): a fixed axis (n, n, 1), a ranged one the multiples of
    step from min to max (cb_bundle_input_range); an output axis that follows
    from the inputs' sizes or that the data sizes (a NonZero's count) gives
    (0, its largest, 0), or the count's own range (cb_bundle_output_range)."""

    def __init__(self, info, ranges=None):
        self.name = info.name.decode()
        self.dtype = np.dtype(_DTYPES[info.dtype])
        self.shape = [info.shape[i] for i in range(info.ndim)]
        self.dims = tuple(self.shape)
        self.nbytes = info.nbytes
        self.ranges = ranges

    @property
    def type(self):  # (on demand: numpy's first dtype.name costs a cold start tens of us)
        return f"tensor({self.dtype.name})"

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, dtype={self.dtype.name}, shape={self.shape})"


class _Closing:
    """close() when collected or at the end of a `with` block."""

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class InferenceSession(_Closing):
    """A loaded bundle with one execution session.

    mode "cold" runs the bundle's plan every time; "continuous" (bundles
    compiled with --continuous) runs the plan first, then switches each
    layer to its warm-fastest variant once an idle-priority thread has read
    that variant's weights (`alternates()` says how many are ready).

    exec_shares (one whole number 1..255 per execution thread) replaces the
    plan's split of parallel loops: thread k takes exec_shares[k] of every
    sum(exec_shares) tasks, e.g. [2, 1] when the second thread's core runs
    at half speed.

    public_key (32 bytes, hex, or a .pub file from `coldbrew keygen`)
    requires the bundle to be signed by that key: an unsigned bundle, one
    signed by another key, or one altered in any byte since it was signed is
    refused (BundleError, status SIGNATURE) before its code is loaded.

    A multi-target bundle opens the best section this machine runs (a GPU
    where one opens, unless cpu_only), or the one `target` names; `target`
    (an attribute) says which it opened."""

    def __init__(self, source, threads=0, verify_weights=True, trace=False, mode="cold", exec_shares=None,
                 public_key=None, target=None, cpu_only=False, _opened=None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self._key = read_public_key(public_key) if public_key is not None else None
        opts = _open_options(verify_weights, self._key, target, cpu_only)
        self._bundle, self._lent = _opened or ctypes.c_void_p(), _opened is not None  # (a PendingSession's)
        self._session = ctypes.c_void_p()
        if _opened is not None:
            pass
        elif isinstance(source, (bytes, bytearray, memoryview)):
            self._buffer = ctypes.create_string_buffer(bytes(source), len(source))
            _check(_lib.cb_bundle_open_memory_with(self._buffer, len(source), ctypes.byref(opts),
                                                   ctypes.byref(self._bundle)))
        else:
            _check(_lib.cb_bundle_open_file_with(os.fsencode(source), ctypes.byref(opts), ctypes.byref(self._bundle)))
        self.target = _lib.cb_bundle_target(self._bundle).decode()
        self._inputs = self._infos(_lib.cb_bundle_input_count, _lib.cb_bundle_input_info,
                                   lambda k, n: self._ranges(_lib.cb_bundle_input_range, k, n))
        self._outputs = self._infos(_lib.cb_bundle_output_count, _lib.cb_bundle_output_info,
                                    lambda k, n: self._ranges(_lib.cb_bundle_output_range, k, n))
        self._sized = any(lo != hi for i in self._inputs for lo, hi, _ in i.ranges)  # shapes set at run time
        self._varies = self._sized or any(lo != hi for o in self._outputs for lo, hi, _ in o.ranges)
        opts = _Options(threads, 1 if trace else 0, MODES.index(mode))
        if exec_shares is not None:
            if not all(isinstance(x, int) and 1 <= x <= 255 for x in exec_shares):
                raise ValueError(f"exec_shares must be whole numbers 1..255, not {exec_shares!r}")
            self._shares = (ctypes.c_uint8 * len(exec_shares))(*exec_shares)
            opts.exec_share_count, opts.exec_shares = len(exec_shares), self._shares
        _check(_lib.cb_session_create(self._bundle, ctypes.byref(opts), ctypes.byref(self._session)))
        # numpy views of the inputs' and outputs' places in the session's arena
        # at their current shapes (fixed for its lifetime where the bundle's
        # shapes are): a run copies the feeds in and the outputs out
        self._in_views = self._views(_lib.cb_session_input_buffer, _lib.cb_session_input_info, self._inputs)[0]
        self._outs_now = self._views(_lib.cb_session_get_output, _lib.cb_session_output_info, self._outputs)

    def _views(self, place, info_fn, metas):
        """Views of each tensor's place at its current shape, and the infos
        whose `shape` points into the session (cb_session_output_info: its
        values follow the runs), so a ranged bundle's outputs need no call
        per run to see their shapes unchanged (the calls were most of a small
        model's run: 64 of 187 us for a VAD's five outputs)."""
        views, infos = [], []
        for k, meta in enumerate(metas):
            info, ptr, size = _TensorInfo(), ctypes.c_void_p(), ctypes.c_size_t()
            _check(info_fn(self._session, k, ctypes.byref(info)))
            _check(place(self._session, k, ctypes.byref(ptr), ctypes.byref(size)))
            shape = tuple(info.shape[i] for i in range(info.ndim))
            if size.value != info.nbytes or size.value != meta.dtype.itemsize * math.prod(shape):
                raise BundleError(_STATUS.index("CORRUPT"), f"'{meta.name}' holds {size.value} bytes in the session, "
                                  f"its shape {list(shape)} needs {meta.dtype.itemsize * math.prod(shape)}")
            # (a memoryview of the place: no ctypes array type made per size, no numpy reduction
            # called for the first time: together most of a small model's Python share of a cold start)
            raw = _memory(ptr.value, size.value, _PYBUF_WRITE) if size.value else b""
            views.append(np.frombuffer(raw, dtype=meta.dtype).reshape(shape))
            infos.append(info)
        return views, infos

    def _ranges(self, fn, k, ndim):
        lo, hi, step = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
        out = []
        for axis in range(ndim):
            _check(fn(self._bundle, k, axis, ctypes.byref(lo), ctypes.byref(hi), ctypes.byref(step)))
            out.append((lo.value, hi.value, step.value))
        return out

    def _infos(self, count, info_fn, ranges=None):
        out = []
        for i in range(count(self._bundle)):
            info = _TensorInfo()
            _check(info_fn(self._bundle, i, ctypes.byref(info)))
            out.append(NodeArg(info, ranges(i, info.ndim) if ranges else None))
        return out

    def verify_weights(self):
        """Check every weight tensor now (runs otherwise check each one when
        they first read it); raises BundleError (CORRUPT) naming the tensor."""
        _check(_lib.cb_bundle_verify_weights(self._bundle))

    def alternates(self):
        """(ready, total): the layers with a warm alternate, and how many of
        them later runs already use (continuous mode)."""
        ready, total = ctypes.c_size_t(), ctypes.c_size_t()
        _check(_lib.cb_session_alternates(self._session, ctypes.byref(ready), ctypes.byref(total)))
        return ready.value, total.value

    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def _bind(self, feeds):
        inputs = self._inputs
        if len(feeds) != len(inputs) or any(i.name not in feeds for i in inputs):
            names = [i.name for i in inputs]
            unknown = sorted(set(feeds) - set(names))
            if unknown:
                raise ValueError(f"unknown input name(s) {unknown}; the model's inputs are {names}")
            raise ValueError(f"missing input(s) {[n for n in names if n not in feeds]}")
        arrays = []
        for k, meta in enumerate(inputs):  # every shape first, in input order (a dim's carrier comes first)
            arr = feeds[meta.name]
            if type(arr) is not np.ndarray or arr.dtype != meta.dtype or arr.shape != self._in_views[k].shape:
                arr = self._checked(meta, arr)
                if arr.shape != self._in_views[k].shape:
                    shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)
                    _check(_lib.cb_session_set_input_shape(self._session, k, shape, arr.ndim))
                    self._in_views = self._views(_lib.cb_session_input_buffer, _lib.cb_session_input_info, inputs)[0]
            arrays.append(arr)
        for meta, view, arr in zip(inputs, self._in_views, arrays):  # then the data
            if arr.shape != view.shape:  # a later input's dims changed it
                raise ValueError(f"input '{meta.name}' has shape {list(arr.shape)}; the other inputs' shapes make it "
                                 f"{list(view.shape)}")
            view[...] = arr

    def _checked(self, meta, arr):
        if isinstance(arr, np.generic):
            arr = np.asarray(arr)
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"input '{meta.name}' must be a numpy array, got {type(arr).__name__}")
        if arr.dtype != meta.dtype:
            raise TypeError(f"input '{meta.name}' must have dtype {meta.dtype.name}, got {arr.dtype.name}")
        if not self._sized and list(arr.shape) != meta.shape:
            raise ValueError(f"input '{meta.name}' must have shape {meta.shape}, got {list(arr.shape)}")
        return arr

    def _outs(self):
        """The outputs at their shapes in the last run."""
        if self._varies:
            views, infos = self._outs_now
            if any(v.shape != tuple(i.shape[:v.ndim]) for v, i in zip(views, infos)):
                self._outs_now = self._views(_lib.cb_session_get_output, _lib.cb_session_output_info, self._outputs)
        return self._outs_now[0]

    def run(self, output_names, input_feed):
        """Run once; returns the requested outputs (all when None) as numpy arrays.
        An input of a bundle whose shapes are set at run time may take any
        shape its `ranges` allow (the outputs come at the shapes it gives);
        one out of them raises BundleError with the runtime's message."""
        self._bind(input_feed)
        _check(_lib.cb_session_run(self._session))
        if output_names is None:
            return [v.copy() for v in self._outs()]  # one copy, straight out of the session's arena
        names = [o.name for o in self._outputs]
        unknown = [n for n in output_names if n not in names]
        if unknown:
            raise ValueError(f"unknown output name '{unknown[0]}'; the model's outputs are {names}")
        outs = self._outs()
        return [outs[names.index(n)].copy() for n in output_names]

    def run_layers(self, input_feed):
        """Run once, step by step (cb_session_run_observed): each
        executed step's outputs as (step, tensor index in the bundle, bytes)."""
        self._bind(input_feed)
        seen = []
        keep = _OBSERVER(lambda _, step, tensor, data, n: seen.append((step, tensor, ctypes.string_at(data, n))))
        _check(_lib.cb_session_run_observed(self._session, keep, None))
        return seen

    def trace(self):
        """Events of the last run (session made with trace=True): dicts with
        step, layer, variant, alternate, phase, cpu, worker, start_ns, end_ns
        (worker: the preparation worker that ran the phase, its queue's
        number, or 0 for any other thread; faults: the page faults its
        thread took meanwhile). Phases:
        verify, code_load, session and thread_start (opening the bundle and
        creating the session, the pool's threads started at open and the
        preparation workers' at the first run; step -1, layer "bundle",
        reported by the first run; verify's variant: the target opened,
        `target`), then per step read and transform (first run) and execute. `alternate` marks a step's warm variant in
        continuous mode (its weights' read, its execution). GPU bundles:
        gpu_context, read per step (a reader thread, during the context),
        upload, pipeline per shader (step -1, layer "shader <k>", on the
        core that made it; those made by the run's end), gpu_execute on the
        GPU's lane (cpu -1): a run that began while pipelines were being
        made has one per chunk of layers it submitted (step: the chunk's
        first; end: when the chunk was seen complete; first_run_layers: how
        many of its layers ran their first-run launches, their own
        pipelines not made yet)."""
        events, count = ctypes.POINTER(_TraceEvent)(), ctypes.c_size_t()
        _check(_lib.cb_session_trace(self._session, ctypes.byref(events), ctypes.byref(count)))
        out = []
        for i in range(count.value):
            e = events[i]
            step, layer, variant = e.step, ctypes.c_char_p(b"bundle"), ctypes.c_char_p(b"")
            if e.phase == _PHASE_PIPELINE:
                step, layer = -1, ctypes.c_char_p(f"shader {e.step}".encode())
            elif step == _STEP_BUNDLE:
                step, variant = -1, ctypes.c_char_p(self.target.encode() if e.phase == _PHASE_VERIFY else b"")
            else:
                _check(_lib.cb_bundle_step_info(self._bundle, step, ctypes.byref(layer), ctypes.byref(variant)))
                if e.alternate and e.phase != _PHASE_GPU_EXECUTE:
                    _check(_lib.cb_bundle_step_alternate(self._bundle, step, ctypes.byref(variant)))
            out.append({"step": step, "layer": layer.value.decode(), "variant": variant.value.decode(),
                        "alternate": bool(e.alternate),
                        "phase": _PHASES.get(e.phase, str(e.phase)), "cpu": e.cpu, "worker": e.worker,
                        "faults": e.faults, "start_ns": e.start_ns, "end_ns": e.end_ns})
            if e.phase == _PHASE_GPU_EXECUTE:
                out[-1]["first_run_layers"] = e.alternate
        return out

    def close(self):
        if self._session:
            _lib.cb_session_release(self._session)
            self._session = ctypes.c_void_p()
        if self._bundle and not self._lent:
            _lib.cb_bundle_release(self._bundle)
        self._bundle = ctypes.c_void_p()


def _open_options(verify_weights, key, target, cpu_only):
    return _OpenOptions((0 if verify_weights else SKIP_WEIGHT_CHECKSUMS) | (CPU_ONLY if cpu_only else 0), key,
                        target.encode() if target else None)


class PendingSession(_Closing):
    """A bundle opening in the background (load(path, wait=False)): a thread
    of the runtime's opens it, then reads and checks every layer's weights
    in plan order. ready() / wait(timeout) say when that is done;
    progress() how far it is; `on_ready(pending)` is called once then, on
    a Python thread of the handle's (no Python runs on the runtime's
    thread). run() (or session()) waits for the open only, then runs: the
    first run waits for the weights its layers need. close() (or cancel())
    stops what is left and frees everything."""

    def __init__(self, path, on_ready=None, **options):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError("load(..., wait=False) opens a file in the background: give its path")
        key = read_public_key(options.get("public_key")) if options.get("public_key") is not None else None
        opts = _open_options(options.get("verify_weights", True), key, options.get("target"),
                             options.get("cpu_only", False))
        self._options, self._session, self._handle, self._calling = options, None, ctypes.c_void_p(), False
        self._closing, self._notifier = threading.Event(), None
        _check(_lib.cb_bundle_open_async(os.fsencode(path), ctypes.byref(opts), None, None,
                                         ctypes.byref(self._handle)))
        if on_ready:  # (the thread holds the handle weakly: a dropped handle goes at once)
            self._notifier = threading.Thread(target=_notify, name="coldbrew-on-ready", daemon=True,
                                              args=(weakref.ref(self), self._handle.value, self._closing, on_ready))
            self._notifier.start()

    def ready(self):
        return bool(_lib.cb_open_ready(self._handle))

    def wait(self, timeout=None):
        """Wait until ready, at most `timeout` seconds (None: no limit); whether it is."""
        return bool(_lib.cb_open_wait(self._handle, -1 if timeout is None else int(timeout * 1000)))

    def progress(self):
        """{"opened", "bytes_read", "bytes_total", "layers_ready", "layers_total"}."""
        p = _Progress()
        _lib.cb_open_get_progress(self._handle, ctypes.byref(p))
        return {"opened": bool(p.opened), "bytes_read": p.bytes_read, "bytes_total": p.bytes_total,
                "layers_ready": p.layers_ready, "layers_total": p.layers_total}

    def session(self):
        """The InferenceSession, made once the open ends (BundleError if it failed)."""
        if self._session is None:
            bundle = ctypes.c_void_p()
            _check(_lib.cb_open_bundle(self._handle, ctypes.byref(bundle)))
            kw = {k: v for k, v in self._options.items() if k in ("threads", "trace", "mode", "exec_shares")}
            self._session = InferenceSession(None, _opened=bundle, **kw)
        return self._session

    def run(self, output_names, input_feed):
        return self.session().run(output_names, input_feed)

    @property
    def target(self):
        return self.session().target

    def close(self):
        here = self._notifier is not None and self._notifier.ident == threading.get_ident()
        if here and self._calling:
            raise RuntimeError("a PendingSession cannot be closed from its on_ready callback (its thread runs it)")
        self._closing.set()
        if self._handle:
            _lib.cb_open_cancel(self._handle)  # the reading stops: the notifier's wait ends
        if self._notifier is not None and not here:  # (here: dropped by it after on_ready, which is over)
            self._notifier.join()
        if self._session is not None:
            self._session.close()
            self._session = None
        if self._handle:
            _lib.cb_open_release(self._handle)
            self._handle = ctypes.c_void_p()

    cancel = close


def _notify(ref, handle, closing, on_ready):
    """The on_ready thread: waits for readiness (the runtime's wait, the GIL
    let go), then on_ready(pending) unless the handle was closed or dropped."""
    _lib.cb_open_wait(handle, -1)
    pending = ref()
    if pending is None or closing.is_set():
        return
    pending._calling = True
    try:
        on_ready(pending)
    finally:
        pending._calling = False


def load(source, threads=0, verify_weights=True, trace=False, mode="cold", exec_shares=None, public_key=None,
         target=None, cpu_only=False, wait=True, on_ready=None):
    """Open a bundle (path or bytes) and return an InferenceSession
    (mode: "cold" or "continuous"; exec_shares, public_key, target, cpu_only: see InferenceSession);
    wait=False: a PendingSession at once, the bundle opening in the background (on_ready: its callback)."""
    options = dict(threads=threads, verify_weights=verify_weights, trace=trace, mode=mode, exec_shares=exec_shares,
                   public_key=public_key, target=target, cpu_only=cpu_only)
    if not wait:
        return PendingSession(source, on_ready=on_ready, **options)
    return InferenceSession(source, **options)
