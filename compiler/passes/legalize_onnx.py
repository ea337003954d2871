"""Pass `legalize_onnx`: rewrite ONNX forms the Relax importer does not take
into equivalent ones it does, then check that every operator is supported
(again: an If's inlined branch may bring new ones) and that every
shape-deciding input, an If's condition among them, is constant
(ops.check_static).

- If whose condition is not a constant (fold_constants inlined the others):
  computed both ways and selected, both branches inlined and each output a
  Where(condition, then, else), where the two branches' outputs have one
  known type and shape each (a verifier run on a detector's score, a mode
  switch on a value); other Ifs stay, and check_static names them.
- Clip with a bound computed at run time (legal ONNX; the importer takes
  constant bounds only): Max by the lower bound, then Min by the upper.
- Scan (opset 9 on): unrolled over its scan inputs' length (onnx/loops.py).
- LSTM, GRU, RNN and onnxruntime's quantized LSTM: on CPU targets, the
  input projection (one product)
  and a cell node of coldbrew's own that import_relax makes a cell layer
  (compiler/kernels/recurrent.py); otherwise, and for the forms the cell
  kernel lacks, unrolled over their sequence, fixed at compile time, into
  MatMuls, gates and state updates (onnx/recurrent.py).
- Single operators the importer lacks or takes in one form only (LRN,
  IsInf, RMSNormalization, OneHot, TopK, Upsample, ReverseSequence,
  ConvInteger, Celu, Swish, LpNormalization, EyeLike, LayerNormalization's
  statistics, float Mod, extrema of bools, ConvTranspose's output_shape,
  Resize's other modes; float16 products accumulated in float32; Pow of
  mixed types or integers): onnx/decompose.py.
- ConvTranspose (2-D, constant weights): one Conv of every output phase's
  sub-kernel and a pixel shuffle (onnx/subpixel.py, run among the
  decompositions), so it gets the convolution variants and multiplies no
  inserted zero.
- Empty optional inputs given as empty tensors (a Resize's unused `roi` or
  `scales` beside its `sizes`): left out, as ONNX means them.
"""
import numpy as np
import onnx
from onnx import TensorProto, helper

from ..errors import CompileError
from ..onnx import shapes
from ..onnx.ops import (types_and_shapes, branches, check_static, check_supported, data_slice, inline_branch, of_shapes,
                        opset_of)
from ..onnx import decompose, fold
from ..ir.branches import SELECT
from ..onnx.loops import BOUND_KEY, MAX_ITERATIONS, at_run_time, unroll_scan, unroll_while
from ..onnx import recurrent
from ..onnx.recurrent import GATES

NAME = "legalize_onnx"

def _same_outputs(a, b, inferred=None):
    """Whether two branches' outputs pair up with one known type and shape
    each (as declared, else as `inferred`: the (dtype, dims) of each
    branch's outputs, in order); a one-value vector pairs with a scalar
    (the select gives the vector: an exporter's branch returning a
    constant scalar where the other computes a [1])."""
    def sig(v):
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] if t.HasField("shape") else None
        return t.elem_type, dims

    def pair(x, y):  # a size set at run time by its name (inferred): the same name, the same size
        if x is None or y is None or x[0] != y[0] or x[1] is None or y[1] is None or None in x[1] + y[1]:
            return False
        return x[1] == y[1] or ({len(x[1]), len(y[1])} == {0, 1} and (x[1] + y[1]) == [1])

    sigs = inferred or ([sig(x) for x in a.output], [sig(y) for y in b.output])
    return len(a.output) == len(b.output) and all(pair(x, y) for x, y in zip(*sigs))


def _branch_types(model, before, then_b, else_b):
    """The (dtype, dims) of each branch's outputs, inferred with the graph's
    nodes `before` them (an exporter's declared shapes may be wrong)."""
    t, e = inline_branch(then_b, "then/"), inline_branch(else_b, "else/")
    got = _named_types(model, before, t[0] + e[0], t[1] + e[1], t[2] + e[2], selects=False)
    return [got.get(n) for n in t[2]], [got.get(n) for n in e[2]]


