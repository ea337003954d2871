"""Turn a variant + spec into PrimFuncs: the weight transform and the
(scheduled) execute kernel. Used by the compiler passes, the tests and the
kernel benchmark."""
import dataclasses

import tvm
from tvm import s_tir, te

from ..ir.forms import PRECISIONS
from .contract import ANCHOR, simplified


WIDEN = "cb_widen"  # the widening block of a narrow transform


def output_axis(spec):
    """The axis of a layer's raw weights that indexes its output channels
    (int8 scales are per entry of it): OIHW convolutions 0, [K, N] dense 1,
    a recurrent cell's [dirs, gates * H, H + 1] 1."""
    return 1 if spec.__class__.__name__ in ("DenseSpec", "RecurrentSpec") else 0


def transform_func(variant, spec, params, precision="fp32"):
    """PrimFunc(raw, transformed), or None for the identity. With a narrow
    `precision` the raw weights are stored narrow and widened first:
    PrimFunc(raw fp16, transformed) or PrimFunc(raw int8, scales, transformed)
    (int8 value times its output channel's fp32 scale); never None."""
    fn = variant.transform(spec, params)
    if precision == "fp32":
        if fn is None:
            return None
        w = te.placeholder(spec.weight_shape, spec.dtype, name="raw")
        return te.create_prim_func([w, fn(w)])
    if precision not in PRECISIONS:
        raise ValueError(f"weight precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    shape, axis = spec.weight_shape, output_axis(spec)
    w = te.placeholder(shape, PRECISIONS[precision], name="raw")
    args = [w]
    if precision == "int8":
        scale = te.placeholder((shape[axis],), "float32", name="scale")
        args.append(scale)
        wide = te.compute(shape, lambda *i: w(*i).astype("float32") * scale[i[axis]], name=WIDEN)
    else:
        wide = te.compute(shape, lambda *i: w(*i).astype("float32"), name=WIDEN)
    return te.create_prim_func([*args, fn(wide) if fn is not None else wide])


class Widened:
    """Narrow transformed weights as the execute kernel's computation sees
    them: every element read is widened to fp32 where it is used, so the
    kernel loads the narrow values and converts them in registers (F16C
    vcvtph2ps, NEON fcvtl) and no fp32 copy is ever made."""

    def __init__(self, wt):
        self.wt = wt

    def __getitem__(self, index):
        return self.wt[index].astype("float32")

    @property
    def shape(self):
        return self.wt.shape


SCALE = "cb_scale"  # the int8 direct form's per-output-channel scaling block


def scale_shape(spec, variant=None):
    """The int8 direct form's scales, shaped like the output's channel axes:
    [K / b, b] for blocked convolutions, [K] for NCHW ones, [N] for dense;
    an integer dense variant's two factors per output [2, N] (dense.int8_dot);
    an integer convolution's one factor per output channel, as the int8 scales."""
    if variant is not None and variant.integer and spec.__class__.__name__ == "DenseSpec":
        return (2, spec.n)
    if spec.__class__.__name__ == "DenseSpec":
        return (spec.n,)
    return (spec.k // spec.out_block, spec.out_block) if spec.out_block else (spec.k,)


def scaled(spec, out, scale):
    """out times its output channel's scale: int8 weights accumulate as
    integers widened to fp32 (q, not q x scale), and since the scale is one
    per output channel it is applied once per output, in the epilogue."""
    if spec.__class__.__name__ == "DenseSpec":
        channel = lambda i: (i[-1],)  # noqa: E731
    elif spec.out_block:
        channel = lambda i: (i[1], i[4])  # noqa: E731
    else:
        channel = lambda i: (i[1],)  # noqa: E731
    return te.compute(out.shape, lambda *i: out(*i) * scale(*channel(i)), name=SCALE)


def execute_te(variant, spec, params):
    """A TE function (x, wt) -> out, for BlockBuilder.emit_te. Weights of a
    narrow dtype (the direct form) are widened where the kernel reads them;
    given a scale too (int8: x, wt, scale), each output is scaled by its channel's
    (an integer variant applies its factors itself). Sized at run time, the
    spec's extents are taken from x as the kernel gets it (its own variables)."""
    def run(x, wt, *scale):
        s = spec
        if getattr(spec, "symbolic", False):
            s = (_rows_of(spec, x) if spec.__class__.__name__ == "DenseSpec"
                 else dataclasses.replace(spec, n=x.shape[0], h=x.shape[2], w=x.shape[3]))
        if variant.integer:
            return variant.compute(s, x, wt, params, scale[0])
        out = variant.compute(s, x, wt if wt.dtype == s.dtype else Widened(wt), params)
        return scaled(s, out, scale[0]) if scale else out

    return run


def _rows_of(spec, x):
    """A dense spec sized at run time with x's own extents: its rows, or a
    batch of fixed rows taken flat (the batch outermost)."""
    if not spec.batch:
        return dataclasses.replace(spec, m=x.shape[-2])
    batch = tuple(x.shape[:-1])
    m = batch[0]
    for d in batch[1:]:
        m = m * d
    return dataclasses.replace(spec, m=simplified(m), batch=(batch[0],) + tuple(int(d) for d in batch[1:]))


def schedule(func, variant, spec, params=None):
    """Apply the variant's schedule (and its finish) to a PrimFunc holding its anchor block."""
    sch = s_tir.Schedule(func)
    variant.schedule(sch, sch.get_sblock(ANCHOR), spec, params if params is not None else variant.space(spec)[0])
    return variant.finish(sch.mod["main"])


def allow_tiles():
    """Ask Linux for this process's AMX tile state (arch_prctl
    ARCH_REQ_XCOMP_PERM, XTILEDATA), without which the first tile
    instruction faults: what the runtime does when it opens a bundle, for
    kernels run in this process instead (tests, tools). False where refused."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    return ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18) == 0  # SYS_arch_prctl


def build(funcs, target):
    """Compile {name: PrimFunc} for `target` (a coldbrew Target); where it
    uses AMX tiles, this process may run them (allow_tiles)."""
    if target.vector.int8_tiles:
        allow_tiles()
    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})
    with tvm.transform.PassContext(opt_level=3):
        return tvm.tirx.build(mod, target=tvm.target.Target(target.llvm()))
