"""Hostile bundles, shared by the runtime's tests: a bundle's bytes read,
its header re-packed with a valid checksum after a change, and a refusal
expected from every way of opening it (tests/runtime/test_bundle.py,
test_cpu.py, test_vulkan.py)."""
import struct

import pytest

import coldbrew
from coldbrew.compiler.bundle.checksum import checksum64
from coldbrew.compiler.measure.protocol import evict
from coldbrew.schemas.generated import bundle_generated as fb


def read(path):
    with open(path, "rb") as f:
        return bytearray(f.read())


def open_bytes(data):
    return coldbrew.load(bytes(data))


def expect(data, status, tmp_path, match=None):
    p = tmp_path / "bad.brew"
    p.write_bytes(bytes(data))
    for source in sources(p, data):
        with pytest.raises(coldbrew.BundleError) as e:
            coldbrew.load(source)
        assert e.value.status == status, str(e.value)
        if match:
            assert match in str(e.value)


def sources(path, data):
    """The ways to open one bundle: from a file in the page cache, from the
    same file just evicted (the open then reads the front and the first
    weights past the page cache, into memory of its own), from memory."""
    yield str(path)
    evict(path)
    yield str(path)
    yield bytes(data)


def repack(data, mutate):
    """Decode the header, let `mutate` change it, re-encode with a valid checksum."""
    import flatbuffers

    hdr_off, hdr_size = struct.unpack_from("<IQ", data, 12)
    b = fb.BundleT.InitFromObj(fb.Bundle.GetRootAs(bytes(data[hdr_off:hdr_off + hdr_size]), 0))
    mutate(b)

    def encode():
        builder = flatbuffers.Builder(4096)
        builder.ForceDefaults(True)
        builder.Finish(b.Pack(builder), file_identifier=b"CBRW")
        return bytes(builder.Output())

    header, first_segment = encode(), min(s.offset for s in b.segments)
    shift = max(0, hdr_off + len(header) - first_segment + 4095) // 4096 * 4096  # a header grown past its room:
    if shift:  # every segment a whole page later (their alignment kept)
        for seg in b.segments:
            seg.offset += shift
        header, data = encode(), bytes(data[:first_segment]) + bytes(shift) + bytes(data[first_segment:])
        struct.pack_into("<Q", data := bytearray(data), 32, len(data))
        first_segment += shift
    assert hdr_off + len(header) <= first_segment
    out = bytearray(data)
    out[hdr_off:first_segment] = header + bytes(first_segment - hdr_off - len(header))
    struct.pack_into("<QQ", out, 16, len(header), checksum64(header))
    return out
