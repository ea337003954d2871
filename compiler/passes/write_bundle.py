"""Pass `write_bundle`: Graph + code -> the bundle file bytes.

Layout (schemas/README.md), in the order a cold start needs it: a 64-byte
preamble, the FlatBuffer header, the CPU code (an LZ4 block, pack_code),
then the weights in the order the plan's steps first use them (page
aligned, each tensor 64-byte aligned).
Runs of tensors of one form (raw or cached) make one segment each, so a plan
that mixes forms still reads its file front to back. Continuous mode's warm
alternates' weights (add_warm_steps) come last: no step of the plan reads
them, so the first run never waits for them. Every weight tensor
carries its own checksum, verified by the run that first reads it. The
header is built twice: once to learn its size (all scalars are written, so
its size does not depend on the offsets), once with the final segment
offsets.
"""
import hashlib
import json
import struct

import flatbuffers
import numpy as np

from coldbrew.schemas.generated import bundle_generated as fb
from coldbrew.targets import task_shares

from ..bundle.checksum import checksum64
from ..errors import InternalError
from ..ir import dims, loops
from ..ir.graph import signatures
from ..ir.forms import DTYPES, STORED

NAME = "write_bundle"
SCHEMA_VERSION = 6  # schemas/README.md, Versions


def version(graph):
    """The schema version a bundle of `graph` is written as: the lowest that
    describes it (6 with Loops the data stops, 5 with sizes set at run
    time, else 4), so older runtimes keep reading the bundles they can run."""
    if graph.loops:
        return 6
    return 5 if any(t.kind == "dim" for t in graph.tensors) else 4
MAGIC = b"COLDBREW"
PREAMBLE_SIZE = 64
PAGE = 4096
KINDS = {"input": fb.TensorKind.input, "output": fb.TensorKind.output,
         "intermediate": fb.TensorKind.intermediate, "weight": fb.TensorKind.weight,
         "prepared": fb.TensorKind.prepared, "dim": fb.TensorKind.dim}


def _align(n, a):
    return (n + a - 1) // a * a


def need_order(graph):
    """Weight tensor indices in the order the layers first use them (the
    execute arguments and the transform's), then any that no layer uses."""
    used = [i for layer in graph.layers for i in list(layer.transform_args) + list(layer.args)]
    every = range(len(graph.tensors))
    return [i for i in dict.fromkeys(used + list(every)) if graph.tensors[i].kind == "weight"]


def _weight_runs(graph):
    """Weights in need order, cut into runs of one form: [(kind, bytes,
    {tensor index: (run, offset in it, checksum)})]. A weight whose bytes
    an earlier one of its form holds (one weight used by several layers,
    in the same form) is stored once: it points at the earlier bytes."""
    runs = []
    for i in need_order(graph):
        t = graph.tensors[i]
        kind = fb.SegmentKind.weights_cached if t.cached else fb.SegmentKind.weights_raw
        if not runs or runs[-1][0] != kind:
            runs.append((kind, []))
        runs[-1][1].append(i)
    out, seen = [], {}
    for r, (kind, ids) in enumerate(runs):
        chunks, offsets, pos = [], {}, 0
        for i in ids:
            raw = np.ascontiguousarray(graph.tensors[i].data).astype(graph.tensors[i].dtype, copy=False).tobytes()
            key = (kind, hashlib.sha256(raw).digest())
            if key not in seen:
                pos = _align(pos, 64)
                seen[key] = (r, pos, checksum64(raw))
                chunks.append((pos, raw))
                pos += len(raw)
            offsets[i] = seen[key]
        data = bytearray(pos)
        for p, raw in chunks:
            data[p:p + len(raw)] = raw
        out.append((kind, bytes(data), offsets))
    return out


def _params(params):
    return json.dumps(params, sort_keys=True, separators=(",", ":")) if params else ""


def _step(layer, k, gpu):
    """The plan step of layer `k`: its kind (a GpuStep, its dispatches, on the GPU; else a CpuStep) and how
    its weights are read."""
    if gpu:
        def launches(ds):
            return [fb.DispatchT(shader=sh, grid=list(g), bindings=list(bd), push=list(p)) for sh, g, bd, p in ds]
        kind = fb.GpuStepT(dispatches=launches(layer.dispatches), firstRun=launches(layer.first_dispatches) or None)
    else:
        g, w = layer.guard, layer.warm
        kind = fb.CpuStepT(kernel=layer.kernel, params=_params(layer.params), tuned=layer.tuned,
                           guard=fb.GuardT(tensor=g[0], value=bool(g[1])) if g is not None else None,
                           warm=fb.WarmAlternateT(variant=w["variant"], kernel=w["kernel"], args=list(w["args"]),
                                                  params=_params(w["params"])) if w else None)
    return fb.StepT(layer=k, variant=layer.variant, kindType=fb.StepKind.GpuStep if gpu else fb.StepKind.CpuStep,
                    kind=kind, transform=layer.transform, transformArgs=list(layer.transform_args),
                    weightForm=getattr(fb.WeightForm, layer.weight_form), prepQueue=layer.prep_queue,
                    execQueue=layer.exec_queue, weightPrecision=DTYPES.index(STORED[layer.weight_precision]),
                    weightError=layer.weight_error, outputError=layer.output_error)


