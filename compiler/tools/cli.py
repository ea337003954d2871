"""The `coldbrew` command: compile, run, inspect."""
import json
import os
import sys
import time
import warnings

import click
import numpy as np


def _parse_shapes(values):
    """{input: its dimensions' text} (options.input_dims reads sizes and ranges)."""
    shapes = {}
    for v in values:
        depth = [v[:k].count("[") - v[:k].count("]") for k in range(len(v))]
        cut = max((k for k, ch in enumerate(v) if ch == "=" and depth[k] == 0), default=-1)  # not in a [D=..]
        name, sep, dims = v[:cut], "=" * (cut >= 0), v[cut + 1:]
        if not sep or not name or not dims:
            raise click.BadParameter(f"'{v}': expected NAME=1x3x224x224 (a range: NAME=1x3x[32:640]x[32:640])")
        shapes[name] = dims
    return shapes


def _parse_binds(values):
    constants = {}
    for b in values:
        name, sep, path = b.partition("=")
        if not sep:
            raise click.BadParameter(f"'{b}': expected NAME=FILE.npy")
        constants[name] = np.load(path)
    return constants


def _parse_bounds(values):
    bounds = {}
    for b in values:
        name, sep, n = b.rpartition("=")
        if not sep or not name or not n.strip().isdigit():
            raise click.BadParameter(f"'{b}': expected TENSOR=N (the most entries that output may hold)")
        bounds[name] = int(n)
    return bounds


def _gpu_phases(events):
    """A GPU bundle's first run, phase by phase with the lanes they ran on
    ("" for a CPU bundle)."""
    if not any(e["phase"] == "gpu_context" for e in events):
        return ""
    parts = []
    for phase in ("gpu_context", "read", "upload", "pipeline", "gpu_execute"):
        evs = [e for e in events if e["phase"] == phase]
        if not evs:
            continue
        wall = (max(e["end_ns"] for e in evs) - min(e["start_ns"] for e in evs)) / 1e6
        lanes = sorted({e["cpu"] for e in evs})
        where = ", ".join("gpu" if c < 0 else f"core {c}" for c in lanes)
        count = f"{len(evs)} " if phase in ("read", "pipeline") else ""
        parts.append(f"{count}{phase} {wall:.2f} ms ({where})")
    return "gpu first run: " + "; ".join(parts)


def _phases(summary):
    return ", ".join(f"{k} {v:.2f}" for k, v in summary["phase_ms"].items()) + " ms"


class _progress:
    """A progress bar on stderr, shown once work reports progress."""

    def __init__(self, label):
        self.label, self.bar, self.done = label, None, 0

    def __call__(self, done, total, what):
        if self.bar is None:
            self.bar = click.progressbar(length=total, label=self.label, file=sys.stderr,
                                         item_show_func=lambda w: w, show_pos=True)
            self.bar.__enter__()
        self.bar.update(done - self.done, what)
        self.done = done

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)


def _parse_choice(values):
    """["x", "c3=y"] -> {"*": "x", "c3": "y"}."""
    out = {}
    for v in values:
        key, sep, val = v.rpartition("=")
        out[key if sep else "*"] = val
    return out


def _parse_queues(values):
    out = {}
    for key, val in _parse_choice(values).items():
        try:
            out[key] = int(val)
        except ValueError:
            raise click.BadParameter(f"preparation queue must be an integer, not {val!r}") from None
    return out


@click.group()
@click.version_option(package_name="coldbrew")
def main():
    """coldbrew: ONNX models -> cold-start bundles."""


@main.command("compile")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="bundle file to write")
@click.option("--target", default="host", show_default=True, help="target name (see targets/); vulkan, or <preset>+vulkan, runs the layers on a GPU")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=DxDx..",
              help="an input's shape: sizes, or ranges [MIN:MAX], [MIN:MAX:STEP], [DIM=MIN:MAX] (DIM: shared by name)")
@click.option("--typical-shape", "typical_shapes", multiple=True, metavar="NAME=DxDx..",
              help="the size of a ranged input the plan is weighed for (default: each range's largest)")
@click.option("--bind", "binds", multiple=True, metavar="NAME=FILE.npy", help="freeze an input to a constant value")
@click.option("--bound", "bound_opts", multiple=True, metavar="TENSOR=N",
              help="the most entries an output sized by the data (NonZero, Compress, NonMaxSuppression, Unique: "
                   "named by its ONNX tensor) may hold [default: all its input allows]")
