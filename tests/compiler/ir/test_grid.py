"""compiler/ir/grid.py on Relax as the front end and block_layout leave it:
the integer bounds and grid scale of a convolution's input."""
import sys

import pytest

from coldbrew.compiler.ir.grid import grid_scale, integer_bounds
from coldbrew.compiler.options import Choices
from coldbrew.compiler.passes import block_layout
from coldbrew.compiler.pipeline import PASSES, _from_front, front_end, run

sys.path.insert(0, __file__.rsplit("/ir/", 1)[0])  # tests/compiler: the quantized test models
import test_quantized_conv as models  # noqa: E402


def _conv_input(model):
    """(the conv2d's input, binding lookup) after block_layout."""
    from tvm import relax

    c = run(PASSES, _from_front(front_end(model), choices=Choices()), block_layout.NAME, block_layout.NAME)
    values, conv = {}, None
    for block in c.mod["main"].body.blocks:
        for b in block.bindings:
            values[b.var] = b.value
            if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.nn.conv2d":
                conv = b.value
    return conv.args[0], values.get


def test_a_conv_integers_input_is_the_integers_less_the_zero_point():
    """float(q) - round(clip(zero, 0, 255)), through the blocked relayout:
    integers in [-255, 255], scale 1."""
    x, binding = _conv_input(models.conv_integer("uint8"))
    assert integer_bounds(x, binding) == (-255.0, 255.0)
    assert grid_scale(x, binding, 255) == 1.0
    assert grid_scale(x, binding, 254) is None  # past the bound: no grid


@pytest.mark.parametrize("zero, kind, bound", [(128, "uint8", 128), (0, "int8", 128), (37, "uint8", 218)])
def test_a_dequantized_input_is_on_its_scale(zero, kind, bound):
    """A DequantizeLinear's output: its scale, when its 8-bit values less
    the zero point stay within the bound."""
    import numpy as np

    x, binding = _conv_input(models.qdq_conv(zero, getattr(np, kind)))
    assert integer_bounds(x, binding) is None  # not integers themselves
    assert grid_scale(x, binding, bound) == pytest.approx(0.03)
    assert grid_scale(x, binding, bound - 1) is None


def test_a_float_input_is_on_no_grid():
    q = models.qdq_conv()
    nodes = [n for n in q.graph.node if n.op_type != "QuantizeLinear" and n.input[0] != "q"]
    for n in nodes:
        if n.op_type == "Conv":
            n.input[0] = "x"
    x, binding = _conv_input(models._model(nodes, list(q.graph.initializer)))
    assert integer_bounds(x, binding) is None and grid_scale(x, binding, 255) is None
