"""Recurrent cells (ONNX LSTM, GRU and RNN), for CPU targets as a cell layer
(`as_cell`: the input projection, then one node of coldbrew's own that
import_relax makes a call of the cell kernel, compiler/kernels/recurrent.py),
otherwise (GPU targets, peepholes) unrolled into plain ONNX nodes over
a sequence whose length is fixed at compile time: one MatMul for the whole
input sequence's projection, then per step one MatMul by the recurrent
weights, the gates (Sigmoid, Tanh) and the state updates. What the
passes cannot unroll (other activations, clipping, peepholes, coupled
gates, ragged sequence lengths) is named in a CompileError.

ONNX's gate orders: LSTM i, o, f, c (W [dirs, 4h, in], R [dirs, 4h, h],
B [dirs, 8h]); GRU z, r, h (W [dirs, 3h, in], R [dirs, 3h, h], B [dirs, 6h]);
RNN one gate (W [dirs, h, in], R [dirs, h, h], B [dirs, 2h]), its activation
Tanh, Relu or Sigmoid. onnxruntime's com.microsoft.DynamicQuantizeLSTM is an
LSTM whose weights are int8 ([dirs, in, 4h] and [dirs, h, 4h], a scale and
zero point per direction or per column) and whose every product quantizes
its left operand on the fly, to uint8 over the whole tensor: the unrolled
cell does the same (DynamicQuantizeLinear, MatMulInteger, the two scales'
product), so it computes what onnxruntime computes; as a cell layer, its
projection is computed so and the kernel quantizes the state per row each
step (RecurrentSpec.quantize_h) against the recurrent weights' integer
values, their scales (a CELL input) applied to each sum; its recurrent
bias joins the projection's.
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ..errors import CompileError

# A cell computed by a kernel (compiler/kernels/recurrent.py) is left by
# legalize_onnx as its input projection and one node of coldbrew's own,
# CELL (xw, R with its bias column, h0, c0, [R's scales: a quantized cell]) -> (Y, Y_h, Y_c), which
# import_relax makes the cell's layer.
DOMAIN, CELL = "ai.coldbrew", "CbRecurrentCell"

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1, "DynamicQuantizeLSTM": 4}
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"],
                       "DynamicQuantizeLSTM": ["Sigmoid", "Tanh", "Tanh"]}
RNN_ACTIVATIONS = {"tanh": "Tanh", "relu": "Relu", "sigmoid": "Sigmoid"}


def _attrs(node):
    out = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: (v.decode() if isinstance(v, bytes) else [x.decode() if isinstance(x, bytes) else x for x in v]
                if isinstance(v, list) else v) for k, v in out.items()}


def contrib_output_types(node, shapes):
    """value_info for the outputs of onnxruntime's DynamicQuantizeLSTM (float
    Y [seq, dirs, batch, hidden], Y_h and Y_c [dirs, batch, hidden]) where
    its input's shape is known; [] otherwise."""
    x = shapes.get(node.input[0]) if node.input else None
    if node.op_type != "DynamicQuantizeLSTM" or x is None or len(x) != 3:
        return []
    a = _attrs(node)
    dirs, hidden = 2 if a.get("direction", "forward") == "bidirectional" else 1, int(a["hidden_size"])
    seq, batch = (x[1], x[0]) if a.get("layout", 0) else (x[0], x[1])
    y = [batch, seq, dirs, hidden] if a.get("layout", 0) else [seq, dirs, batch, hidden]
    state = [batch, dirs, hidden] if a.get("layout", 0) else [dirs, batch, hidden]
    return [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape)
            for o, shape in zip(node.output, (y, state, state)) if o]


def _x_shape(node, shapes):
    """The cell's input shape as [seq, batch, size] (None where ONNX infers
    no shape; a dimension sized at run time None)."""
    x = shapes.get(node.input[0])
    return [x[1], x[0], x[2]] if x and any(t.name == "layout" and t.i for t in node.attribute) else x