@click.option("--variant", "variant_opts", multiple=True, metavar="[LAYER=]VARIANT",
              help="force a kernel variant: globally (im2col_gemm), per op (conv2d=winograd_f4) "
                   "or per layer (c3=direct); see `coldbrew variants`")
@click.option("--weights", "weight_opts", multiple=True, metavar="[LAYER=]raw|cached|direct|auto",
              help="ship raw weights + transform, or transformed weights; with fp16 weights, direct: the "
                   "kernel reads them fp16 in place, widening in registers (no first-run widening); "
                   "global or per layer "
                   "[default: cached; GPU targets: auto, raw where the transform fits under pipeline creation]")
@click.option("--threads", default=2, show_default=True, help="execution threads the plan is made for")
@click.option("--prep-queue", "queue_opts", multiple=True, metavar="[LAYER=]Q", default=["0"], show_default=True,
              help="who prepares a layer's weights on the first run: 0 the executing thread, Q >= 1 "
                   "preparation worker Q (ahead of execution, pinned to the core after the execution cores); "
                   "global or per layer")
@click.option("--plan", "plan", type=click.Choice(["default", "warm", "cold-greedy", "cold"]), default="default",
              show_default=True,
              help="plan from the device cost table (profiled once, then cached): fastest warm variants, "
                   "least cold cost per layer, or the cold scheduler (variants, weight forms, preparation "
                   "queues and execution threads)")
@click.option("--tune/--no-tune", default=False, show_default=True,
              help="search each layer's variant and schedule parameters by measurement on this machine (target "
                   "host only; cached per target); without it they are derived from the target's register/cache "
                   "model, as compile_model() does, so the bundle is the same whichever machine builds it")
@click.option("--continuous", is_flag=True,
              help="also store each layer's warm-fastest variant (from the cost table) for continuous mode: "
                   "the first run follows the plan, later runs switch to those variants once their weights "
                   "are ready (coldbrew.load(..., mode='continuous'))")
@click.option("--dump-ir", type=click.Path(file_okay=False), help="write the IR after each pass here")
@click.option("--sign", "sign_key", type=click.Path(dir_okay=False), metavar="KEY",
              help="sign the bundle with this secret key (coldbrew keygen)")
@click.option("--weights-precision", "precision", type=click.Choice(["fp32", "fp16", "int8"]), default="fp32",
              show_default=True,
              help="store the conv/dense layers' weights in this precision (int8: one scale per output channel); "
                   "widened to fp32 on the first run (or in registers: --weights direct); the effect on the "
                   "outputs is measured and stored")
@click.option("--max-error", type=float, metavar="E",
              help="with a narrow precision: keep the fewest layers fp32 that hold the outputs' relative error "
                   "(max |y' - y| / max |y| against fp32) under E")
@click.option("--calibration-data", "calibration", type=click.Path(exists=True, dir_okay=False), metavar="FILE.npz",
              help="sample inputs for measuring the error: one array per input name, shaped like it or "
                   "[samples, ...] (default: generated)")
@click.option("--calibration-samples", default=4, show_default=True, help="sample inputs generated for the error "
              "when no --calibration-data is given")
