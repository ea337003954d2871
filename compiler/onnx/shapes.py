"""Shape arithmetic on sizes set at run time, folded into constants.

Exporters compute the shapes a model reshapes to from its inputs' shapes:
Shape -> Gather -> Unsqueeze -> Concat -> Reshape, and the like. With a
fixed input shape fold_constants evaluates such chains; with input
dimensions declared as ranges they stay, and the importer takes few of
them. Here each chain is evaluated on sizes: ONNX's shape inference names
every dimension (the declared ones by their names, fixed ones as numbers),
Shape reads them, and Gather, Concat, Slice, arithmetic ... carry them as
expressions (TVM's, one variable per name). A shape input of a Reshape,
Expand or Slice whose value is then known is written as a constant in the
operator's own relative terms, which hold at every size:

- Reshape: an entry equal to the input's size at the same axis is 0 (copy
  it), one other sized at run time is -1 (what is left);
- Expand: an entry equal to the input's size at the aligned axis is 1;
- Slice: an end equal to the sliced axis's size (or past it) is the
  largest int64, one that size less a constant is that constant, negated.

Repeated (ONNX infers anew what a rewrite lets it know) until nothing
changes. What cannot be written so stays for the importer (or for
check_static to name)."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper, shape_inference

from .ops import drop_unread, opset_of, shape_of_sizes

BIG = np.iinfo(np.int64).max
SIZES = "/cb_sizes"  # a Cast so named hands its shape on to the importer as sizes (import_relax)
_ARITH = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


def apply(model, ranges=None):
    """Fold the model's shape arithmetic on sizes set at run time (in place).
    `ranges`: {dimension name: (min, max)} of the sizes declared as ranges
    (a Slice ending past an axis's largest size keeps the whole axis: the
    importer would carry min(end, size) as the axis's extent)."""
    table = {}  # dim name -> its size (a TVM expression), across rounds
    for _ in range(8):
        if not _fold_once(model, table, ranges or {}):
            break
    drop_unread(model)  # the chains folded
    return model


def _fold_once(model, names, ranges):
    from tvm import tirx

    g = shape_inference.infer_shapes(model, strict_mode=False).graph

    def dim(d):
        if d.HasField("dim_value"):
            return d.dim_value
        if not d.dim_param:
            return None
        return names.setdefault(d.dim_param, tirx.Var(d.dim_param, "int64"))

    infos = list(g.input) + list(g.value_info) + list(g.output)
    shapes = {v.name: [dim(d) for d in v.type.tensor_type.shape.dim] for v in infos if v.type.tensor_type.HasField("shape")}
    elems = {v.name: v.type.tensor_type.elem_type for v in infos}  # (a rewrite keeps every element type)
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer  # small integer constants
              if t.data_type in (6, 7) and np.prod(t.dims, dtype=np.int64) <= 64}  # (int32: a jax2tf shape)
    changed, inserts = False, []  # inserts: (a node's first output, a node to put before it)
    bounded = _bounded(names, ranges)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] not in values:
            v = _constant(node)
            if v is not None:
                values[node.output[0]] = v
            continue
        out = _evaluate(node, values, shapes)
        if out is not None:
            values[node.output[0]] = np.asarray(out, dtype=object)
        if node.op_type == "Range" and _unknown(shapes.get(node.output[0], [None])):  # its length named
            length = _range_length(node, values)  # a Range over sizes, or one the data sizes (a fresh name)
            _name_dims(model, node.output[0], [names.setdefault(f"count_{node.output[0]}", tirx.Var(
                f"count_{node.output[0]}", "int64")) if length is None else length], names, elems)
            changed = True
        done = _rewrite(model, node, values, shapes, inserts, elems) or \
            (node.op_type == "Slice" and node.input[0] not in values  # (a shape's slices: evaluated)
             and _whole_axes(model, node, values, shapes.get(node.input[0]), bounded))
        changed |= bool(done)
        if isinstance(done, list):  # what ONNX infers from a -1 is a new name: say which size it is
            _name_dims(model, node.output[0], done, names, elems)
    if inserts:
        before = {}
        for out, n in inserts:
            before.setdefault(out, []).append(n)
        nodes = [m for n in model.graph.node for m in before.get(n.output[0], []) + [n]]
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return changed


