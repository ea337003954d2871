"""Pass `schedule_gpu` (GPU targets, in place of select_variants and
schedule_kernels): GPU schedules for every fused layer.

TVM's dlight rules schedule each PrimFunc for a GPU thread hierarchy:
matmul-shaped layers (convolutions, dense) get shared-memory tiles and
per-thread register blocks, reductions a cooperative tree, everything else
one output element per thread. The limits are those every Vulkan device
meets (`TVM_TARGET`), so one bundle runs on any of them.
"""
from .errors import CompileError

NAME = "schedule_gpu"
# Vulkan's guaranteed minimums: 128 invocations per workgroup (we use up to
# 256: every desktop and mobile GPU coldbrew targets allows it), 16 KiB of
# shared memory; no subgroup assumptions (warp size 1).
TVM_TARGET = {"kind": "vulkan", "max_threads_per_block": 256, "max_num_threads": 256,
              "max_shared_memory_per_block": 16384, "thread_warp_size": 1,
              "supports_float32": True, "supports_int32": True}


def rules():
    from tvm.s_tir.dlight import gpu

    return [gpu.Matmul(), gpu.GEMV(), gpu.Reduction(), gpu.GeneralReduction(), gpu.Fallback()]


def run(mod):
    import tvm
    from tvm import relax, s_tir

    from .select_gpu_variants import ANCHOR_RE

    # shape-generic variants (select_gpu_variants) bring their own shaders
    funcs = {gv: f for gv, f in mod.functions.items()
             if not isinstance(f, relax.Function) and not ANCHOR_RE.search(gv.name_hint)}
    if not funcs:
        return mod
    try:
        with tvm.target.Target(TVM_TARGET):
            scheduled = s_tir.dlight.ApplyDefaultSchedule(*rules())(tvm.IRModule(funcs))
    except Exception as e:  # dlight raises several error types
        msg = str(e).strip().splitlines()
        raise CompileError(f"GPU scheduling failed: {msg[-1] if msg else type(e).__name__}") from None
    for gv in funcs:
        mod[gv] = scheduled[gv.name_hint]
    return mod
