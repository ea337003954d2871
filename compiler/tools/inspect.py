"""`coldbrew inspect`: a bundle described in lines of text (its header,
read by compiler/bundle/reader.py; no code is loaded, so bundles of any
target can be described).
InspectError: a file that is not a readable bundle."""
import json

from coldbrew.schemas.generated import bundle_generated as fb

from ..bundle.reader import WEIGHT_FORMS, cpu_step, read_bytes, text
from ..ir.forms import DTYPES, PRECISION_OF_DTYPE

_SEG = {v: k for k, v in vars(fb.SegmentKind).items() if not k.startswith("_")}
_KIND = {v: k for k, v in vars(fb.TensorKind).items() if not k.startswith("_")}


def _schedule(cpu):
    """A CPU step's schedule parameters and where they came from: tuned on
    the device, or derived from the target's register/cache model."""
    params = text(cpu.params)
    if not params:
        return ""
    p = ",".join(f"{k}={v}" for k, v in json.loads(params).items())
    return f"{p} ({'tuned' if cpu.tuned else 'derived'})"


def describe(path):
    """Return the human-readable description as a list of lines."""
    with open(path, "rb") as f:
        data = f.read()
    b, size, version = read_bytes(data, path)
    t = b.target
    lines = [
        f"bundle     {path} ({size:,} bytes, schema v{version})",
        f"model      {text(b.modelName)}  sha256 {text(b.modelHash)[:16]}…",
        f"producer   {text(b.producer)}",
        f"target     {text(t.triple)} cpu={text(t.cpu)} features={','.join(text(f) for f in t.features or []) or '-'}"
        + (f" gpu={text(t.gpuClass)}" if t.gpuClass else ""),
    ]
    for label, ids in (("input ", b.inputs), ("output", b.outputs)):
        for i in ids:
            x = b.tensors[i]
            lines.append(f"{label}     {text(x.name)} {DTYPES[x.dtype]}{[int(d) for d in x.shape]}")
    later = (f", later runs on {b.plan.warmThreads}" if b.plan.warmThreads and b.plan.warmThreads != b.plan.threads
             else "")
    lines.append(f"plan       {len(b.plan.steps)} steps, arena {b.plan.arenaSize:,} bytes, threads {b.plan.threads}"
                 + later + _split(b.plan.execShares))
    placed = _placed(b.plan)
    if placed:
        lines.append(placed)
    lines.append(tuning_line(b))
    lines.append(f"  {'#':>3} {'layer':<6} {'op':<34} {'variant':<26} {'weights':<12} {'q':>3} {'bytes':>12}  schedule")
    for k, s in enumerate(b.plan.steps):
        layer, cpu = b.layers[s.layer], cpu_step(s)
        used = dict.fromkeys(list(layer.args) + list(s.transformArgs if s.transformArgs is not None else []))
        wbytes = sum(b.tensors[a].nbytes for a in used if b.tensors[a].kind == fb.TensorKind.weight)
        weights = f"{WEIGHT_FORMS.get(s.weightForm, '?')} {PRECISION_OF_DTYPE.get(s.weightPrecision, '?')}"
        lines.append(f"  {k:>3} {text(layer.name):<6} {text(layer.op)[:34]:<34} {text(s.variant):<26} "
                     f"{weights:<12} {s.prepQueue:>3} {wbytes:>12,}  "
                     f"{_schedule(cpu) if cpu else _dispatches(s.kind)}".rstrip())
        if s.weightPrecision != 0:
            lines.append(f"  {'':>3} {'':<6} {'  narrowed: weight error':<34} {s.weightError:.3g} (max |w' - w| / max |w|),"
                         f" model output error with this layer alone narrowed {s.outputError:.3g}")
        guard, warm = (cpu.guard, cpu.warm) if cpu else (None, None)
        if guard:
            lines.append(f"  {'':>3} {'':<6} {'  branch step: runs when':<34} {text(b.tensors[guard.tensor].name)} is "
                         f"{'true' if guard.value else 'false'}")
        if warm:
            alt = [b.tensors[a] for a in (warm.args if warm.args is not None else [])]
            abytes = sum(x.nbytes for x in alt if x.kind == fb.TensorKind.weight)
            params = ",".join(f"{k}={v}" for k, v in json.loads(text(warm.params) or "{}").items())
            lines.append(f"  {'':>3} {'':<6} {'  warm alternate':<34} {text(warm.variant):<26} {'cached fp32':<12} "
                         f"{'':>3} {abytes:>12,}  {params}".rstrip())
    cpus = [c for c in map(cpu_step, b.plan.steps) if c]
    generic = [text(b.layers[s.layer].name) for s in b.plan.steps if text(s.variant) in ("", "generic")]
    if generic and not b.shaders:
        lines.append(f"generic    {len(generic)} of {len(b.plan.steps)} layers on the generic schedule (no kernel variant; "
                     f"coldbrew trace gives their share of a warm run)")
    branch = [c for c in cpus if c.guard]
    if branch:
        lines.append(f"branches   {len(branch)} branch steps (Ifs decided at run time: the branch not taken is "
                     "skipped)")
    alternates = [c for c in cpus if c.warm]
    if alternates:
        lines.append(f"continuous {len(alternates)} warm alternates (coldbrew.load(..., mode='continuous')); "
                     f"later runs on {b.plan.warmThreads or b.plan.threads} thread(s)" + _split(b.plan.warmExecShares))
    lines.append(accuracy_line(b))
    if b.shaders:
        lines.append(gpu_summary(b))
    if b.kernels:
        args = sum(len(k.argDtypes) for k in b.kernels)
        lines.append(f"kernels    {len(b.kernels)} CPU kernels, {args} arguments: every call's dtypes and byte sizes "
                     "checked at open (schemas/README.md, Versions)")
    lines.append("segments")
    for k, s in enumerate(b.segments):
        decoded = f" (decoded {s.rawSize:,})" if s.kind == fb.SegmentKind.cpu_code_lz4 else ""
        lines.append(f"  {k} {_SEG.get(s.kind, '?'):<15} offset {s.offset:>12,} size {s.size:>12,} "
                     f"checksum {s.checksum:016x}{decoded}")
    kinds = {}
    for x in b.tensors:
        n = kinds.setdefault(_KIND.get(x.kind, "?"), [0, 0])
        n[0], n[1] = n[0] + 1, n[1] + x.nbytes
    lines.append("totals     " + ", ".join(f"{k}: {n} tensors {nb:,} B" for k, (n, nb) in sorted(kinds.items())))
    lines.append(signature_line(data))
    return lines


