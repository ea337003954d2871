"""Pass `schedule_gpu` (GPU targets, in place of select_variants and
schedule_kernels): GPU schedules for every fused layer.

TVM's dlight rules schedule each PrimFunc for a GPU thread hierarchy:
matmul-shaped layers (convolutions, dense) get shared-memory tiles and
per-thread register blocks, reductions a cooperative tree, everything else
one output element per thread. The limits are those every Vulkan device
meets (`anchors.GPU_TVM_TARGET`), so one bundle runs on any of them.
"""
from . import provenance
from ..ir.anchors import GPU_ANCHOR_RE, GPU_TVM_TARGET

NAME = "schedule_gpu"


def rules():
    from tvm.s_tir.dlight import gpu

    return [gpu.Matmul(), gpu.GEMV(), gpu.Reduction(), gpu.GeneralReduction(), gpu.Fallback()]


def apply(mod, proto=None):
    """`mod` with its kernels scheduled; a kernel dlight cannot schedule is
    refused naming its node (`proto`: the ONNX model)."""
    import tvm
    from tvm import relax, s_tir

    # shape-generic variants (select_gpu_variants) bring their own shaders
    funcs = {gv.name_hint: f for gv, f in mod.functions.items()
             if not isinstance(f, relax.Function) and not GPU_ANCHOR_RE.search(gv.name_hint)}
    if not funcs:
        return mod

    def schedule(fs):
        with tvm.target.Target(GPU_TVM_TARGET):
            return s_tir.dlight.ApplyDefaultSchedule(*rules())(tvm.IRModule(fs))

    scheduled = provenance.per_kernel(proto, lambda s: provenance.bound_to(mod, s), funcs, schedule,
                                      "the GPU scheduler (dlight) cannot schedule")
    for gv in [gv for gv in mod.functions if gv.name_hint in funcs]:
        mod[gv] = scheduled[gv.name_hint]
    return mod


def run(c):
    c.mod = apply(c.mod, c.proto)
    return c
