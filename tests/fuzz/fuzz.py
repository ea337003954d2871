"""Fuzz the C runtime with libFuzzer (ASan + UBSan; Debian clang and
libfuzzer-14-dev, installed by .ci/setup.sh).

    python tests/fuzz/fuzz.py [--runs 1000000 | --seconds S] [--targets open,run,open_structured,run_structured,decode] [--jobs N]
    python tests/fuzz/fuzz.py --make-corpus      # rebuild tests/fuzz/corpus from small models

Targets (tests/fuzz/fuzz_bundle.c): `open` opens a bundle from memory and
reads its description and weights; `run` also creates sessions (cold and
continuous) and runs them. The `_structured` builds add
tests/fuzz/structured.cc, which mutates FlatBuffer fields, offsets,
counts, indices, strings, segment tables and weight bytes and then
recomputes every checksum, so mutations reach the plan checks, the session
and the run instead of stopping at the door. `decode` (tests/fuzz/fuzz_lz4.c)
feeds any bytes to the code segment's LZ4 decoder, seeded with the seeds'
compressed code.

The code segment is never fuzzed as code: an input whose code passes its
(linear) checksum but differs from every seed's code is skipped
(tests/fuzz/fuzz_bundle.c says why). Each target starts from the committed seed corpus (tiny bundles compiled
for x86_64-avx2, so every x86-64 machine that runs the tests can load
them). Prints per target: executions, seconds, the crashes found (saved as
files to add to tests/fuzz/regressions/) and the coverage of the runtime's
functions. Exit status 1 when any target crashed.
"""
import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")
REGRESSIONS = os.path.join(HERE, "regressions")
TARGETS = ("open", "run", "open_structured", "run_structured", "decode")
FLAGS = ["-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer",
         "-g", "-O1"]
ENV = {  # a GPU bundle's open fails fast at the Vulkan loader (no driver): its header is what is fuzzed
    # an allocation over 2 GiB fails (NULL) rather than stopping the run: a bundle may
    # claim a huge arena, and the runtime's answer to a failed allocation is what is tested
    "ASAN_OPTIONS": "detect_leaks=1:allocator_may_return_null=1:max_allocation_size_mb=2048",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    "VK_DRIVER_FILES": "/nonexistent/coldbrew-fuzz.json",
    "VK_ICD_FILENAMES": "/nonexistent/coldbrew-fuzz.json",
}
# Functions whose coverage the summary names: the header's checks, the plan's, the session's and the run's.
KEY_FUNCTIONS = ("cb_bundle_from_memory", "parse", "parse_gpu", "cb_target_check", "cb_bundle_verify", "cb_open_cpu",
                 "cb_session_create", "cb_session_run", "cb_read_tensors", "cb_check_tensor", "cb_session_release",
                 "cb_lz4_decode")

sys.path.insert(0, os.path.join(ROOT, "runtime"))
import build  # noqa: E402  (runtime/build.py)


def _compile(source, obj, inc, defines=()):
    is_c = source.endswith(".c")
    cmd = ["clang" if is_c else "clang++", "-std=c11" if is_c else "-std=c++17", *FLAGS, *defines, *inc,
           "-c", source, "-o", obj]
    if not is_c:
        cmd += ["-fno-exceptions", "-fno-rtti"]
    subprocess.run(cmd, check=True)
    return obj


