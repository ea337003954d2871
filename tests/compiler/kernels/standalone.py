"""Kernels and layouts outside a model, for the kernel tests: a variant's
execute kernel as a PrimFunc of its own, and NCHW arrays in the blocked layout."""
import numpy as np
from tvm import te

from coldbrew.compiler.ir.forms import PRECISIONS
from coldbrew.compiler.kernels.build import execute_te, scale_shape


def execute_func(variant, spec, epilogue=None, params=None, precision="fp32", x_dtype=None):
    """Standalone PrimFunc(x, wt, [scale], [extra...], out): the execute
    kernel with an optional epilogue (a function of (out, *extra
    placeholders)); a narrow `precision` makes the kernel read its
    transformed weights in it (int8: with a scale per output channel);
    `x_dtype` (an integer variant's "uint8" / "int8") the model's integers
    as its input."""
    params = params if params is not None else variant.space(spec)[0]
    precision = "int8" if variant.integer else precision
    x = te.placeholder(spec.input_shape, x_dtype or spec.dtype, name="x")
    wt = te.placeholder(variant.transformed_shape(spec, params),
                        variant.weight_dtype if variant.integer else PRECISIONS[precision], name="wt")
    scale = [te.placeholder(scale_shape(spec, variant), "float32", name="scale")] if precision == "int8" else []
    out = execute_te(variant, spec, params)(x, wt, *scale)
    extra = []
    if epilogue is not None:
        out, extra = epilogue(out)
    return te.create_prim_func([x, wt, *scale, *extra, out])


def to_blocked(a, b):
    """numpy NCHW -> NCHW{b}c, the channels a multiple of b."""
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // b, b, h, w).transpose(0, 1, 3, 4, 2))


def workspace_sizes(lib):
    """The byte sizes of the runtime workspace blocks a built module's code
    asks for (each call of TVMBackendAllocWorkspace in its LLVM IR)."""
    import re

    ir = lib.inspect_source("ll")
    return [int(n) for n in re.findall(r"= tail call ptr %\w+\(i32 1, i32 %dev_id, i64 (\d+),", ir)]
