"""ConvTranspose as one convolution and a pixel shuffle (sub-pixel
convolution), so that a transposed convolution gets the convolution
variants (their schedules, weight transforms and cold-plan choices)
instead of the generic schedule, and computes no product of an inserted
zero.

A 2-D transposed convolution of stride s and kernel k writes output row
o = i * s + t from input row i and kernel tap t. Output rows of one phase
r = o mod s take the taps t = r, r + s, r + 2s, ...: each phase is a plain
convolution of the input with that phase's sub-kernel, flipped, of
m = ceil(k / s) taps. Every phase's sub-kernel (zero past the kernel's end)
becomes a group of output channels of one Conv (padded m - 1 on each side);
a Reshape and Transpose interleave the s * s phases into the output rows
and columns, and a Slice crops the transposed convolution's pads.

Rewritten: 2-D ConvTranspose of fixed sizes (the importer's
_conv_transpose does the same over sizes set at run time) with constant
weights, dilations 1, explicit pads (output_shape made pads before), any
stride, groups and output_padding, a bias or none.
"""
import numpy as np
from onnx import helper, numpy_helper

from .ops import opset_of, types_and_shapes


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def phase_weights(w, strides, groups):
    """The Conv weights [groups * sh * sw * co, ci, mh, mw] (output channels
    ordered group, row phase, column phase, channel) of a ConvTranspose's
    weights w [groups * ci, co, kh, kw]."""
    c, co, kh, kw = w.shape
    (sh, sw), ci = strides, c // groups
    mh, mw = -(-kh // sh), -(-kw // sw)
    padded = np.zeros((c, co, mh * sh, mw * sw), w.dtype)
    padded[:, :, :kh, :kw] = w
    # tap (rh + a * sh, rw + b * sw) of phase (rh, rw), flipped: a -> mh - 1 - a
    taps = padded.reshape(groups, ci, co, mh, sh, mw, sw)[:, :, :, ::-1, :, ::-1, :]
    return np.ascontiguousarray(taps.transpose(0, 4, 6, 2, 1, 3, 5)).reshape(groups * sh * sw * co, ci, mh, mw)


def _eligible(node, a, consts, shapes):
    x, w = node.input[0], node.input[1]
    return (w in consts and x in shapes and len(shapes[x]) == 4 and "output_shape" not in a
            and a.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET") and all(d == 1 for d in a.get("dilations", [1, 1]))
            and (len(node.input) < 3 or not node.input[2] or node.input[2] in consts))


def expand(node, name, consts, shapes, opset):
    """(nodes, initializers) computing `node` as a Conv and a pixel shuffle
    (in the forms of `opset`), or None where it is not rewritten."""
    a = _attrs(node)
    if not _eligible(node, a, consts, shapes):
        return None
    w = numpy_helper.to_array(consts[node.input[1]])
    n, _, h, wd = shapes[node.input[0]]
    groups, (kh, kw) = int(a.get("group", 1)), w.shape[2:]
    sh, sw = a.get("strides", [1, 1])
    pt, pl, pb, pr = a.get("pads", [0, 0, 0, 0])
    oph, opw = a.get("output_padding", [0, 0])
    co = w.shape[1] * groups
    mh, mw = -(-kh // sh), -(-kw // sw)
    # rows of the full (uncropped) output to compute: through the last one kept
    end_h, end_w = (h - 1) * sh + kh + oph - pb, (wd - 1) * sw + kw + opw - pr
    qh, qw = max(h + mh - 1, -(-end_h // sh)), max(wd + mw - 1, -(-end_w // sw))
    if mh == mw == 1 and w.shape[0] == groups == co and (qh, qw) == (h, wd):
        nodes, inits = _per_channel(node, name, consts, w, (n, co, h, wd), (sh, sw))
    else:
        nodes, inits = _phases(node, name, consts, w, (n, h, wd), (sh, sw), (pt, pl, pb, pr), (qh, qw), groups)
    full = f"{name}/full"
    if opset < 10:  # Slice's bounds as attributes
        nodes.append(helper.make_node("Slice", [full], [node.output[0]], name=f"{name}/crop", starts=[pt, pl],
                                      ends=[end_h, end_w], axes=[2, 3]))
        return nodes, inits
    starts, ends = np.array([pt, pl], np.int64), np.array([end_h, end_w], np.int64)
    inits += [numpy_helper.from_array(starts, f"{name}/crop_start"), numpy_helper.from_array(ends, f"{name}/crop_end"),
              numpy_helper.from_array(np.array([2, 3], np.int64), f"{name}/crop_axes")]
    nodes.append(helper.make_node("Slice", [full, f"{name}/crop_start", f"{name}/crop_end", f"{name}/crop_axes"],
                                  [node.output[0]], name=f"{name}/crop"))
    return nodes, inits


def _per_channel(node, name, consts, w, shape, strides):
    """A depthwise ConvTranspose whose kernel fits its stride (2 x 2,
    stride 2: a learned upsampling) writes each input value, times one
    weight per tap, to its own s x s block: x [n, c, h, 1, w, 1] times
    w [1, c, 1, sh, 1, sw] (plus the bias), read as [n, c, h sh, w sw];
    elementwise, no product of a zero."""
    n, c, h, wd = shape
    (sh, sw), (kh, kw) = strides, w.shape[2:]
    taps = np.zeros((c, sh, sw), w.dtype)
    taps[:, :kh, :kw] = w[:, 0]
    inits = [numpy_helper.from_array(taps.reshape(1, c, 1, sh, 1, sw), f"{name}/taps"),
             numpy_helper.from_array(np.array([n, c, h, 1, wd, 1], np.int64), f"{name}/spread"),
             numpy_helper.from_array(np.array([n, c, h * sh, wd * sw], np.int64), f"{name}/rows")]
    nodes = [helper.make_node("Reshape", [node.input[0], f"{name}/spread"], [f"{name}/x6"], name=f"{name}/spread"),
             helper.make_node("Mul", [f"{name}/x6", f"{name}/taps"], [f"{name}/blocks"], name=f"{name}/taps")]
    out = f"{name}/blocks"
    if len(node.input) > 2 and node.input[2]:
        b = numpy_helper.to_array(consts[node.input[2]]).reshape(1, c, 1, 1, 1, 1)
        inits.append(numpy_helper.from_array(np.ascontiguousarray(b), f"{name}/bias"))
        nodes.append(helper.make_node("Add", [out, f"{name}/bias"], [f"{name}/biased"], name=f"{name}/bias"))
        out = f"{name}/biased"
    nodes.append(helper.make_node("Reshape", [out, f"{name}/rows"], [f"{name}/full"], name=f"{name}/full"))
    return nodes, inits


def _phases(node, name, consts, w, shape, strides, pads, q, groups):
    """The phases' Conv, then the Reshape and Transpose that interleave
    them into the rows and columns of the full output."""
    n, h, wd = shape
    (sh, sw), (qh, qw), (kh, kw) = strides, q, w.shape[2:]
    co = w.shape[1] * groups
    mh, mw = -(-kh // sh), -(-kw // sw)
    inits = [numpy_helper.from_array(phase_weights(w, (sh, sw), groups), f"{name}/phase_w")]
    conv_in = [node.input[0], inits[0].name]
    if len(node.input) > 2 and node.input[2]:
        b = numpy_helper.to_array(consts[node.input[2]]).reshape(groups, 1, 1, co // groups)
        inits.append(numpy_helper.from_array(np.ascontiguousarray(np.broadcast_to(
            b, (groups, sh, sw, co // groups))).reshape(-1), f"{name}/phase_b"))
        conv_in.append(inits[-1].name)
    pads = [mh - 1, mw - 1, qh - h, qw - wd]
    nodes = [helper.make_node("Conv", conv_in, [f"{name}/phases"], name=f"{name}/phases", pads=pads,
                              kernel_shape=[mh, mw], group=groups)]
    shape6 = np.array([n, groups, sh, sw, co // groups, qh, qw], np.int64)
    shape4 = np.array([n, co, qh * sh, qw * sw], np.int64)
    inits += [numpy_helper.from_array(shape6, f"{name}/by_phase"), numpy_helper.from_array(shape4, f"{name}/rows")]
    nodes += [helper.make_node("Reshape", [f"{name}/phases", f"{name}/by_phase"], [f"{name}/by_phase_v"],
                               name=f"{name}/by_phase"),
              helper.make_node("Transpose", [f"{name}/by_phase_v"], [f"{name}/shuffled"], name=f"{name}/shuffle",
                               perm=[0, 1, 4, 5, 2, 6, 3])]
    full = f"{name}/full"
    nodes.append(helper.make_node("Reshape", [f"{name}/shuffled", f"{name}/rows"], [full], name=full))
    return nodes, inits


def apply(model):
    """Every eligible ConvTranspose of `model` rewritten."""
    g = model.graph
    if not any(n.op_type == "ConvTranspose" for n in g.node):
        return model
    consts = {t.name: t for t in g.initializer}
    _, shapes = types_and_shapes(model)  # fixed sizes only
    opset, nodes = opset_of(model), []
    for node in g.node:
        done = (expand(node, node.name or node.output[0], consts, shapes, opset) if node.op_type == "ConvTranspose"
                else None)
        if done is None:
            nodes.append(node)
            continue
        nodes += done[0]
        g.initializer.extend(done[1])
    g.ClearField("node")
    g.node.extend(nodes)
    return model
