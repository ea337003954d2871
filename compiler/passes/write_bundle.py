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
import json
import struct

import flatbuffers
import numpy as np

from coldbrew.schemas.generated import bundle_generated as fb
from coldbrew.targets import task_shares

from ..bundle.checksum import checksum64
from ..errors import InternalError
from ..ir.graph import signatures
from ..ir.forms import DTYPES, PRECISIONS

NAME = "write_bundle"
SCHEMA_VERSION = 4  # schemas/README.md, Versions
MAGIC = b"COLDBREW"
PREAMBLE_SIZE = 64
PAGE = 4096
KINDS = {"input": fb.TensorKind.input, "output": fb.TensorKind.output,
         "intermediate": fb.TensorKind.intermediate, "weight": fb.TensorKind.weight,
         "prepared": fb.TensorKind.prepared}


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
    {tensor index: (offset in the run, checksum)})]."""
    runs = []
    for i in need_order(graph):
        t = graph.tensors[i]
        kind = fb.SegmentKind.weights_cached if t.cached else fb.SegmentKind.weights_raw
        if not runs or runs[-1][0] != kind:
            runs.append((kind, []))
        runs[-1][1].append(i)
    out = []
    for kind, ids in runs:
        chunks, offsets, pos = [], {}, 0
        for i in ids:
            pos = _align(pos, 64)
            raw = np.ascontiguousarray(graph.tensors[i].data).astype(graph.tensors[i].dtype, copy=False).tobytes()
            offsets[i] = (pos, checksum64(raw))
            chunks.append((pos, raw))
            pos += len(raw)
        data = bytearray(pos)
        for p, raw in chunks:
            data[p:p + len(raw)] = raw
        out.append((kind, bytes(data), offsets))
    return out


def _params(params):
    return json.dumps(params, sort_keys=True, separators=(",", ":")) if params else ""


def _step(layer, k, gpu):
    """The plan step of layer `k`: a GpuStep (its dispatches) on the GPU, else a CpuStep."""
    s = fb.StepT()
    s.layer, s.variant, s.transform = k, layer.variant, layer.transform
    s.weightForm = getattr(fb.WeightForm, layer.weight_form)
    s.prepQueue, s.execQueue = layer.prep_queue, layer.exec_queue
    s.transformArgs = list(layer.transform_args)
    s.weightPrecision = DTYPES.index(PRECISIONS[layer.weight_precision])
    s.weightError, s.outputError = layer.weight_error, layer.output_error
    s.kindType, s.kind = (fb.StepKind.GpuStep, fb.GpuStepT()) if gpu else (fb.StepKind.CpuStep, fb.CpuStepT())
    if gpu:
        s.kind.dispatches = []
        for shader, grid, bindings, push in layer.dispatches:
            d = fb.DispatchT()
            d.shader, d.grid, d.bindings, d.push = shader, list(grid), list(bindings), list(push)
            s.kind.dispatches.append(d)
        return s
    c, warm = s.kind, layer.warm
    c.kernel, c.params, c.tuned = layer.kernel, _params(layer.params), layer.tuned
    if layer.guard is not None:
        c.guard = fb.GuardT()
        c.guard.tensor, c.guard.value = layer.guard[0], bool(layer.guard[1])
    if warm:
        c.warm = fb.WarmAlternateT()
        c.warm.variant, c.warm.kernel, c.warm.args = warm["variant"], warm["kernel"], list(warm["args"])
        c.warm.params = _params(warm["params"])
    return s


def _header(graph, target, producer, model_hash, segments, weight_offsets, shaders=()):
    """weight_offsets: {tensor index: (segment index, offset, checksum)};
    shaders: GPU bundles' Shader records (codegen_spirv)."""
    b = fb.BundleT()
    b.schemaVersion = SCHEMA_VERSION
    b.producer = producer
    b.modelHash = model_hash
    b.modelName = graph.name
    t = fb.TargetT()
    gpu = target.executes_on == "gpu"
    # a GPU bundle carries no CPU code: any CPU of its architecture runs it
    t.triple, t.cpu, t.features = target.triple, target.cpu, [] if gpu else list(target.features)
    t.gpuClass = target.gpu.api if gpu else ""
    b.target = t
    b.tensors = []
    for i, ten in enumerate(graph.tensors):
        x = fb.TensorT()
        x.name, x.dtype, x.shape = ten.name, DTYPES.index(ten.dtype), [int(d) for d in ten.shape]
        x.kind, x.nbytes, x.source, x.layout = KINDS[ten.kind], ten.nbytes, ten.source, ten.layout
        if ten.kind == "weight":
            x.segment, x.segmentOffset, x.checksum = weight_offsets[i]
        else:
            x.arenaOffset = ten.arena_offset
        b.tensors.append(x)
    b.inputs, b.outputs = list(graph.inputs), list(graph.outputs)
    b.layers, steps = [], []
    for k, layer in enumerate(graph.layers):
        x = fb.LayerT()
        x.name, x.op, x.args, x.numOutputs, x.sources, x.attrs = layer.name, layer.op, list(layer.args), layer.num_outputs, [], []
        b.layers.append(x)
        steps.append(_step(layer, k, gpu))
    p = fb.PlanT()
    p.steps, p.arenaSize, p.threads = steps, graph.arena_size, graph.threads
    p.preparedSize = graph.prepared_size
    p.warmThreads = graph.warm_threads
    p.execShares = _shares(target, graph.threads)
    p.warmExecShares = _shares(target, graph.warm_threads) if graph.warm_threads else []
    queues = max((st.prepQueue for st in steps), default=0)
    p.execClasses, p.queueClasses = placed_classes(target, graph.threads, queues)
    b.plan = p
    b.weightChecksums = True
    if graph.accuracy:
        acc = graph.accuracy
        b.accuracy = fb.AccuracyT()
        b.accuracy.outputError, b.accuracy.samples = acc["output_error"], acc["samples"]
        b.accuracy.inputs, b.accuracy.maxError = acc["inputs"], acc.get("max_error") or 0.0
        b.accuracy.top1Agree = acc.get("top1_agree", 1.0)
    b.kernels = None if gpu else _kernels(graph)
    b.shaders = []
    for sh in shaders:
        x = fb.ShaderT()
        x.name, x.offset, x.size = sh["name"], sh["offset"], sh["size"]
        x.localSize, x.bindings = list(sh["local_size"]), sh["bindings"]
        b.shaders.append(x)
    b.segments = []
    for kind, offset, data, raw_size in segments:
        s = fb.SegmentT()
        s.kind, s.offset, s.size, s.alignment, s.checksum = kind, offset, len(data), 64, checksum64(data)
        s.rawSize = raw_size
        b.segments.append(s)
    builder = flatbuffers.Builder(4096)
    builder.ForceDefaults(True)
    builder.Finish(b.Pack(builder), file_identifier=b"CBRW")
    return bytes(builder.Output())


