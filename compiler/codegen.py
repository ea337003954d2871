"""Pass `codegen`: compile every layer's kernel with TVM's LLVM backend into
one shared object, the bundle's CPU code segment.

Each kernel is exported as `__tvm_ffi_<symbol>` (tvm-ffi packed calling
convention); the runtime resolves them once at load.

For another ISA (aarch64) TVM's LLVM writes the object file and LLVM's
linker `ld.lld` links it alone, stripped (`-s`): one tool for every target,
no C library needed at link time and none named (no DT_NEEDED), so the same
file loads under glibc and bionic; its layout keeps RELRO without padding the
file to the 64 KiB maximum page size (GNU ld's does). Its few undefined
symbols (TVMFFIErrorSetRaisedFromCStrParts, and any libc/libm function LLVM
calls) resolve in the process that dlopens it: the runtime provides the first,
the C library the rest.
"""
import os
import shutil
import subprocess
import tempfile

from .errors import CompileError

NAME = "codegen"
CROSS_ARCHS = ("aarch64",)


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
        if target.arch == os.uname().machine:
            lib.export_library(so)
            subprocess.run(["strip", "--strip-unneeded", so], check=True)
        else:
            _cross_link(lib, target, tmp, so)
        with open(so, "rb") as f:
            return f.read()


def _cross_link(lib, target, tmp, so):
    if target.arch not in CROSS_ARCHS:
        raise CompileError(f"cross-compiling CPU code for {target.triple} is not supported "
                           f"(supported: {', '.join(CROSS_ARCHS)} and this machine's {os.uname().machine})")
    if not shutil.which("ld.lld"):
        raise CompileError(f"cannot link CPU code for {target.triple}: ld.lld not found "
                           "(install the Debian package lld)")
    obj = os.path.join(tmp, "kernels.o")
    lib.write_to_file(obj)
    r = subprocess.run(["ld.lld", "-shared", "-s", "-O1", "-z", "now", "-z", "relro", "-z", "noexecstack",
                        "--hash-style=both", "-o", so, obj], capture_output=True, text=True)
    if r.returncode:
        raise CompileError(f"linking CPU code for {target.triple} failed: {r.stderr.strip()}")
