"""A model's compute-heavy layers as standalone ONNX models ("units"), so
that each layer can run alone in coldbrew and in onnxruntime
(bench/kernels.py).

A unit is one node of a heavy operator (Conv, MatMul, Gemm, ConvTranspose, a
normalization, Softmax, a reduction, Resize, pooling, a recurrent cell)
together with the QuantizeLinear/DequantizeLinear nodes that put its inputs on
an 8-bit grid, or a normalization written out in elementary operators
(ReduceMean, Sub, Pow, Add, Sqrt, Div and its scale and shift) taken whole.
Its inputs carry the values the whole model computes (captured from an
onnxruntime run of the model), so shapes, masks and indices are the real ones;
small integer inputs (shapes, axes, sizes) and the model's constants stay
constants.
"""
import json
from collections import defaultdict

import numpy as np

KINDS = {
    "MatMul": "matmul", "Gemm": "matmul", "MatMulInteger": "matmul", "Einsum": "matmul",
    "Conv": "conv", "ConvInteger": "conv", "ConvTranspose": "conv_transpose",
    "LayerNormalization": "normalization", "GroupNormalization": "normalization",
    "RMSNormalization": "normalization", "InstanceNormalization": "normalization",
    "LSTM": "recurrent", "GRU": "recurrent", "RNN": "recurrent", "DynamicQuantizeLSTM": "recurrent",
    "Softmax": "softmax", "LogSoftmax": "softmax",
    "ReduceMean": "reduction", "ReduceSum": "reduction", "ReduceMax": "reduction", "ReduceMin": "reduction",
    "ReduceL2": "reduction", "ReduceProd": "reduction", "ArgMax": "reduction",
    "Resize": "resize", "Upsample": "resize",
    "MaxPool": "pooling", "AveragePool": "pooling", "GlobalAveragePool": "pooling", "GlobalMaxPool": "pooling",
}
_NORM_STEPS = {"Sub", "Pow", "Mul", "ReduceMean", "Add", "Sqrt", "Div", "Reciprocal", "Cast"}
_MAX_NORM_NODES = 12


class Unit:
    def __init__(self, kind, nodes):
        self.kind, self.nodes = kind, nodes

    @property
    def label(self):
        ops = [n.op_type for n in self.nodes]
        return ops[-1] if len(ops) == 1 else f"{ops[-1] if self.kind != 'normalization' else 'norm'}({'+'.join(ops)})"


def units(graph):
    """The heavy layers of an ONNX graph's top level, in graph order: written-
    out normalizations first claim their nodes, then every heavy node with
    the quantization nodes feeding it."""
    nodes = list(graph.node)  # nodes by index (a protobuf field hands out new wrappers on each access)
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    consumers = defaultdict(list)
    for k, n in enumerate(nodes):
        for i in n.input:
            consumers[i].append(k)
    inits = {t.name for t in graph.initializer}
    taken, found = set(), []
    for k in range(len(nodes)):
        mine = _written_out_norm(k, nodes, producer, consumers, inits)
        if mine and not taken & set(mine):
            taken.update(mine)
            found.append(("normalization", sorted(mine)))
    for k, n in enumerate(nodes):
        if n.op_type in KINDS and k not in taken:
            mine = [m for m in _grid_inputs(n, nodes, producer) if m not in taken] + [k]
            taken.update(mine)
            found.append((KINDS[n.op_type], sorted(mine)))
    return [Unit(kind, [nodes[m] for m in mine]) for kind, mine in sorted(found, key=lambda f: f[1][-1])]


def _grid_inputs(node, nodes, producer):
    """The DequantizeLinear nodes (and the QuantizeLinear before each) that
    feed `node`: with them the layer sees its inputs' 8-bit grid."""
    out = []
    for i in node.input:
        p = producer.get(i)
        if p is not None and nodes[p].op_type == "DequantizeLinear":
            q = producer.get(nodes[p].input[0])
            out += ([q] if q is not None and nodes[q].op_type == "QuantizeLinear" else []) + [p]
    return out


