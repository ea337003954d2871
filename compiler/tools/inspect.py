"""`coldbrew inspect`: a bundle described in lines of text (its header,
read by compiler/bundle/reader.py; no code is loaded, so bundles of any
target can be described).
InspectError: a file that is not a readable bundle."""
import json

from coldbrew.schemas.generated import bundle_generated as fb

from ..bundle.multi import sections
from ..bundle.reader import WEIGHT_FORMS, cpu_step, read_bytes, shape_now, text
from ..ir.forms import DTYPES, PRECISION_OF_DTYPE

_SEG = {v: k for k, v in vars(fb.SegmentKind).items() if not k.startswith("_")}
_KIND = {v: k for k, v in vars(fb.TensorKind).items() if not k.startswith("_")}
_WEIGHT_KINDS = (fb.SegmentKind.weights_raw, fb.SegmentKind.weights_cached)


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
    if not b.sections:
        return [f"bundle     {path} ({size:,} bytes, schema v{version})"] + _one(b, data)
    lines = [f"bundle     {path} ({size:,} bytes, schema v{version}: {len(b.sections)} targets, best first)"]
    lines += section_lines(data, path)
    for name, one, v in sections(data, path):
        lines += ["", f"section    {name} (schema v{v})"] + _one(one, data)[:-1]
    return lines + [signature_line(data)]


def section_lines(data, path):
    """A multi-target bundle's sections: each one's target, header (as
    stored, an LZ4 block where marked *), code and the weight bytes it
    stores itself or shares with another section."""
    found = sections(data, path)
    stored = {text(s.name): s for s in read_bytes(data, path)[0].sections}
    users = {}
    for _, b, _ in found:
        for s in b.segments:
            users.setdefault(s.offset, []).append(s)
    lines = [f"  {'target':<14} {'cpu':<12} {'header':>9} {'code':>10} {'own weights':>12} {'shared':>10} "
             f"{'relaid':>6}  features"]
    for name, b, _ in found:
        code = sum(s.size for s in b.segments if s.kind not in _WEIGHT_KINDS)
        own = sum(s.size for s in b.segments if s.kind in _WEIGHT_KINDS and len(users[s.offset]) == 1)
        shared = sum(s.size for s in b.segments if s.kind in _WEIGHT_KINDS and len(users[s.offset]) > 1)
        t, relaid = b.target, sum(1 for x in b.tensors if x.relayout is not None and list(x.relayout.stored) != list(x.shape))
        s = stored[name]
        header = f"{s.headerSize:,}" + ("*" if s.headerRawSize else " ")
        lines.append(f"  {name:<14} {text(t.gpuClass or t.cpu):<12} {header:>9} {code:>10,} {own:>12,} {shared:>10,} "
                     f"{relaid:>6}  "
                     f"{','.join(text(f) for f in t.features or []) or '-'}")
    once = sum(v[0].size for v in users.values() if v[0].kind in _WEIGHT_KINDS and len(v) > 1)
    lines.append(f"shared     {once:,} weight bytes stored once for several targets (relaid: weights a GPU section "
                 "reads from a CPU section's rearranged form, laid out back as it uploads; *: a header stored "
                 "compressed)")
    return lines


def _one(b, data):
    """A single-target bundle's (or a section's) lines after the first."""
    t = b.target
    lines = [
        f"model      {text(b.modelName)}  sha256 {text(b.modelHash)[:16]}…",
        f"producer   {text(b.producer)}",
        f"target     {text(t.triple)} cpu={text(t.cpu)} features={','.join(text(f) for f in t.features or []) or '-'}"
        + (f" gpu={text(t.gpuClass)}" if t.gpuClass else ""),
    ]
    lines += shape_lines(b)
    later = (f", later runs on {b.plan.warmThreads}" if b.plan.warmThreads and b.plan.warmThreads != b.plan.threads
             else "")
    lines.append(f"plan       {len(b.plan.steps)} steps, arena {b.plan.arenaSize:,} bytes, threads {b.plan.threads}"
                 + later + _split(b.plan.execShares))
    placed = _placed(b.plan)
    if placed:
        lines.append(placed)
    lines += [tuning_line(b)] + _tied(b)
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
    lines += loop_lines(b)
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


