"""ONNX Loop unrolled when its trip count is known at compile time; Scan
unrolled over its scan inputs' fixed length.

A Loop runs its body while the iteration count is below M and the condition
is true. The count is known at compile time when M and the first condition
are constants and the body's condition is computed from constants, the
iteration number and loop-carried values that are themselves computed so
(an exporter's `while i < n` over a fixed sequence): `trip_count` runs that
static part of the body with ONNX's reference implementation to count the
iterations. `unroll` then inlines the body once per iteration, each copy's
names prefixed, carried values threaded from one copy to the next, and
each scan output the copies' values stacked along a new first axis.
A Loop whose condition depends on the data (a decoder that stops at an end
token) is unrolled to the most iterations it may run (`unroll_while`), each
copy taken only while the condition holds. `unroll_scan` does the same
for a Scan (opset 9 on): each copy reads its step's slice of every scan
input (forward or reversed) and its scan outputs are stacked on their axes.
"""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import CompileError
from .ops import inline_branch, shape_of_sizes

MAX_ITERATIONS = 4096  # more would make a bundle of repeated layers; refused


def body_of(node):
    return next(helper.get_attribute_value(a) for a in node.attribute if a.name == "body")


def _const_inputs(node, consts):
    """(M or None when absent, first condition) if both are constants, else None."""
    m_name, c_name = (list(node.input) + ["", ""])[:2]
    if (m_name and m_name not in consts) or (c_name and c_name not in consts):
        return None
    m = int(np.asarray(consts[m_name]).reshape(-1)[0]) if m_name else None
    cond = bool(np.asarray(consts[c_name]).reshape(-1)[0]) if c_name else True
    return m, cond


def _static_part(body, carried_const, outer_consts):
    """The body's nodes computable without the data, and which carried
    values (indices) stay so: a fixed point from the constant ones."""
    it_name, cond_name = body.input[0].name, body.input[1].name
    carried = [i.name for i in body.input[2:]]
    keep = {j for j, known in enumerate(carried_const) if known}
    while True:
        known = {it_name, cond_name} | {t.name for t in body.initializer} | set(outer_consts)
        known |= {carried[j] for j in keep}
        nodes = []
        for n in body.node:
            if n.op_type in ("If", "Loop", "Scan") or not all(i in known for i in n.input if i):
                continue
            nodes.append(n)
            known.update(o for o in n.output if o)
        still = {j for j in keep if body.output[1 + j].name in known}
        if still == keep:
            return nodes, keep, known
        keep = still


def trip_count(node, consts, opset_imports):
    """How many times the Loop runs, or None where that depends on the data."""
    got = _const_inputs(node, consts)
    if got is None:
        return None
    m, cond = got
    body = body_of(node)
    cond_out = body.output[0].name
    carried_init = list(node.input[2:])
    nodes, keep, known = _static_part(body, [i in consts for i in carried_init], consts)
    if cond_out == body.input[1].name:  # the condition passes through unchanged
        return None if m is None else (m if cond else 0)
    if cond_out not in known:
        return None
    keep = sorted(keep)
    used = {i for n in nodes for i in n.input} | {cond_out}
    outer = [numpy_helper.from_array(np.asarray(consts[k]), k) for k in sorted(used & set(consts))]
    ins = [body.input[0], body.input[1]] + [body.input[2 + j] for j in keep]
    outs = [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None)
            for n in [cond_out] + [body.output[1 + j].name for j in keep]]
    graph = helper.make_graph(nodes, "trip", ins, outs, list(body.initializer) + outer)
    try:
        from onnx.reference import ReferenceEvaluator

        run = ReferenceEvaluator(helper.make_model(graph, opset_imports=opset_imports))
    except Exception:
        return None
    state = [np.asarray(consts[carried_init[j]]) for j in keep]
    count = 0
    while cond and (m is None or count < m):
        if count >= MAX_ITERATIONS:
            return count + 1  # unroll refuses it, naming the limit
        feeds = {body.input[0].name: np.array(count, np.int64), body.input[1].name: np.array(cond)}
        feeds.update({body.input[2 + j].name: v for j, v in zip(keep, state)})
        got = run.run(None, feeds)
        cond, state = bool(np.asarray(got[0]).reshape(-1)[0]), [np.asarray(v) for v in got[1:]]
        count += 1
    return count