def _written_out_norm(r, nodes, producer, consumers, inits):
    """The node indices of a layer (x - mean) / sqrt(var + eps) or
    x / sqrt(mean(x^2) + eps) written out from ReduceMean `r` (with a scale
    and shift by constants after it), or None."""
    if nodes[r].op_type != "ReduceMean":
        return None
    x, mean = nodes[r].input[0], nodes[r].output[0]
    sub = next((c for c in consumers[x] if nodes[c].op_type == "Sub" and list(nodes[c].input) == [x, mean]), None)
    if sub is not None:  # layer norm: the end divides (or multiplies) the centred x
        start, src, mine = sub, nodes[sub].output[0], [r, sub]
    else:  # RMS norm: the mean is of x * x or x ^ 2, the end divides x
        p = producer.get(x)
        if p is None or not (nodes[p].op_type == "Pow" or (nodes[p].op_type == "Mul"
                                                            and nodes[p].input[0] == nodes[p].input[1])):
            return None
        start, src, mine = r, nodes[p].input[0], [p, r]
    end, frontier, seen = None, [start], set(mine)
    while frontier:  # the elementary operators after the start, the first division of src by something the end
        for c in (c for o in nodes[frontier.pop(0)].output for c in consumers[o]):
            n = nodes[c]
            if n.op_type not in _NORM_STEPS or c in seen:
                continue
            seen.add(c)
            if end is None and n.op_type in ("Div", "Mul") and src in n.input and n.input[0] != n.input[1]:
                end = c
            elif c != end:
                frontier.append(c)
        if len(seen) > 3 * _MAX_NORM_NODES:
            break
    if end is None:
        return None
    producer_in = {o: k for k in seen for o in nodes[k].output}
    back, mine = [end], set(mine) | {end}  # the nodes on a path to the end
    while back:
        for i in nodes[back.pop()].input:
            k = producer_in.get(i)
            if k is not None and k not in mine:
                mine.add(k)
                back.append(k)
    mine = sorted(mine)
    if len(mine) > _MAX_NORM_NODES or sum(nodes[m].op_type == "ReduceMean" for m in mine) < (2 if sub is not None else 1):
        return None
    for op in ("Mul", "Add"):  # the scale and shift
        after = consumers[nodes[end].output[0]]
        if len(after) == 1 and nodes[after[0]].op_type == op and any(i in inits for i in nodes[after[0]].input):
            end = after[0]
            mine.append(end)
    return mine


def interface(graph, unit):
    """(inputs, outputs) of a unit: the tensors its nodes read from outside
    (initializers included) and those they write that are read outside or
    are the model's outputs."""
    produced = [o for n in unit.nodes for o in n.output if o]
    inputs = list(dict.fromkeys(i for n in unit.nodes for i in n.input if i and i not in produced))
    read_outside = {i for n in graph.node if not set(n.output) & set(produced) for i in n.input}
    read_outside |= {o.name for o in graph.output}
    outputs = [o for o in produced if o in read_outside] or list(unit.nodes[-1].output)
    return inputs, outputs


def captured(model, feeds, names):
    """The values of tensors `names` in onnxruntime's run of `model` on
    `feeds` (no graph optimizations: every named tensor exists)."""
    import onnx
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output} | {t.name for t in m.graph.initializer}
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(names) if n not in have)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = [o.name for o in sess.get_outputs()]
    values = dict(zip(outs, sess.run(None, feeds)))
    values.update({t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer if t.name in set(names)})
    return values


def constant_tensors(graph):
    """The tensors computed from constants alone (a Constant's output, a
    Transpose or DequantizeLinear of an initializer...): a compiler folds
    them, so a layer alone gets them as constants too."""
    const = {t.name for t in graph.initializer}
    for n in graph.node:  # in topological order
        subgraph = any(a.type in (a.GRAPH, a.GRAPHS) for a in n.attribute)
        if not subgraph and all(i in const for i in n.input if i):
            const.update(o for o in n.output if o)
    return const - {t.name for t in graph.initializer}


def unit_model(model, unit, values):
    """(standalone ONNX model of `unit`, its feeds, a key naming its shapes):
    the model's initializers and Constant outputs and small integer values
    stay constants, every other input is a graph input fed its captured
    value."""
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    const_nodes = constant_tensors(g)
    ins, outs = interface(g, unit)
    graph_inputs, consts, feeds, sig = [], [], {}, []
    for name in ins:
        v = values[name]
        if name in inits or name in const_nodes or (v.dtype.kind in "iu" and v.dtype.itemsize >= 4 and v.size <= 64):
            consts.append(inits[name] if name in inits else numpy_helper.from_array(np.asarray(v), name))
            sig.append(("const", list(v.shape), str(v.dtype)))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
            feeds[name] = v
            sig.append(("in", list(v.shape), str(v.dtype)))
    outputs = [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(values[o].dtype), values[o].shape)
               for o in outs]
    graph = helper.make_graph(list(unit.nodes), f"unit_{unit.label}", graph_inputs, outputs, consts)
    m = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=max(model.ir_version, 4))  # 3 wants initializers as inputs too
    ops = [(n.op_type, sorted((a.name, str(helper.get_attribute_value(a))) for a in n.attribute
                              if a.type != a.GRAPH)) for n in unit.nodes]
    return m, feeds, json.dumps([ops, sig])