def _tied(b):
    """Weight tensors of several layers that point at one stored copy."""
    at = {}
    for x in (x for x in b.tensors if x.kind == fb.TensorKind.weight):
        at.setdefault((x.segment, x.segmentOffset), []).append(x)
    tied = [v for v in at.values() if len(v) > 1]
    return [f"shared     {sum(len(v) for v in tied)} weight tensors are {len(tied)} stored once "
            f"({sum(v[0].nbytes * (len(v) - 1) for v in tied):,} bytes not repeated: one weight, several layers)"] if tied else []


def _count(vector):
    return 0 if vector is None else len(vector)


def loop_lines(b):
    """One line per Loop the data stops: its steps, condition and limits."""
    lines = []
    for loop in b.plan.loops or []:
        most = f"at most {loop.most} iterations (its scan outputs' rows)" if loop.most >= 0 else "no limit but M"
        lines.append(f"loop       steps {loop.start}..{loop.end} ('{text(loop.name)}'): the body, steps {loop.start + 1}.."
                     f"{loop.end - 1}, runs while {text(b.tensors[loop.cond].name)} holds and the iteration number is "
                     f"below {text(b.tensors[loop.trip].name)}, {most}; {_count(loop.carriedFrom) - 1} carried "
                     f"values, {_count(loop.scanFrom)} scan outputs")
    return lines


def shape_lines(b):
    """The inputs and outputs with their shapes, then, for shapes set at run
    time, the dims and the intermediate tensors sized at run time."""
    dims = {i: x for i, x in enumerate(b.tensors) if x.kind == fb.TensorKind.dim}
    lines = [f"input      {text(b.tensors[i].name)} {_input_shape(b.tensors[i], dims)}" for i in b.inputs]
    lines += [f"output     {text(b.tensors[i].name)} {_shape(b.tensors[i], dims)}" for i in b.outputs]
    lines += [f"dim        {text(x.name)} {_range(x.bounds)} typical {x.bounds.typical}: " + (
        f"input {text(b.tensors[b.inputs[x.bounds.input]].name)} axis {x.bounds.axis}" if x.bounds.count < 0 else
        f"counted by the data into %{x.bounds.count} ({_writer(b, x.bounds.count)})") for x in dims.values()]
    sized = [(i, x) for i, x in enumerate(b.tensors) if x.kind == fb.TensorKind.intermediate and _program(x)]
    if sized:
        lines.append(f"sized      {len(sized)} intermediate tensors sized at run time (the arena holds each at its "
                     "largest)")
    return lines + [f"  %{i} {text(x.name)} {_shape(x, dims)}" for i, x in sized]


def _writer(b, t):
    """The layer of the step that takes tensor `t` (the one writing a count)."""
    return next((f"layer {text(layer.name)}" for layer in b.layers if t in list(layer.args)), "no layer")


def _program(x):
    return [] if x.shapeProgram is None else [int(w) for w in x.shapeProgram]


def _range(r):
    """A dim's Range as text: 32..640, or 32..640/32 in steps of 32."""
    return f"{r.min}..{r.max}" + (f"/{r.step}" if r.step > 1 else "")


def _shape(x, dims):
    """A tensor's dtype and shape: sized at run time, its shape program in
    terms of the dims' sizes, then its largest shape (`shape`)."""
    largest = [int(d) for d in x.shape]
    if not _program(x):
        return f"{DTYPES[x.dtype]}{largest}"
    return f"{DTYPES[x.dtype]}[{', '.join(infix(_program(x), dims))}] largest {largest}"