def compile_cmd(model, output, target, input_shapes, typical_shapes, binds, bound_opts, variant_opts, weight_opts, threads, queue_opts, plan, tune,
                continuous, dump_ir, sign_key, precision, max_error, calibration, calibration_samples):
    """Compile MODEL (ONNX) into a bundle."""
    from coldbrew.compiler import CompileError
    from coldbrew.compiler.driver import compile as compile_with
    from coldbrew.compiler.errors import ScheduleFallbackWarning
    from coldbrew.compiler.options import Options

    t0 = time.perf_counter()
    planned = []
    try:
        options = Options(target=target, input_shapes=_parse_shapes(input_shapes),
                          typical_shapes=_parse_shapes(typical_shapes), constants=_parse_binds(binds),
                          bounds=_parse_bounds(bound_opts), variants=_parse_choice(variant_opts), weights=_parse_choice(weight_opts), threads=threads,
                          queues=_parse_queues(queue_opts), plan=plan, tune=_tunes(target, tune),
                          continuous=continuous, precision=precision, max_error=max_error, calibration=calibration,
                          calibration_samples=calibration_samples, sign=sign_key, dump_ir=dump_ir)
        with _progress("measuring") as progress, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ScheduleFallbackWarning)
            data = compile_with(model, options, output, progress, on_plan=planned.append)
    except (CompileError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    for w in caught:  # coldbrew's own as a line each, not Python's file-and-line form
        if issubclass(w.category, ScheduleFallbackWarning):
            click.echo(f"warning: {w.message}", err=True)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    for p in planned:
        workers = sorted({q for q in p["queues"].values() if q})
        click.echo(f"plan {plan}: made in {p['plan_ms']:.0f} ms; {p['threads']} execution thread(s), "
                   f"preparation {'on worker(s) ' + ','.join(map(str, workers)) if workers else 'inline'}; "
                   f"predicted cold {p['predicted_ms']:.1f} ms")
    if precision != "fp32":
        from ..bundle.reader import read_bytes
        from .inspect import accuracy_line

        click.echo(accuracy_line(read_bytes(data)[0]))
    click.echo(f"wrote {output} ({len(data):,} bytes{', signed' if sign_key else ''}) in "
               f"{time.perf_counter() - t0:.1f} s")


@main.command("keygen")
@click.argument("key", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True, help="replace an existing key")
def keygen_cmd(key, force):
    """Make an Ed25519 key pair for signing bundles: KEY (secret, keep it
    private) and KEY.pub (give it to apps: coldbrew.load(..., public_key=...))."""
    from ..bundle.sign import keygen

    if os.path.exists(key) and not force:
        raise click.ClickException(f"{key} exists (use --force to replace it)")
    public = keygen(key)
    click.echo(f"wrote {key} (secret) and {key}.pub (public key {public})")


@main.command("run")
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False))
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy", help="input from a .npy file")
@click.option("--output-dir", type=click.Path(file_okay=False), help="save outputs as NAME.npy here")
@click.option("--cold/--warm", default=True, show_default=True, help="evict the bundle from the page cache first")
@click.option("--repeat", default=10, show_default=True, help="warm runs after the first")
@click.option("--threads", default=0, help="execution threads (0 = the plan's)")
@click.option("--mode", type=click.Choice(["cold", "continuous"]), default="cold", show_default=True,
              help="continuous: runs after the first switch to the bundle's warm variants (compile --continuous)")
def run_cmd(bundle, inputs, output_dir, cold, repeat, threads, mode):
    """Run BUNDLE once cold, then warm; print outputs and timings.

    Inputs not given are filled with seeded random data."""
    import coldbrew

    feeds_files = dict(v.split("=", 1) for v in inputs)
    if cold:
        from ..measure.protocol import evict

        evict(bundle)
    t1 = time.perf_counter()
    try:
        sess = coldbrew.load(bundle, threads=threads, mode=mode, trace=True)
    except coldbrew.BundleError as e:
        raise click.ClickException(str(e)) from None
    t_load = time.perf_counter() - t1
    rng = np.random.default_rng(0)
    feeds = {}
    for meta in sess.get_inputs():
        if meta.name in feeds_files:
            feeds[meta.name] = np.load(feeds_files.pop(meta.name))
        elif meta.dtype.kind == "f":
            feeds[meta.name] = rng.standard_normal(meta.shape).astype(meta.dtype)
        else:
            feeds[meta.name] = np.zeros(meta.shape, meta.dtype)
    if feeds_files:
        raise click.ClickException(f"unknown input(s) {sorted(feeds_files)}; inputs are {[m.name for m in sess.get_inputs()]}")
    t2 = time.perf_counter()
    try:
        outs = sess.run(None, feeds)
    except (coldbrew.BundleError, ValueError, TypeError) as e:
        raise click.ClickException(str(e)) from None
    t_first = time.perf_counter() - t2
    gpu_line = _gpu_phases(sess.trace())
    warm = []
    for _ in range(repeat):
        t = time.perf_counter()
        sess.run(None, feeds)
        warm.append(time.perf_counter() - t)
    for meta, out in zip(sess.get_outputs(), outs):
        flat = out.reshape(-1)
        top = int(np.argmax(flat)) if flat.size and out.dtype.kind == "f" else None
        click.echo(f"output {meta.name} {out.dtype}{list(out.shape)}  min {flat.min():.4g} max {flat.max():.4g}"
                   + (f"  argmax {top}" if top is not None else ""))
        if output_dir:
            os.makedirs(output_dir, exist_ok=True)
            np.save(os.path.join(output_dir, f"{meta.name}.npy"), out)
    click.echo(f"{'cold' if cold else 'warm-cache'} load {t_load * 1e3:.2f} ms + first run {t_first * 1e3:.2f} ms "
               f"= {(t_load + t_first) * 1e3:.2f} ms to first result")
    if gpu_line:
        click.echo(gpu_line)
    if warm:
        click.echo(f"warm run median {np.median(warm) * 1e3:.2f} ms over {repeat}")
    if mode == "continuous":
        ready, total = sess.alternates()
        runs = ", ".join(f"run {k + 2} {t * 1e3:.2f} ms" for k, t in enumerate(warm[:2]))
        click.echo(f"continuous: {runs}; {ready}/{total} warm alternates ready")


