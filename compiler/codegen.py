"""Pass `codegen`: compile every layer's kernel with TVM's LLVM backend into
one shared object, the bundle's CPU code segment.

Each kernel is exported as `__tvm_ffi_<symbol>` (tvm-ffi packed calling
convention); the runtime resolves them once at load.
"""
import os
import subprocess
import tempfile

from .errors import CompileError

NAME = "codegen"


def run(graph, target):
    import tvm

    funcs = {}
    for sym, func in sorted(graph.kernels.items()):
        funcs[sym] = func.with_attr("global_symbol", sym)
    mod = tvm.IRModule(funcs)
    try:
        with tvm.transform.PassContext(opt_level=3):
            lib = tvm.tirx.build(mod, target=tvm.target.Target(target.llvm()))
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise CompileError(f"kernel code generation failed: {msg[-1] if msg else type(e).__name__}") from None
    with tempfile.TemporaryDirectory() as tmp:
        so = os.path.join(tmp, "kernels.so")
        if target.arch != os.uname().machine:
            raise CompileError(f"cross-compiling CPU code for {target.triple} is not available yet")
        lib.export_library(so)
        subprocess.run(["strip", "--strip-unneeded", so], check=True)
        with open(so, "rb") as f:
            return f.read()