def unroll(node, count, label, opset):
    """(nodes, initializers) computing the Loop's outputs by `count` copies
    of its body."""
    if count > MAX_ITERATIONS:
        raise CompileError(f"{label}: it runs more than {MAX_ITERATIONS} iterations; coldbrew unrolls "
                           f"loops of at most {MAX_ITERATIONS}")
    body = body_of(node)
    n_carried = len(node.input) - 2
    n_scan = len(body.output) - 1 - n_carried
    if count == 0 and n_scan:
        raise CompileError(f"{label}: it runs no iteration, so its scan outputs are empty "
                           "(zero-size tensors are not supported)")
    name = node.name or node.output[0]
    values = list(node.input[2:])
    nodes, inits, pieces = [], [], [[] for _ in range(n_scan)]
    for k in range(count):
        consts = {body.input[0].name: np.array(k, np.int64), body.input[1].name: np.array(True)}
        outs = _inline_copy(body, f"{name}/iter{k}/", dict(zip([i.name for i in body.input[2:]], values)), consts,
                            nodes, inits)
        values = outs[1:1 + n_carried]
        for j, out in enumerate(outs[1 + n_carried:]):
            pieces[j].append(out)
    nodes += [helper.make_node("Identity", [v], [o], name=f"{name}/out{j}")
              for j, (v, o) in enumerate(zip(values, node.output)) if o]
    for j, (parts, out) in enumerate(zip(pieces, node.output[n_carried:])):
        if out:
            _stack(parts, out, 0, opset, nodes, inits)
    return nodes, inits


BOUND_KEY = "coldbrew.bound:"  # model metadata: a tensor's bound, set by a rewrite (import_relax reads it)


