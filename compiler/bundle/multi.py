"""One file for several targets (schema version 7): single-target bundles
packed as sections of one bundle, their equal bytes stored once.

    data = pack([(name, bundle bytes), ...])   the first target's bytes first

The file: the preamble, an index (a Bundle whose `sections` name each
target, best first), every section's header (a whole single-target
Bundle, its segments' offsets rewritten), then each section's segments in
the order given: its code, then its weights in the order its plan needs
them. A weight tensor whose bytes an earlier section already stores (raw
weights; a cached layout two targets' kernels share) is not stored again:
the section lists the earlier section's segment and points into it.
Equal code is stored once too. The runtime opens the first section this
machine runs (runtime/src/exec/load.c).
"""
import hashlib
import struct

import flatbuffers

from coldbrew.schemas.generated import bundle_generated as fb

from .checksum import checksum64
from .reader import read_bytes, text

VERSION = 7
RELAID = 8  # a section whose weights are stored relaid out (a GPU section reading a CPU section's bytes)
PAGE = 4096
_WEIGHTS = (fb.SegmentKind.weights_raw, fb.SegmentKind.weights_cached)


def _align(n, a):
    return (n + a - 1) // a * a


def order(parts):
    """The sections' names best first: GPU sections (the runtime takes one
    only where a GPU is there), then CPU sections by how many CPU features
    they need, most first (a superset of another's runs where it runs and
    is tuned for more), ties in the order given."""
    def rank(item):
        k, (name, b) = item
        gpu = bool(b.target.gpuClass)
        return (not gpu, -len(b.target.features or []), k)
    return [name for _, (name, _) in sorted(enumerate(parts), key=rank)]


def pack(bundles):
    """The multi-target bundle of `bundles`, [(name, single-target bundle
    bytes)], laid out in that order."""
    names = [n for n, _ in bundles]
    if len(set(names)) != len(names):
        raise ValueError(f"a target is named twice: {names}")
    parsed = []
    for name, data in bundles:
        b, _, version = read_bytes(data, name)
        if b.sections:
            raise ValueError(f"{name}: a multi-target bundle cannot be a section")
        parsed.append((name, b, version, data))
    blobs, lists = _store(parsed)
    # places: after the index, each section's header and then the blobs it stores first, so the
    # first section reads as a single bundle does (header, code, weights in the order of need)
    index = _index(parsed, [(0, 0, 0)] * len(parsed))
    headers = [_section_header(b, kept, blobs, [0] * len(blobs)) for (_, b, _, _), kept in zip(parsed, lists)]
    pos, places, offsets, first = 64 + _align(len(index), 8), [], [0] * len(blobs), True
    for h, kept in zip(headers, lists):
        places.append(_align(pos, 8))
        pos = places[-1] + len(h)
        for k in kept:
            kind, body, _ = blobs[k]
            if offsets[k]:  # an earlier section's
                continue
            page = kind == fb.SegmentKind.cpu_code or (kind in _WEIGHTS and first)  # as a single bundle's:
            first = first and kind not in _WEIGHTS  # plain code and the first weights on a page
            pos = _align(pos, PAGE if page else 64)
            offsets[k] = pos
            pos += len(body)
    headers = [_section_header(b, kept, blobs, offsets) for (_, b, _, _), kept in zip(parsed, lists)]
    index = _index(parsed, [(p, len(h), checksum64(h)) for p, h in zip(places, headers)])
    size = _align(pos, 64)
    out = bytearray(size)
    struct.pack_into("<8sIIQQQ", out, 0, b"COLDBREW", VERSION, 64, len(index), checksum64(index), size)
    out[64:64 + len(index)] = index
    for p, h in zip(places, headers):
        out[p:p + len(h)] = h
    for off, (_, body, _) in zip(offsets, blobs):
        out[off:off + len(body)] = body
    return bytes(out)


