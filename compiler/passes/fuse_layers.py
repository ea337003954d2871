"""Pass `fuse_layers`: lower Relax operators to TIR and fuse them into layers.

Each Relax operator becomes a TIR PrimFunc (legalization); constants are
folded; then producers are fused with their elementwise consumers (conv +
bias + activation + residual add, ...), each fused group one PrimFunc: one
coldbrew layer.
"""
from ..errors import CompileError

NAME = "fuse_layers"


def _sigmoid_te(x):
    """1 / (1 + e^-x) with TVM's polynomial exp (topi.fast_exp): LLVM
    vectorizes it, where the exp intrinsic becomes one libm call per lane
    (efficientnet's swish epilogues ran 4x slower). Absolute error under
    1e-7 over all of fp32 (the input clamped at +-88, as fast_exp clamps)."""
    from tvm import te, tirx, topi

    e = topi.fast_exp(topi.negative(x))
    one = tirx.const(1.0, x.dtype)
    return te.compute(x.shape, lambda *i: one / (one + e(*i)), name="cb_sigmoid")


def _legalize_sigmoid(bb, call):
    if str(call.args[0].ty.dtype) != "float32":
        from tvm import topi

        return bb.call_te(topi.sigmoid, call.args[0])
    return bb.call_te(_sigmoid_te, call.args[0], primfunc_name_hint="sigmoid")


def _polynomial(name):
    """Legalization of exp, softmax, erf or tanh on float32 by TVM's
    polynomial forms (topi.fast_exp, fast_softmax, fast_erf, fast_tanh),
    which LLVM vectorizes, where the intrinsics become one libm call per
    lane (a transformer's softmax ran 10x slower than onnxruntime's).
    Measured over [-20, 20]: exp within 1.3e-7 relative, erf and tanh within
    3.4e-7 absolute. Other dtypes keep TVM's exact forms."""
    from tvm import topi

    fast, exact = {"exp": (topi.fast_exp, topi.exp), "erf": (topi.fast_erf, topi.erf),
                   "tanh": (topi.fast_tanh, topi.tanh), "softmax": (topi.nn.fast_softmax, topi.nn.softmax)}[name]

    def legalize(bb, call):
        x = call.args[0]
        extra = [int(call.attrs.axis)] if name == "softmax" else []
        return bb.call_te(fast if str(x.ty.dtype) == "float32" else exact, x, *extra, primfunc_name_hint=name)

    return legalize


def apply(mod, cpu=True):
    """`cpu`: lower for the CPU code generator (the GPU's GLSL emitter has no
    bit reinterpretation, which the vectorizable sigmoid, exp, softmax, erf
    and tanh use)."""
    import tvm
    from tvm import relax

    from ..kernels.lower_resize import legalize_resize2d
    from ..kernels.lower_sequential import legalize_cumsum, legalize_topk

    fast = {"relax.sigmoid": _legalize_sigmoid, "relax.nn.softmax": _polynomial("softmax"),
            **{f"relax.{op}": _polynomial(op) for op in ("exp", "erf", "tanh")}}
    legalize = {"relax.image.resize2d": legalize_resize2d, "relax.cumsum": legalize_cumsum,
                "relax.topk": legalize_topk, **(fast if cpu else {})}
    seq = tvm.transform.Sequential([
        relax.transform.DecomposeOpsForInference(),
        # Nearest resize gets coldbrew's exact lowering (see lower_resize.py),
        # CumSum and TopK sequential kernels (lower_sequential.py);
        # on CPUs, sigmoid, exp, softmax, erf and tanh vectorizable ones.
        relax.transform.LegalizeOps(customize_legalize_map=legalize),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
    ])
    try:
        with tvm.transform.PassContext(opt_level=3):
            return seq(mod)
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise CompileError(f"lowering to TIR failed: {msg[-1] if msg else type(e).__name__}") from None


def run(c):
    c.mod = apply(c.mod, cpu=not c.on_gpu)
    return c
