"""Pass `fuse_layers`: lower Relax operators to TIR and fuse them into layers.

Each Relax operator becomes a TIR PrimFunc (legalization); constants are
folded; then producers are fused with their elementwise consumers (conv +
bias + activation + residual add, ...), each fused group one PrimFunc: one
coldbrew layer.
"""
from .errors import CompileError

NAME = "fuse_layers"


def run(mod):
    import tvm
    from tvm import relax

    from .lower_resize import legalize_resize2d

    seq = tvm.transform.Sequential([
        relax.transform.DecomposeOpsForInference(),
        # Nearest resize gets coldbrew's exact lowering (see lower_resize.py).
        relax.transform.LegalizeOps(customize_legalize_map={"relax.image.resize2d": legalize_resize2d}),
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
