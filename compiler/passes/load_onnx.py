"""Pass `load_onnx`: read and check an ONNX model; fix its input shapes.

Checks, each with a clear CompileError: the bytes parse as ONNX, the ONNX
checker accepts the graph, the default-domain opset is in range, every
operator is supported (all unsupported ones are named in one message), the
graph has outputs, every input dimension is fixed (from the model or from
`input_shapes`), and ONNX's strict type and shape inference accepts it.
"""
import hashlib
import os

import onnx
from onnx import TensorProto

from ..errors import CompileError
from ..options import Dim
from ..onnx.ops import MAX_OPSET, MIN_OPSET, check_supported, graph_inputs, opset_of

NAME = "load_onnx"


def read_model(source):
    """Return (ModelProto, sha256 hex of its bytes) from a path, bytes or ModelProto."""
    if isinstance(source, onnx.ModelProto):
        data = source.SerializeToString()
    elif isinstance(source, (bytes, bytearray)):
        data = bytes(source)
    else:
        path = os.fspath(source)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise CompileError(f"cannot read model '{path}': {e.strerror}") from None
    try:
        model = onnx.load_model_from_string(data)
    except Exception as e:  # protobuf raises DecodeError and friends
        raise CompileError(f"not an ONNX model (protobuf parse failed: {e})") from None
    if not model.HasField("graph") or (len(model.graph.node) == 0 and len(model.graph.output) == 0):
        raise CompileError("not an ONNX model (no graph)")
    _load_external_data(model, None if isinstance(source, (onnx.ModelProto, bytes, bytearray))
                        else os.path.dirname(os.path.abspath(os.fspath(source))))
    return model, hashlib.sha256(data).hexdigest()


def _load_external_data(model, folder):
    """Weights a model keeps in files beside it (ONNX external data), read
    from `folder` (the model file's); a CompileError naming the files where
    there is no folder or a file is missing."""
    from onnx.external_data_helper import load_external_data_for_model, uses_external_data

    files = sorted({e.value for t in model.graph.initializer if uses_external_data(t)
                    for e in t.external_data if e.key == "location"})
    if not files:
        return
    if folder is None:
        raise CompileError(f"the model keeps its weights in external data file(s) {', '.join(files)}: "
                           f"give the model's path (with the files beside it), not its bytes")
    missing = [f for f in files if not os.path.exists(os.path.join(folder, f))]
    if missing:
        raise CompileError(f"the model's external data file(s) {', '.join(missing)} are not beside it in {folder}")
    try:
        load_external_data_for_model(model, folder)
    except Exception as e:
        raise CompileError(f"reading the model's external data failed: {e}") from None


def _in_order(model):
    """The graph's nodes in an order where each follows what it reads
    (exporters write some out of order; ONNX requires the order, engines
    sort), the given order kept where it holds; unchanged if none exists."""
    from ..onnx.ops import outer_names

    g = model.graph
    ready = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    pending, order = list(g.node), []
    made = {o for n in pending for o in n.output}
    while pending:
        rest = []
        for n in pending:
            needs = (set(n.input) | outer_names(n)) & made
            (order if needs <= ready else rest).append(n)
            if needs <= ready:
                ready.update(n.output)
        if len(rest) == len(pending):
            return
        pending = rest
    if [o for n in order for o in n.output] != [o for n in g.node for o in n.output]:
        del g.node[:]
        g.node.extend(order)


def apply(model, input_shapes=None, constants=None):
    check_supported(model)
    _in_order(model)
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise CompileError(f"the ONNX checker rejects the model: {e}") from None
    opset = opset_of(model, None)
    if opset is None or not MIN_OPSET <= opset <= MAX_OPSET:
        raise CompileError(f"ONNX opset {opset} is not supported (supported: {MIN_OPSET}..{MAX_OPSET})")
    if not model.graph.output:
        raise CompileError("the model has no graph outputs: nothing to compute")
    bind_constants(model, constants or {})
    fix_input_shapes(model, input_shapes or {})
    check_types(model)
    return model


MAX_ELEMENTS = 2**31 - 1  # kernels index tensors with 32-bit integers


