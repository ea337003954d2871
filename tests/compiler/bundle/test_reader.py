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
    assert size == len(open(small_bundle, "rb").read()) and version >= 1
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


def test_checksum64_weights_each_word_by_its_position():
    words = np.array([1, 2, 3], "<u8")
    assert checksum64(words.tobytes()) == 1 * 1 + 2 * 3 + 3 * 5
    assert checksum64(b"\x01") == 1  # padded to a whole word with zeros
    assert checksum64(b"") == 0
    wrap = np.array([2 ** 63, 2 ** 63], "<u8").tobytes()  # sums wrap at 2**64
    assert checksum64(wrap) == (2 ** 63 * 1 + 2 ** 63 * 3) % 2 ** 64
