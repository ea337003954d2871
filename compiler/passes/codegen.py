"""Pass `codegen`: compile every layer's kernel with TVM's LLVM backend into
one shared object, the bundle's CPU code segment.

Each kernel is exported as `__tvm_ffi_<symbol>` (tvm-ffi packed calling
convention); the runtime resolves them once at load. The kernels are
compiled without TVM's argument checks (argument count, type codes, dtype,
shape, strides, each with its own error message: about two thirds of the
code). In their place the bundle records each kernel's argument dtypes and
byte sizes (`signatures`, `Bundle.kernels`) and the runtime checks every
call of the plan against them once, at open.

For another ISA (aarch64) TVM's LLVM writes the object file and LLVM's
linker `ld.lld` links it, stripped (`-s`): one tool for every target and no
C library needed at link time; its layout keeps RELRO without padding the
file to the 64 KiB maximum page size (GNU ld's does). The object's undefined
symbols resolve when the runtime dlopens it: TVMFFIErrorSetRaisedFromCStrParts
in the runtime, math and memory functions LLVM calls (erff, expf, memcpy) in
libm and libc, which it names by the soname of the triple's C library (glibc
or bionic).
"""
import os
import shutil
import subprocess
import tempfile

from ..errors import CompileError

NAME = "codegen"
CROSS_EMULATION = {"aarch64": "aarch64linux"}  # arch -> ld.lld emulation
LIBC_SONAMES = {"glibc": ("libm.so.6", "libc.so.6"), "bionic": ("libm.so", "libc.so")}


def apply(graph, target):
    import tvm

    funcs = {}
    for sym, func in sorted(graph.kernels.items()):
        funcs[sym] = func.with_attr("global_symbol", sym)
    mod = tvm.IRModule(funcs)
    try:
        # no argument checks in the kernels: the runtime checks every call against graph.signatures()
        with tvm.transform.PassContext(opt_level=3, config={"tirx.disable_assert": True}):
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
    if target.arch not in CROSS_EMULATION:
        raise CompileError(f"cross-compiling CPU code for {target.triple} is not supported "
                           f"(supported: {', '.join(CROSS_EMULATION)} and this machine's {os.uname().machine})")
    if not shutil.which("ld.lld"):
        raise CompileError(f"cannot link CPU code for {target.triple}: ld.lld not found "
                           "(install the Debian package lld)")
    # ld.lld records a library it is given as DT_NEEDED (--no-as-needed), so stand-ins linked from an
    # empty archive, carrying only the C library's sonames, name libm and libc without a sysroot.
    empty = os.path.join(tmp, "empty.a")
    with open(empty, "wb") as f:
        f.write(b"!<arch>\n")
    stubs = []
    for soname in LIBC_SONAMES["bionic" if target.triple.endswith("android") else "glibc"]:
        stubs.append(os.path.join(tmp, soname))
        _lld(target, "-m", CROSS_EMULATION[target.arch], "-soname", soname, "-o", stubs[-1], empty)
    obj = os.path.join(tmp, "kernels.o")
    lib.write_to_file(obj)
    _lld(target, "-s", "-O1", "-z", "now", "-z", "relro", "-z", "noexecstack", "--hash-style=both",
         "-o", so, obj, "--no-as-needed", *stubs)


def _lld(target, *args):
    r = subprocess.run(["ld.lld", "-shared", *args], capture_output=True, text=True)
    if r.returncode:
        raise CompileError(f"linking CPU code for {target.triple} failed: {r.stderr.strip()}")


def run(c):
    c.code = apply(c.graph, c.target)
    return c