@main.command("profile")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--target", default="host", show_default=True, help="target name (see targets/); modeled "
              "targets get the host table scaled per core class")
@click.option("--threads", default=2, show_default=True, help="execution threads of the plan")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=DxDx..", help="fix an input's shape")
@click.option("--bind", "binds", multiple=True, metavar="NAME=FILE.npy", help="freeze an input to a constant value")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="also write the cost table here")
@click.option("--force", is_flag=True, help="measure again even if the table is cached")
@click.option("--tune/--no-tune", default=False, show_default=True,
              help="time the kernels with their tuned schedule parameters, as `compile --tune` ships them "
                   "(target host only)")
@click.option("--precision", type=click.Choice(["all", "fp32", "fp16", "int8"]), default="all", show_default=True,
              help="the weight precision the table's plans are for: the direct forms of the others are not "
                   "measured (fp32: none, as `compile --plan` of fp32 weights profiles)")
def profile_cmd(model, target, threads, input_shapes, binds, output, force, tune, precision):
    """Measure MODEL's device cost table: per layer x variant, read / transform / execute."""
    from ..errors import CompileError
    from ..measure.profile import profile

    t0 = time.perf_counter()
    try:
        with _progress("measuring") as progress:
            front, tuning = _front(model, target, threads, _parse_shapes(input_shapes), _parse_binds(binds), tune,
                                   progress)
            table = profile(front, threads, progress, force, tuning=tuning,
                            direct=None if precision == "all" else [precision])
    except (CompileError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if output:
        with open(output, "w") as f:
            json.dump(table, f, indent=1, sort_keys=True)
    n = sum(len(layer["candidates"]) for layer in table["layers"])
    label = " (MODELED: host measurements scaled per core class)" if table["modeled"] else ""
    click.echo(f"cost table of {table['model']} on {table['target']}{label}: {len(table['layers'])} layers, "
               f"{n} layer x variant entries; {'from the cache' if table['cached'] else 'measured'} "
               f"in {time.perf_counter() - t0:.1f} s" + (f", written to {output}" if output else ""))


def _table(costs, model, target, threads, tune):
    """The cost table from a file, or profiled for `model` (tuned as the
    bundle it is for was compiled)."""
    from ..measure.profile import profile

    if costs:
        with open(costs) as f:
            return json.load(f)
    if not model:
        raise click.UsageError("give --costs FILE or --model MODEL.onnx")
    with _progress("profiling") as progress:
        front, tuning = _front(model, target, threads, None, None, tune, progress)
        return profile(front, threads, progress, tuning=tuning)


def _tunes(target, tune):
    """Whether a command tunes: as asked (default: no, as compile_model);
    only the machine it runs on (the host) can be measured."""
    if tune and target != "host":
        raise click.UsageError(f"--tune measures kernels on this machine: it needs --target host, not '{target}' "
                               "(other targets get parameters derived from their register/cache model)")
    return bool(tune)


def _front(model, target, threads, shapes, constants, tune, progress):
    """(front, tuning) for the profile: the first passes' result and the
    tuning `compile` uses (_tunes), so a table profiled here is the one
    its plans are made from."""
    from ..driver import tune as tune_stage
    from ..options import Options
    from ..pipeline import front_end

    options = Options(target=target, input_shapes=shapes, constants=constants, threads=threads,
                      tune=_tunes(target, tune))
    front = front_end(model, options)
    return front, tune_stage(front, options, progress)


@main.command("simulate")
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False))
@click.option("--costs", type=click.Path(exists=True, dir_okay=False), help="cost table file (coldbrew profile -o)")
@click.option("--model", type=click.Path(exists=True, dir_okay=False), help="or: the ONNX model to profile")
@click.option("--target", default="host", show_default=True, help="target of the cost table (with --model)")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="write the predicted timeline (trace JSON)")
@click.option("--png", type=click.Path(dir_okay=False), help="write the predicted timeline as a picture")
def simulate_cmd(bundle, costs, model, target, output, png):
    """Predict BUNDLE's cold run from a device cost table."""
    from . import trace_export
    from ..plan.simulate import PlanError, plan_of_bundle, simulate

    plan = plan_of_bundle(bundle)
    table = _table(costs, model, target, plan["threads"], plan["tuned"] and target == "host")
    try:
        result = simulate(plan, table)
    except PlanError as e:
        raise click.ClickException(str(e)) from None
    label = "MODELED " if result["modeled"] else ""
    title = f"predicted cold run of {os.path.basename(bundle)} on {table['target']} ({label.strip() or 'measured'} costs)"
    if output:
        trace_export.write_chrome(result["events"], output, {"title": title})
    if png:
        trace_export.to_png(result["events"], png, title=title)
    s = trace_export.summary(result["events"])
    click.echo(f"{label}predicted cold latency on {table['target']}: {result['latency_ms']:.2f} ms "
               f"(open {result['open_ms']:.2f} ms; {_phases(s)})")