def unroll_while(node, most, label, opset, consts, typed, select):
    """(nodes, initializers, {tensor: bound}) computing a Loop whose
    condition depends on the data, run at most `most` times: the body
    inlined `most` times, copy k's results taken where the condition before
    it held, by Where nodes named `select` (an If's selects, ir/branches.py:
    a run executes copy k only while that condition holds, and no copy
    after the first it skips), the carried values passed on unchanged
    otherwise; each scan output the values of the copies that ran, stacked
    (a Compress by the conditions, its length the iteration count: a size
    the data sets). Where M allows more than `most` iterations, the
    condition after the last copy joins the Compress's, bounded at `most`:
    a run that would need another iteration fails, naming --bound.
    `typed(nodes, inits, names)`: {name: (ONNX dtype, shape)} of values
    with `nodes` in the graph."""
    body = body_of(node)
    if any(n.op_type in ("Loop", "Scan", "If") for n in body.node):
        raise CompileError(f"{label}: control flow inside a Loop whose condition depends on the data is not "
                           f"supported yet")
    n_carried = len(node.input) - 2
    n_scan = len(body.output) - 1 - n_carried
    limit, first = (list(node.input) + ["", ""])[:2]
    name = node.name or node.output[0]
    nodes, inits = [], []

    def const(tag, value):
        inits.append(numpy_helper.from_array(np.asarray(value), f"{name}/{tag}"))
        return f"{name}/{tag}"

    shape = const("scalar", np.zeros(0, np.int64))

    def scalar(value, tag):
        nodes.append(helper.make_node("Reshape", [value, shape], [f"{name}/{tag}"]))
        return f"{name}/{tag}"

    runtime_limit = scalar(limit, "limit") if limit and limit not in consts else None

    def gate(cond, k):  # the condition and k < M, where M is known at run time only
        if runtime_limit is None:
            return cond
        below = f"{name}/below{k}"
        nodes.append(helper.make_node("Less", [const(f"k{k}", np.array(k, np.int64)), runtime_limit], [below]))
        nodes.append(helper.make_node("And", [cond, below], [f"{below}/and"]))
        return f"{below}/and"

    false = const("false", np.array(False))
    cond = gate(scalar(first, "first") if first else const("true", np.array(True)), 0)
    values, flags, slots, zeros = list(node.input[2:]), [], [[] for _ in range(n_scan)], None
    for k in range(most):
        prefix = f"{name}/iter{k}/"
        outer = {body.input[1].name: cond, **dict(zip([i.name for i in body.input[2:]], values))}
        outs = _inline_copy(body, prefix, outer, {body.input[0].name: np.array(k, np.int64)}, nodes, inits)
        if zeros is None:
            types = typed(nodes, inits, outs[1 + n_carried:])
            if any(types.get(o) is None for o in outs[1 + n_carried:]):
                raise CompileError(f"{label}: its scan outputs need shapes known at compile time")
            zeros = [const(f"none{j}", np.zeros(shape_, helper.tensor_dtype_to_np_dtype(dtype)))
                     for j, (dtype, shape_) in enumerate(types[o] for o in outs[1 + n_carried:])]

        def take(j, a, b):  # the first copy of a loop that always starts needs no select
            if k == 0 and runtime_limit is None and (not first or bool(np.asarray(consts.get(first, False)).all())):
                return a
            nodes.append(helper.make_node("Where", [cond, a, b], [f"{prefix}out{j}"], name=f"{prefix}{select}{j}"))
            return f"{prefix}out{j}"

        nxt = take(0, scalar(outs[0], f"iter{k}/cond"), false)
        values = [take(1 + j, a, b) for j, (a, b) in enumerate(zip(outs[1:1 + n_carried], values))]
        for j, a in enumerate(outs[1 + n_carried:]):
            slots[j].append(take(1 + n_carried + j, a, zeros[j]))
        flags.append(cond)
        cond = gate(nxt, k + 1)
    nodes += [helper.make_node("Identity", [v], [o], name=f"{name}/out{j}")
              for j, (v, o) in enumerate(zip(values, node.output)) if o]
    more = not limit or limit not in consts or int(np.asarray(consts[limit]).reshape(-1)[0]) > most
    bounds = _taken_scans(slots, zeros, flags + [cond] * more, node.output[n_carried:], most, opset, nodes, inits)
    if more and not bounds:
        raise CompileError(f"{label}: it may run more than the {most} iterations it is compiled for, and it has no "
                           f"scan output to check that against: give a bound of at least its trip count")
    return nodes, inits, bounds


START, END = "CbLoopStart", "CbLoopEnd"  # ai.coldbrew: a Loop the runtime runs (import_relax, ir/loops.py)
UNBOUNDED = -1  # a run-time loop's `most` where neither M nor a bound limits it (it has no scan output)


