"""compiler/bundle/reader.py and checksum.py: a bundle's header read back
without running it, damaged files refused in one sentence, and the
checksum (the runtime's agreement with it: tests/runtime/test_base.py)."""
import struct

import numpy as np
import pytest

from coldbrew.compiler.bundle.checksum import checksum64
from coldbrew.compiler.bundle.reader import InspectError, input_specs, read, read_bytes, read_header


def test_a_bundle_reads_back_with_its_inputs(small_bundle, small_model):
    b, size, version = read(small_bundle)
    assert size == len(open(small_bundle, "rb").read()) and version == b.schemaVersion == 4
    assert len(b.plan.steps) == len(b.layers) > 0
    (x,) = small_model.graph.input
    dims = [d.dim_value for d in x.type.tensor_type.shape.dim]
    assert input_specs(small_bundle) == [(x.name, dims, "float32")]
    assert read_header(small_bundle).plan.threads == b.plan.threads


@pytest.mark.parametrize("damage,message", [
    (lambda d: b"NOTABNDL" + d[8:], "not a coldbrew bundle"),
    (lambda d: d[:32], "not a coldbrew bundle"),
    (lambda d: d[:-1], "truncated or damaged"),
    (lambda d: d[:struct.unpack_from("<IIQ", d, 8)[1]] + b"XXXX" + d[struct.unpack_from("<IIQ", d, 8)[1] + 4:],
     "header lacks the CBRW identifier|header is damaged"),
])
def test_damaged_bundles_are_refused_in_one_sentence(small_bundle, damage, message):
    data = open(small_bundle, "rb").read()
    with pytest.raises(InspectError, match=message):
        read_bytes(damage(data), "x.brew")


def test_a_step_without_a_kind_is_refused(small_bundle):
    """Readers switch on a step's kind (CPU or GPU): a step of neither is named."""
    import flatbuffers

    from coldbrew.compiler.bundle.reader import cpu_step
    from coldbrew.schemas.generated import bundle_generated as fb

    b = read(small_bundle)[0]
    assert all(cpu_step(s) is s.kind for s in b.plan.steps)
    b.plan.steps[1].kindType, b.plan.steps[1].kind = fb.StepKind.NONE, None
    builder = flatbuffers.Builder(4096)
    builder.Finish(b.Pack(builder), file_identifier=b"CBRW")
    header = bytes(builder.Output())
    data = b"COLDBREW" + struct.pack("<IIQQQ", 4, 64, len(header), 0, 64 + len(header)) + bytes(24) + header
    with pytest.raises(InspectError, match="plan step 1 has no kind"):
        read_bytes(data, "x.brew")


def test_checksum64_weights_each_word_by_its_position():
    words = np.array([1, 2, 3], "<u8")
    assert checksum64(words.tobytes()) == 1 * 1 + 2 * 3 + 3 * 5
    assert checksum64(b"\x01") == 1  # padded to a whole word with zeros
    assert checksum64(b"") == 0
    wrap = np.array([2 ** 63, 2 ** 63], "<u8").tobytes()  # sums wrap at 2**64
    assert checksum64(wrap) == (2 ** 63 * 1 + 2 ** 63 * 3) % 2 ** 64