def _if_to_where(model):
    """Every If with a non-constant condition and branches that pair up
    (_same_outputs), computed both ways and selected (module docstring)."""
    g = model.graph
    consts = {t.name for t in g.initializer}
    if not any(n.op_type == "If" and n.input[0] not in consts for n in g.node):
        return
    before = len(g.node)
    nodes, inits = [], []
    for node in g.node:
        then_b, else_b = branches(node) if node.op_type == "If" else (None, None)
        if node.op_type != "If" or node.input[0] in consts or not (
                _same_outputs(then_b, else_b) or _same_outputs(then_b, else_b, _branch_types(model, nodes, then_b,
                                                                                              else_b))):
            nodes.append(node)
            continue
        name = node.name or node.output[0]
        t, e = inline_branch(then_b, f"{name}/then/"), inline_branch(else_b, f"{name}/else/")
        scalar = f"{name}/cond_scalar"
        inits.append(helper.make_tensor(f"{name}/scalar_shape", TensorProto.INT64, [0], []))
        nodes += t[0] + e[0] + [helper.make_node("Reshape", [node.input[0], f"{name}/scalar_shape"], [scalar],
                                                 name=f"{name}/cond")]
        nodes += [helper.make_node("Where", [scalar, a, b], [out], name=f"{name}/{SELECT}{k}")
                  for k, (a, b, out) in enumerate(zip(t[2], e[2], node.output)) if out]
        inits += t[1] + e[1]
    g.ClearField("node")
    g.node.extend(nodes)
    g.initializer.extend(inits)
    if len(nodes) != before or inits:
        _if_to_where(model)  # the Ifs inside the branches just inlined


_EMPTY_MEANS_ABSENT = {"Resize": (1, 2)}  # optional inputs that an empty tensor leaves out


def _drop_empty_optionals(model):
    g = model.graph
    empty = {t.name for t in g.initializer if 0 in t.dims}
    for node in g.node:
        for pos in _EMPTY_MEANS_ABSENT.get(node.op_type, ()):
            if pos < len(node.input) and node.input[pos] in empty:
                node.input[pos] = ""


def _clip_bounds(model):
    g = model.graph
    consts = {t.name for t in g.initializer}
    nodes = []
    for node in g.node:
        bounds = list(node.input[1:3])
        if node.op_type != "Clip" or all(not b or b in consts for b in bounds):
            nodes.append(node)
            continue
        x, name = node.input[0], node.name or node.output[0]
        for k, (op, bound) in enumerate(zip(("Max", "Min"), bounds + [""] * (2 - len(bounds)))):
            if not bound:
                continue
            out = f"{name}/{op.lower()}"
            nodes.append(helper.make_node(op, [x, bound], [out], name=out))
            x = out
        nodes.append(helper.make_node("Identity", [x], [node.output[0]], name=f"{name}/out"))
    g.ClearField("node")
    g.node.extend(nodes)


def _while_loops(model, bounds):
    """Every Loop left (fold_constants unrolled those whose trip count it
    counts: the rest stop on a condition the data sets), unrolled to the
    most iterations it may run (onnx/loops.py unroll_while): its trip count
    M, or the user's bound (--bound on the Loop's name or an output's);
    the bounds of its scan outputs kept in the model's metadata for
    import_relax."""
    g = model.graph
    if not any(n.op_type == "Loop" for n in g.node):
        return False
    from onnx import numpy_helper

    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    opset, nodes, ran = opset_of(model), [], False

    def typed(before, new, inits, names):
        tmp = _probe(model, before, new, inits, names)
        fold.apply(tmp)  # the copy's iteration number is a constant: what it decides (a Slice's start) folds
        types, shapes = types_and_shapes(tmp, values=True)
        return {n: (types[n], shapes[n]) for n in names if n in types and n in shapes}

    for node in g.node:
        if node.op_type != "Loop":
            nodes.append(node)
            continue
        name = node.name or node.output[0]
        label, limit = f"Loop node '{name}'", (list(node.input) + [""])[0]
        given = next((bounds[k] for k in [node.name, *node.output] if k and k in bounds), None)
        m = int(np.asarray(consts[limit]).reshape(-1)[0]) if limit in consts else None
        most = min(v for v in (given, m) if v is not None) if given is not None or m is not None else None
        key = next((o for o in node.output[len(node.input) - 2:] if o), name)
        before = list(nodes)
        looped = at_run_time(node, label, most, consts, lambda n, i, ns: _named_types(model, before, n, i, ns),
                             opset)
        if not isinstance(looped, str):  # the runtime runs it (ir/loops.py)
            nodes += looped[0]
            g.initializer.extend(looped[1])
            g.value_info.extend(looped[2])
            if not any(o.domain == recurrent.DOMAIN for o in model.opset_import):
                model.opset_import.append(helper.make_opsetid(recurrent.DOMAIN, 1))
            ran = True
            continue
        why = f" (the runtime cannot run it as one body: {looped})"
        if most is None or most > MAX_ITERATIONS:
            raise CompileError(f"{label}: its condition depends on the data and it may run "
                               f"{'any number of' if most is None else most} iterations; coldbrew unrolls it to the "
                               f"most it runs (at most {MAX_ITERATIONS}): give that with --bound {key}=N{why}")
        try:
            new, inits, found = unroll_while(node, max(most, 1), label, opset, consts,
                                             lambda n, i, names: typed(before, n, i, names), SELECT)
        except CompileError as e:
            raise CompileError(f"{e}{why}") from None
        nodes += new
        g.initializer.extend(inits)
        consts.update((t.name, numpy_helper.to_array(t)) for t in inits)
        for tensor, n in found.items():
            model.metadata_props.add(key=f"{BOUND_KEY}{tensor}", value=str(n))
    g.ClearField("node")
    g.node.extend(nodes)
    return ran