def build_target(name, out_dir):
    """The libFuzzer binary for target `name`; its path. The runtime's
    objects are compiled once per `out_dir` and shared by the targets."""
    run, structured = name.startswith("run"), name.endswith("_structured")
    src = os.path.join(ROOT, "runtime", "src")
    objdir = os.path.join(out_dir, "obj")
    os.makedirs(objdir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        inc = ["-I", os.path.join(ROOT, "runtime", "include"), "-I", src, "-I",
               os.path.join(ROOT, "schemas", "generated"), "-I", build.flatbuffers_include(), "-I",
               build.vulkan_include(tmp)]
        objects = []
        for s in build.C_SOURCES + build.CXX_SOURCES:
            obj = os.path.join(objdir, s.replace("/", "_") + ".o")
            objects.append(obj if os.path.exists(obj) else _compile(os.path.join(src, s), obj, inc))
        harness = "fuzz_lz4.c" if name == "decode" else "fuzz_bundle.c"
        objects.append(_compile(os.path.join(HERE, harness), os.path.join(tmp, harness + ".o"), inc,
                                ["-DCB_FUZZ_RUN"] if run else []))
        if structured:
            obj = os.path.join(objdir, "structured.o")
            objects.append(obj if os.path.exists(obj) else _compile(os.path.join(HERE, "structured.cc"), obj, inc))
        out = os.path.join(out_dir, f"fuzz_{name}")
        # -rdynamic: the kernels resolve the runtime's error hook from the executable
        subprocess.run(["clang++", *FLAGS, *objects, "-rdynamic", "-ldl", "-lpthread", "-o", out], check=True)
    return out


def make_corpus(out=CORPUS):
    """Seed bundles: tiny models compiled for x86_64-avx2, CPU plans of every
    shape the runtime reads (cached and raw weights, a preparation worker,
    warm alternates) and one GPU bundle."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from conftest import small_cnn

    from coldbrew.compiler import compile_graph, compile_model

    os.makedirs(out, exist_ok=True)
    m, t = small_cnn(), "x86_64-avx2"
    compile_model(m, os.path.join(out, "cached.brew"), target=t)
    compile_model(m, os.path.join(out, "raw_worker.brew"), target=t, weights="raw", queues={"*": 1})
    compile_graph(m, os.path.join(out, "continuous.brew"), target=t, variants={"conv2d": "conv2d.im2col_gemm"},
                  weights="raw", queues=1, warm=({"conv2d": "conv2d.winograd_f2"}, 2))
    compile_model(m, os.path.join(out, "gpu.brew"), target="vulkan")
    return sorted(os.listdir(out))


def code_seeds(corpus):
    """The seeds' compressed code segments as `decode` inputs (a capacity
    byte that fits the decoded size, then the block) in `corpus`."""
    from coldbrew.compiler.bundle.reader import read_bytes
    from coldbrew.schemas.generated import bundle_generated as fb

    for f in sorted(os.listdir(CORPUS)):
        with open(os.path.join(CORPUS, f), "rb") as fh:
            data = fh.read()
        for s in read_bytes(data)[0].segments:
            if s.kind == fb.SegmentKind.cpu_code_lz4:
                cap = min(255, -(-s.rawSize * 64 // (s.size + 16)))
                with open(os.path.join(corpus, f"{f}.code"), "wb") as out:
                    out.write(bytes([cap]) + data[s.offset:s.offset + s.size])


def covered(output):
    """{function: (edges covered, edges)} of the runtime's sources, from
    libFuzzer's -print_coverage=1 (names without namespace or arguments)."""
    cov = {}
    for m in re.finditer(r"^(UN)?COVERED_FUNC: hits: \d+ edges: (\d+)/(\d+) (.+) (\S+):\d+$", output, re.M):
        if "/runtime/src/" not in m.group(5):
            continue
        name = re.sub(r"\(anonymous namespace\)::", "", m.group(4)).split("(")[0]
        hit, edges = cov.get(name, (0, 0))
        cov[name] = (max(hit, int(m.group(2))), max(edges, int(m.group(3))))
    return cov


def fuzz(binary, runs=None, seconds=None, work=None, extra=(), seeds=None):
    """Run one target over a fresh copy of the corpus (or of the files
    `seeds`); a dict of results."""
    work = work or tempfile.mkdtemp(prefix="cb-fuzz-")
    corpus = os.path.join(work, "corpus")
    if seeds is None:
        shutil.copytree(CORPUS, corpus, dirs_exist_ok=True)
    else:
        os.makedirs(corpus, exist_ok=True)
        for f in seeds:
            shutil.copy(f, corpus)
    if os.path.basename(binary) == "fuzz_decode":
        code_seeds(corpus)
    artifacts = os.path.join(work, "artifacts") + "/"
    os.makedirs(artifacts, exist_ok=True)
    # Linux carries the peak RSS of the process that spawns the fuzzer into
    # the fuzzer's own (ru_maxrss survives fork + exec): a test process that
    # has compiled models would trip a fixed limit at once. The budget is 4 GiB
    # over that inherited peak.
    inherited = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    cmd = [binary, corpus, f"-artifact_prefix={artifacts}", "-print_final_stats=1", "-print_coverage=1",
           "-max_len=262144", f"-rss_limit_mb={4096 + inherited}", "-malloc_limit_mb=4096", "-timeout=20", "-seed=1", *extra]
    cmd.append(f"-runs={runs}" if runs else f"-max_total_time={seconds}")
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV, "CB_FUZZ_CORPUS": CORPUS})
    dt = time.perf_counter() - t
    out = r.stdout + r.stderr
    done = re.search(r"stat::number_of_executed_units:\s*(\d+)", out)
    found = sorted(os.listdir(artifacts))
    # a slow unit (over libFuzzer's 10 s report threshold, under -timeout) is
    # noted, not failed: on a shared machine it measures the load
    crashes = [os.path.join(artifacts, f) for f in found if not f.startswith("slow-unit-")]
    slow = [os.path.join(artifacts, f) for f in found if f.startswith("slow-unit-")]
    return {"binary": os.path.basename(binary), "executions": int(done.group(1)) if done else 0, "seconds": dt,
            "crashes": crashes, "slow": slow, "exit": r.returncode, "coverage": covered(out), "log": out}


