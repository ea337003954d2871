"""Anchors, the layers a kernel variant computes, as the passes share them:
select_variants / select_gpu_variants name each anchor's function by these
patterns, and schedule_kernels, schedule_gpu and codegen_spirv find them
again by name after fusion; a forced choice (`--variant`) is looked up the
same way by block_layout and select_variants. GPU kernels, variants and
scheduled ones alike, are made within one set of device limits.
"""
import re

ANCHOR_RE = re.compile(r"(?:^|_)cb(\d+)_")  # CPU: cb<index>_ in a (fused) function's name
GPU_ANCHOR_RE = re.compile(r"^cbg(\d+)_")  # GPU variants' functions

# Vulkan's guaranteed minimums: 128 invocations per workgroup (we use up to
# 256: every desktop and mobile GPU coldbrew targets allows it), 16 KiB of
# shared memory; no subgroup assumptions (warp size 1).
GPU_TVM_TARGET = {"kind": "vulkan", "max_threads_per_block": 256, "max_num_threads": 256,
                  "max_shared_memory_per_block": 16384, "thread_warp_size": 1,
                  "supports_float32": True, "supports_int32": True}
# Storage buffers one shader binds (a tensor each): Vulkan guarantees 4;
# the GPUs coldbrew targets allow 24 (Adreno 6xx) to 32 (lavapipe) and more.
GPU_MAX_BINDINGS = 16


def forced(choice, anchor_id, op):
    """The choices that name a variant for one anchor, most specific first:
    (key, name as given, full name, schedule params or None)."""
    for key in (anchor_id, op, "*"):
        want = choice.get(key)
        want, params = want if isinstance(want, tuple) else (want, None)
        if want is not None and want != "auto":
            yield key, want, want if "." in want else f"{op}.{want}", params
