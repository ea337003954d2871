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

    seq = tvm.transform.Sequential([
        relax.transform.DecomposeOpsForInference(),
        relax.transform.LegalizeOps(),
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