def fuzz_parallel(binary, jobs, runs=None, seconds=None, work=None):
    """`jobs` processes of one target at once (seeds 1..jobs, a corpus copy
    each), `runs` split between them; their results merged: executions
    summed, the longest wall time, every crash, the widest coverage."""
    from concurrent.futures import ThreadPoolExecutor

    work = work or tempfile.mkdtemp(prefix="cb-fuzz-")
    share = None if runs is None else -(-runs // jobs)
    with ThreadPoolExecutor(jobs) as pool:
        parts = list(pool.map(lambda k: fuzz(binary, share, seconds, os.path.join(work, f"job{k}"),
                                             [f"-seed={k}"]), range(1, jobs + 1)))
    cov = {}
    for p in parts:
        for f, (hit, edges) in p["coverage"].items():
            old = cov.get(f, (0, 0))
            cov[f] = (max(old[0], hit), max(old[1], edges))
    return {"binary": parts[0]["binary"], "executions": sum(p["executions"] for p in parts),
            "seconds": max(p["seconds"] for p in parts), "crashes": [c for p in parts for c in p["crashes"]],
            "slow": [c for p in parts for c in p["slow"]], "exit": max((p["exit"] for p in parts), key=abs),
            "coverage": cov, "log": "\n".join(p["log"] for p in parts), "jobs": jobs}


def replay(binary, files):
    """Run a target once over each file (regression cases); its result."""
    return subprocess.run([binary, *files], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **ENV, "CB_FUZZ_CORPUS": CORPUS})


def crash_report(log):
    """The sanitizer's or libFuzzer's report in a run's output (not its coverage lines)."""
    lines = [ln for ln in log.splitlines() if "COVERED_FUNC" not in ln]
    start = next((k for k, ln in enumerate(lines) if "==ERROR" in ln or "runtime error" in ln
                  or "deadly signal" in ln or "ERROR: libFuzzer" in ln), max(0, len(lines) - 60))
    return "\n".join(lines[start:start + 80])


def summary(res):
    cov = res["coverage"]
    hit = sum(1 for c in cov.values() if c[0])
    jobs = f" ({res['jobs']} processes at once)" if res.get("jobs", 1) > 1 else ""
    lines = [f"{res['binary']}: {res['executions']:,} executions in {res['seconds']:.0f} s{jobs}, "
             f"{len(res['crashes'])} crashes (exit {res['exit']}); runtime functions covered {hit}/{len(cov)}"]
    key = [f"{f} {cov[f][0]}/{cov[f][1]}" for f in KEY_FUNCTIONS if f in cov]
    lines.append("  edges covered: " + ", ".join(key))
    for c in res["crashes"]:
        lines.append(f"  crash: {c}")
    for c in res.get("slow", []):
        lines.append(f"  slow unit (not a failure; hangs fail at -timeout): {c}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=int, help="run each target this long instead of --runs executions")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--jobs", type=int, default=1, help="processes per target at once (seeds 1..N), --runs split between them")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "fuzz"))
    ap.add_argument("--make-corpus", action="store_true")
    args = ap.parse_args()
    if args.make_corpus:
        print("\n".join(make_corpus()))
        return 0
    os.makedirs(args.out, exist_ok=True)
    shutil.rmtree(os.path.join(args.out, "obj"), ignore_errors=True)  # the runtime's objects, rebuilt from its sources
    failed = False
    for name in args.targets.split(","):
        if name not in TARGETS:
            raise SystemExit(f"unknown target {name}; targets: {', '.join(TARGETS)}")
        binary = build_target(name, args.out)
        res = fuzz_parallel(binary, max(1, args.jobs), None if args.seconds else args.runs, args.seconds,
                            work=tempfile.mkdtemp(prefix=f"cb-fuzz-{name}-", dir=args.out))
        print(summary(res), flush=True)
        if res["crashes"] or res["exit"]:
            failed = True
            print(crash_report(res["log"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