def _checked(node, label, consts, x_shape, sized_seq=False):
    """The cell's attributes, after refusing what unrolling (or, `sized_seq`,
    the cell kernel over a sequence sized at run time) does not cover."""
    a = _attrs(node)
    kind, dirs = node.op_type, 2 if a.get("direction", "forward") == "bidirectional" else 1
    acts = a.get("activations", DEFAULT_ACTIVATIONS[kind] * dirs)
    problems = []
    if kind == "RNN":
        if any(s.lower() not in RNN_ACTIVATIONS for s in acts):
            problems.append(f"activations {acts} (only {sorted(RNN_ACTIVATIONS.values())})")
    elif [s.lower() for s in acts] != [s.lower() for s in DEFAULT_ACTIVATIONS[kind] * dirs]:
        problems.append(f"activations {acts} (only the default {DEFAULT_ACTIVATIONS[kind]})")
    for name in ("clip", "activation_alpha", "activation_beta"):
        if name in a:
            problems.append(f"the {name} attribute")
    if a.get("input_forget", 0):
        problems.append("input_forget=1")
    inputs = list(node.input) + [""] * 12
    quantized = ((8, "W_scale"), (9, "W_zero_point"), (10, "R_scale"), (11, "R_zero_point"))
    for pos, what in ((1, "W"), (2, "R"), (3, "B")) + (quantized if kind == "DynamicQuantizeLSTM" else ()):
        if inputs[pos] and inputs[pos] not in consts:
            problems.append(f"{what} ('{inputs[pos]}') must be constant")
    if GATES[kind] == 4 and inputs[7] and inputs[7] not in consts:
        problems.append(f"P ('{inputs[7]}') must be constant")
    if x_shape is None or x_shape[2] is None:
        problems.append(f"its input '{node.input[0]}' has no static shape")
    elif x_shape[1] is None and (x_shape[0] is None or sized_seq or kind == "DynamicQuantizeLSTM"):
        problems.append(f"its input '{node.input[0]}' of a batch sized at run time (unrolled: float weights, "
                        f"a fixed sequence)")
    elif x_shape[0] is None and not sized_seq:
        problems.append(f"its input '{node.input[0]}' sized at run time (a cell layer computes it: CPU targets, "
                        f"no peepholes)")
    elif inputs[4]:
        lens = consts.get(inputs[4])
        if lens is None or not np.all(numpy_helper.to_array(lens) == x_shape[0]):
            problems.append("sequence_lens other than the whole sequence")
    if problems:
        raise CompileError(f"{label}: unrolling it is not supported with {', '.join(problems)}")
    return a, dirs, inputs


class _Builder:
    """New nodes and initializers, named after the cell, in the forms the
    model's opset takes."""

    def __init__(self, prefix, opset, hidden):
        self.prefix, self.opset, self.hidden, self.nodes, self.inits, self.k = prefix, opset, hidden, [], [], 0
        self.names = set()

    def const(self, value, tag):
        name = f"{self.prefix}/{tag}"
        if name not in self.names:
            self.names.add(name)
            self.inits.append(numpy_helper.from_array(np.array(value, order="C"), name))  # keeps 0-d arrays 0-d
        return name

    def op(self, op_type, inputs, **attrs):
        self.k += 1
        out = f"{self.prefix}/{op_type.lower()}{self.k}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def ops(self, op_type, inputs, count):
        """A node of `count` outputs."""
        self.k += 1
        outs = [f"{self.prefix}/{op_type.lower()}{self.k}_{j}" for j in range(count)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=outs[0]))
        return outs

    def lead(self, x, n):
        """x with n leading axes of 1 (an Unsqueeze: the batch may be sized
        at run time)."""
        axes = list(range(n))
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.const(np.array(axes, np.int64), f"lead{n}")])
        return self.op("Unsqueeze", [x], axes=axes)

    def take(self, x, index, axis):
        """x's slice `index` along `axis`, that axis dropped."""
        return self.op("Gather", [x, self.const(np.array(index, np.int64), f"i{index}")], axis=axis)

    def split(self, x, parts):
        """x [rows, parts * hidden] in `parts` column blocks."""
        self.k += 1
        outs = [f"{self.prefix}/split{self.k}_{j}" for j in range(parts)]
        sizes = [self.hidden] * parts
        if self.opset >= 13:
            node = helper.make_node("Split", [x, self.const(np.array(sizes, np.int64), f"sizes{parts}")], outs,
                                    name=f"{self.prefix}/split{self.k}", axis=1)
        else:
            node = helper.make_node("Split", [x], outs, name=f"{self.prefix}/split{self.k}", axis=1, split=sizes)
        self.nodes.append(node)
        return outs


