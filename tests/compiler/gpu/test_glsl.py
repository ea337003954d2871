"""compiler/gpu/glsl.py: coldbrew's GLSL emitter. A GPU-lowered TIR kernel
becomes a GLSL 4.50 compute shader that glslang compiles: one storage
buffer per pointer parameter, the launch extents as workgroup size and
grid, shared memory and barriers, float constants exact (inf and nan as
bits), TIR names kept apart from GLSL's; a grid wider than 65535
workgroups folded into two dimensions; what it cannot emit is a
CompileError naming the kernel."""
import re

import pytest
from gpu_models import glsl_to_spirv, needs_tools, SPIRV_MAGIC

from coldbrew.compiler import CompileError
from coldbrew.compiler.gpu import codegen_spirv, glsl, schedule_gpu

tvm = pytest.importorskip("tvm")
from tvm.script import tirx as T  # noqa: E402


def device(func, name="f"):
    """The device kernels of one PrimFunc as codegen_spirv lowers them: [(kernel name, device PrimFunc)]."""
    return codegen_spirv.lower({name: func})[name]


def emit_one(func, name="f"):
    (kernel, dev), = device(func, name)
    return glsl.emit(dev, kernel)


@T.prim_func
def exp_plus_one(a_h: T.handle, input_h: T.handle):
    A = T.match_buffer(a_h, (1024,), "float32")
    input = T.match_buffer(input_h, (1024,), "float32")
    for bx in T.thread_binding(4, thread="blockIdx.x"):
        for tx in T.thread_binding(256, thread="threadIdx.x"):
            input[bx * 256 + tx] = T.exp(A[bx * 256 + tx]) + T.float32(1)


@needs_tools
def test_elementwise_kernel_becomes_a_compute_shader(tmp_path):
    sh = emit_one(exp_plus_one)
    assert sh.name == "f_kernel" and sh.local_size == (256, 1, 1) and sh.grid == (4, 1, 1)
    assert sh.params == ["A_ptr", "input_ptr"]  # binding order: the kernel's parameters
    src = sh.source
    assert src.startswith("#version 450\n")
    assert "layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;" in src
    decls = re.findall(r"layout\(std430, set = 0, binding = (\d)\) buffer B\d \{ float (\w+)\[\]; \};", src)
    assert decls == [("0", "v_A_ptr"), ("1", "v_input_ptr")]  # `input` is a GLSL keyword: prefixed
    assert "exp(v_A_ptr[" in src and "int(gl_LocalInvocationID.x)" in src and "int(gl_WorkGroupID.x)" in src
    assert glsl_to_spirv(src, tmp_path)[:4] == SPIRV_MAGIC


@T.prim_func
def special_floats(a_h: T.handle, b_h: T.handle):
    A = T.match_buffer(a_h, (256,), "float32")
    B = T.match_buffer(b_h, (256,), "float32")
    for tx in T.thread_binding(256, thread="threadIdx.x"):
        B[tx] = (T.Select(A[tx] > T.float32(0), T.float32("inf"), T.float32(0.1))
                 + T.Select(A[tx] < T.float32(-1), T.float32("-inf"), T.float32("nan")))


@needs_tools
def test_float_constants_are_exact_and_inf_nan_are_bit_patterns(tmp_path):
    src = emit_one(special_floats).source
    assert "0.10000000149011612" in src  # float32(0.1) exactly, not 0.1
    for bits in ("0x7f800000u", "0xff800000u", "0x7fc00000u"):
        assert f"uintBitsToFloat({bits})" in src
    glsl_to_spirv(src, tmp_path)


@needs_tools
def test_shared_memory_and_barriers_of_a_reduction(tmp_path):
    """A row sum as dlight schedules it: a cooperative tree in shared memory, barriers between steps."""
    from tvm import te

    a = te.placeholder((64, 128), name="A")
    k = te.reduce_axis((0, 128), name="k")
    s = te.compute((64,), lambda i: te.sum(a[i, k], axis=k), name="S")
    func = schedule_gpu.apply(tvm.IRModule({"rowsum": te.create_prim_func([a, s])}))["rowsum"]
    sh = emit_one(func, "rowsum")
    shared = re.findall(r"^shared float (\w+)\[(\d+)\];$", sh.source, re.M)
    assert shared and int(shared[0][1]) == sh.local_size[0]  # one slot per invocation
    assert sh.source.count("memoryBarrierShared(); barrier();") >= 2
    assert sh.params == ["A_ptr", "S_ptr"] and sh.grid == (64, 1, 1)
    glsl_to_spirv(sh.source, tmp_path)


@T.prim_func
def wide_grid(a_h: T.handle, b_h: T.handle):
    A = T.match_buffer(a_h, (70000 * 64,), "float32")
    B = T.match_buffer(b_h, (70000 * 64,), "float32")
    for bx in T.thread_binding(70000, thread="blockIdx.x"):
        for tx in T.thread_binding(64, thread="threadIdx.x"):
            B[bx * 64 + tx] = A[bx * 64 + tx] * T.float32(2)


@needs_tools
def test_a_grid_past_65535_workgroups_is_folded(tmp_path):
    sh = emit_one(wide_grid)
    assert sh.grid == (glsl.MAX_GROUPS, 2, 1) and sh.local_size == (64, 1, 1)
    # the shader rebuilds the workgroup index and returns past the end
    assert "int cb_group_x = int(gl_WorkGroupID.x + gl_WorkGroupID.y * 65535u);" in sh.source
    assert "if (cb_group_x >= 70000) return;" in sh.source
    glsl_to_spirv(sh.source, tmp_path)
    assert emit_one(exp_plus_one).grid == (4, 1, 1)  # a grid within the limit is not folded