def _store(parsed):
    """(blobs, lists): the distinct segments' bytes, [kind, bytearray,
    raw size] each, and per section the blob indices of its segments;
    each section's tensors pointed at their blob (its index, for now) and
    offset in it, a GPU section's raw weights at a CPU section's form they
    rearrange (Tensor.relayout; the section then of schema RELAID)."""
    stored, blobs = {}, []  # sha256 of bytes -> (blob index, offset in it); blobs: [kind, bytearray]
    lists, relaid = [], _relaid(parsed)  # per section: [blob index] of its segments
    for at, (name, b, version, data) in enumerate(parsed):
        own, kept = {}, []
        for k, seg in enumerate(b.segments):
            body = data[seg.offset:seg.offset + seg.size]
            if seg.kind not in _WEIGHTS:
                key = hashlib.sha256(body).digest()
                if key not in stored:
                    blobs.append([seg.kind, bytearray(body), seg.rawSize])
                    stored[key] = (len(blobs) - 1, 0)
                own[k] = stored[key][0]
                kept.append(own[k])
        weights = [t for t in b.tensors if t.kind == fb.TensorKind.weight]
        transformed = {b.tensors[a].name for st in b.plan.steps  # (read raw by the runtime's transform)
                       for a in list(st.transformArgs if st.transformArgs is not None else [])[:1]}
        for t in sorted(weights, key=lambda t: (b.segments[t.segment].offset, t.segmentOffset)):  # file order
            seg = b.segments[t.segment]
            body = data[seg.offset + t.segmentOffset:seg.offset + t.segmentOffset + t.nbytes]
            key = hashlib.sha256(bytes([seg.kind]) + body).digest()
            shared = (relaid.get(hashlib.sha256(body).digest())
                      if b.target.gpuClass and key not in stored and t.name not in transformed else None)
            if shared and list(shared[0].raw) == list(t.shape):
                t.relayout, t.checksum, key, body, seg = shared
                parsed[at] = (name, b, RELAID, data)
            if key not in stored:
                if t.segment not in own:
                    blobs.append([seg.kind, bytearray(), 0])
                    own[t.segment] = len(blobs) - 1
                blob = blobs[own[t.segment]]
                pos = _align(len(blob[1]), 64)
                blob[1] += bytes(pos - len(blob[1])) + body
                stored[key] = (own[t.segment], pos)
            t.segment, t.segmentOffset = stored[key]  # (a blob index until the offsets are known)
            if t.segment not in kept:
                kept.append(t.segment)
        lists.append(kept)
    for (name, b, version, data), kept in zip(parsed, lists):
        b.schemaVersion = version
        for t in b.tensors:
            if t.kind == fb.TensorKind.weight:
                t.segment = kept.index(t.segment)
    return blobs, lists


def _relaid(parsed):
    """{sha256 of a raw weight: (Relayout, checksum, stored key, stored
    bytes, segment)} for the CPU sections' cached weights whose transform only
    rearranges (Tensor.relayout): a GPU section reads such a weight from
    their bytes, laid out back by the runtime as it uploads."""
    import numpy as np

    from ..ir.relayout import Relayout, unlay

    out = {}
    for name, b, version, data in parsed if any(b.target.gpuClass for _, b, _, _ in parsed) else ():
        for t in b.tensors if not b.target.gpuClass else ():
            r, seg = t.relayout, b.segments[t.segment]
            if t.kind != fb.TensorKind.weight or r is None or list(r.stored) != list(t.shape) or t.dtype != 0:
                continue
            body = data[seg.offset + t.segmentOffset:seg.offset + t.segmentOffset + t.nbytes]
            desc = Relayout(*(tuple(int(d) for d in v) for v in (r.raw, r.stored, r.axes, r.mults)))
            raw = unlay(np.frombuffer(body, np.float32).reshape(desc.stored), desc).tobytes()
            key = hashlib.sha256(bytes([seg.kind]) + body).digest()
            out.setdefault(hashlib.sha256(raw).digest(), (fb.RelayoutT(raw=list(desc.raw), stored=list(desc.stored),
                                                                       axes=list(desc.axes), mults=list(desc.mults)),
                                                          t.checksum, key, body, seg))
    return out


def _section_header(b, kept, blobs, offsets):
    b.segments = [fb.SegmentT(kind=blobs[k][0], offset=offsets[k], size=len(blobs[k][1]), alignment=64,
                              checksum=checksum64(bytes(blobs[k][1])), rawSize=blobs[k][2]) for k in kept]
    return _finish(b)


def _index(parsed, places):
    rank = {n: k for k, n in enumerate(order([(name, b) for name, b, _, _ in parsed]))}
    first = parsed[0][1]
    sections = [fb.SectionT(name=name, target=b.target, headerOffset=p, headerSize=n, headerChecksum=c,
                            schemaVersion=version)
                for (name, b, version, _), (p, n, c) in zip(parsed, places)]
    sections.sort(key=lambda s: rank[text(s.name)])
    return _finish(fb.BundleT(schemaVersion=VERSION, producer=first.producer, modelHash=first.modelHash,
                              modelName=first.modelName, sections=sections))


def _finish(b):
    builder = flatbuffers.Builder(4096)
    builder.ForceDefaults(True)
    builder.Finish(b.Pack(builder), file_identifier=b"CBRW")
    return bytes(builder.Output())


def sections(data, path="<bytes>"):
    """[(name, BundleT, schema version)] of a bundle's sections, best first;
    a single-target bundle is one section named by its target's cpu (or
    GPU class)."""
    b, _, version = read_bytes(data, path)
    if not b.sections:
        return [(text(b.target.gpuClass or b.target.cpu), b, version)]
    got = []
    for s in b.sections:
        header = data[s.headerOffset:s.headerOffset + s.headerSize]
        fake = struct.pack("<8sIIQQQ", b"COLDBREW", s.schemaVersion, 64, len(header), 0, 64 + len(header))
        got.append((text(s.name), read_bytes(fake + bytes(64 - len(fake)) + header, path)[0], s.schemaVersion))
    return got
