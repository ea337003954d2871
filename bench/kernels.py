"""Kernel benchmark: per layer of a model and per kernel variant, the weight
transform time, execute time and raw/transformed weight bytes, beside
onnxruntime running the same layer alone (same thread count).

    python bench/kernels.py resnet50 [--threads 2] [--layers 12]

Identical layers (same shape) are measured once. Prints the fastest variant
per layer and, per layer, how its execution compares with onnxruntime's.
"""
import argparse
import os

from common import conv_model, geomean, median_ms, ort_session, zoo
import numpy as np  # noqa: E402  (after common: it sets the BLAS threads)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=0, help="only the first N distinct layers")
    ap.add_argument("--no-search", action="store_true", help="default schedule parameters only")
    args = ap.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    from coldbrew.compiler.measure import anchors_of, candidates
    from coldbrew.targets import resolve

    target = resolve("host")
    anchors = anchors_of(zoo().build(args.model))
    seen, ratios, winograd = {}, [], []
    print(f"{'layer':<6} {'shape':<44} {'variant':<26} {'params':<20} {'transform':>9} {'execute':>8} "
          f"{'raw B':>10} {'trans B':>10} {'ort':>8}")
    for a in anchors:
        if a.spec in seen:
            continue
        if args.layers and len(seen) >= args.layers:
            break
        op = a.variant.op
        results = candidates(a.spec, op, target, search=not args.no_search)
        seen[a.spec] = results[0]
        m, xs = conv_model(a.spec, a.raw)
        sess = ort_session(m, args.threads)
        x = np.random.default_rng(0).standard_normal(xs).astype(np.float32)
        ort_ms = median_ms(lambda: sess.run(None, {"x": x}))
        shape = _describe(a.spec)
        for k, r in enumerate(results):
            params = ",".join(f"{key}={val}" for key, val in r.params.items())
            print(f"{a.id if k == 0 else '':<6} {shape if k == 0 else '':<44} {r.variant:<26} {params:<20} "
                  f"{r.transform_ms:>8.3f}m {r.exec_ms:>7.3f}m {r.raw_bytes:>10,} {r.transformed_bytes:>10,} "
                  f"{ort_ms if k == 0 else float('nan'):>7.3f}m")
        ratios.append(results[0].exec_ms / ort_ms)
        wino = [r for r in results if "winograd" in r.variant]
        gemm = [r for r in results if "gemm" in r.variant or "direct" in r.variant]
        if wino and gemm:
            winograd.append((a.id, min(wino, key=lambda r: r.exec_ms), min(gemm, key=lambda r: r.exec_ms)))
    print(f"\nfastest variant vs onnxruntime per layer (execute time ratio, <1 = coldbrew faster): "
          f"geomean {geomean(ratios):.2f}x over {len(ratios)} distinct layers")
    if winograd:
        print("\nwinograd vs the best GEMM/direct variant (the paper's Table 2 trade-off):")
        for lid, w, g in winograd:
            print(f"  {lid:<5} {w.variant:<24} exec {w.exec_ms:7.3f} ms transform {w.transform_ms:7.3f} ms | "
                  f"{g.variant:<22} exec {g.exec_ms:7.3f} ms transform {g.transform_ms:7.3f} ms")


def _describe(spec):
    if hasattr(spec, "out_h"):
        return (f"c{spec.c}x{spec.h}x{spec.w}->k{spec.k} {spec.r}x{spec.s} s{spec.stride[0]} "
                f"g{spec.groups}" + (f" d{spec.dilation[0]}" if spec.dilation != (1, 1) else ""))
    return f"dense {spec.m}x{spec.k}x{spec.n}"


if __name__ == "__main__":
    main()
