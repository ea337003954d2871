"""compiler/ir/forms.py: the one vocabulary of weight forms and precisions
that the bundle, the cost table, the simulator and the scheduler share."""
import pytest

from coldbrew.compiler.ir.forms import (DIRECT_FORMS, FORM_BYTES, NARROW, PRECISIONS, cost_form, is_direct,
                                        is_narrow_form, plan_form)

PAIRS = [("raw", "fp32", "raw"), ("cached", "fp32", "cached"), ("cached", "fp16", "fp16"), ("raw", "int8", "int8"),
         ("direct", "fp16", "direct"), ("direct", "int8", "direct_int8")]


@pytest.mark.parametrize("form,precision,cost", PAIRS)
def test_a_stored_form_and_its_cost_form_map_both_ways(form, precision, cost):
    assert cost_form(form, precision) == cost
    assert plan_form(cost) == (form, precision)
    assert is_narrow_form(cost) == (precision in NARROW)
    assert is_direct(cost) == (form == "direct")
    assert cost in FORM_BYTES  # the cost table counts its bytes


def test_a_generic_layers_narrow_weights_cost_as_its_fp32_ones():
    assert cost_form("cached", "fp16", narrow_costed=False) == "cached"
    assert cost_form("direct", "int8", narrow_costed=False) == "direct_int8"  # only variants read direct


def test_every_narrow_precision_has_a_direct_form_and_a_dtype():
    assert set(DIRECT_FORMS) == set(NARROW) and set(NARROW) < set(PRECISIONS)