def _program(graph, t):
    """A tensor's shape program (schemas/bundle.fbs), where sized at run time."""
    if t.extents is None:
        return None
    tensors = {graph.tensors[i].dim: i for i in range(len(graph.tensors)) if graph.tensors[i].kind == "dim"}
    by_var = {v.name: tensors[d] for d, v in graph.variables.items() if d in tensors}
    return dims.program(t.extents, lambda v: by_var[v.name])


def _range(graph, t):
    """A dim tensor's Range: its bounds and the first input axis that carries it."""
    if t.kind != "dim":
        return None
    if t.count is not None:  # counted by a kernel, into tensor `count`
        return fb.RangeT(min=t.dim.min, max=t.dim.max, step=1, typical=t.dim.typical, input=0, axis=0,
                         count=t.count)
    var = graph.variables[t.dim]
    at = next((k, a) for k, i in enumerate(graph.inputs) for a, e in enumerate(graph.tensors[i].extents or ())
              if dims.is_extent(e, t.dim, var))
    return fb.RangeT(min=t.dim.min, max=t.dim.max, step=t.dim.step, typical=t.dim.typical, input=at[0], axis=at[1],
                     count=-1)


def _relayout(t):
    """A cached fp32 weight whose transform only rearranges: how (fb.Relayout)."""
    r = getattr(t.anchor, "relayout", None) if t.kind == "weight" and t.cached else None
    if r is None or t.dtype != "float32" or tuple(t.shape) != r.stored:
        return None
    return fb.RelayoutT(raw=list(r.raw), stored=list(r.stored), axes=list(r.axes), mults=list(r.mults))


def _header(graph, target, producer, model_hash, segments, weight_offsets, shaders=()):
    """weight_offsets: {tensor index: (segment index, offset, checksum)};
    shaders: GPU bundles' Shader records (codegen_spirv)."""
    gpu = target.executes_on == "gpu"
    # a GPU bundle carries no CPU code: any CPU of its architecture runs it
    t = fb.TargetT(triple=target.triple, cpu=target.cpu, features=[] if gpu else list(target.features),
                   gpuClass=target.gpu.api if gpu else "")
    b = fb.BundleT(schemaVersion=version(graph), producer=producer, modelHash=model_hash, modelName=graph.name,
                   target=t, inputs=list(graph.inputs), outputs=list(graph.outputs), weightChecksums=True,
                   kernels=None if gpu else _kernels(graph))
    b.tensors = []
    for i, ten in enumerate(graph.tensors):
        weight = ten.kind == "weight"
        seg, off, checksum = weight_offsets[i] if weight else (0, 0, 0)
        b.tensors.append(fb.TensorT(name=ten.name, dtype=DTYPES.index(ten.dtype), shape=[int(d) for d in ten.shape],
                                    kind=KINDS[ten.kind], nbytes=ten.nbytes, segment=seg, segmentOffset=off,
                                    arenaOffset=0 if weight else ten.arena_offset, checksum=checksum,
                                    source=ten.source, layout=ten.layout, bounds=_range(graph, ten),
                                    shapeProgram=_program(graph, ten), relayout=_relayout(ten)))
    b.layers = [fb.LayerT(name=x.name, op=x.op, sources=[], attrs=[], args=list(x.args), numOutputs=x.num_outputs)
                for x in graph.layers]
    steps = [_step(layer, k, gpu) for k, layer in enumerate(graph.layers)]
    execs, queues = placed_classes(target, graph.threads, max((st.prepQueue for st in steps), default=0))
    b.plan = fb.PlanT(steps=steps, arenaSize=graph.arena_size, threads=graph.threads, preparedSize=graph.prepared_size,
                      warmThreads=graph.warm_threads, execShares=_shares(target, graph.threads),
                      warmExecShares=_shares(target, graph.warm_threads) if graph.warm_threads else [],
                      execClasses=execs, queueClasses=queues,
                      loops=[fb.LoopT(name=r["name"], start=r["start"], end=r["end"], iteration=r["iteration"],
                                      trip=r["trip"], cond=r["cond"], carriedFrom=r["carried_from"],
                                      carriedTo=r["carried_to"], scanFrom=r["scan_from"], scanTo=r["scan_to"],
                                      most=r["most"], atLeastOnce=r["at_least_once"])
                             for r in loops.records(graph)] or None)
    if graph.accuracy:
        acc = graph.accuracy
        b.accuracy = fb.AccuracyT(outputError=acc["output_error"], samples=acc["samples"], inputs=acc["inputs"],
                                  maxError=acc.get("max_error") or 0.0, top1Agree=acc.get("top1_agree", 1.0))
    b.shaders = [fb.ShaderT(name=sh["name"], offset=sh["offset"], size=sh["size"], localSize=list(sh["local_size"]),
                            bindings=sh["bindings"]) for sh in shaders]
    b.segments = [fb.SegmentT(kind=kind, offset=offset, size=len(data), alignment=64, checksum=checksum64(data),
                              rawSize=raw_size) for kind, offset, data, raw_size in segments]
    builder = flatbuffers.Builder(4096)
    builder.ForceDefaults(True)
    builder.Finish(b.Pack(builder), file_identifier=b"CBRW")
    return bytes(builder.Output())


