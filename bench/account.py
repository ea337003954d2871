"""Where every millisecond of a cold start goes, beside its floor.

    python bench/account.py [models...] [--samples 7] [--threads 2] [--corpus]

Per model (zoo names, or corpus:NAME once bench/corpus/fetch.py has
fetched the corpus; --corpus adds every fetched corpus model): one bundle
(the default plan), `--samples` traced cold samples in fresh processes
(bench/harness/cold_sample.py --trace --runs 5, page cache dropped), and
the account of the median one (compiler/tools/trace_export.py account):
what the executing thread spent its time on — opening (verify, the pool's
thread start, code load, session), reading weights it waited for,
transforming, executing, the caller's own between the runtime's calls
(open, session, run: the language binding's), idle waits for a
preparation worker or the streamer, and what the caller and the library
spent before the open and after the result —
with the page faults it took (their cost per fault measured here on fresh
memory: a part of the phases, not added) and what other threads did
meanwhile. The floor is the larger of the warm time (the median of the
later runs) and the bundle's bytes over this machine's read rate
(compiler/measure/protocol.py read_rate, measured once in the run); the
issue's bound: cold within 1.3x of a floor of 5 ms or more, else within
the floor + 1.5 ms.
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cold import samples  # noqa: E402
from harness.common import host_isa, model_source  # noqa: E402
from peers import read_bandwidth  # noqa: E402

MODELS = ["squeezenet", "mobilenet_v2", "resnet18", "corpus:ch_ppocr_mobile_v2_0_cls_infer",
          "corpus:ch_pp_ocrv4_det_infer"]
OPEN = ("verify", "thread_start", "code_load", "session")


def corpus_names():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"))
    import fetch

    return [f"corpus:{e['name']}" for e in fetch.models(None) if fetch.fetched(e)]


def bound_ms(floor):
    return 1.3 * floor if floor >= 5 else floor + 1.5


def measure(name, args, work, rate, fault_us):
    from coldbrew.compiler import compile_model
    from coldbrew.compiler.tools import trace_export

    model, shapes, binds = model_source(name)
    path = os.path.join(work, name.replace(":", "_") + ".brew")
    data = compile_model(model, path, input_shapes=shapes, constants=binds, threads=args.threads)
    (runs,) = samples(args.samples, (path, ["--threads", str(args.threads), "--trace", "--runs", "5"]))
    runs.sort(key=lambda r: r["cold_ms"])
    mid = runs[len(runs) // 2]
    warm = statistics.median(t for r in runs for t in r["runs_ms"])
    floor = max(warm, len(data) / rate * 1e3)
    a = trace_export.account(mid["events"], mid["cold_ms"], fault_us)
    ph = a["phase_ms"]
    row = {"model": name, "bytes": len(data), "cold_ms": mid["cold_ms"], "warm_ms": warm, "floor_ms": floor,
           "ratio": mid["cold_ms"] / floor, "within": mid["cold_ms"] <= bound_ms(floor),
           "open_ms": sum(ph.get(p, 0) for p in OPEN), "read_ms": ph.get("read", 0),
           "transform_ms": ph.get("transform", 0), "execute_ms": ph.get("execute", 0), "wait_ms": a["wait_ms"], "between_ms": a["between_ms"],
           "outside_ms": a["outside_ms"], "faults": a["faults"], "fault_ms": a["fault_ms"],
           "thread_start_ms": ph.get("thread_start", 0), "code_load_ms": ph.get("code_load", 0),
           "overlapped_ms": sum(a["overlapped_ms"].values())}
    print(f"| {name} | {len(data) / 1e6:.1f} | {row['cold_ms']:.2f} | {floor:.2f} | {row['ratio']:.2f} "
          f"| {'yes' if row['within'] else 'no'} | {row['open_ms']:.2f} ({row['thread_start_ms']:.2f}, "
          f"{row['code_load_ms']:.2f}) | {row['read_ms']:.2f} | {row['transform_ms']:.2f} | {row['execute_ms']:.2f} "
          f"| {row['between_ms']:.2f} | {row['wait_ms']:.2f} | {row['outside_ms']:.2f} | {row['faults']} ({row['fault_ms']:.2f}) "
          f"| {row['overlapped_ms']:.2f} |", flush=True)
    return row


def main(argv=None):
    from coldbrew.compiler.tools import trace_export

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--samples", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--corpus", action="store_true", help="every fetched corpus model too")
    args = ap.parse_args(argv)
    names = (args.models or MODELS) + (corpus_names() if args.corpus else [])
    with tempfile.TemporaryDirectory() as work:
        rate = read_bandwidth(work)
        fault_us = trace_export.fault_cost_us()
        print(f"# cold-start account; host {host_isa()}, {args.threads} threads; read rate {rate / 1e9:.2f} GB/s; "
              f"a page fault on fresh memory {fault_us:.2f} us; {args.samples} traced cold samples each, the median's "
              f"account (ms)")
        print("| model | MB | cold | floor | cold/floor | within bound | open (thread start, code) | read wait "
              "| transform | execute | between calls | idle wait | outside runtime | faults (~ms) | other threads |")
        print("| --- |" + " --- |" * 14)
        rows = [measure(n, args, work, rate, fault_us) for n in names]
    ok = sum(r["within"] for r in rows)
    print(f"summary: {ok} of {len(rows)} within the bound (1.3x a floor >= 5 ms, else floor + 1.5 ms); "
          f"cold/floor {min(r['ratio'] for r in rows):.2f}-{max(r['ratio'] for r in rows):.2f}")


if __name__ == "__main__":
    main()