def tuning_line(b):
    """Whether the kernels' schedule parameters were measured on the
    compiling machine (`--tune`) or derived from the target's model."""
    scheduled = [c for c in map(cpu_step, b.plan.steps) if c and text(c.params)]
    tuned = sum(1 for c in scheduled if c.tuned)
    if not scheduled:
        return "tuning     none (no layer has schedule parameters)"
    if tuned:
        return (f"tuning     tuned: {tuned}/{len(scheduled)} scheduled layers' parameters measured on the compiling "
                f"machine (--tune), the rest derived")
    return (f"tuning     derived: {len(scheduled)} scheduled layers' parameters from the target's register/cache "
            f"model (not tuned; coldbrew compile --tune measures them on this machine)")


def accuracy_line(b):
    """What narrow weights did to the outputs (compiler/measure/error.py)."""
    narrowed = [s for s in b.plan.steps if s.weightPrecision != 0]
    if b.accuracy is None:
        return "accuracy   every weight fp32 (no narrowing to measure)"
    a = b.accuracy
    bound = f", bound {a.maxError:.3g} (--max-error)" if a.maxError else ""
    return (f"accuracy   {len(narrowed)}/{len(b.plan.steps)} layers narrowed; model output error {a.outputError:.3g} "
            f"(max |y' - y| / max |y| against fp32){bound}; first output's argmax unchanged on "
            f"{a.top1Agree:.0%} of {a.samples} samples: {text(a.inputs)}")


def signature_line(data):
    """Who signed the bundle, and whether the signature holds for its bytes."""
    from ..bundle.sign import signer

    s = signer(data)
    if s is None:
        return "signature  none (unsigned: opens without a key; coldbrew compile --sign KEY signs)"
    key, ok = s
    return f"signature  Ed25519 by {key}: " + ("valid for every byte" if ok else "INVALID (altered after signing)")


def _dispatches(gpu):
    """A GPU step's launches: shader index and grid of each (and how many
    push-constant words carry its shapes to a shape-generic shader)."""
    return " ".join(f"shader {d.shader} grid {'x'.join(str(int(g)) for g in d.grid)}"
                    + (f" push {len(d.push)}w" if d.push is not None and len(d.push) else "")
                    for d in gpu.dispatches or [])


def gpu_summary(b):
    """Distinct shaders and pipelines of a GPU bundle (one pipeline per
    distinct shader: nothing is specialized at load; shape-generic shaders
    take shapes in push constants), against the dispatches they serve."""
    steps = b.plan.steps
    dispatches = sum(len(s.kind.dispatches or []) for s in steps)
    spirv = sum(sh.size for sh in b.shaders)
    return (f"gpu        {len(b.shaders)} distinct shaders, {len(b.shaders)} pipelines for {dispatches} dispatches "
            f"of {len(steps)} layers; SPIR-V {spirv:,} bytes")


def _placed(plan):
    """The core class each execution thread and preparation queue is planned for ("" where not recorded)."""
    execs = [text(c) for c in (plan.execClasses or [])]
    queues = [text(c) for c in (plan.queueClasses or [])]
    if not execs:
        return ""
    line = f"placed     execution threads on {', '.join(execs)}"
    if queues:
        line += "; preparation queues " + ", ".join(f"{q + 1} on {c}" for q, c in enumerate(queues))
    return line + " (the runtime: fastest cores first, by their sysfs capacity)"


def _split(shares):
    """How the plan divides parallel loops across its execution threads."""
    if shares is None or not len(shares):
        return ", loops split evenly"
    return f", loops split {':'.join(str(int(x)) for x in shares)} by core speed"