def _kernels(graph):
    """Every CPU kernel's argument dtypes and byte sizes (graph.signatures),
    sorted by symbol, so the runtime finds one by binary search."""
    out = []
    for sym, args in signatures(graph):
        k = fb.KernelT()
        k.symbol = sym
        k.argDtypes, k.argNbytes = [DTYPES.index(d) for d, _ in args], [n for _, n in args]
        out.append(k)
    return out


def apply(graph, code, target, producer, model_hash, spirv=None):
    """`code`: the CPU code segment (None on GPU targets); `spirv`: GPU
    targets' (segment bytes, Shader records) from codegen_spirv."""
    runs = _weight_runs(graph)
    head = [pack_code(code)] if code is not None else [(fb.SegmentKind.spirv, spirv[0], 0)]
    shaders = spirv[1] if spirv else ()
    parts = head + [(kind, data, 0) for kind, data, _ in runs]
    weight_offsets = {i: (k + 1, o, c) for k, (_, _, offsets) in enumerate(runs) for i, (o, c) in offsets.items()}
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
    struct.pack_into("<8sIIQQQ", out, 0, MAGIC, SCHEMA_VERSION, PREAMBLE_SIZE, len(header),
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


def unpack_code(kind, data, raw_size):
    """The shared object of a CPU code segment (either kind)."""
    if kind != fb.SegmentKind.cpu_code_lz4:
        return bytes(data)
    import lz4.block

    return lz4.block.decompress(bytes(data), uncompressed_size=raw_size)


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
