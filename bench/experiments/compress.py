"""Does lossless compression of fp16 weights pay on this machine? Measured,
not built: a weight form is worth adding only if a preparation core
decompresses faster than the bytes it saves take to read.

    python bench/experiments/compress.py [models...]     (codecs: zlib from Python; zstandard, lz4 from `.[bench]`)

Per zoo model: its conv/dense weights as the fp16 bundle stores them (raw
layout), byte-shuffled (all low bytes, then all high bytes: the exponent
bytes compress, the mantissa bytes barely), then per codec the compressed
size and the one-thread decompression rate (median of 5, in-memory). The
storage's cold read bandwidth is measured in the same run. Compression pays
when reading the compressed bytes and decompressing them on one core is
faster than reading the fp16 bytes:

    C / bandwidth + U / decompress rate < U / bandwidth

(a preparation core that decompresses while the next bytes arrive could
overlap the two: the condition then is max(C / bandwidth, U / rate) <
U / bandwidth, printed too).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: harness, peers
from harness.common import geomean, host_isa, zoo  # noqa: E402
from peers import read_bandwidth  # noqa: E402


def fp16_weights(model):
    """The conv/dense weights of `model` in fp16, raw layout, one buffer."""
    import onnx
    from onnx import numpy_helper

    kept = {n.input[1] for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul") and len(n.input) > 1}
    arrays = [numpy_helper.to_array(t) for t in model.graph.initializer if t.name in kept]
    del onnx
    return np.concatenate([a.astype(np.float16).ravel() for a in arrays if a.dtype == np.float32])


def shuffle(half):
    b = half.view(np.uint8).reshape(-1, 2)
    return np.ascontiguousarray(b.T).tobytes()


def codecs():
    out = {"zlib-1": (lambda d: zlib.compress(d, 1), zlib.decompress)}
    try:
        import zstandard

        for level in (1, 3):
            c, d = zstandard.ZstdCompressor(level=level), zstandard.ZstdDecompressor()
            out[f"zstd-{level}"] = (c.compress, d.decompress)
    except ImportError:
        pass
    try:
        import lz4.frame

        out["lz4"] = (lz4.frame.compress, lz4.frame.decompress)
    except ImportError:
        pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["alexnet", "resnet50", "googlenet", "mobilenet_v2", "squeezenet"])
    args = ap.parse_args()
    z = zoo()
    with tempfile.TemporaryDirectory() as work:
        bw = read_bandwidth(work)
    cs = codecs()
    print(f"# fp16 weights compressed ({host_isa()}; read bandwidth {bw / 1e9:.2f} GB/s cold; one thread)\n")
    print("| model | codec | fp16 MB | compressed / fp16 | decompress GB/s | read fp16 ms | read + decompress ms "
          "| overlapped ms | pays |")
    print("|" + " --- |" * 9)
    gains = {k: [] for k in cs}
    for name in args.models:
        data = shuffle(fp16_weights(z.build(name)))
        u = len(data)
        for cname, (comp, decomp) in cs.items():
            packed = comp(data)
            times = []
            for _ in range(5):
                t = time.perf_counter()
                decomp(packed)
                times.append(time.perf_counter() - t)
            rate = u / statistics.median(times)
            plain = u / bw * 1e3
            serial = (len(packed) / bw + u / rate) * 1e3
            overlap = max(len(packed) / bw, u / rate) * 1e3
            gains[cname].append(plain / overlap)
            print(f"| {name} | {cname} | {u / 1e6:.1f} | {len(packed) / u:.3f} | {rate / 1e9:.2f} | {plain:.1f} | "
                  f"{serial:.1f} | {overlap:.1f} | {'yes' if serial < plain else ('overlapped only' if overlap < plain else 'no')} |")
    print()
    for cname, g in gains.items():
        print(f"{cname}: read fp16 / (read compressed, overlapped with decompressing) = {geomean(g):.2f}x (geomean)")


if __name__ == "__main__":
    main()