class _Float:
    """Products by float weights, ONNX's layout [dirs, out, in]."""

    def __init__(self, w, tag):
        self.w, self.tag = w, tag

    def times(self, b, a, d, rows=1):
        return b.op("MatMul", [a, b.const(self.w[d].T, f"{self.tag}{d}T")])


class _Quantized:
    """Products by int8 weights [dirs, in, out] as onnxruntime's quantized
    LSTM computes them: `a` quantized to uint8, an integer product, scaled
    by a's scale times the weights'. The input sequence is quantized as one
    tensor; the state per batch row (onnxruntime's multi-threaded path; run
    on one thread it quantizes the whole state, which differs in the last
    bits where the batch has more than one row)."""

    def __init__(self, q, scale, zero, tag):
        self.q, self.scale, self.zero, self.tag = q, scale.astype(np.float32), zero, tag

    def times(self, b, a, d, rows=1):
        if rows > 1:
            parts = [self.times(b, b.op("Slice", [a, b.const(np.array([r], np.int64), f"r{r}"),
                                                  b.const(np.array([r + 1], np.int64), f"r{r + 1}")]), d)
                     for r in range(rows)]
            return b.op("Concat", parts, axis=0)
        qa, sa, za = b.ops("DynamicQuantizeLinear", [a], 3)
        prod = b.op("MatMulInteger", [qa, b.const(self.q[d], f"{self.tag}{d}q"), za,
                                      b.const(self.zero[d], f"{self.tag}{d}zp")])
        scale = b.op("Mul", [sa, b.const(self.scale[d], f"{self.tag}{d}scale")])
        return b.op("Mul", [b.op("Cast", [prod], to=TensorProto.FLOAT), scale])


def _weights(consts, inputs, quantized):
    """(W, R) as _Float or _Quantized."""
    arr = {k: numpy_helper.to_array(consts[inputs[k]]) for k in (1, 2, 8, 9, 10, 11) if inputs[k] in consts}
    if not quantized:
        return _Float(arr[1].astype(np.float32), "W"), _Float(arr[2].astype(np.float32), "R")
    return _Quantized(arr[1], arr[8], arr[9], "W"), _Quantized(arr[2], arr[10], arr[11], "R")


