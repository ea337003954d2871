"""Multi-target bundles: one file for several targets against the
single-target bundles it replaces, in bytes and in cold start.

    python bench/targets.py [models...] [--targets host,x86_64-avx2,aarch64,sd855,vulkan] [--samples 7]

Per model (zoo names, or corpus:NAME once bench/corpus/fetch.py has
fetched the corpus): a bundle for each target alone and one for the whole
list (compiler/bundle/multi.py). Bytes: the multi-target file against the
largest single-target bundle plus the other targets' code (their code
and SPIR-V segments: what a file with no weight stored twice would add),
and against the sum of the single bundles. Cold: fresh-process samples
(bench/harness/cold_sample.py) of the host-only bundle and of the
multi-target one on this machine (which opens its host section), and of
a byte-identical copy of the host-only file (the control: what two files
of the same bytes differ by on this storage), interleaved in rounds whose
order rotates; the ratios of medians.
"""
import argparse
import os
import shutil
import statistics
import tempfile

from harness.common import host_isa, model_source
from cold import samples

MODELS = ["mobilenet_v2", "resnet18", "squeezenet", "corpus:ch_pp_ocrv4_det_infer", "corpus:ch_pp_ocrv4_rec_infer",
          "corpus:ch_ppocr_mobile_v2_0_cls_infer"]
CODE_KINDS = (2, 3, 4)  # cpu_code, spirv, cpu_code_lz4 (schemas/bundle.fbs SegmentKind)


def code_bytes(data):
    from coldbrew.compiler.bundle.multi import sections

    return sum(s.size for _, b, _ in sections(data) for s in b.segments if s.kind in CODE_KINDS)


def run_model(name, targets, args, work):
    from coldbrew.compiler import compile_model

    model, shapes, binds = model_source(name)
    if model is None:
        print(f"{name}: not fetched (python bench/corpus/fetch.py), skipped")
        return None
    opts = dict(input_shapes=shapes, constants=binds, threads=args.threads)
    tag = name.replace(":", "_")
    single = {t: compile_model(model, os.path.join(work, f"{tag}.{t}.brew"), target=t, **opts) for t in targets}
    multi_path = os.path.join(work, f"{tag}.multi.brew")
    multi = compile_model(model, multi_path, target=",".join(targets), **opts)
    largest = max(single, key=lambda t: len(single[t]))
    floor = len(single[largest]) + sum(code_bytes(single[t]) for t in targets if t != largest)
    row = {"model": name, "multi": len(multi), "single": {t: len(d) for t, d in single.items()},
           "largest": largest, "floor": floor, "ratio": len(multi) / floor,
           "vs_sum": len(multi) / sum(len(d) for d in single.values())}
    print(f"{name:34s} multi {len(multi):>12,} B; largest single ({largest}) {len(single[largest]):>12,} B + others' "
          f"code = {floor:>12,} B: {row['ratio']:.2f}x (bound 1.3); {row['vs_sum']:.2f}x the {len(targets)} singles",
          flush=True)
    if "host" in targets and args.samples:
        host = os.path.join(work, f"{tag}.host.brew")
        flags = ["--threads", str(args.threads)]
        control = os.path.join(work, f"{tag}.host-copy.brew")  # the same bytes, another file: the noise floor
        shutil.copyfile(host, control)
        cold = samples(args.samples, (host, flags), (control, flags), (multi_path, flags))
        c = [statistics.median(r["cold_ms"] for r in k) for k in cold]
        row.update(cold_host_ms=c[0], cold_multi_ms=c[2], cold_ratio=c[2] / c[0], cold_control_ratio=c[1] / c[0])
        print(f"{'':34s} cold host-only {c[0]:7.2f} ms, multi-target {c[2]:7.2f} ms: {c[2] / c[0]:.3f}x "
              f"(bound 1.05); a copy of the host-only file {c[1] / c[0]:.3f}x (same bytes: the noise); "
              f"{args.samples} samples each, interleaved, order rotating", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=MODELS)
    ap.add_argument("--targets", default="host,x86_64-avx2,aarch64,sd855,vulkan")
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    targets = args.targets.split(",")
    print(f"# multi-target bundles ({args.targets}) against single-target ones; host {host_isa()}, "
          f"{args.threads} threads")
    with tempfile.TemporaryDirectory() as work:
        rows = [r for r in (run_model(m, targets, args, work) for m in args.models) if r]
    if rows:
        worst = max(rows, key=lambda r: r["ratio"])
        print(f"summary: bytes {min(r['ratio'] for r in rows):.2f}-{worst['ratio']:.2f}x of the bound's base "
              f"(worst {worst['model']})" + (f"; cold multi / host-only {min(r['cold_ratio'] for r in rows):.3f}-"
                                             f"{max(r['cold_ratio'] for r in rows):.3f}x"
                                             if all("cold_ratio" in r for r in rows) else ""))


if __name__ == "__main__":
    main()
