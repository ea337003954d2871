"""Does the CPU code segment's LZ4 block pay on this machine? Per model, the
bundle compiled twice, its code stored plain and as an LZ4 block
(compiler/passes/write_bundle.py's pack_code), then:

- the code's decoded and compressed sizes;
- the runtime's decoder rate (cb_lz4_decode, one thread, median of 200)
  and the time to read the saved bytes at the storage bandwidth measured
  in the same run (bench/peers.py's measurement);
- cold load + first result of both bundles (bench/harness/cold_sample.py: a fresh
  process per sample, the page cache dropped before each, each arm reading
  its own file, the arms' order alternating per round), medians.

    python bench/experiments/code_codec.py [models...] [--rounds 10]
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: harness, peers
from harness.common import host_isa, zoo  # noqa: E402
from coldbrew.compiler.measure.protocol import cold_process, describe as cold_protocol  # noqa: E402
import peers  # noqa: E402

SAMPLER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "harness", "cold_sample.py")


def compile_both(model, out):
    """{"plain": path, "lz4": path} of `model` compiled with each code encoding."""
    from coldbrew.compiler import compile_model
    from coldbrew.compiler.passes import write_bundle
    from coldbrew.schemas.generated import bundle_generated as fb

    packed = write_bundle.pack_code
    paths = {}
    for arm, pack in (("plain", lambda code: (fb.SegmentKind.cpu_code, code, 0)), ("lz4", packed)):
        write_bundle.pack_code = pack
        try:
            paths[arm] = os.path.join(out, f"{arm}.brew")
            compile_model(model, paths[arm])
        finally:
            write_bundle.pack_code = packed
    return paths


def decode_rate(path):
    """(decoded bytes, compressed bytes, ms to decode on one thread)."""
    from coldbrew.compiler.bundle.reader import read
    from coldbrew.runtime import testing_function
    from coldbrew.schemas.generated import bundle_generated as fb

    b = read(path)[0]
    seg = next(s for s in b.segments if s.kind == fb.SegmentKind.cpu_code_lz4)
    with open(path, "rb") as f:
        f.seek(seg.offset)
        src = f.read(seg.size)
    fn = testing_function("cb_lz4_decode", ctypes.c_int64, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_void_p,
                          ctypes.c_uint64)
    dst = ctypes.create_string_buffer(seg.rawSize)
    times = []
    for _ in range(200):
        t = time.perf_counter()
        n = fn(src, len(src), dst, seg.rawSize)
        times.append((time.perf_counter() - t) * 1e3)
        assert n == seg.rawSize
    return seg.rawSize, seg.size, statistics.median(times)


def cold_ms(path):
    out = cold_process([sys.executable, SAMPLER, path], capture_output=True, text=True,
                       env=dict(os.environ, OPENBLAS_NUM_THREADS="1"), check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["cold_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["squeezenet", "mobilenet_v2", "shufflenet_v2"])
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    z = zoo()
    with tempfile.TemporaryDirectory(prefix="coldbrew-codec-") as tmp:
        bundles = {}
        for name in args.models:
            os.makedirs(os.path.join(tmp, name))
            bundles[name] = compile_both(z.build(name), os.path.join(tmp, name))
        bw = peers.read_bandwidth(tmp) / 1e6  # MB/s, this run's storage
        samples = {(m, arm): [] for m in bundles for arm in ("plain", "lz4")}
        for r in range(args.rounds):
            for m, arms in bundles.items():
                for arm in (("plain", "lz4") if r % 2 == 0 else ("lz4", "plain")):
                    samples[(m, arm)].append(cold_ms(arms[arm]))
        print(f"# CPU code plain vs LZ4 ({host_isa()}, read bandwidth {bw:.0f} MB/s; "
              f"{args.rounds} rounds, arms alternating, medians; {cold_protocol()})")
        print("| model | code KB | LZ4 KB | decode ms | saved bytes' read ms | cold plain ms | cold LZ4 ms | LZ4 / plain |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for m, arms in bundles.items():
            raw, packed, dec = decode_rate(arms["lz4"])
            plain, lz4 = (statistics.median(samples[(m, a)]) for a in ("plain", "lz4"))
            print(f"| {m} | {raw / 1e3:.1f} | {packed / 1e3:.1f} | {dec:.3f} | {(raw - packed) / (bw * 1e3):.3f} | "
                  f"{plain:.2f} | {lz4:.2f} | {lz4 / plain:.3f} |")


if __name__ == "__main__":
    main()
