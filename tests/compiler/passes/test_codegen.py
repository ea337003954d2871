"""compiler/passes/codegen.py: every kernel of the graph compiled into one
shared object that exports each under `__tvm_ffi_<symbol>`, without TVM's
argument checks (the runtime checks the calls against the recorded
signatures instead); a kernel that does not compile, or an ISA it cannot
link for, is a CompileError."""
import dataclasses
import subprocess

import pytest

from coldbrew.compiler import CompileError
from coldbrew.compiler.passes import codegen
from coldbrew.compiler.options import Choices, Options


@pytest.fixture(scope="module")
def host():
    from coldbrew.targets import resolve

    return resolve("host")


@pytest.fixture(scope="module")
def graph(small_model, host):
    """The small model lowered with raw weights: execute and transform kernels."""
    from coldbrew.compiler import pipeline

    return pipeline.lower(pipeline.front_end(small_model), Choices(None, "raw", 2, 0))


def _exported(code, tmp_path):
    so = tmp_path / "kernels.so"
    so.write_bytes(code)
    nm = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}


def test_every_kernel_is_exported_from_one_shared_object(graph, host, tmp_path):
    assert any(s.startswith("cb_transform_") for s in graph.kernels) and len(graph.kernels) >= 4
    code = codegen.apply(graph, host)
    assert code[:4] == b"\x7fELF" and code[16] == 3  # ET_DYN: a shared object
    exported = _exported(code, tmp_path)
    assert {f"__tvm_ffi_{s}" for s in graph.kernels} <= exported, sorted(exported)
    # no argument checks compiled in: their messages ("Mismatched type on argument #0 when calling: ...") are absent
    assert b"on argument #" not in code and b" when calling:" not in code
    # the pass entry leaves the same code on the compilation
    from coldbrew.compiler.pipeline import Compilation

    c = codegen.run(Compilation(graph=graph, options=Options(target=host)))
    assert _exported(c.code, tmp_path) == exported


def test_a_kernel_that_does_not_compile_is_a_compile_error(host):
    from tvm import te, tirx

    from coldbrew.compiler.ir.graph import Graph

    a = te.placeholder((4,), name="a")
    good = te.create_prim_func([a, te.compute((4,), lambda i: a[i] * 2, name="b")])
    out = tirx.decl_buffer((4,), "float32", "out")
    free = tirx.Var("free", "int32")  # used, but not an argument: no code can be made
    bad = tirx.PrimFunc([out], tirx.BufferStore(out, tirx.Cast("float32", free), [0]))
    assert codegen.apply(Graph("m", kernels={"good": good}), host)[:4] == b"\x7fELF"
    with pytest.raises(CompileError, match="kernel code generation failed: .*free") as e:
        codegen.apply(Graph("m", kernels={"good": good, "bad": bad}), host)
    assert e.value.__suppress_context__  # one line, not TVM's traceback


def test_cross_compiling_for_an_isa_without_a_linker_setup_is_refused(graph, host):
    riscv = dataclasses.replace(host, triple="riscv64-linux-gnu", cpu="generic-rv64")
    with pytest.raises(CompileError, match=r"cross-compiling CPU code for riscv64-linux-gnu is not supported "
                                           r"\(supported: aarch64 and this machine's"):
        codegen.apply(graph, riscv)