def at_run_time(node, label, most, consts, typed, opset):
    """(nodes, initializers, value_infos) running a Loop whose condition
    depends on the data as the runtime's loop: one copy of its body between
    a START node (the iteration number 0, the trip count, the first
    condition and the first carried values written) and an END node (the
    final carried values; each scan output at its bound, taken to the
    iteration count). After the body the runtime copies each carried value
    onto its input and each scan value into its slot, and runs the body
    again while the condition holds and the count is below M. Carried
    values passed through unchanged are read where they are. A sentence
    saying why not (`unroll_while` then) where a carried value changes its
    shape or type from one iteration to the next (beyond what _settled
    settles), one is another's input, a scan value's shape is unknown, or
    every value the loop reads is a constant. `most`: M or the user's
    bound, None where neither is known (a loop with scan outputs then
    needs one). `typed(nodes, inits, names)` as unroll_while's; `opset`
    the model's."""
    from .recurrent import DOMAIN

    body = body_of(node)
    slices = _varying_slices(body)
    if isinstance(slices, str):
        return slices
    n_carried = len(node.input) - 2
    n_scan = len(body.output) - 1 - n_carried
    limit, first = (list(node.input) + ["", ""])[:2]
    name = node.name or node.output[0]
    ins = [i.name for i in body.input]
    c_in, c_out = ins[2:], [o.name for o in body.output[1:1 + n_carried]]
    init = list(node.input[2:])
    passing = {j for j in range(n_carried) if c_out[j] == c_in[j]}
    kept = [j for j in range(n_carried) if j not in passing]
    if any(c_out[j] in ins for j in kept):
        return "one carried value is another's input"
    settled = _settled(body, name, init, kept, typed, opset, [n.output[0] for n in slices])
    if isinstance(settled, str):
        return settled
    init, nodes, inits, found, outs, once = settled
    body = _sliced_at(body, slices, {n.output[0]: found.get(f"{name}/probe/{n.output[0]}") for n in slices})
    if isinstance(body, str):
        return body
    scans = [found.get(o) for o in outs[1 + n_carried:]]
    if any(s is None for s in scans):
        return "a scan output's shape is not known"
    defined = {o for n in body.node for o in n.output} | set(ins) | {t.name for t in body.initializer}
    outer = [i for n in body.node for i in n.input if i and i not in defined]
    dep = next((v for v in [*node.input[2:], limit, first, *outer] if v and v not in consts), None)
    if dep is None:
        return "it reads nothing but constants"
    if n_scan and most is None:
        key = next(o for o in node.output[n_carried:] if o) if any(node.output[n_carried:]) else name
        raise CompileError(f"{label}: its condition depends on the data and it may run any number of "
                           f"iterations; its scan outputs need a bound: give it with --bound {key}=N")
    most = UNBOUNDED if most is None else most
    it, trip, cond = f"{name}/iteration", f"{name}/trip", f"{name}/cond"
    v_in = {j: f"{name}/carried{j}" for j in kept}
    nodes.append(helper.make_node(START, [dep, limit, first] + [init[j] for j in kept],
                                  [it, trip, cond] + [v_in[j] for j in kept], name=f"{name}/start", domain=DOMAIN,
                                  most=most, at_least_once=int(once)))
    bound = {ins[0]: it, ins[1]: cond, **{c_in[j]: v_in.get(j, init[j]) for j in range(n_carried)}}
    outs = _inline_copy(body, f"{name}/body/", bound, {}, nodes, inits)
    _constants_held(nodes, inits)
    finals = [node.output[j] if j < len(node.output) and node.output[j] else f"{name}/final{j}" for j in kept]
    scan_names = [o or f"{name}/scan{k}" for k, o in enumerate((list(node.output) + [""] * n_scan)[n_carried:]
                                                                [:n_scan])]
    nodes.append(helper.make_node(END, [it, trip, cond] + [v_in[j] for j in kept] + [outs[0]] +
                                  [outs[1 + j] for j in kept] + outs[1 + n_carried:], finals + scan_names,
                                  name=f"{name}/end", domain=DOMAIN, carried=len(kept), scans=n_scan, most=most))
    nodes += [helper.make_node("Identity", [init[j]], [node.output[j]], name=f"{name}/out{j}")
              for j in sorted(passing) if j < len(node.output) and node.output[j]]
    state = [(it, TensorProto.INT64, []), (trip, TensorProto.INT64, []), (cond, TensorProto.BOOL, [])]
    state += [(v_in[j], *found[init[j]]) for j in kept] + [(f, *found[init[j]]) for f, j in zip(finals, kept)]
    state += [(o, dtype, [f"count_{o}", *shape]) for o, (dtype, shape) in zip(scan_names, scans)]
    state += [(f"{name}/body/{n.output[0]}", *found[f"{name}/probe/{n.output[0]}"]) for n in slices]
    return nodes, inits, [helper.make_tensor_value_info(*v) for v in state]


# ai.coldbrew: a Slice at a place the iteration sets (or a Range, `range` 1), of the length it has first
SLICE_AT = "CbSliceAt"