def _input_shape(x, dims):
    """An input's dtype and shape: each axis a dim carries as its range,
    with the shape the plan is weighed for (each dim's typical size)."""
    if not _program(x):
        return _shape(x, dims)
    named = {text(d.name): d.bounds for d in dims.values()}
    axes = [_range(named[a]) if a in named else a for a in infix(_program(x), dims)]
    typical = shape_now(x, {i: d.bounds.typical // d.bounds.step for i, d in dims.items()})
    return f"{DTYPES[x.dtype]}[{', '.join(axes)}] typical {typical}"


def infix(words, dims):
    """A shape program (schemas/bundle.fbs Tensor.shape_program) as one
    expression per axis, each dim by its name, standing for its size (the
    dim tensor holds the size over its step): `4 DIM t MUL` reads W."""
    import operator
    from fractions import Fraction

    from ..ir.dims import DIM, END, NEG

    def show(item, need=0):  # item: (factor, the text it multiplies or None for a constant, its precedence)
        k, body, prec = item
        if body is None:
            body, prec = str(int(k)), 3
        elif k != 1:
            body = ("" if k.numerator == 1 else f"{k.numerator}*") + (f"({body})" if prec < 3 else body) + (
                f"/{k.denominator}" if k.denominator > 1 else "")
            prec = 2
        return f"({body})" if prec < need else body

    ops = {-2: ("+", 1, 2, operator.add), -3: ("-", 1, 2, operator.sub), -4: ("*", 2, 3, operator.mul),
           -5: ("//", 2, 3, operator.floordiv), -6: ("%", 2, 3, operator.mod), -7: ("min", 3, 0, min),
           -8: ("max", 3, 0, max)}
    out, stack, k = [], [], 0
    while k < len(words):
        w, k = words[k], k + 1
        if w >= 0:
            stack.append((Fraction(w), None, 3))
        elif w == END:
            out.append(show(stack.pop()))
        elif w == DIM:
            d, k = dims[words[k]], k + 1
            stack.append((Fraction(1, d.bounds.step), text(d.name), 3))
        elif w == NEG:
            f, body, prec = stack.pop()
            stack.append((-f, body, prec))
        else:
            rhs, lhs = stack.pop(), stack.pop()
            op, prec, right, fn = ops[w]
            if lhs[1] is None and rhs[1] is None:
                stack.append((Fraction(fn(int(lhs[0]), int(rhs[0]))), None, 3))
            elif w == -4 and None in (lhs[1], rhs[1]):  # a constant factor
                stack.append((lhs[0] * rhs[0], *(rhs if lhs[1] is None else lhs)[1:]))
            elif prec == 3:
                stack.append((Fraction(1), f"{op}({show(lhs)}, {show(rhs)})", 3))
            else:
                stack.append((Fraction(1), f"{show(lhs, prec)} {op} {show(rhs, right)}", prec))
    return out


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
    push-constant words carry its shapes to a shape-generic shader), then
    the first run's, where it has its own (`first run: ...`)."""
    def launches(ds):
        return " ".join(f"shader {d.shader} grid {'x'.join(str(int(g)) for g in d.grid)}"
                        + (f" push {len(d.push)}w" if d.push is not None and len(d.push) else "") for d in ds)
    first = f"; first run: {launches(gpu.firstRun)}" if gpu.firstRun else ""
    return launches(gpu.dispatches or []) + first


def gpu_summary(b):
    """Distinct shaders and pipelines of a GPU bundle (one pipeline per
    distinct shader: nothing is specialized at load; shape-generic shaders
    take shapes in push constants), against the dispatches they serve."""
    steps = b.plan.steps
    dispatches = sum(len(s.kind.dispatches or []) for s in steps)
    first = sum(1 for s in steps if s.kind.firstRun)
    spirv = sum(sh.size for sh in b.shaders)
    return (f"gpu        {len(b.shaders)} distinct shaders, {len(b.shaders)} pipelines for {dispatches} dispatches "
            f"of {len(steps)} layers; SPIR-V {spirv:,} bytes"
            + (f"; {first} layers with first-run launches (used until their own pipelines exist)" if first else ""))


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
