"""Pass `schedule_gpu` (GPU targets, in place of select_variants and
schedule_kernels): GPU schedules for every fused layer.

TVM's dlight rules schedule each PrimFunc for a GPU thread hierarchy:
matmul-shaped layers (convolutions, dense) get shared-memory tiles and
per-thread register blocks, reductions a cooperative tree, everything else
one output element per thread. The limits are those every Vulkan device
meets (`anchors.GPU_TVM_TARGET`), so one bundle runs on any of them.
"""
from ..ir.anchors import GPU_ANCHOR_RE, GPU_TVM_TARGET
from ..errors import CompileError

NAME = "schedule_gpu"


def rules():
    from tvm.s_tir.dlight import gpu

    return [gpu.Matmul(), gpu.GEMV(), gpu.Reduction(), gpu.GeneralReduction(), gpu.Fallback()]


def apply(mod):
    import tvm
    from tvm import relax, s_tir


    # shape-generic variants (select_gpu_variants) bring their own shaders
    funcs = {gv: f for gv, f in mod.functions.items()
             if not isinstance(f, relax.Function) and not GPU_ANCHOR_RE.search(gv.name_hint)}
    if not funcs:
        return mod
    try:
        with tvm.target.Target(GPU_TVM_TARGET):
            scheduled = s_tir.dlight.ApplyDefaultSchedule(*rules())(tvm.IRModule(funcs))
    except Exception as e:  # dlight raises several error types
        msg = str(e).strip().splitlines()
        raise CompileError(f"GPU scheduling failed: {msg[-1] if msg else type(e).__name__}") from None
    for gv in funcs:
        mod[gv] = scheduled[gv.name_hint]
    return mod


def run(c):
    c.mod = apply(c.mod)
    return c
