"""Read a bundle's header without running it (the inspector, the simulator,
benchmarks and tests read bundles through here).

Works for bundles of any target (no code is loaded); structural checks here
are the preamble and the FlatBuffer identifier; full verification is the
runtime's job (`coldbrew inspect --verify`).
"""
import os
import struct

from coldbrew.schemas.generated import bundle_generated as fb

from ..ir.forms import DTYPES

WEIGHT_FORMS = {fb.WeightForm.raw: "raw", fb.WeightForm.cached: "cached", fb.WeightForm.direct: "direct"}


class InspectError(Exception):
    pass


def read(path):
    with open(path, "rb") as f:
        return read_bytes(f.read(), path)


def read_header(path):
    """The header alone (BundleT; a multi-target bundle's first section's),
    read without the weights and without the
    kernel's read-ahead (a cold-start benchmark reads it, then evicts the
    file: no read of the weights may still be on its way)."""
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
        _, hdr_off, hdr_size, file_size = _preamble(os.pread(f.fileno(), 64, 0), path)
        header = os.pread(f.fileno(), hdr_size, hdr_off)
        if len(header) == hdr_size and _root(header, path).sections:  # a multi-target bundle: its first section's
            first = _root(header, path).sections[0]  # (every section takes the same inputs)
            header, hdr_size = os.pread(f.fileno(), first.headerSize, first.headerOffset), first.headerSize
            if len(header) == hdr_size and first.headerRawSize:
                header = section_header(first, header, path)
                hdr_size = len(header)
    if len(header) != hdr_size:
        raise InspectError(f"{path}: truncated or damaged (header cut short; the file should hold {file_size} bytes)")
    return _root(header, path)


def section_header(s, stored, path="<bytes>"):
    """A multi-target bundle's section header from the bytes the file
    stores for it (Section.headerRawSize: an LZ4 block of that many bytes)."""
    if not s.headerRawSize:
        return bytes(stored)
    import lz4.block

    try:
        header = lz4.block.decompress(bytes(stored), uncompressed_size=s.headerRawSize)
    except lz4.block.LZ4BlockError as e:
        raise InspectError(f"{path}: a section's header does not decode ({e})") from None
    if len(header) != s.headerRawSize:
        raise InspectError(f"{path}: a section's header decodes to {len(header)} bytes, not {s.headerRawSize}")
    return header


def input_specs(path):
    """[(name, shape, numpy dtype name)] of a bundle's inputs, in order."""
    b = read_header(path)
    return [(text(b.tensors[i].name), [int(d) for d in b.tensors[i].shape], DTYPES[b.tensors[i].dtype])
            for i in b.inputs]


def read_bytes(data, path="<bytes>"):
    """(BundleT, size, schema version) from a bundle's bytes."""
    version, hdr_off, hdr_size, file_size = _preamble(data, path)
    if file_size != len(data) or hdr_off + hdr_size > len(data):
        raise InspectError(f"{path}: truncated or damaged ({len(data)} bytes, header says {file_size})")
    return _root(data[hdr_off:hdr_off + hdr_size], path), len(data), version


def _preamble(data, path):
    """(schema version, header offset, header size, file size) from a bundle's first 64 bytes."""
    if len(data) < 64 or data[:8] != b"COLDBREW":
        raise InspectError(f"{path}: not a coldbrew bundle")
    version, hdr_off, hdr_size, _, file_size = struct.unpack_from("<IIQQQ", data, 8)
    return version, hdr_off, hdr_size, file_size


def _root(header, path):
    """The header's FlatBuffer as a BundleT."""
    if not fb.Bundle.BundleBufferHasIdentifier(header, 0):
        raise InspectError(f"{path}: header lacks the CBRW identifier")
    try:
        b = fb.BundleT.InitFromObj(fb.Bundle.GetRootAs(header, 0))
    except Exception as e:  # a damaged header can fail anywhere in the reader
        raise InspectError(f"{path}: header is damaged ({type(e).__name__}: {e})") from None
    for k, s in enumerate(b.plan.steps or [] if b.plan else []):
        if s.kind is None:  # its kind missing or unknown: readers switch on it
            raise InspectError(f"{path}: plan step {k} has no kind (a CPU or a GPU step)")
    return b


def cpu_step(step):
    """A CPU step's own fields (CpuStepT: kernel, schedule, guard, warm alternate); None for a GPU step
    (GpuStepT: its dispatches)."""
    return step.kind if step.kindType == fb.StepKind.CpuStep else None


def text(x):
    return x.decode() if isinstance(x, bytes) else (x or "")


def dim_values(b, input_shapes, written=None):
    """{dim tensor index: its value} when the inputs have these shapes
    ([shape] in input order): each dim's size read at the input axis its
    Range names, over its step (schemas/bundle.fbs); a counted dim's from
    the bytes a run wrote to its count tensor (`written`: {tensor: bytes}),
    else its typical value."""
    import numpy as np

    def value(t):
        if t.bounds.count < 0:
            return input_shapes[t.bounds.input][t.bounds.axis] // t.bounds.step
        data = (written or {}).get(t.bounds.count)
        return int(np.frombuffer(data, np.int64)[0]) if data else t.bounds.typical

    return {i: value(t) for i, t in enumerate(b.tensors) if t.kind == fb.TensorKind.dim}


def shape_now(desc, values):
    """A tensor's shape for these dim values (dim_values): its shape
    program evaluated, or its fixed shape."""
    from ..ir.dims import ADD, DIM, END, FLOORDIV, FLOORMOD, MAX, MIN, MUL, NEG, SUB

    words = [] if desc.shapeProgram is None else [int(w) for w in desc.shapeProgram]
    if not words:
        return [int(d) for d in desc.shape]
    ops = {ADD: lambda a, b: a + b, SUB: lambda a, b: a - b, MUL: lambda a, b: a * b, FLOORDIV: lambda a, b: a // b,
           FLOORMOD: lambda a, b: a % b, MIN: min, MAX: max}
    out, stack, k = [], [], 0
    while k < len(words):
        w, k = words[k], k + 1
        if w >= 0:
            stack.append(w)
        elif w == END:
            out.append(stack.pop())
        elif w == DIM:
            stack.append(values[words[k]])
            k += 1
        elif w == NEG:
            stack.append(-stack.pop())
        else:
            rhs = stack.pop()
            stack.append(ops[w](stack.pop(), rhs))
    return out
