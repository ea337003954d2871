"""compiler/passes/select_variants.py: a kernel variant per conv and dense
layer with constant weights (ids c0.., d0.. in binding order), forced
choices honoured or refused in one sentence, the weights as the chosen
variant's kernel reads them."""
import numpy as np
import pytest

from coldbrew.compiler import CompileError, compile_model
from coldbrew.compiler.ir.anchors import ANCHOR_RE
from coldbrew.compiler.passes import block_layout, select_variants
from coldbrew.compiler.pipeline import front_end
from coldbrew.targets import resolve

ISA = resolve("host").vector


@pytest.fixture(scope="module")
def blocked(small_model):
    return block_layout.apply(front_end(small_model).mod, ISA)


def test_each_layer_gets_an_id_a_variant_and_its_alternatives(blocked):
    mod, anchors = select_variants.apply(blocked, ISA)
    assert [(a.id, a.index, a.variant.op) for a in anchors] == [("c0", 0, "conv2d"), ("d0", 1, "dense")]
    for a in anchors:
        assert a.variant.name in a.alternatives and a.variant.name == select_variants.auto_variant(a.spec, ISA)
        assert a.raw.shape == a.spec.weight_shape
    names = [gv.name_hint for gv in mod.functions if ANCHOR_RE.search(gv.name_hint)]
    assert sorted(int(ANCHOR_RE.search(n).group(1)) for n in names) == [0, 1]


def test_a_forced_variant_is_taken_per_layer_per_op_or_for_all(blocked):
    _, anchors = select_variants.apply(blocked, ISA)
    other = next(v for v in anchors[0].alternatives if v != anchors[0].variant.name)
    for choice in ({"c0": other}, {"conv2d": other.split(".")[1]}, {"*": other}):
        _, forced = select_variants.apply(blocked, ISA, choice)
        assert forced[0].variant.name == other and forced[1].variant.name == anchors[1].variant.name


def test_a_forced_layer_variant_that_does_not_apply_is_a_compile_error(blocked, small_model):
    with pytest.raises(CompileError, match="variant 'no_such' does not apply to c0"):
        select_variants.apply(blocked, ISA, {"c0": "no_such"})
    with pytest.raises(CompileError, match="does not apply to c0"):  # the same through compile_model
        compile_model(small_model, variants={"c0": "no_such"})


def test_transformed_weights_are_the_variants_transform_of_the_raw_ones(blocked):
    _, anchors = select_variants.apply(blocked, ISA)
    for a in anchors:
        assert a.transformed.shape == tuple(a.variant.transformed_shape(a.spec, a.params))
        if a.variant.transform_rearranges:  # the same values in another order (and zero padding)
            got = np.sort(a.transformed[a.transformed != 0])
            assert np.array_equal(got, np.sort(a.raw[a.raw != 0]))
    assert any(a.transform_func is not None for a in anchors)


def test_the_direct_form_stores_the_weights_narrow(blocked):
    _, anchors = select_variants.apply(blocked, ISA, direct=lambda aid: "fp16" if aid == "c0" else None)
    conv = anchors[0]
    if not conv.variant.transform_rearranges:
        pytest.skip(f"{conv.variant.name} does not only rearrange its weights")
    assert conv.direct == "fp16" and conv.const.value.numpy().dtype == np.float16
    assert 0 < conv.direct_error < 1e-3 and anchors[1].direct == ""
