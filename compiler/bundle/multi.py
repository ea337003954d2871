"""One file for several targets (schema version 9): single-target bundles
packed as sections of one bundle, their equal bytes stored once.

    data = pack([(name, bundle bytes), ...])   the first target's bytes first

The file: the preamble, an index (a Bundle whose `sections` name each
target, best first), every section's header (a whole single-target
Bundle, its segments' offsets rewritten), then each section's segments in
the order given: its code, then its weights in the order its plan needs
them. A weight tensor whose bytes an earlier section already stores (raw
weights; a cached layout two targets' kernels share) is not stored again:
the section lists the earlier section's segment and points into it.
Equal code is stored once too. A GPU section whose shaders read a raw
weight that a CPU section stores blocked (padded, its axes split) reads
those bytes and the runtime lays them out back (Tensor.relayout). Every
section's header after the first is stored as one LZ4 block: a header
lists every tensor and step, and for a small model five of them weigh as
much as its weights; the first section's reads as a single bundle's.
The runtime opens the first section this machine runs
(runtime/src/exec/load.c).
"""
import hashlib
import struct

import flatbuffers

from coldbrew.schemas.generated import bundle_generated as fb

from .checksum import checksum64
from .reader import read_bytes, section_header, text

VERSION = 9  # 7: the same index, its headers stored as they are (the runtime reads both)
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
    # first section reads as a single bundle does (header, code, weights in the order of need); a
    # later header's room is its packed size at a first guess, grown until the packed header fits
    room = [len(_stored_header(k, _section_header(b, kept, blobs, [0] * len(blobs))))
            for k, ((_, b, _, _), kept) in enumerate(zip(parsed, lists))]
    while True:
        index = _index(parsed, [(0, 0, 0, 0)] * len(parsed))
        pos, places, offsets, first = 64 + _align(len(index), 8), [], [0] * len(blobs), True
        for n, kept in zip(room, lists):
            places.append(_align(pos, 8))
            pos = places[-1] + n
            for k in kept:
                kind, body, _ = blobs[k]
                if offsets[k]:  # an earlier section's
                    continue
                page = kind == fb.SegmentKind.cpu_code or (kind in _WEIGHTS and first)  # as a single bundle's:
                first = first and kind not in _WEIGHTS  # plain code and the first weights on a page
                pos = _align(pos, PAGE if page else 64)
                offsets[k] = pos
                pos += len(body)
        plain = [_section_header(b, kept, blobs, offsets) for (_, b, _, _), kept in zip(parsed, lists)]
        headers = [_stored_header(k, h) for k, h in enumerate(plain)]
        if all(len(h) <= n for h, n in zip(headers, room)):
            break
        room = [max(n, len(h) + 256) for h, n in zip(headers, room)]
    index = _index(parsed, [(p, len(h), checksum64(h), len(r) if h is not r else 0)
                            for p, h, r in zip(places, headers, plain)])
    size = _align(pos, 64)
    out = bytearray(size)
    struct.pack_into("<8sIIQQQ", out, 0, b"COLDBREW", VERSION, 64, len(index), checksum64(index), size)
    out[64:64 + len(index)] = index
    for p, h in zip(places, headers):
        out[p:p + len(h)] = h
    for off, (_, body, _) in zip(offsets, blobs):
        out[off:off + len(body)] = body
    return bytes(out)


def _stored_header(k, header):
    """A section's header as the file stores it: the first section's as it
    is (it reads as a single bundle's), a later one's as one LZ4 block (the
    runtime decodes it, runtime/src/bundle/open.c) where that is smaller."""
    import lz4.block

    packed = lz4.block.compress(header, mode="high_compression", compression=12, store_size=False) if k else header
    return packed if len(packed) < len(header) else header


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
            shared = (relaid.get(_nonzero_key(body, t.shape))
                      if b.target.gpuClass and key not in stored and t.name not in transformed and t.dtype == 0
                      else None)
            if shared and len(shared[0].raw) == len(t.shape) and all(r >= d for r, d in zip(shared[0].raw, t.shape)):
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


def _nonzero_key(raw, shape):
    """The sha256 of a float32 value's smallest box from its origin that
    holds every element whose bits are not zero, and of that box's bytes:
    equal for a weight and a zero-padded form of it (a CPU form's raw shape
    is padded where its kernels block the channels)."""
    import numpy as np

    a = np.frombuffer(raw, np.uint32).reshape([int(d) for d in shape])
    nz = a != 0
    box = tuple(int(np.flatnonzero(nz.any(axis=tuple(k for k in range(a.ndim) if k != j))).max(initial=-1)) + 1
                for j in range(a.ndim))
    box = box if all(box) else (0,) * a.ndim
    return hashlib.sha256(repr(box).encode() + a[tuple(slice(0, n) for n in box)].tobytes()).digest()


def _relaid(parsed):
    """{key of a raw weight's nonzero box (_nonzero_key): (Relayout,
    checksum, stored key, stored bytes, segment)} for the CPU sections'
    cached weights whose transform only rearranges (Tensor.relayout): a GPU
    section reads such a weight from their bytes, laid out back by the
    runtime as it uploads (its part of a padded raw form: the rest is
    zero)."""
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
            out.setdefault(_nonzero_key(raw, desc.raw), (fb.RelayoutT(raw=list(desc.raw), stored=list(desc.stored),
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
                            schemaVersion=version, headerRawSize=raw)
                for (name, b, version, _), (p, n, c, raw) in zip(parsed, places)]
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
        header = section_header(s, data[s.headerOffset:s.headerOffset + s.headerSize], path)
        fake = struct.pack("<8sIIQQQ", b"COLDBREW", s.schemaVersion, 64, len(header), 0, 64 + len(header))
        got.append((text(s.name), read_bytes(fake + bytes(64 - len(fake)) + header, path)[0], s.schemaVersion))
    return got
