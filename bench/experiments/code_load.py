"""What making a bundle's kernel code callable costs, three ways, each
timed in fresh processes (bench/experiments/code_load.c): the runtime's
(decode the LZ4 block into a memfd, dlopen it), decoding into anonymous
memory and relocating without the loader, and mapping the plain object's
segments straight from the file (in the page cache) and relocating: no
copy at all. The arms alternate in rounds; medians, microseconds.

    python bench/experiments/code_load.py [models...] [--rounds 15]

x86-64 hosts; needs gcc. Models: zoo names or corpus:NAME (the bundle is
compiled with the defaults, host target).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: harness
from harness.common import host_isa, model_source  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ARMS = ("memfd", "anon", "inplace")


def build(work):
    import coldbrew.runtime

    lib = os.path.dirname(os.path.abspath(coldbrew.runtime.__file__))  # libcoldbrew.so: cb_lz4_decode
    exe = os.path.join(work, "code_load")
    subprocess.run(["gcc", "-O2", "-o", exe, os.path.join(HERE, "code_load.c"), f"-L{lib}", "-lcoldbrew",
                    f"-Wl,-rpath,{lib}", "-ldl"], check=True)
    return exe


def code_files(name, work):
    """(plain file, offset, size, LZ4 file, a kernel symbol) of the model's host bundle's code."""
    import lz4.block

    from coldbrew.compiler import compile_model
    from coldbrew.compiler.bundle.reader import cpu_step, read_bytes, text

    model, shapes, binds = model_source(name)
    data = compile_model(model, input_shapes=shapes, constants=binds)
    b = read_bytes(data)[0]
    seg = next(s for s in b.segments if s.kind in (2, 4))  # cpu_code, cpu_code_lz4
    body = data[seg.offset:seg.offset + seg.size]
    plain = lz4.block.decompress(body, uncompressed_size=seg.rawSize) if seg.kind == 4 else body
    packed = body if seg.kind == 4 else lz4.block.compress(body, mode="high_compression", store_size=False)
    tag = name.replace(":", "_")
    at = 3 * 4096  # page-aligned, as a bundle stores plain code
    with open(os.path.join(work, f"{tag}.plain"), "wb") as f:
        f.write(bytes(at) + plain)
    with open(os.path.join(work, f"{tag}.lz4"), "wb") as f:
        f.write(packed)
    kernel = next(text(cpu_step(st).kernel) for st in b.plan.steps
                  if cpu_step(st) and not text(cpu_step(st).kernel).startswith("cb."))
    symbol = "__tvm_ffi_" + kernel
    return os.path.join(work, f"{tag}.plain"), at, len(plain), os.path.join(work, f"{tag}.lz4"), symbol


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["corpus:ch_ppocr_mobile_v2_0_cls_infer", "squeezenet", "mobilenet_v2"])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    print(f"# code load, {args.rounds} fresh processes per arm, arms alternating; host {host_isa()}; microseconds")
    with tempfile.TemporaryDirectory() as work:
        exe = build(work)
        for name in args.models:
            plain, at, size, packed, symbol = code_files(name, work)
            subprocess.run(["cat", plain], stdout=subprocess.DEVNULL, check=True)  # in the page cache
            times = {a: [] for a in ARMS}
            for r in range(args.rounds):
                for arm in ARMS[r % 3:] + ARMS[:r % 3]:
                    out = subprocess.run([exe, arm, plain, str(at), str(size), packed, symbol], capture_output=True,
                                         text=True, check=True).stdout.split()
                    assert out[2] == "found", (name, arm, out)
                    times[arm].append(float(out[1]))
            med = {a: statistics.median(t) for a, t in times.items()}
            print(f"{name:40s} code {size:>9,} B: " + ", ".join(f"{a} {med[a]:7.1f}" for a in ARMS) +
                  f"  (inplace / memfd {med['inplace'] / med['memfd']:.2f})", flush=True)


if __name__ == "__main__":
    main()