def unroll(node, label, consts, shapes, opset):
    """(nodes, initializers) computing `node` (an LSTM or a GRU) step by
    step, in ONNX nodes of `opset`."""
    x_shape = _x_shape(node, shapes)  # batch first ([batch, seq, in]): computed as [seq, batch, in]
    batch_first = any(t.name == "layout" and t.i for t in node.attribute)
    a, dirs, inputs = _checked(node, label, consts, x_shape)
    kind, hidden = node.op_type, int(a["hidden_size"])
    gates = GATES[kind]
    seq, batch, _ = x_shape
    W, R = _weights(consts, inputs, kind == "DynamicQuantizeLSTM")
    kind = "LSTM" if gates == 4 else kind
    B = (numpy_helper.to_array(consts[inputs[3]]).astype(np.float32) if inputs[3]
         else np.zeros((dirs, 2 * gates * hidden), np.float32))
    b = _Builder(node.name or next(o for o in node.output if o), opset, hidden)
    x = node.input[0]
    if batch_first:
        x = b.op("Transpose", [x], perm=[1, 0, 2])
        inputs[5:7] = [b.op("Transpose", [i], perm=[1, 0, 2]) if i else "" for i in inputs[5:7]]
    ys, hs, cs = [], [], []
    for d in range(dirs):
        reverse = a.get("direction", "forward") == "reverse" or d == 1
        h = _initial(b, inputs[5], d, batch, hidden, "h")
        c = _initial(b, inputs[6], d, batch, hidden, "c") if kind == "LSTM" else None
        wb, rb = B[d, :gates * hidden], B[d, gates * hidden:]
        # the whole sequence's input projection at once: [seq, batch, gates * hidden]
        bias = wb + rb if kind != "GRU" else np.concatenate([wb[:2 * hidden] + rb[:2 * hidden], wb[2 * hidden:]])
        acts = a.get("activations", DEFAULT_ACTIVATIONS[kind] * dirs)
        xw = b.op("Add", [W.times(b, x, d), b.const(bias, f"bias{d}")])
        out = [None] * seq
        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            xt = b.take(xw, t, 0)  # [batch, gates * hidden]
            if kind == "LSTM":
                h, c = _lstm_step(b, xt, h, c, R.times(b, h, d, batch), _peepholes(b, consts, inputs[7], d, hidden))
            elif kind == "RNN":
                act = RNN_ACTIVATIONS[acts[d if len(acts) > 1 else 0].lower()]
                h = b.op(act, [b.op("Add", [xt, R.times(b, h, d)])])
            else:
                h = _gru_step(b, xt, h, R.w[d], d, rb, a.get("linear_before_reset", 0))
            out[t] = h
        ys.append(out)
        hs.append(h)
        cs.append(c)
    return _outputs(b, node, ys, hs, cs, (seq, batch, hidden, dirs), batch_first), b.inits


def _initial(b, name, d, batch, hidden, tag):
    """Direction d's initial state [batch, hidden] (zeros when not given;
    [1, hidden] where the batch is sized at run time: the first step's sums
    broadcast it)."""
    if not name:
        return b.const(np.zeros((batch or 1, hidden), np.float32), f"{tag}0_{d}")
    return b.take(name, d, 0)


def _peepholes(b, consts, name, d, hidden):
    """Direction d's peephole weights (i, o, f) as constants, or None."""
    if not name:
        return None
    p = numpy_helper.to_array(consts[name]).astype(np.float32)[d]
    return [b.const(p[k * hidden:(k + 1) * hidden], f"P{d}{'iof'[k]}") for k in range(3)]


def _lstm_step(b, xt, h, c, hr, peep=None):
    """One LSTM step (hr: h times the recurrent weights); with peepholes the
    input and forget gates see the old cell state, the output gate the new one."""
    g = b.op("Add", [xt, hr])
    i, o, f, cand = b.split(g, 4)
    if peep:
        i = b.op("Add", [i, b.op("Mul", [c, peep[0]])])
        f = b.op("Add", [f, b.op("Mul", [c, peep[2]])])
    i, f = b.op("Sigmoid", [i]), b.op("Sigmoid", [f])
    c = b.op("Add", [b.op("Mul", [f, c]), b.op("Mul", [i, b.op("Tanh", [cand])])])
    if peep:
        o = b.op("Add", [o, b.op("Mul", [c, peep[1]])])
    return b.op("Mul", [b.op("Sigmoid", [o]), b.op("Tanh", [c])]), c


def _gru_step(b, xt, h, r, d, rb, linear_before_reset):
    """One GRU step; r: the direction's recurrent weights [3h, h]."""
    hidden = b.hidden
    xz, xr, xh = b.split(xt, 3)
    if linear_before_reset:  # h's projection, reset after: r * (h Rh^T + Rbh)
        rbh = np.concatenate([np.zeros(2 * hidden, np.float32), rb[2 * hidden:]])
        hz, hr, hh = b.split(b.op("Add", [b.op("MatMul", [h, b.const(r.T, f"R{d}T")]), b.const(rbh, f"rbh{d}")]), 3)
        z, rg = b.op("Sigmoid", [b.op("Add", [xz, hz])]), b.op("Sigmoid", [b.op("Add", [xr, hr])])
        cand = b.op("Tanh", [b.op("Add", [xh, b.op("Mul", [rg, hh])])])
    else:  # reset first: (r * h) Rh^T + Rbh
        hz, hr = b.split(b.op("MatMul", [h, b.const(r[:2 * hidden].T, f"Rzr{d}T")]), 2)
        z, rg = b.op("Sigmoid", [b.op("Add", [xz, hz])]), b.op("Sigmoid", [b.op("Add", [xr, hr])])
        rh = b.op("MatMul", [b.op("Mul", [rg, h]), b.const(r[2 * hidden:].T, f"Rh{d}T")])
        cand = b.op("Tanh", [b.op("Add", [b.op("Add", [xh, rh]), b.const(rb[2 * hidden:], f"rbh{d}")])])
    return b.op("Add", [cand, b.op("Mul", [z, b.op("Sub", [h, cand])])])  # (1 - z) cand + z h


