"""Pass `write_bundle`: Graph + code -> the bundle file bytes.

Layout (schemas/README.md): a 64-byte preamble, the FlatBuffer header, then
segments: raw weights (page aligned, each tensor 64-byte aligned) and the CPU
code. The header is built twice: once to learn its size (all scalars are
written, so its size does not depend on the offsets), once with the final
segment offsets.
"""
import json
import struct

import flatbuffers
import numpy as np

from coldbrew.schemas.generated import bundle_generated as fb

from .checksum import checksum64
from .graph import DTYPES

NAME = "write_bundle"
SCHEMA_VERSION = 1
MAGIC = b"COLDBREW"
PREAMBLE_SIZE = 64
PAGE = 4096
KINDS = {"input": fb.TensorKind.input, "output": fb.TensorKind.output,
         "intermediate": fb.TensorKind.intermediate, "weight": fb.TensorKind.weight,
         "prepared": fb.TensorKind.prepared}


def _align(n, a):
    return (n + a - 1) // a * a


def _weights_segment(graph, cached):
    """Concatenate the raw or the cached weights (64-byte aligned); returns
    bytes and {tensor index: offset}."""
    chunks, offsets, pos = [], {}, 0
    for i, t in enumerate(graph.tensors):
        if t.kind != "weight" or t.cached != cached:
            continue
        pos = _align(pos, 64)
        offsets[i] = pos
        raw = np.ascontiguousarray(t.data).astype(t.dtype, copy=False).tobytes()
        chunks.append((pos, raw))
        pos += len(raw)
    out = bytearray(pos)
    for p, raw in chunks:
        out[p:p + len(raw)] = raw
    return bytes(out), offsets


def _header(graph, target, producer, model_hash, segments, weight_offsets):
    """weight_offsets: {tensor index: (segment index, offset)}."""
    b = fb.BundleT()
    b.schemaVersion = SCHEMA_VERSION
    b.producer = producer
    b.modelHash = model_hash
    b.modelName = graph.name
    t = fb.TargetT()
    t.triple, t.cpu, t.features, t.gpuClass = target.triple, target.cpu, list(target.features), ""
    b.target = t
    b.tensors = []
    for i, ten in enumerate(graph.tensors):
        x = fb.TensorT()
        x.name, x.dtype, x.shape = ten.name, DTYPES.index(ten.dtype), [int(d) for d in ten.shape]
        x.kind, x.nbytes = KINDS[ten.kind], ten.nbytes
        if ten.kind == "weight":
            x.segment, x.segmentOffset = weight_offsets[i]
        else:
            x.arenaOffset = ten.arena_offset
        b.tensors.append(x)
    b.inputs, b.outputs = list(graph.inputs), list(graph.outputs)
    b.layers, steps = [], []
    for k, layer in enumerate(graph.layers):
        x = fb.LayerT()
        x.name, x.op, x.args, x.numOutputs, x.sources, x.attrs = layer.name, layer.op, list(layer.args), layer.num_outputs, [], []
        b.layers.append(x)
        s = fb.StepT()
        s.layer, s.variant, s.kernel, s.transform = k, layer.variant, layer.kernel, layer.transform
        s.weightForm = fb.WeightForm.raw if layer.weight_form == "raw" else fb.WeightForm.cached
        s.prepQueue, s.execQueue = layer.prep_queue, layer.exec_queue
        s.transformArgs = list(layer.transform_args)
        s.params = json.dumps(layer.params, sort_keys=True, separators=(",", ":")) if layer.params else ""
        s.tuned = layer.tuned
        steps.append(s)
    p = fb.PlanT()
    p.steps, p.arenaSize, p.threads = steps, graph.arena_size, graph.threads
    p.preparedSize = graph.prepared_size
    b.plan = p
    b.segments = []
    for kind, offset, data in segments:
        s = fb.SegmentT()
        s.kind, s.offset, s.size, s.alignment, s.checksum = kind, offset, len(data), 64, checksum64(data)
        b.segments.append(s)
    builder = flatbuffers.Builder(4096)
    builder.ForceDefaults(True)
    builder.Finish(b.Pack(builder), file_identifier=b"CBRW")
    return bytes(builder.Output())


def run(graph, code, target, producer, model_hash):
    raw, raw_offsets = _weights_segment(graph, cached=False)
    cached, cached_offsets = _weights_segment(graph, cached=True)
    weight_offsets = {i: (0, o) for i, o in raw_offsets.items()}
    weight_offsets.update({i: (1, o) for i, o in cached_offsets.items()})
    parts = [(fb.SegmentKind.weights_raw, raw), (fb.SegmentKind.weights_cached, cached),
             (fb.SegmentKind.cpu_code, code)]
    # pass 1: header size with placeholder offsets
    size = len(_header(graph, target, producer, model_hash, [(k, 0, d) for k, d in parts], weight_offsets))
    pos = _align(PREAMBLE_SIZE + size, PAGE)
    segments = []
    for kind, data in parts:
        segments.append((kind, pos, data))
        pos = _align(pos + len(data), PAGE if kind != fb.SegmentKind.cpu_code else 64)
    header = _header(graph, target, producer, model_hash, segments, weight_offsets)
    assert len(header) == size, "bundle header size changed between passes"
    file_size = _align(segments[-1][1] + len(segments[-1][2]), 64)
    out = bytearray(file_size)
    struct.pack_into("<8sIIQQQ", out, 0, MAGIC, SCHEMA_VERSION, PREAMBLE_SIZE, len(header),
                     checksum64(header), file_size)
    out[PREAMBLE_SIZE:PREAMBLE_SIZE + len(header)] = header
    for _, offset, data in segments:
        out[offset:offset + len(data)] = data
    return bytes(out)