@T.prim_func
def wide_2d_grid(a_h: T.handle, b_h: T.handle):
    A = T.match_buffer(a_h, (256,), "float32")
    B = T.match_buffer(b_h, (256,), "float32")
    for bx in T.thread_binding(70000, thread="blockIdx.x"):
        for by in T.thread_binding(2, thread="blockIdx.y"):
            for tx in T.thread_binding(2, thread="threadIdx.x"):
                B[tx] = A[tx]


@T.prim_func
def float64(a_h: T.handle, b_h: T.handle):
    A = T.match_buffer(a_h, (256,), "float64")
    B = T.match_buffer(b_h, (256,), "float64")
    for tx in T.thread_binding(256, thread="threadIdx.x"):
        B[tx] = A[tx] * T.float64(2)


@T.prim_func
def int8(a_h: T.handle, b_h: T.handle):
    A = T.match_buffer(a_h, (256,), "int8")
    B = T.match_buffer(b_h, (256,), "int8")
    for tx in T.thread_binding(256, thread="threadIdx.x"):
        B[tx] = A[tx]


@T.prim_func
def extern_call(a_h: T.handle, b_h: T.handle):
    A = T.match_buffer(a_h, (256,), "float32")
    B = T.match_buffer(b_h, (256,), "float32")
    for tx in T.thread_binding(256, thread="threadIdx.x"):
        B[tx] = T.call_pure_extern("float32", "mystery", A[tx])


@T.prim_func
def big_workgroup(a_h: T.handle, b_h: T.handle):
    A = T.match_buffer(a_h, (2048,), "float32")
    B = T.match_buffer(b_h, (2048,), "float32")
    for tx in T.thread_binding(2048, thread="threadIdx.x"):
        B[tx] = A[tx]


@T.prim_func
def scalar_param(a_h: T.handle, b_h: T.handle, n: T.int32):
    A = T.match_buffer(a_h, (256,), "float32")
    B = T.match_buffer(b_h, (256,), "float32")
    for tx in T.thread_binding(256, thread="threadIdx.x"):
        B[tx] = A[tx] * T.Cast("float32", n)


@T.prim_func
def int_floordiv(a_h: T.handle, d_h: T.handle, b_h: T.handle):
    A = T.match_buffer(a_h, (256,), "int32")
    D = T.match_buffer(d_h, (256,), "int32")
    B = T.match_buffer(b_h, (256,), "int32")
    for tx in T.thread_binding(256, thread="threadIdx.x"):
        B[tx] = T.floordiv(A[tx], D[tx]) * 7 + T.floormod(A[tx], D[tx])


@pytest.mark.parametrize("func, message", [
    (wide_2d_grid, "grid 70000x2x1 exceeds 65535 per dimension"),
    (float64, "dtype float64 has no GLSL form"),
    (int8, "dtype int8 has no GLSL form"),
    (extern_call, "external function mystery has no GLSL form"),
    (big_workgroup, r"workgroup of 2048 invocations \(at most 1024\)"),
    (scalar_param, "scalar parameter 'n' is not supported"),
    (int_floordiv, "expression-level let is not supported"),
], ids=["2d_grid_too_wide", "float64", "int8", "extern", "workgroup_2048", "scalar_param", "let"])
def test_what_has_no_glsl_form_is_a_compile_error(func, message):
    (kernel, dev), = device(func, "bad")
    with pytest.raises(CompileError, match=f"^GPU kernel bad_kernel: {message}$"):
        glsl.emit(dev, kernel)


def test_fresh_names_are_prefixed_sanitized_and_distinct():
    e = glsl._Emitter(None, "k")
    assert [e.fresh("input"), e.fresh("input"), e.fresh("a.b[0]"), e.fresh("input")] == [
        "v_input", "v_input_1", "v_a_b_0_", "v_input_2"]


@T.prim_func
def clamp_to_int64_max(a_h: T.handle, b_h: T.handle):
    A = T.match_buffer(a_h, (256,), "int64")
    B = T.match_buffer(b_h, (256,), "float32")
    for tx in T.thread_binding(256, thread="threadIdx.x"):
        B[tx] = T.Cast("float32", T.max(T.min(A[tx], T.int64(9223372036854775807)), T.int64(-9223372036854775808))) \
            + T.Cast("float32", T.int64(1 << 40))


@T.prim_func
def max_with_int64_max(a_h: T.handle, b_h: T.handle):
    A = T.match_buffer(a_h, (256,), "int64")
    B = T.match_buffer(b_h, (256,), "int64")
    for tx in T.thread_binding(256, thread="threadIdx.x"):
        B[tx] = T.max(A[tx], T.int64(1 << 40))


@needs_tools
def test_int64_constants_beyond_32_bits_clamp_to_the_32_bit_side_or_are_refused(tmp_path):
    """Shaders compute int64 in 32 bits: a clamp to INT64_MAX / INT64_MIN
    (an exporter's) keeps the value (taken modulo 2^32 it would be -1 / 0),
    a wide constant cast to float keeps its value, and a max whose answer
    would be the wide constant is refused."""
    src = emit_one(clamp_to_int64_max).source
    assert "min(" not in src and "max(" not in src and "(-1)" not in src and "1099511627776.0" in src
    glsl_to_spirv(src, tmp_path)
    (kernel, dev), = device(max_with_int64_max, "wide")
    with pytest.raises(CompileError, match="max with the int64 constant 1099511627776 gives a value beyond 32 bits"):
        glsl.emit(dev, kernel)