def _outputs(b, node, ys, hs, cs, dims, batch_first):
    """Identity nodes giving the cell's outputs: Y [seq, dirs, batch, hidden],
    Y_h and Y_c [dirs, batch, hidden] (batch first: [batch, seq, dirs,
    hidden] and [batch, dirs, hidden])."""
    seq, batch, hidden, dirs = dims
    outs = list(node.output) + ["", "", ""]
    if outs[0]:
        per_t = [b.op("Concat", [b.lead(ys[d][t], 2) for d in range(dirs)], axis=1) if dirs > 1
                 else b.lead(ys[0][t], 2) for t in range(seq)]
        y = b.op("Concat", per_t, axis=0) if seq > 1 else per_t[0]
        y = b.op("Transpose", [y], perm=[2, 0, 1, 3]) if batch_first else y
        b.nodes.append(helper.make_node("Identity", [y], [outs[0]], name=f"{b.prefix}/Y"))
    for k, states in ((1, hs), (2, cs)):
        if outs[k] and states[0] is not None:
            parts = [b.lead(s, 1) for s in states]
            state = b.op("Concat", parts, axis=0) if dirs > 1 else parts[0]
            state = b.op("Transpose", [state], perm=[1, 0, 2]) if batch_first else state
            b.nodes.append(helper.make_node("Identity", [state], [outs[k]], name=f"{b.prefix}/Y{'hc'[k - 1]}"))
    return b.nodes