def _probe(model, before, new, inits, names):
    """A copy of `model` whose graph is the nodes `before` + `new` and whose
    outputs are `names` (those not already inputs or initializers)."""
    tmp = type(model)()
    tmp.CopyFrom(model)
    tmp.graph.ClearField("node")
    tmp.graph.node.extend(before + new)
    tmp.graph.initializer.extend(inits)
    tmp.graph.ClearField("output")
    fixed = {t.name for t in tmp.graph.initializer} | {i.name for i in tmp.graph.input}
    tmp.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None)
                            for n in dict.fromkeys(names) if n not in fixed)
    return tmp


def _named_types(model, before, new, inits, names, selects=True):
    """{name: (ONNX dtype, dims)} of `names` with `before` + `new` nodes as
    the graph, a dimension set at run time by its name; the copy's
    iteration number is a constant, so what it decides folds; with
    `selects`, Ifs are made selects as the model's own will be."""
    tmp = _probe(model, before, new, inits, names)
    known = {}
    for folded in (False, True):
        if folded:
            fold.apply(tmp)
            if selects:
                _if_to_where(tmp)
        g2 = onnx.shape_inference.infer_shapes(tmp, strict_mode=False, data_prop=True).graph
        known.update((t.name, (t.data_type, list(t.dims))) for t in g2.initializer)
        for v in list(g2.input) + list(g2.value_info) + list(g2.output):
            tt = v.type.tensor_type
            if tt.HasField("shape") and all(d.HasField("dim_value") or d.dim_param for d in tt.shape.dim):
                known[v.name] = (tt.elem_type, [d.dim_value if d.HasField("dim_value") else d.dim_param
                                                for d in tt.shape.dim])
    return {n: known[n] for n in names if n in known}


def _unroll_scans(model):
    _, shapes = types_and_shapes(model)
    opset = opset_of(model)

    def expand(node, name, a, add_init):
        if opset < 9:
            raise CompileError(f"Scan node '{name}': the opset-8 Scan (with a batch axis) is not supported; "
                               "re-export at opset 9 or later")
        nodes, inits = unroll_scan(node, f"Scan node '{name}'", shapes, opset)
        model.graph.initializer.extend(inits)
        return nodes
    decompose.rewrite(model, "Scan", expand)


def _recurrent(model, cells):
    """Every recurrent cell, in graph order, made a cell layer's node
    (`cells`, where the kernel covers it: onnx/recurrent.py as_cell) or
    unrolled; shapes inferred again after a cell whose type ONNX's
    inference does not know (an onnxruntime contrib cell) hid the shapes
    of the ones after it."""
    g = model.graph
    opset = opset_of(model)
    while any(n.op_type in GATES for n in g.node):
        consts = {t.name: t for t in g.initializer}
        _, shapes = types_and_shapes(model, symbolic=True)
        nodes, done = [], False
        for i, node in enumerate(g.node):
            if (node.op_type not in GATES or node.domain not in ("", "ai.onnx", "com.microsoft")
                    or (done and node.input[0] not in shapes)):
                nodes.append(node)
                continue
            label = f"{node.op_type} node '{node.name or f'#{i}'}'"
            cell = recurrent.as_cell(node, label, consts, shapes) if cells else None
            if cell is not None:
                new, inits, infos = cell
                g.value_info.extend(infos)
                if not any(o.domain == recurrent.DOMAIN for o in model.opset_import):
                    model.opset_import.append(helper.make_opsetid(recurrent.DOMAIN, 1))
            else:
                new, inits = recurrent.unroll(node, label, consts, shapes, opset)
            nodes += new
            g.initializer.extend(inits)
            done = True
        g.ClearField("node")
        g.node.extend(nodes)
        if not done:
            return


