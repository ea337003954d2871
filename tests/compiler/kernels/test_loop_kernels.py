"""compiler/kernels/loops.py: a Slice and a Range at a place the data sets
give their references' values and, as their counted size, the length
they find (which the runtime holds to the first iteration's); the loop's
START writes its state."""
import numpy as np
import pytest
import tvm
from tvm import te

from coldbrew.compiler.kernels import loops


def _run(outputs, placeholders, args):
    f = tvm.compile(te.create_prim_func([*placeholders, *outputs]), target="llvm")
    out = [tvm.runtime.tensor(np.zeros([int(d) for d in o.shape], str(o.dtype))) for o in outputs]
    f(*[tvm.runtime.tensor(a) for a in args], *out)
    return [o.numpy() for o in out]


@pytest.mark.parametrize("start,end,expect", [(2, 4, 2), (-3, -1, 2), (5, 9, 1), (0, 2, 2)])
def test_a_slice_at_a_place_the_data_sets(start, end, expect):
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    xp = te.placeholder((6, 4), "float32", name="x")
    sp, ep = te.placeholder((1,), "int64", name="s"), te.placeholder((1,), "int64", name="e")
    out, length = _run(loops.slice_at_te(xp, sp, ep, [0], [1], [2, 4]), [xp, sp, ep],
                       [x, np.array([start], np.int64), np.array([end], np.int64)])
    assert length[0] == expect
    ref = loops.slice_at_reference(x, [start], [end], [0], [1])
    np.testing.assert_array_equal(out[:len(ref)], ref)


def test_a_range_at_a_place_the_data_sets():
    ph = [te.placeholder((1,), "int64", name=n) for n in "azd"]
    for a, z, d, n in ((3, 4, 1, 1), (0, 5, 2, 3), (7, 7, 1, 0)):
        values, count = _run(loops.range_at_te(*ph, 1), ph, [np.array([v], np.int64) for v in (a, z, d)])
        assert count[0] == n and (n == 0 or values[0] == loops.range_reference(a, z, d)[0])


def test_the_start_writes_the_loop_state():
    lim, first = te.placeholder((1,), "int64", name="m"), te.placeholder((), "bool", name="c")
    h = te.placeholder((2, 3), "float32", name="h")
    it, trip, cond, copy = _run(loops.start_te(None, lim, first, [h], 5), [lim, first, h],
                                [np.array([9], np.int64), np.array(False), np.ones((2, 3), np.float32)])
    assert (int(it), int(trip), bool(cond)) == (0, 9, False) and copy.sum() == 6