@main.command("trace")
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="trace JSON (Chrome / Perfetto)")
@click.option("--png", type=click.Path(dir_okay=False), help="also a timeline picture, one lane per core")
@click.option("--cold/--warm", default=True, show_default=True, help="evict the bundle from the page cache first")
@click.option("--threads", default=0, help="execution threads (0 = the plan's)")
@click.option("--costs", type=click.Path(exists=True, dir_okay=False),
              help="cost table: add the simulator's predicted timeline beside the measured one")
@click.option("--layers", default=8, show_default=True, help="the account's slowest steps shown (0: none)")
def trace_cmd(bundle, output, png, cold, threads, costs, layers):
    """Run BUNDLE once (cold by default), write what each core did, and
    account for every millisecond of the executing thread."""
    import coldbrew

    from . import trace_export
    from ..measure.protocol import evict

    fault_us = trace_export.fault_cost_us()
    if cold:
        evict(bundle)
    t0 = time.perf_counter_ns()
    try:
        sess = coldbrew.load(bundle, threads=threads, trace=True)
        feeds = {i.name: np.zeros(i.shape, i.dtype) for i in sess.get_inputs()}
        sess.run(None, feeds)
    except coldbrew.BundleError as e:
        raise click.ClickException(str(e)) from None
    total_ms = (time.perf_counter_ns() - t0) / 1e6
    events = sess.trace()
    s = trace_export.summary(events)
    if costs:
        from ..plan.simulate import plan_of_bundle, simulate

        with open(costs) as f:
            predicted = simulate(plan_of_bundle(bundle), json.load(f))
        events = events + predicted["events"]
        click.echo(f"predicted {predicted['latency_ms']:.2f} ms")
    title = f"{'cold' if cold else 'warm-cache'} run of {os.path.basename(bundle)}"
    trace_export.write_chrome(events, output, {"title": title, "load_and_first_run_ms": total_ms})
    if png:
        trace_export.to_png(events, png, title=title)
    click.echo(f"{title}: {total_ms:.2f} ms load + first run; traced {_phases(s)}; wrote {output}"
               + (f" and {png}" if png else ""))
    for line in trace_export.account_lines(trace_export.account(sess.trace(), total_ms, fault_us), layers):
        click.echo(line)
    _generic_share(bundle, sess, feeds)


def _generic_share(bundle, sess, feeds, runs=5, shown=8):
    """The layers still on the generic schedule and their share of a warm
    run's execute time (the last of `runs` warm runs, traced)."""
    from . import trace_export
    from ..bundle.reader import read_bytes

    for _ in range(runs):
        sess.run(None, feeds)
    rows = trace_export.layer_times(sess.trace())
    with open(bundle, "rb") as f:
        b = read_bytes(f.read())[0]
    ops = {k: b.layers[st.layer].op.decode() for k, st in enumerate(b.plan.steps)}
    total = sum(r[3] for r in rows) or 1e-9
    generic = [r for r in rows if r[2] in ("", "generic")]
    click.echo(f"warm run: execute {total:.3f} ms over {len(rows)} layers; {len(generic)} on the generic schedule, "
               f"{100 * sum(r[3] for r in generic) / total:.0f}% of it")
    for k, layer, _, ms in generic[:shown]:
        click.echo(f"  {layer:<8} {ops.get(k, '?')[:44]:<44} generic {ms:8.3f} ms {100 * ms / total:5.1f}%")