def _name_dims(model, value, sizes, names, elems):
    """Record `value`'s shape in the graph (value_info), each size sized at
    run time by a name `names` maps to it."""
    from tvm.sym import Analyzer

    dims = []
    for e in sizes:
        if _fixed(e):
            dims.append(int(e))
            continue
        e = Analyzer().simplify(e)
        name = next((n for n, v in names.items() if v.same_as(e) or (not _fixed(v) and _same(v, e))), None)
        if name is None:
            name = f"cb_size{len(names)}"
            names[name] = e
        dims.append(None if name.startswith("unk__") else name)  # (ONNX's name for a size it could not
        # work out: kept, it would outlive a later round that works the size out)
    g = model.graph
    elem = elems.get(value, 1)
    kept = [v for v in g.value_info if v.name != value]
    del g.value_info[:]
    g.value_info.extend(kept + [helper.make_tensor_value_info(value, elem, dims)])


def _unknown(sizes):
    """Whether a shape has a size ONNX could not work out (none, or its own
    `unk__` name for one)."""
    return any(e is None or getattr(e, "name", "").startswith("unk__") for e in sizes)


def _range_length(node, values):
    """A Range's length where its start and step are constant integers and
    its limit a size: (limit - start) / step, rounded up; else None."""
    from tvm import tirx

    if any(values.get(i) is None or np.asarray(values[i]).size != 1 for i in node.input):
        return None
    start, limit, step = (np.asarray(values[i]).reshape(-1)[0] for i in node.input)
    if not _fixed(start) or not _fixed(step) or int(step) <= 0 or _fixed(limit):
        return None
    return tirx.max((limit - int(start) + int(step) - 1) // int(step), 0)


def _constant(node):
    a = next((a for a in node.attribute if a.name == "value"), None)
    if a is None or a.t.data_type != 7:
        return None
    v = numpy_helper.to_array(a.t)
    return v if v.size <= 64 else None


def _evaluate(node, values, shapes):
    """The value of a node's output as an object array of sizes (ints and
    TVM expressions), where every input it reads is known; else None."""
    op, ins = node.op_type, list(node.input)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if op == "Shape":
        s = shapes.get(ins[0])
        if s is None or None in s:
            return None
        start, end = attrs.get("start", 0), attrs.get("end", len(s))
        return np.array(s[start:end], dtype=object)
    known = [None if values.get(i) is None else np.asarray(values[i]) for i in ins if i]
    if op not in ("Gather", "Concat", "Unsqueeze", "Squeeze", "Cast", "Slice", "Add", "Sub", "Mul", "Div",
                  "Identity", "Reshape", "Equal", "Where", "Transpose") or any(v is None for v in known) or not known:
        return None
    x = known[0].astype(object)
    if op == "Equal":  # a size is never negative: the exporters' test for -1
        def equal(a, b):
            if _fixed(a) and _fixed(b):
                return int(a) == int(b)
            c = b if _fixed(b) else a if _fixed(a) else None
            return False if c is not None and int(c) < 0 else True if _same(a, b) else None
        out = np.vectorize(equal, otypes=[object])(x, known[1].astype(object))
        return None if any(v is None for v in out.reshape(-1)) else out
    if op == "Where":
        return np.where(known[0].astype(bool), known[1].astype(object), known[2].astype(object))
    if op == "Cast" and attrs.get("to") == TensorProto.BOOL:  # a size tested for zero
        return np.vectorize(lambda a: int(a != 0), otypes=[object])(x) if all(map(_fixed, x.reshape(-1))) else None
    if op in ("Cast", "Identity"):
        return x
    if op == "Gather":
        return np.take(x, known[1].astype(np.int64), axis=attrs.get("axis", 0))
    if op == "Concat":
        return np.concatenate([v.astype(object).reshape(-1) if v.ndim == 0 else v.astype(object) for v in known],
                              axis=attrs.get("axis", 0))
    if op == "Unsqueeze":
        axes = attrs.get("axes", known[1].tolist() if len(known) > 1 else None)
        return x.reshape(1) if x.ndim == 0 and axes in ([0], [-1]) else None
    if op == "Squeeze":
        return x.reshape(()) if x.size == 1 else None
    if op == "Reshape":  # (PyTorch's pads: [-1, 2], reversed, transposed, flat again)
        target = known[1].reshape(-1).tolist()
        return x.reshape(target) if all(_fixed(e) and int(e) != 0 for e in target) and target.count(-1) <= 1 else None
    if op == "Transpose":
        return np.transpose(x, attrs.get("perm"))
    if op == "Slice":
        bounds = [v.reshape(-1).tolist() for v in known[1:]]
        axes = bounds[2] if len(bounds) > 2 else list(range(len(bounds[0])))
        steps = bounds[3] if len(bounds) > 3 else [1] * len(axes)
        if x.ndim == 0 or not all(_fixed(e) for b in bounds for e in b):
            return None
        at = [slice(None)] * x.ndim
        for b, e, a, st in zip(bounds[0], bounds[1], axes, steps):  # numpy's clamping is ONNX's
            at[int(a)] = slice(int(b), None if st < 0 and e < -x.shape[int(a)] else int(e), int(st))
        return x[tuple(at)]
    y = known[1].astype(object)
    if op == "Div":
        return np.vectorize(lambda a, b: a // b, otypes=[object])(x, y)  # sizes: floor and truncation agree
    return _ARITH[op](x, y)


def _same(a, b):
    """Whether two sizes are equal at every size (ints, TVM expressions)."""
    if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
        return int(a) == int(b)
    from tvm.sym import Analyzer

    return bool(Analyzer().can_prove(a == b))


def _fixed(e):
    return isinstance(e, (int, np.integer))


def _rewrite(model, node, values, shapes, inserts, elems):
    """Give a Reshape, Expand or Slice whose shape input is known its
    constant form (module docstring); True if one was given."""
    op = node.op_type
    if op == "If":  # a test of a size that holds at every size (a rank, a fixed axis): the branch folds
        return _fixed_condition(model, node, values)
    fixed = _fixed_inputs(model, node, values)
    if op == "Pad" and len(node.input) > 1 and node.input[1] not in _initializers(model):
        return _sizes_of_values(model, node, values, inserts)
    if op == "ConstantOfShape" and node.input and values.get(node.input[0]) is not None and \
            not all(_fixed(e) for e in values[node.input[0]].reshape(-1)):
        return _shape_from_dims(model, node, values[node.input[0]].reshape(-1), shapes, inserts, at=0)
    if op == "Tile" and len(node.input) > 1 and node.input[1] not in _initializers(model):
        return _tile_by_sizes(model, node, values, shapes, inserts)
    if op == "Resize" and len(node.input) > 3 and node.input[3] and node.input[3] not in _initializers(model):
        return _resize_scales(model, node, values, shapes.get(node.input[0]))
    if op not in ("Reshape", "Expand", "Slice") or len(node.input) < 2:
        return fixed
    x = shapes.get(node.input[0])
    if op == "Slice":
        return _slice(model, node, values, x)
    if op == "Expand" and node.input[1] in _initializers(model):
        return _broadcast(model, node, values, x, elems)
    target = values.get(node.input[1])
    if target is not None and x is None and op == "Expand" and node.input[1] not in _initializers(model):
        return _shape_of_earlier(model, node, target.reshape(-1), shapes, inserts) or \
            _shape_from_dims(model, node, target.reshape(-1), shapes, inserts)
    if target is None or x is None:
        return False
    if node.input[1] in _initializers(model):  # a constant target: the sizes a -1 leaves, named once
        unknown = _unknown(shapes.get(node.output[0], [None]))
        if op != "Reshape" or not unknown or None in x or not any(_fixed(e) and e == -1 for e in target):
            return False
        t = _inferred(target.reshape(-1).astype(object), x)
        out = [x[k] if _fixed(e) and int(e) == 0 and k < len(x) else e for k, e in enumerate(t)]
        return False if any(e is None for e in out) else out
    target = target.reshape(-1)
    if op == "Reshape" and any(_fixed(e) and int(e) == -1 for e in target) and None not in x:
        target = _inferred(target, x)  # the exporter's own -1, worked out: one -1 is all a Reshape takes
    out = []
    for k, e in enumerate(target):
        if _fixed(e):
            out.append(int(e))
        elif op == "Reshape" and k < len(x) and x[k] is not None and _same(e, x[k]):
            out.append(0)
        elif op == "Expand" and len(target) - k <= len(x) and x[k - len(target)] is not None \
                and _same(e, x[k - len(target)]):
            out.append(1)
        else:
            out.append(None)
    if op == "Expand" and None in out:
        return _shape_of_earlier(model, node, target, shapes, inserts) or \
            _shape_from_dims(model, node, target, shapes, inserts)
    if out.count(None) + out.count(-1) > 1:
        return False
    if op == "Reshape" and 0 in out and any(a.name == "allowzero" and a.i for a in node.attribute):
        if any(_fixed(e) and int(e) == 0 for e in target):
            return False  # a size of zero asked for: refused later, as every zero-size tensor is
        _keep_zeros(node)
    _replace_input(model, node, 1, np.array([-1 if e is None else e for e in out], np.int64))
    if op == "Reshape" and -1 not in out:  # its sizes, where all are known: ONNX names what a -1 leaves anew
        sizes = [x[k] if _fixed(e) and int(e) == 0 else e for k, e in enumerate(target)]
        return True if any(e is None for e in sizes) else sizes
    return True


def _tile_by_sizes(model, node, values, shapes, inserts):
    """A Tile by counts set at run time, each on an axis of size 1 (a
    row repeated over the batch): an Expand to those counts, after a Tile
    by the fixed counts where one is more than 1; True if so."""
    reps, x = values.get(node.input[1]), shapes.get(node.input[0])
    if reps is None or x is None or len(x) != reps.size or all(_fixed(e) for e in reps.reshape(-1)):
        return False
    reps = reps.reshape(-1)
    if any(not _fixed(e) and not (_fixed(d) and int(d) == 1) for e, d in zip(reps, x)):
        return False
    name = f"{node.name or node.output[0]}/tiled"
    if not _shape_from_dims(model, node, np.array([1 if _fixed(e) else e for e in reps], dtype=object), shapes,
                            inserts):
        return False
    node.op_type = "Expand"
    if any(_fixed(e) and int(e) != 1 for e in reps):
        model.graph.initializer.append(numpy_helper.from_array(
            np.array([int(e) if _fixed(e) else 1 for e in reps], np.int64), f"{name}/reps"))
        inserts.append((node.output[0], helper.make_node("Tile", [node.input[0], f"{name}/reps"], [name])))
        node.input[0] = name
    return True


def _resize_scales(model, node, values, x):
    """A Resize to sizes set at run time that keeps those axes (a batch)
    and resizes fixed ones: given the scales the sizes imply instead
    (ONNX's scale is size out / size in either way), where each scale
    gives back its size; the output's sizes if so, else False."""
    sizes = values.get(node.input[3])
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if sizes is None or x is None or len(x) != sizes.size or _unknown(list(sizes.reshape(-1))) or "axes" in attrs or \
            attrs.get("keep_aspect_ratio_policy", b"stretch") not in (b"stretch", "stretch"):
        return False
    scales = []
    for e, d in zip(sizes.reshape(-1), x):
        if d is not None and _same(e, d):
            scales.append(1.0)
        elif _fixed(e) and d is not None and _fixed(d) and int(d) > 0 and \
                int(np.floor(int(d) * np.float32(int(e) / int(d)))) == int(e):
            scales.append(int(e) / int(d))
        else:
            return False
    del node.input[3]
    _replace_input(model, node, 2, np.array(scales, np.float32))
    return list(sizes.reshape(-1))  # (named: ONNX's inference loses a size set at run time times a scale)


def _fixed_condition(model, node, values):
    """An If whose condition is a number at every size: written as a
    constant (fold.apply then inlines the branch taken); True if so."""
    v = values.get(node.input[0])
    if v is None or node.input[0] in _initializers(model) or v.size != 1 or not _fixed(v.reshape(-1)[0]):
        return False
    _replace_input(model, node, 0, np.array(bool(v.reshape(-1)[0])))
    return True


_FIXED = ("Tile", "ConstantOfShape", "Range")  # operators whose shape inputs are written as numbers once known


def _fixed_inputs(model, node, values):
    """Shape inputs (ops.STATIC_INPUTS) worked out to numbers only, written
    as constants (a Tile's repeats from a fixed axis's Shape); True if any."""
    from .ops import STATIC_INPUTS

    done, inits = False, _initializers(model)
    positions = (0, 1, 2) if node.op_type == "Range" else STATIC_INPUTS.get(node.op_type, ())
    for k in positions if node.op_type in _FIXED else ():
        v = values.get(node.input[k]) if k < len(node.input) and node.input[k] else None
        if v is not None and node.input[k] not in inits and all(_fixed(e) for e in v.reshape(-1)) and v.size:
            _replace_input(model, node, k, np.array(v.astype(np.int64)))
            done = True
    return done


def _inferred(target, x):
    """A Reshape target with its -1 replaced by the size it stands for
    (every size of the input known)."""
    from tvm.sym import Analyzer

    k = next(k for k, e in enumerate(target) if _fixed(e) and int(e) == -1)
    rest = [e for j, e in enumerate(target) if j != k and not (_fixed(e) and int(e) == 0)]
    total, part = np.prod(np.array(x, dtype=object)), np.prod(np.array(rest, dtype=object)) if rest else 1
    value = total // part
    out = target.copy()
    out[k] = value if _fixed(value) else Analyzer().simplify(value)
    if not _fixed(out[k]) and hasattr(out[k], "value"):
        out[k] = int(out[k].value)
    return out


def _broadcast(model, node, values, x, elems):
    """An Expand to a constant shape of a value sized at run time (the
    importer's Expand reads its input's sizes as numbers): the product with
    ones of the shape (x * 1 is x exactly, -0, inf and NaN too; a bool's
    Or with false)."""
    target = values.get(node.input[1])
    if x is None or target is None or all(_fixed(d) for d in x) or len(target) < len(x):
        return False
    aligned = [None] * (len(target) - len(x)) + list(x)
    if any(not _fixed(d) and int(t) != 1 for d, t in zip(aligned, target)):
        return False
    elem = elems.get(node.input[0])
    if elem is None:
        return False
    ones = np.ones([int(t) for t in target], helper.tensor_dtype_to_np_dtype(elem))
    name = f"{node.name or node.output[0]}/ones"
    model.graph.initializer.append(numpy_helper.from_array(ones if elem != 9 else ~ones, name))
    node.op_type = "Or" if elem == 9 else "Mul"
    node.input[1] = name
    return True


def _slice(model, node, values, x):
    ends = values.get(node.input[2]) if len(node.input) > 2 else None
    if ends is None or x is None or node.input[2] in _initializers(model):
        return False
    axes = values.get(node.input[3]) if len(node.input) > 3 and node.input[3] else np.arange(len(ends))
    if any(not _fixed(a) for a in axes.reshape(-1)):
        return False
    out = []
    for e, a in zip(ends.reshape(-1), axes.reshape(-1)):
        size = x[int(a)]
        if _fixed(e):
            out.append(int(e))
        elif size is not None and _same(e, size):
            out.append(BIG)
        elif size is not None and _fixed(_constant_offset(size, e)):
            out.append(-int(_constant_offset(size, e)))
        else:
            return False
    _replace_input(model, node, 2, np.array(out, np.int64))
    return True


def _bounded(names, ranges):
    """An analyzer knowing each named size's declared range."""
    from tvm import ir
    from tvm.sym import Analyzer

    a = Analyzer()
    for name, (lo, hi) in ranges.items():
        if name in names and hasattr(names[name], "name"):
            a.bind(names[name], ir.Range.from_min_extent(lo, hi - lo + 1))
    return a


def _whole_axes(model, node, values, x, a):
    """A Slice's axes that it keeps whole (from 0, by 1, to an end past
    the axis's largest size under analyzer `a`) dropped from it; the Slice
    an Identity where it keeps every axis whole. True if any was dropped."""
    starts, ends, axes, steps = [values.get(i) if i else None for i in list(node.input[1:5]) + [""] * 4][:4]
    if x is None or starts is None or ends is None or (len(node.input) > 3 and node.input[3] and axes is None) \
            or (len(node.input) > 4 and node.input[4] and steps is None):
        return False
    axes = np.arange(len(ends)) if axes is None else axes.reshape(-1)
    steps = np.ones(len(ends), np.int64) if steps is None else steps.reshape(-1)
    keep = []
    for k, (st, e, ax, sp) in enumerate(zip(starts.reshape(-1), ends.reshape(-1), axes, steps)):
        size = x[int(ax)] if _fixed(ax) and -len(x) <= int(ax) < len(x) else None
        whole = all(map(_fixed, (st, e, sp))) and int(st) == 0 and int(sp) == 1 and size is not None and (
            int(e) >= BIG // 2 or (int(e) >= size if _fixed(size) else a.can_prove(size <= int(e))))
        if not whole:
            keep.append(k)
    if not keep:  # every axis whole
        node.op_type = "Identity"
        del node.input[1:]
    if len(keep) in (0, len(axes)):
        return not keep
    while len(node.input) < 4:  # the axes kept named
        node.input.append("")
    for pos, v in enumerate((starts, ends, axes, steps)[:len(node.input) - 1]):
        _replace_input(model, node, pos + 1, np.array([v.reshape(-1)[k] for k in keep], np.int64))
    return True


def _constant_offset(size, e):
    """size - e where it is a constant, else None."""
    from tvm import tirx
    from tvm.sym import Analyzer

    d = Analyzer().simplify(size - e)
    return int(d) if isinstance(d, tirx.IntImm) else None


def _initializers(model):
    return {t.name for t in model.graph.initializer}


def _shape_of_earlier(model, node, target, shapes, inserts):
    """An Expand to sizes no relative form says (a constant broadcast to a
    tensor's shape): its shape read from a tensor computed before it that
    has exactly that shape (a Shape node the importer takes); True if one was found."""
    g = model.graph
    if _read_already(node):
        return False
    for n in g.node:
        if list(n.output) == list(node.output):
            return False
        for o in n.output:
            s = shapes.get(o)
            if s is not None and len(s) == len(target) and None not in s and all(_same(a, b) for a, b in zip(s, target)):
                name = f"{node.name or node.output[0]}/shape_of"
                inserts.append((node.output[0], helper.make_node("Shape", [o], [name])))  # placed after the walk
                node.input[1] = name
                return True
    return False


def _of_shapes(g, name, depth=0):
    """Whether `name` is made of Shape values and constants only, through
    what the importer keeps as a shape."""
    producer = next((n for n in g.node if name in n.output), None)
    if producer is None:
        return any(t.name == name for t in g.initializer)
    if producer.op_type == "Shape":
        return True
    if producer.op_type not in ("Concat", "Gather", "Slice", "Squeeze", "Unsqueeze", "Cast", "Identity") or depth > 16:
        return False
    if producer.op_type == "Cast" and next((a.i for a in producer.attribute if a.name == "to"), 0) != TensorProto.INT64:
        return False  # a shape through int32 (a TensorFlow exporter's): the importer reads its values as data
    data = producer.input if producer.op_type == "Concat" else producer.input[:1]
    return all(_of_shapes(g, i, depth + 1) for i in data if i)


def _read_already(node, at=1):
    """Whether an Expand's shape is read from shapes already (_shape_of_earlier, _shape_from_dims)."""
    return node.input[at] in (f"{node.name or node.output[0]}/shape_of", f"{node.name or node.output[0]}/dims")


def _shape_from_dims(model, node, target, shapes, inserts, at=1):
    """An Expand (or a ConstantOfShape, a Tile: `at` its shape input) to
    sizes each of which is an axis of a tensor computed before it (the
    exporters' [1, T, 1] of Where(Equal(shape, -1), ...)): its shape a
    Concat of those axes (Shape and Gather, which the importer takes as a
    shape) and the fixed sizes; True if every size was found."""
    g = model.graph
    name = f"{node.name or node.output[0]}/dims"
    if _read_already(node, at) or (node.op_type != "Tile" and _of_shapes(g, node.input[at])):  # the importer
        return False  # takes a shape made of Shapes (but a Tile's repeats: none)
    earlier = [i.name for i in g.input]
    for n in g.node:
        if list(n.output) == list(node.output):
            break
        earlier += [o for o in n.output if o]
    sizes = [e if _fixed(e) else next(((t, a) for t in earlier for a, d in enumerate(shapes.get(t) or [])
                                       if d is not None and _same(d, e)), None) for e in target]
    if None in sizes:
        return False
    new, inits = shape_of_sizes(sizes, name, opset_of(model))
    g.initializer.extend(inits)
    inserts += [(node.output[0], n) for n in new]
    node.input[at] = name
    return True


def _sizes_of_values(model, node, values, inserts):
    """A Pad by sizes (PyTorch's F.pad by a length, its pads reversed and
    transposed on the way): its pads a Concat of the constants and of the
    scalars computed before it that hold its sizes, which the importer
    keeps a shape, and a Cast named SIZES that hands it to the Pad
    (import_relax pads by it); True if every size was found."""
    pads, name = values.get(node.input[1]), f"{node.name or node.output[0]}/pads"
    if pads is None or node.input[1] == name or all(_fixed(e) for e in pads.reshape(-1)):
        return False
    parts, found = [], {}
    for k, e in enumerate(pads.reshape(-1)):
        if _fixed(e):
            model.graph.initializer.append(numpy_helper.from_array(np.array([int(e)], np.int64), f"{name}/{k}"))
            parts.append(f"{name}/{k}")
            continue
        src = next((v for v, a in values.items() if a.size == 1 and not _fixed(a.reshape(-1)[0])
                    and _same(a.reshape(-1)[0], e)), None)
        if src is None:
            return False
        if values[src].ndim == 1:
            parts.append(src)
            continue
        found.setdefault(src, f"{name}/{k}")
        parts.append(found[src])
    for src, part in found.items():
        model.graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), f"{part}/at"))
        inserts.append((node.output[0], helper.make_node("Unsqueeze", [src, f"{part}/at"], [part])
                        if opset_of(model) >= 13 else helper.make_node("Unsqueeze", [src], [part], axes=[0])))
    inserts += [(node.output[0], helper.make_node("Concat", parts, [f"{name}/sizes"], axis=0)),
                (node.output[0], helper.make_node("Cast", [f"{name}/sizes"], [name], name=name + SIZES,
                                                  to=TensorProto.INT64))]
    node.input[1] = name
    return True


def _keep_zeros(node):
    """A Reshape whose target now says 0 for "the size it has": allowzero
    off (a PyTorch exporter's allowzero=1 would read the 0 as a size of
    zero; its own target had none, so nothing else changes)."""
    for a in node.attribute:
        if a.name == "allowzero":
            a.i = 0


def _replace_input(model, node, k, value):
    name = f"{node.name or node.output[0]}/folded_{k}"
    for t in [t for t in model.graph.initializer if t.name == name]:  # folded before: replaced
        model.graph.initializer.remove(t)
    model.graph.initializer.append(numpy_helper.from_array(value, name))
    node.input[k] = name
