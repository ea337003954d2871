"""compiler/ir/dims.py: the variables of input dimensions declared as
ranges, their extents' largest and typical values, and the shape programs
a run evaluates (read back by compiler/bundle/reader.py shape_now, as the
runtime's bundle/program.c does)."""
import types

import numpy as np
import pytest

from coldbrew.compiler.bundle.reader import shape_now
from coldbrew.compiler.ir import dims
from coldbrew.compiler.options import Dim


def test_a_shape_program_computes_what_dims_at_computes():
    from tvm import tirx

    h_dim, w_dim = Dim("h", 9, 33), Dim("w", 8, 40, 4)
    variables = dims.variables([h_dim, w_dim])
    h, w = variables[h_dim], variables[w_dim]
    one = lambda n: tirx.IntImm("int64", n)  # noqa: E731
    extents = [one(1), dims.extent(w_dim, w), tirx.floordiv(h + 1, 2), h * 2 - 3, tirx.floormod(w * 4 + h, 5),
               tirx.min(h, w * 4), tirx.max(h - 20, one(1)), tirx.Add(h, one(-3)), tirx.floordiv(h - 12, 2),
               tirx.Cast("int64", w) * h]
    words = dims.program(extents, lambda v: {"h": 0, "w": 1}[v.name])  # h is dim tensor 0, w dim tensor 1
    assert dims.NEG in words and dims.MIN in words and dims.FLOORMOD in words
    desc = types.SimpleNamespace(shapeProgram=np.array(words), shape=[])
    for hs, ws in [(9, 8), (33, 40), (10, 12), (21, 28), (12, 36)]:
        assert shape_now(desc, {0: hs, 1: ws // 4}) == list(dims.at(extents, variables, {h_dim: hs, w_dim: ws}))
    assert dims.largest(extents[:4], variables) == (1, 40, 17, 63)
    assert dims.typical(extents[:3], variables) == (1, 40, 17)
    with pytest.raises(ValueError, match="is not arithmetic a run can compute"):
        dims.program([tirx.Select(h > 10, h, one(10))], lambda v: 0)