def apply(model, cells=True, sized=False, bounds=None, ranges=None):
    """`cells`: recurrent cells the kernel covers become cell layers
    (compiler/kernels/recurrent.py; CPU targets), the rest are unrolled;
    `sized`: some input dimensions are sized at run time (shape arithmetic
    on them is left to the importer); `bounds`: the user's, of outputs
    sized by the data (a Loop's iterations among them); `ranges`: {name:
    (min, max)} of the input dimensions declared as ranges."""
    if sized:
        _name_counts(model)
        _fold_sizes(model, ranges)
        _sizes_as_data(model)
    if _while_loops(model, bounds or {}):  # a loop the runtime runs: its body's shapes fold as the rest did
        fold.apply(model)
        if sized:
            _name_counts(model)  # what follows it (a slice to its step count)
            _fold_sizes(model, ranges)
    _if_to_where(model)
    _unroll_scans(model)
    _drop_empty_optionals(model)
    _clip_bounds(model)
    _recurrent(model, cells)
    decompose.apply(model)
    check_supported(model)  # again: fold_constants may have inlined an If's branch
    check_static(model, sized)
    return model


def _fold_sizes(model, ranges):
    """The shape arithmetic on sizes set at run time folded (onnx/shapes.py),
    and the If branches that a size decides at every size inlined, until
    none is left (an inlined branch's shapes may decide the next If)."""
    for _ in range(8):
        consts = {t.name for t in shapes.apply(model, ranges).graph.initializer}
        if not any(n.op_type == "If" and n.input[0] in consts for n in model.graph.node):
            return
        fold.apply(model)


def _name_counts(model):
    """The outputs sized by the data, their counted axis named (value_info)
    as import_relax names its variable: ONNX's shape inference carries the
    name on, and the shape arithmetic after them folds (onnx/shapes.py)."""
    types, known = types_and_shapes(model, symbolic=True)
    g = model.graph
    consts = {t.name: t for t in g.initializer}
    for node in g.node:
        out = node.output[0] if node.output else ""
        count = f"count_{out}"
        if node.op_type == "NonZero" and node.input[0] in known:
            shape = [max(len(known[node.input[0]]), 1), count]
        elif data_slice(node, consts) and node.input[0] in known:  # along its one axis
            axis = _slice_axis(node, consts, len(known[node.input[0]]))
            shape = [count if k == axis else d for k, d in enumerate(known[node.input[0]])]
        elif node.op_type == "NonMaxSuppression" or (node.op_type == "Unique" and not any(
                a.name == "axis" for a in node.attribute)):  # a Range: onnx/shapes.py names its length
            shape = [count, 3] if node.op_type == "NonMaxSuppression" else [count]
        else:
            continue
        named = {v.name for v in g.value_info}
        for k, o in enumerate(node.output):
            if o and k != 2 and o not in named:  # Unique's inverse has its input's size
                g.value_info.append(helper.make_tensor_value_info(o, types.get(o, TensorProto.INT64), shape))


def _slice_axis(node, consts, rank):
    """The one axis of a data_slice."""
    from onnx import numpy_helper

    axes = node.input[3] if len(node.input) > 3 and node.input[3] else None
    return int(numpy_helper.to_array(consts[axes]).reshape(-1)[0]) % rank if axes else 0


_SIZE_READERS = {"ReduceMin": 0, "ReduceMax": 0, "ReduceSum": 0, "ReduceProd": 0, "TopK": 1}


def _sizes_as_data(model):
    """A shape's values read as data (the least of a count and a limit, a
    TopK's k): a Cast to int64 between, which the importer makes a tensor
    (import_relax writes sizes set at run time into it)."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    consts = {t.name for t in g.initializer}
    nodes = []
    for node in g.node:
        k = _SIZE_READERS.get(node.op_type)
        if k is not None and k < len(node.input) and node.input[k] and of_shapes(node.input[k], producer, consts):
            name = f"{node.input[k]}/as_data"
            nodes.append(helper.make_node("Cast", [node.input[k]], [name], to=TensorProto.INT64))
            node.input[k] = name
        nodes.append(node)
    del g.node[:]
    g.node.extend(nodes)


def _sized_by_data(model):
    """Whether some output's size depends on the data (a NonZero, a Loop
    that stops on a condition the data sets): the shape arithmetic after
    it is left to the importer."""
    from ..onnx.ops import COUNTED_OPS

    consts = {t.name: t for t in model.graph.initializer}
    return any(n.op_type in COUNTED_OPS or n.op_type == "Loop" or data_slice(n, consts) for n in model.graph.node)


def run(c):
    ranges = {d.name: (d.min, d.max) for d in c.options.dims.values()}
    c.proto = apply(c.proto, c.cells, bool(ranges) or _sized_by_data(c.proto), c.options.bounds, ranges)
    if decompose.has_exact_sums(c.proto):  # a ConvInteger's or MatMulInteger's centred weights: int8 times 1
        c.qdq_scales.append(np.ones(1, np.float32))
    return c