def as_cell(node, label, consts, shapes):
    """(nodes, initializers, value_infos) computing `node` (LSTM, GRU, RNN or
    onnxruntime's DynamicQuantizeLSTM) as its input projection (one product
    over every step at once) and a CELL node, or None where the cell kernel
    does not cover it (peepholes, an RNN whose two directions differ):
    those are unrolled."""
    quantized = node.op_type == "DynamicQuantizeLSTM" and node.domain == "com.microsoft"
    if not quantized and (node.op_type not in ("LSTM", "GRU", "RNN") or node.domain not in ("", "ai.onnx")):
        return None
    x_shape = _x_shape(node, shapes)
    if x_shape and x_shape[0] is not None and x_shape[1] is None and not quantized:
        return None  # a batch sized at run time over a fixed sequence: unrolled
    batch_first = any(t.name == "layout" and t.i for t in node.attribute)
    a, dirs, inputs = _checked(node, label, consts, x_shape, sized_seq=True)
    acts = a.get("activations", DEFAULT_ACTIVATIONS[node.op_type] * dirs)
    if inputs[7] or len({s.lower() for s in acts}) > 1 and node.op_type == "RNN":
        return None
    kind, hidden, gates = "lstm" if quantized else node.op_type.lower(), int(a["hidden_size"]), GATES[node.op_type]
    (seq, batch, size), n = x_shape, gates * hidden
    project, r, bias, scale = _cell_weights(label, consts, inputs, quantized, (dirs, n, hidden, size))
    b = _Builder(node.name or next(o for o in node.output if o), 13, hidden)
    x, h0, c0 = node.input[0], inputs[5], inputs[6] if kind == "lstm" else ""
    if batch_first:
        x = b.op("Transpose", [x], perm=[1, 0, 2])
        h0, c0 = (b.op("Transpose", [i], perm=[1, 0, 2]) if i else "" for i in (h0, c0))
    rows = b.op("Reshape", [x, b.const(np.array([-1, size], np.int64), "rows")])
    if quantized:  # R's bias joins W's (R's integer values are scaled after their sums: its column stays 0)
        bias = np.concatenate([bias[:, :n] + bias[:, n:], np.zeros_like(bias[:, n:])], axis=1)
    proj = b.op("Add", [project(b, rows), b.const(bias[:, :n].reshape(-1), "Wb")])
    xw = b.op("Reshape", [proj, b.const(np.array([-1, batch, dirs * n], np.int64), "steps")])
    zeros = np.zeros((dirs, batch, hidden), np.float32)
    h0, c0 = h0 or b.const(zeros, "h0"), c0 or b.const(zeros, "c0")
    raw = b.const(np.concatenate([r, bias[:, n:, None]], axis=2), "R")
    outs = [o if i < len(node.output) and o and not batch_first else f"{b.prefix}/cell{i}"
            for i, o in enumerate(list(node.output)[:3] + [""] * (3 - len(node.output[:3])))]
    scales = [b.const(scale, "R_scale")] if quantized else []
    b.nodes.append(helper.make_node(
        CELL, [xw, raw, h0, c0] + scales, outs, name=f"{b.prefix}/cell", domain=DOMAIN, kind=kind, hidden_size=hidden,
        direction=a.get("direction", "forward"), linear_before_reset=int(a.get("linear_before_reset", 0)),
        activation=RNN_ACTIVATIONS.get(acts[0].lower(), "Tanh"), quantize_h=int(quantized)))
    state = [dirs, batch, hidden]
    infos = [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape)
             for o, shape in zip(outs, ([seq, dirs, batch, hidden], state, state))]
    if batch_first:
        for i, perm in ((0, [2, 0, 1, 3]), (1, [1, 0, 2]), (2, [1, 0, 2])):
            if i < len(node.output) and node.output[i]:
                b.nodes.append(helper.make_node("Transpose", [outs[i]], [node.output[i]], name=f"{b.prefix}/out{i}",
                                                perm=perm))
    return b.nodes, b.inits, infos


def _cell_weights(label, consts, inputs, quantized, dims):
    """(project, R [dirs, n, H] float, B [dirs, 2n], scale) of a cell:
    project(b, rows) gives the input projection of every direction side by
    side (a MatMul by W^T; quantized, as onnxruntime computes it); R of a
    quantized cell is its int8 values less their zero point (integers), its
    scales [dirs, n] apart (None for a float cell)."""
    dirs, n, hidden, size = dims
    W, R = _weights(consts, inputs, quantized)
    bias = (numpy_helper.to_array(consts[inputs[3]]).astype(np.float32) if inputs[3]
            else np.zeros((dirs, 2 * n), np.float32))
    if quantized:  # W [dirs, in, n], R [dirs, H, n]
        shapes = (("W", W.q.shape, (dirs, size, n)), ("R", R.q.shape, (dirs, hidden, n)))
        ok = all(tuple(got) == want for _, got, want in shapes)
        r = np.stack([(R.q[d].astype(np.float32) - R.zero[d]).T for d in range(dirs)]) if ok else None
        scale = np.stack([np.broadcast_to(R.scale[d], (n,)) for d in range(dirs)]).astype(np.float32) if ok else None
    else:
        shapes = (("W", W.w.shape, (dirs, n, size)), ("R", R.w.shape, (dirs, n, hidden)))
        r, scale = R.w, None
    for what, got, want in shapes + (("B", bias.shape, (dirs, 2 * n)),):
        if tuple(got) != want:
            raise CompileError(f"{label}: {what} has shape {list(got)}, not {list(want)} (hidden_size {hidden}, "
                               f"{dirs} direction(s), input size {size})")

    def project(b, rows):
        if quantized:
            parts = [W.times(b, rows, d) for d in range(dirs)]
            return b.op("Concat", parts, axis=1) if dirs > 1 else parts[0]
        return b.op("MatMul", [rows, b.const(np.concatenate([W.w[d].T for d in range(dirs)], axis=1), "W")])

    return project, np.ascontiguousarray(r, np.float32), bias, scale