@main.command("variants")
def variants_cmd():
    """List the kernel variants."""
    from coldbrew.compiler.kernels import variants
    from coldbrew.targets import resolve

    for v in variants(resolve("host").vector):
        click.echo(f"{v.name:<28} {(v.__doc__ or '').strip().splitlines()[0] if v.__doc__ else ''}")


@main.command("ops")
def ops_cmd():
    """List the ONNX operators coldbrew compiles, and those whose outputs the data sizes."""
    from coldbrew.compiler.onnx.ops import COUNTED_OPS, MAX_OPSET, MIN_OPSET, SUPPORTED_OPS

    names = sorted(SUPPORTED_OPS)
    click.echo(f"{len(names)} operators (ONNX's at opsets {MIN_OPSET}-{MAX_OPSET}; others with their domain):")
    for k in range(0, len(names), 4):
        click.echo("  " + "".join(f"{n:<23}" for n in names[k:k + 4]).rstrip())
    click.echo("outputs sized by the input values (planned at a bound: --bound TENSOR=N, default all the input "
               "allows):")
    for op, why in sorted(COUNTED_OPS.items()):
        click.echo(f"  {op:<20} (by {why})")


@main.command("targets")
def targets_cmd():
    """List the targets with what the kernel schedules derive from them."""
    from coldbrew.targets import available, resolve

    click.echo(f"{'target':<15} {'triple':<24} {'cpu':<16} {'isa':<7} {'lanes':>5} {'regs':>5} {'fma':>4} "
               f"{'L1d KB':>6} {'L2 KB':>6}  cores")
    for name in available():
        t = resolve(name)
        v = t.vector
        cores = " ".join(f"{c.name}x{len(c.ids)}" for c in t.core_classes)
        click.echo(f"{name:<15} {t.triple:<24} {t.cpu:<16} {v.isa:<7} {v.lanes:>5} {v.registers:>5} "
                   f"{'yes' if v.fma else 'no':>4} {v.l1d_kb:>6} {v.l2_kb:>6}  {cores}"
                   + ("  (modeled)" if t.modeled else ""))


@main.command("compare")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False))
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy", help="an input's value (others: seeded random)")
@click.option("--tolerance", default=1e-3, show_default=True, help="max |diff| / max(1, max |onnxruntime|)")
@click.option("--runner", metavar="CMD", help="run the bundle with this run_bundle command (e.g. under qemu-aarch64)")
def compare_cmd(model, bundle, inputs, tolerance, runner):
    """Run BUNDLE layer by layer against onnxruntime running MODEL; name the first layer that departs."""
    from ..bundle.reader import InspectError
    from .compare import CompareError, compare

    try:
        report = compare(model, bundle, _parse_binds(inputs), tolerance, runner)
    except (CompareError, InspectError) as e:
        raise click.ClickException(str(e)) from None
    for line in report.lines():
        click.echo(line)
    sys.exit(1 if report.first or not report.matched else 0)  # nothing compared proves nothing


@main.command("inspect")
@click.argument("bundle", type=click.Path(exists=True, dir_okay=False))
@click.option("--verify", is_flag=True, help="also open it with the runtime (full verification)")
@click.option("--public-key", metavar="KEY.pub|HEX", help="with --verify: require a signature by this key")
def inspect_cmd(bundle, verify, public_key):
    """Show everything in BUNDLE: target, layers and variants, segments, totals."""
    from ..bundle.reader import InspectError
    from .inspect import describe

    try:
        for line in describe(bundle):
            click.echo(line)
    except InspectError as e:
        raise click.ClickException(str(e)) from None
    if verify:
        import coldbrew

        try:
            sess = coldbrew.load(bundle, public_key=public_key)
            sess.verify_weights()
            sess.close()
        except (coldbrew.BundleError, ValueError) as e:
            raise click.ClickException(f"verification failed: {e}") from None
        click.echo("verify     ok (runtime accepted the bundle and every weight checksum on this machine"
                   + (", and its signature by the given key)" if public_key else ")"))


if __name__ == "__main__":
    sys.exit(main())