def _kernels(graph):
    """Every CPU kernel's argument dtypes and byte sizes (graph.signatures),
    sorted by symbol, so the runtime finds one by binary search."""
    return [fb.KernelT(symbol=sym, argDtypes=[DTYPES.index(d) for d, _ in args], argNbytes=[n for _, n in args])
            for sym, args in signatures(graph)]


def apply(graph, code, target, producer, model_hash, spirv=None):
    """`code`: the CPU code segment (None on GPU targets); `spirv`: GPU
    targets' (segment bytes, Shader records) from codegen_spirv."""
    runs = _weight_runs(graph)
    head = [pack_code(code)] if code is not None else [(fb.SegmentKind.spirv, spirv[0], 0)]
    shaders = spirv[1] if spirv else ()
    parts = head + [(kind, data, 0) for kind, data, _ in runs]
    weight_offsets = {i: (r + 1, o, c) for _, _, offsets in runs for i, (r, o, c) in offsets.items()}
    # pass 1: header size with placeholder offsets
    size = len(_header(graph, target, producer, model_hash, [(k, 0, d, r) for k, d, r in parts], weight_offsets,
                       shaders))
    # compressed code is decoded, not mapped: it follows the header on 64 bytes
    pos = _align(PREAMBLE_SIZE + size, 64 if head[0][0] == fb.SegmentKind.cpu_code_lz4 else PAGE)
    segments = []
    for kind, data, raw_size in parts:
        segments.append((kind, pos, data, raw_size))
        # the first weights start on a page, later runs follow on 64 bytes
        pos = _align(pos + len(data), PAGE if kind in CODE_KINDS else 64)
    header = _header(graph, target, producer, model_hash, segments, weight_offsets, shaders)
    assert len(header) == size, "bundle header size changed between passes"
    file_size = _align(segments[-1][1] + len(segments[-1][2]), 64)
    out = bytearray(file_size)
    struct.pack_into("<8sIIQQQ", out, 0, MAGIC, version(graph), PREAMBLE_SIZE, len(header),
                     checksum64(header), file_size)
    out[PREAMBLE_SIZE:PREAMBLE_SIZE + len(header)] = header
    for _, offset, data, _ in segments:
        out[offset:offset + len(data)] = data
    return bytes(out)


CODE_KINDS = (fb.SegmentKind.cpu_code, fb.SegmentKind.cpu_code_lz4, fb.SegmentKind.spirv)


def pack_code(code):
    """The CPU code segment: the shared object as one LZ4 block (the `lz4`
    package's high-compression mode; runtime/src/base/lz4.c decodes it), kept
    plain where that is not smaller. (kind, bytes, decoded size or 0)."""
    import lz4.block

    packed = lz4.block.compress(code, mode="high_compression", compression=12, store_size=False)
    if len(packed) < len(code):
        return fb.SegmentKind.cpu_code_lz4, packed, len(code)
    return fb.SegmentKind.cpu_code, code, 0


def placed_classes(target, threads, queues):
    """(per execution thread, per preparation queue) the core class it is
    planned for: the target's cores fastest first, the execution threads on
    the first ones (more threads than cores share the slowest), the workers
    on the cores after them (the last execution core's where none is left)."""
    cores = [c.name for c in target.core_classes for _ in c.ids] or ["core"]
    execs = [cores[min(k, len(cores) - 1)] for k in range(max(threads, 1))]
    rest = cores[len(execs):] or [execs[-1]]
    return execs, [rest[(q - 1) % len(rest)] for q in range(1, queues + 1)]


def _shares(target, threads):
    """Each execution thread's share of a parallel loop (targets.task_shares);
    empty where the split is even."""
    shares = task_shares(target.exec_speeds(threads))
    return [] if len(set(shares)) <= 1 else shares


def run(c):
    """Pass entry: the accuracy measured for narrow weights, then the bundle's bytes (c.data)."""
    if c.accuracy:
        c.graph.accuracy = {k: v for k, v in c.accuracy.items() if k != "layers"}
        for layer in c.graph.layers:
            layer.output_error = (c.accuracy.get("layers", {}).get(layer.name, 0.0)
                                  if layer.weight_precision != "fp32" else 0.0)
    c.data = apply(c.graph, c.code, c.target, c.producer, c.model_hash, c.spirv)
    verify(c.data)
    return c


def verify(data):
    """The runtime's own structural checks of the bytes written (a GPU
    bundle's shaders and dispatches too): a bundle the runtime would refuse
    is a coldbrew bug, never shipped."""
    from coldbrew.runtime import BundleError, check_bundle

    try:
        check_bundle(data)
    except BundleError as e:
        raise InternalError("the bundle written, by the runtime's verifier", e) from e
