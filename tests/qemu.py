"""Run aarch64 bundles on this machine: the runtime and examples/c/run_bundle.c
cross-built for aarch64-linux-gnu, run under qemu-user with the Debian
cross sysroot (glibc). Used by tests/runtime/test_aarch64.py and
tests/aarch64_zoo.py; .ci/setup.sh installs the tools.

Bundles for Android name bionic's libm.so and libc.so (compiler/passes/codegen.py);
here those names are links to glibc's libraries, on the loader's path, so
the same code object runs. Bionic itself is not tested.
"""
import functools
import os
import re
import shutil
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRIPLE = "aarch64-linux-gnu"
SYSROOT = f"/usr/{TRIPLE}"
BIONIC_NAMES = {"libm.so": "libm.so.6", "libc.so": "libc.so.6"}
TOOLS = {"qemu-aarch64": "qemu-user", "ld.lld": "lld", f"{TRIPLE}-gcc": f"gcc-{TRIPLE}",
         f"{TRIPLE}-g++": f"g++-{TRIPLE}"}


class QemuError(RuntimeError):
    pass


def build_runner(out_dir):
    """Cross-build libcoldbrew.so and run_bundle into `out_dir`; the path of run_bundle."""
    missing = [f"{tool} (Debian package {pkg})" for tool, pkg in TOOLS.items() if not shutil.which(tool)]
    if not os.path.exists(f"{SYSROOT}/lib/libc.so.6"):
        missing.append(f"the {TRIPLE} C library (Debian package libc6-arm64-cross)")
    if missing:
        raise QemuError("aarch64 bundles are tested under qemu-user; missing: " + ", ".join(missing)
                        + " (bash .ci/setup.sh installs them)")
    sys.path.insert(0, os.path.join(ROOT, "runtime"))
    import build as runtime_build

    runtime_build.build(out_dir, triple=TRIPLE)
    os.makedirs(os.path.join(out_dir, "bionic"), exist_ok=True)
    for name, glibc_name in BIONIC_NAMES.items():
        link = os.path.join(out_dir, "bionic", name)
        if not os.path.lexists(link):
            os.symlink(f"{SYSROOT}/lib/{glibc_name}", link)
    return runtime_build.build_example(out_dir, triple=TRIPLE)


def tensors(path):
    """[(name, dtype, shape)] of a bundle's inputs and of its outputs, read from its header."""
    from coldbrew.compiler.bundle.multi import sections
    from coldbrew.compiler.ir.forms import DTYPES

    with open(path, "rb") as f:
        b = sections(f.read(), path)[0][1]  # (a multi-target bundle's sections take the same tensors)

    def info(ids):
        return [(t.name.decode(), np.dtype(DTYPES[t.dtype]), [int(d) for d in t.shape])
                for t in (b.tensors[i] for i in ids)]
    return info(b.inputs), info(b.outputs)


@functools.lru_cache(maxsize=None)
def cpus():
    """The CPUs qemu-aarch64 can emulate (`qemu-aarch64 -cpu help`; Debian 12's qemu-user 7.2:
    a64fx, cortex-a35, cortex-a53, cortex-a57, cortex-a72, cortex-a76, max, neoverse-n1).
    Without -cpu qemu-user emulates "max", every feature it has."""
    r = subprocess.run(["qemu-aarch64", "-cpu", "help"], capture_output=True, text=True, timeout=60)
    return tuple(line.split()[0] for line in r.stdout.splitlines()[1:] if line.strip())


def command(runner, cpu=None):
    """The command line that runs `runner` (build_runner's) under qemu, arguments to follow."""
    bionic = os.path.join(os.path.dirname(runner), "bionic")
    return ["qemu-aarch64", *(["-cpu", cpu] if cpu else []), "-L", SYSROOT, "-E", f"LD_LIBRARY_PATH={bionic}", runner]


def run(runner, bundle, inputs, work_dir, timeout=600, cpu=None, seen=None):
    """Run `bundle` once under qemu with the arrays `inputs` (in input order); its outputs as arrays.
    `cpu`: the CPU qemu emulates (`qemu-aarch64 -cpu NAME`, one of cpus()); None: qemu's default.
    `seen` (a dict) gets "target": the target the runtime opened (a multi-target bundle's section)."""
    if cpu is not None and cpu not in cpus():
        raise QemuError(f"qemu-aarch64 cannot emulate cpu '{cpu}' (it can: {', '.join(cpus())})")
    _, outs = tensors(bundle)
    files = []
    for k, x in enumerate(inputs):
        files.append(os.path.join(work_dir, f"input{k}.bin"))
        np.ascontiguousarray(x).tofile(files[-1])
    prefix = os.path.join(work_dir, "output")
    bionic = os.path.join(os.path.dirname(runner), "bionic")
    cmd = ["qemu-aarch64", *(["-cpu", cpu] if cpu else []), "-L", SYSROOT, "-E", f"LD_LIBRARY_PATH={bionic}",
           runner, bundle, prefix, *files]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise QemuError(f"run_bundle under qemu-aarch64 exited {r.returncode}: {r.stderr.strip()}")
    ran = {}  # each output's shape in the run (an output sized by the data is shorter than the bundle's)
    for line in r.stdout.splitlines():
        if line.startswith("target ") and seen is not None:
            seen["target"] = line.split(" ", 1)[1]
        m = re.match(r"output (\d+) .*, shape ([\dx]*)$", line)
        if m:
            ran[int(m.group(1))] = [int(d) for d in m.group(2).split("x") if d]
    return [np.fromfile(f"{prefix}{k}.bin", dtype).reshape(ran.get(k, shape)) for k, (_, dtype, shape) in enumerate(outs)]


def compile_and_run(runner, model, target, work_dir, seed=11, precision="fp32", cpu=None):
    """Compile `model` for `target`, run it under qemu (emulating `cpu`, see run) and in
    onnxruntime on the same random inputs; [(ours, onnxruntime's)] per output."""
    from coldbrew.compiler import compile_model

    path = os.path.join(work_dir, f"model-{target}.brew")
    compile_model(model, path, target=target, precision=precision)
    return run_and_compare(runner, model, path, work_dir, seed, cpu)


def run_and_compare(runner, model, path, work_dir, seed=11, cpu=None, seen=None):
    """Run the bundle at `path` (compiled from `model`) under qemu emulating `cpu` and `model` in
    onnxruntime on the same random inputs; [(ours, onnxruntime's)] per output (`seen`: see run)."""
    from conftest import ort_run

    ins, _ = tensors(path)
    rng = np.random.default_rng(seed)
    feeds = {name: rng.standard_normal(shape).astype(dtype) for name, dtype, shape in ins}
    ours = run(runner, path, list(feeds.values()), work_dir, cpu=cpu, seen=seen)
    return list(zip(ours, ort_run(model, feeds)))