def check_types(model):
    """ONNX's strict type and shape inference over the whole graph: an input
    of a type an operator does not take, or shapes that cannot meet, is named
    here rather than deep inside the import; so is a tensor too large for
    32-bit indexing."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as e:  # InferenceError and its relatives
        saved = type(model)()
        saved.CopyFrom(model)
        if not _forget_declared(model):
            raise CompileError(f"the model's types or shapes do not check: {_inference_problem(e)}") from None
        try:  # the exporter's own record of its values' shapes may be what is wrong (onnxruntime ignores it too)
            inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        except Exception:
            model.CopyFrom(saved)
            raise CompileError(f"the model's types or shapes do not check: {_inference_problem(e)}") from None
    g = inferred.graph
    for v in list(g.input) + list(g.value_info) + list(g.output):
        dims = [d.dim_value for d in v.type.tensor_type.shape.dim if d.HasField("dim_value")]
        n = 1
        for d in dims:
            n *= d
        if n > MAX_ELEMENTS:
            raise CompileError(f"tensor '{v.name}' would hold {n:,} elements (shape {dims}); coldbrew's kernels "
                               f"index at most {MAX_ELEMENTS:,}")


def _forget_declared(model):
    """Drop the shapes the exporter declared for values inside the graph:
    the main graph's value_info, and the value_info and outputs' shapes of
    every subgraph (a Loop's body, an If's branches; their types stay).
    False if there were none."""
    def graphs(g):
        yield g
        for n in g.node:
            for a in n.attribute:
                subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
                for sg in subs:
                    yield from graphs(sg)

    dropped = False
    for k, g in enumerate(graphs(model.graph)):
        dropped |= bool(g.value_info)
        g.ClearField("value_info")
        for out in g.output if k else []:
            if out.type.HasField("tensor_type") and out.type.tensor_type.HasField("shape"):
                out.type.tensor_type.ClearField("shape")
                dropped = True
    return dropped


def _inference_problem(e):
    """ONNX's inference error in one line: the chain of nodes it is in (a
    Loop's body, an If's branch inside it, ...) and its innermost message."""
    import re

    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    first = lines[0]
    chain = re.findall(r"\(op_type:(\w+), node name: ([^)]*)\)", first)
    if len(chain) < 2:
        return first
    inner = first.rsplit("): ", 1)[-1]
    return "in " + " > ".join(f"{op} node '{name}'" for op, name in chain) + f": {inner}"


def bind_constants(model, constants):
    """Turn the named inputs into initializers holding the given values."""
    import numpy as np
    from onnx import numpy_helper

    inputs = {i.name: i for i in graph_inputs(model)}
    for name, value in constants.items():
        if name not in inputs:
            raise CompileError(f"--bind names '{name}', but the model's inputs are {sorted(inputs)}")
        tt = inputs[name].type.tensor_type
        want = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        value = np.asarray(value)
        if value.dtype != want:
            raise CompileError(f"--bind {name}: value has dtype {value.dtype}, the input is {want}")
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if len(dims) != value.ndim or any(d is not None and d != s for d, s in zip(dims, value.shape)):
                raise CompileError(f"--bind {name}: value has shape {list(value.shape)}, the input is {dims}")
        model.graph.initializer.append(numpy_helper.from_array(value, name))
    if constants:
        kept = [i for i in model.graph.input if i.name not in constants]
        model.graph.ClearField("input")
        model.graph.input.extend(kept)


def _forget_shapes(model):
    """Drop the shapes recorded for intermediate values and outputs (their
    types stay): shape inference works them out anew from the inputs."""
    g = model.graph
    g.ClearField("value_info")
    for out in g.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")


def fix_input_shapes(model, input_shapes):
    inputs = graph_inputs(model)
    names = {i.name for i in inputs}
    for name in input_shapes:
        if name not in names:
            raise CompileError(f"--input-shape names '{name}', but the model's inputs are {sorted(names)}")
    for inp in inputs:
        tt = inp.type.tensor_type
        if not inp.type.HasField("tensor_type") or tt.elem_type == TensorProto.UNDEFINED:
            raise CompileError(f"input '{inp.name}' is not a typed tensor")
        if inp.name in input_shapes:
            shape = list(input_shapes[inp.name])
            if tt.HasField("shape") and len(tt.shape.dim) != len(shape):
                raise CompileError(f"input '{inp.name}' has rank {len(tt.shape.dim)}, --input-shape gives {len(shape)}")
            if [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim] != shape:
                _forget_shapes(model)  # what the exporter recorded for its own input shape no longer holds
            tt.ClearField("shape")
            tt.shape.SetInParent()
            for d in shape:
                if isinstance(d, Dim):  # a range: a named symbolic dimension
                    tt.shape.dim.add().dim_param = d.name
                    continue
                if d <= 0:
                    raise CompileError(f"input '{inp.name}': dimension {d} must be positive")
                tt.shape.dim.add().dim_value = d
        elif not tt.HasField("shape"):
            raise CompileError(f"input '{inp.name}' has no shape; give one with --input-shape {inp.name}=1x3x224x224")
        for k, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value == 0:
                raise CompileError(f"input '{inp.name}' dimension {k} is 0: zero-size tensors are not supported")
            if (not d.HasField("dim_value") or d.dim_value < 0) and not isinstance(
                    (input_shapes.get(inp.name) or [None] * (k + 1))[k], Dim):
                label = d.dim_param or "?"
                raise CompileError(
                    f"input '{inp.name}' dimension {k} ('{label}') is not fixed; "
                    f"give it with --input-shape {inp.name}=... (a size, or a range such as [1:512])")


def run(c):
    """Pass entry: c.model read, checked and its input shapes fixed (c.proto, c.model_hash, names)."""
    c.proto, c.model_hash = read_model(c.model)
    c.proto = apply(c.proto, c.options.input_shapes, c.options.constants)
    c.input_names = [i.name for i in graph_inputs(c.proto)]
    c.output_names = [o.name for o in c.proto.graph.output]
    return c
