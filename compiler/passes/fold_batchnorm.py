"""Pass `fold_batchnorm`: fold inference BatchNormalization into the Conv before it.

conv(x, W, b) then BN(scale, bias, mean, var, eps) equals
conv(x, W * s, (b - mean) * s + bias) with s = scale / sqrt(var + eps), per
output channel. Applies when the conv output feeds only that BN and all its
parameters are constants, which is how exported vision models look.
"""
import numpy as np
from onnx import numpy_helper

NAME = "fold_batchnorm"


def apply(model):
    g = model.graph
    consts = {t.name: t for t in g.initializer}
    consumers = {}
    for node in g.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    producer = {o: n for n in g.node for o in n.output}
    outputs = {o.name for o in g.output}
    removed, new_inits = set(), {}
    for bn in g.node:
        if bn.op_type != "BatchNormalization" or len([o for o in bn.output if o]) != 1:
            continue
        conv = producer.get(bn.input[0])
        if (conv is None or conv.op_type != "Conv" or len(consumers.get(conv.output[0], [])) != 1
                or conv.output[0] in outputs or conv.input[1] not in consts
                or (len(conv.input) > 2 and conv.input[2] and conv.input[2] not in consts)
                or not all(n in consts for n in bn.input[1:5])):
            continue
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        scale, bias, mean, var = (numpy_helper.to_array(consts[n]).astype(np.float64) for n in bn.input[1:5])
        w = numpy_helper.to_array(consts[conv.input[1]])
        b = (numpy_helper.to_array(consts[conv.input[2]]).astype(np.float64)
             if len(conv.input) > 2 and conv.input[2] else np.zeros(w.shape[0]))
        s = scale / np.sqrt(var + eps)
        w_name, b_name = conv.output[0] + "_bnW", conv.output[0] + "_bnB"
        new_inits[w_name] = (w.astype(np.float64) * s.reshape(-1, *[1] * (w.ndim - 1))).astype(w.dtype)
        new_inits[b_name] = ((b - mean) * s + bias).astype(w.dtype)
        del conv.input[1:]
        conv.input.extend([w_name, b_name])
        conv.output[0] = bn.output[0]
        removed.add(id(bn))
    if not removed:
        return model
    kept = [n for n in g.node if id(n) not in removed]
    g.ClearField("node")
    g.node.extend(kept)
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in new_inits.items())
    used = {i for n in g.node for i in n.input}
    live = [t for t in g.initializer if t.name in used or t.name in outputs]
    g.ClearField("initializer")
    g.initializer.extend(live)
    return model


def run(c):
    c.proto = apply(c.proto)
    return c