def _varying_slices(body):
    """The body's Slices whose starts or ends and Ranges whose limits change
    from one iteration to the next (a decoder reading or writing its
    step's row), or why not where something else the iteration changes
    decides a shape (the copies are needed). An If's condition may change:
    it becomes a select."""
    from .ops import STATIC_INPUTS

    if any(n.op_type in ("Loop", "Scan") for n in body.node):
        return "its body holds a Loop or a Scan"
    varying, slices = {i.name for i in body.input}, []
    for n in body.node:  # (a carried value's shape does not change: what Shape or Size reads of it is fixed)
        if n.op_type in ("Shape", "Size") or not any(i in varying for i in n.input):
            continue
        static = [p for p in STATIC_INPUTS.get(n.op_type, ()) if p < len(n.input) and n.input[p] in varying]
        if (n.op_type == "Slice" and static and set(static) <= {1, 2}) or n.op_type == "Range":
            slices.append(n)
        elif static and n.op_type != "If":
            return f"the iteration changes what {n.op_type} node '{n.name or n.output[0]}' takes as a shape"
        varying.update(n.output)
    return slices


def _sliced_at(body, slices, shapes):
    """A copy of `body` whose varying Slices are SLICE_AT nodes of the
    shape their first iteration gives (`shapes`; the kernel checks it at
    every iteration: kernels/loops.py slice_at_te), or why not where one is unknown
    or steps backwards."""
    from .recurrent import DOMAIN

    if not slices:
        return body
    consts = {t.name: numpy_helper.to_array(t) for t in body.initializer}
    consts.update((n.output[0], numpy_helper.to_array(n.attribute[0].t)) for n in body.node
                  if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value")
    copy = onnx.GraphProto()
    copy.CopyFrom(body)
    del copy.node[:]
    for n in body.node:
        if n not in slices:
            copy.node.append(n)
            continue
        got, extra = shapes.get(n.output[0]), list(n.input[3:5])
        if n.op_type == "Range":
            if got is None or len(got[1]) != 1 or not isinstance(got[1][0], int):
                return f"Range node '{n.name or n.output[0]}' has no length known from the first iteration"
            copy.node.append(helper.make_node(SLICE_AT, list(n.input), [n.output[0]], name=n.name, domain=DOMAIN,
                                              shape=got[1], range=1))
            continue
        axes = [int(a) for a in consts[extra[0]].reshape(-1)] if extra and extra[0] in consts else None
        cut = {a % len(got[1]) for a in (axes if axes is not None else range(len(got[1])))} if got else set()
        if got is None or any(not isinstance(got[1][a], int) for a in cut) or any(e and e not in consts for e in extra):
            return f"Slice node '{n.name or n.output[0]}' has no shape known from the first iteration"
        whole = [d if isinstance(d, int) else -1 for d in got[1]]  # -1: an axis it keeps whole, sized at run time
        steps = [int(v) for v in consts[extra[1]].reshape(-1)] if len(extra) > 1 and extra[1] else None
        if steps is not None and min(steps) <= 0:
            return f"Slice node '{n.name or n.output[0]}' steps backwards at a place the iteration sets"
        attrs = dict(shape=whole, **({"axes": axes} if axes is not None else {}),
                     **({"steps": steps} if steps is not None else {}))
        copy.node.append(helper.make_node(SLICE_AT, list(n.input[:3]), [n.output[0]], name=n.name, domain=DOMAIN,
                                          **attrs))
    return copy


def _settled(body, name, init, kept, typed, opset, more=()):
    """(first values, nodes and initializers making them, {value: (dtype,
    dims)}, a probe copy's outputs, whether the loop must run once) where
    every carried value in `kept` keeps one shape and type from the
    START on, or None. A carried value whose first iteration changes its
    shape but not its size (a scalar that becomes a [1]) starts reshaped;
    one the body never reads (a buffer an exporter starts as a scalar)
    starts as zeros of its later shape (_zeros_of), and a run must then take at least
    one iteration (the runtime fails one that takes none)."""
    ins = [i.name for i in body.input]
    read = {i for n in _all_nodes(body) for i in n.input}
    nodes, inits, once = [], [], False
    for _ in range(3):
        probe_nodes, probe_inits = [], []
        outs = _inline_copy(body, f"{name}/probe/", dict(zip(ins[2:], init)),
                            {ins[0]: np.array(0, np.int64), ins[1]: np.array(True)}, probe_nodes, probe_inits)
        found = typed(nodes + probe_nodes, inits + probe_inits, init + outs + [f"{name}/probe/{m}" for m in more])
        changed = [j for j in kept if found.get(init[j]) != found.get(outs[1 + j])]
        if not changed:
            return init, nodes, inits, found, outs, once
        for j in changed:
            (dtype, was), (_, now) = found.get(init[j], (None, None)), found.get(outs[1 + j], (None, None))
            label = f"carried value '{ins[2 + j]}'"
            if now is None or dtype != found[outs[1 + j]][0]:
                return f"{label}: its shape or type after an iteration is not known or not its first one's"
            new, sized = f"{name}/first{j}", any(not isinstance(d, int) for d in now)
            if not sized and was is not None and all(isinstance(d, int) for d in was) and np.prod(was) == np.prod(now):
                inits.append(numpy_helper.from_array(np.array(now, np.int64), f"{new}/shape"))
                nodes.append(helper.make_node("Reshape", [init[j], f"{new}/shape"], [new], name=new))
            elif ins[2 + j] not in read:
                floats = sorted((v for v in init if v in found), key=lambda v: found[v][0] != TensorProto.FLOAT)
                if not _zeros_of(now, dtype, {v: found[v][1] for v in floats}, new, nodes, inits, opset):
                    return f"{label} starts as {was} and becomes {now}, a shape set at run time"
                once = True
            else:
                return f"{label} starts as {was}, becomes {now}, and the body reads it"
            init[j] = new
    return "its carried values' shapes do not settle"


def _zeros_of(dims, dtype, shapes, out, nodes, inits, opset):
    """`out` = zeros of `dtype` and of `dims`: a constant, or where a size
    is set at run time, a ConstantOfShape of sizes read from the first of
    `shapes` ({value: dims}: float tensors first, not sizes the importer
    keeps as a shape) that has it; False if one is not found."""
    zero = np.zeros(1, helper.tensor_dtype_to_np_dtype(dtype))
    if all(isinstance(d, int) for d in dims):
        inits.append(numpy_helper.from_array(np.zeros(dims, zero.dtype), out))
        return True
    sizes = [d if isinstance(d, int) else next(((v, a) for v, s in shapes.items() for a, e in enumerate(s or [])
                                                if e == d), None) for d in dims]
    if None in sizes:
        return False
    new, more = shape_of_sizes(sizes, f"{out}/dims", opset)
    nodes += new + [helper.make_node("ConstantOfShape", [f"{out}/dims"], [out], name=out,
                                     value=numpy_helper.from_array(zero))]
    inits += more
    return True


def _constants_held(nodes, inits):
    """The Constant nodes among `nodes` made initializers (the importer and
    the rewrites after read a node's constant inputs from those)."""
    keep = []
    for n in nodes:
        value = next((a.t for a in n.attribute if a.name == "value"), None) if n.op_type == "Constant" else None
        if value is None:
            keep.append(n)
            continue
        t = onnx.TensorProto()
        t.CopyFrom(value)
        t.name = n.output[0]
        inits.append(t)
    nodes[:] = keep


def _all_nodes(graph):
    """The graph's nodes and those of its subgraphs, all the way down."""
    for n in graph.node:
        yield n
        for a in n.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                yield from _all_nodes(g)


def _taken_scans(slots, zeros, flags, outs, most, opset, nodes, inits):
    """Each scan output: its copies' values stacked, those whose condition
    held taken (a Compress); a condition past the last copy (`flags` one
    longer) takes an empty slot: a count over the bound. {output: bound}."""
    bounds = {}
    for j, (parts, out) in enumerate(zip(slots, outs)):
        if out:
            _stack(parts + [zeros[j]] * (len(flags) - len(parts)), f"{out}/all", 0, opset, nodes, inits)
            _stack(flags, f"{out}/ran", 0, opset, nodes, inits)
            nodes.append(helper.make_node("Compress", [f"{out}/all", f"{out}/ran"], [out], axis=0,
                                          name=f"{out}/taken"))
            bounds[out] = most
    return bounds


def _inline_copy(body, prefix, bound, consts, nodes, inits):
    """Append one copy of `body` to nodes/inits, its inputs read from the
    outer values `bound` ({input: outer name}) or constants `consts`
    ({input: value}); its output names returned."""
    copy = onnx.GraphProto()
    copy.CopyFrom(body)
    del copy.input[:]
    copy.initializer.extend([numpy_helper.from_array(v, k) for k, v in consts.items()])
    del copy.node[:]
    copy.node.extend([helper.make_node("Identity", [v], [i]) for i, v in bound.items() if v != i] +
                     list(body.node))  # an input named as the outer value it is bound to reads that value
    new, more, outs = inline_branch(copy, prefix)
    nodes += new
    inits += more
    return outs


def _stack(parts, out, axis, opset, nodes, inits):
    """`out` = the `parts` stacked along a new axis `axis`."""
    stacked = []
    for k, p in enumerate(parts):
        s = f"{out}/part{k}"
        if opset >= 13:
            axes = f"{out}/axes"
            if k == 0:
                inits.append(numpy_helper.from_array(np.array([axis], np.int64), axes))
            nodes.append(helper.make_node("Unsqueeze", [p, axes], [s]))
        else:
            nodes.append(helper.make_node("Unsqueeze", [p], [s], axes=[axis]))
        stacked.append(s)
    nodes.append(helper.make_node("Concat", stacked, [out], axis=axis, name=f"{out}/stack"))


def unroll_scan(node, label, shapes, opset):
    """(nodes, initializers) computing a Scan (opset 9 on) by one copy of
    its body per step of its scan inputs."""
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    body = a["body"]
    m = int(a["num_scan_inputs"])
    n = len(node.input) - m
    k_out = len(body.output) - n
    in_axes = list(a.get("scan_input_axes", [0] * m))
    in_rev = list(a.get("scan_input_directions", [0] * m))
    out_axes = list(a.get("scan_output_axes", [0] * k_out))
    out_rev = list(a.get("scan_output_directions", [0] * k_out))
    scans = list(node.input[n:])
    if any(s not in shapes for s in scans):
        raise CompileError(f"{label}: its scan inputs need static shapes")
    in_axes = [ax % len(shapes[s]) for ax, s in zip(in_axes, scans)]
    steps = {shapes[s][ax] for s, ax in zip(scans, in_axes)}
    if len(steps) != 1 or 0 in steps:
        raise CompileError(f"{label}: its scan inputs have different or zero lengths {sorted(steps)}")
    steps = steps.pop()
    if steps > MAX_ITERATIONS:
        raise CompileError(f"{label}: it runs more than {MAX_ITERATIONS} steps; coldbrew unrolls at most that")
    name = node.name or node.output[0]
    nodes, inits, pieces = [], [], [[] for _ in range(k_out)]
    values = list(node.input[:n])
    for t in range(steps):
        bound = dict(zip([i.name for i in body.input[:n]], values))
        for j, (s, ax, rev) in enumerate(zip(scans, in_axes, in_rev)):
            idx = f"{name}/step{t}/index{j}"
            inits.append(numpy_helper.from_array(np.array(steps - 1 - t if rev else t, np.int64), idx))
            nodes.append(helper.make_node("Gather", [s, idx], [f"{idx}/slice"], axis=ax))
            bound[body.input[n + j].name] = f"{idx}/slice"
        outs = _inline_copy(body, f"{name}/step{t}/", bound, {}, nodes, inits)
        values = outs[:n]
        for j, out in enumerate(outs[n:]):
            pieces[j].append(out)
    nodes += [helper.make_node("Identity", [v], [o], name=f"{name}/state{j}")
              for j, (v, o) in enumerate(zip(values, node.output)) if o]
    for j, (parts, out) in enumerate(zip(pieces, node.output[n:])):
        if out:
            t = body.output[n + j].type.tensor_type
            axis = out_axes[j] % (len(t.shape.dim) + 1) if out_axes[j] < 0 and t.HasField("shape") else out_axes[j]
            _stack(parts[::-1] if out_rev[j] else parts, out, axis, opset, nodes, inits)
    return nodes, inits
