"""The coldbrew model zoo: ONNX models built locally, with seeded weights.

It builds the CNNs that the NNV12 cold-inference paper evaluates, following
torchvision's layer structure and channel counts, plus a small OCR model:

    resnet18, resnet50, mobilenet (v1), mobilenet_v2, squeezenet (1.1),
    shufflenet_v2 (x1.0), googlenet (inception v1, no aux heads), alexnet,
    efficientnet_b0, crnn (conv stack + self-attention over the text line)

Only the `onnx` package's helpers are used. Every model has opset 17, IR
version 9, one float32 input `input` ([1, 3, 224, 224]; crnn: a grayscale
text line [1, 1, 32, 128]) and one output `output` (logits: [1, 1000]; crnn:
[1, 31, 37], one row of character scores per horizontal position).

Weights come from one `np.random.default_rng(seed)` per model and node and
initializer names are fixed counters, so a build is byte-for-byte
reproducible. Convolutions are He-initialised by fan-in and
BatchNormalization stays a separate node with sane random statistics; the
last BN of each residual branch has a small gamma so that activations keep
their scale through the depth and the logits are of order 1-10.

Some models write shape computations the way PyTorch/Paddle exporters do
(Shape/Gather/Unsqueeze/Concat before a Reshape, channel shuffles computed
from Shape, a Range/Expand/ConstantOfShape position grid, Shape/Slice/Concat
before a Reshape); all of them depend on shapes only and fold to constants.

    python examples/zoo.py OUTDIR [names...]    # writes OUTDIR/<name>.onnx
"""
import collections
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 9
RES_GAMMA = 0.25  # gamma of the last BN in a residual branch
# He gain for a conv by what feeds it: 1 / E[act(z)^2] for z ~ N(0, 1), so that
# a conv after a ReLU (2), a SiLU (2.8) or a linear layer (1) keeps the scale.
RELU_GAIN, SILU_GAIN, LINEAR_GAIN = 2.0, 2.8, 1.0
FLOAT = TensorProto.FLOAT


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


class Graph:
    """Appends nodes and seeded initializers; names are per-op-type counters."""

    def __init__(self, name, seed, input_shape=(1, 3, 224, 224), bn_eps=1e-5):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.input_shape = list(input_shape)
        self.bn_eps = bn_eps
        self.nodes, self.inits, self.shared = [], [], {}
        self.counts = collections.Counter()

    # -- plumbing --------------------------------------------------------
    def _name(self, op_type):
        self.counts[op_type] += 1
        return f"{op_type}_{self.counts[op_type]}"

    def op(self, op_type, inputs, n_out=1, name=None, **attrs):
        name = name or self._name(op_type)
        outs = [name] if n_out == 1 else [f"{name}_out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def param(self, name, array):
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array, dtype=np.float32), name))
        return name

    def shared_param(self, name, array):
        if name not in self.shared:
            self.shared[name] = self.param(name, array)
        return name

    def const(self, values, dtype=np.int64):
        """A Constant node, as exporters write shape constants."""
        return self.op("Constant", [], value=numpy_helper.from_array(np.array(values, dtype=dtype)))

    def normal(self, shape, std):
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    # -- layers ----------------------------------------------------------
    def conv(self, x, cin, cout, k, stride=1, pad=None, groups=1, bias=False, gain=RELU_GAIN):
        (kh, kw), (sh, sw) = _pair(k), _pair(stride)
        ph, pw = (kh // 2, kw // 2) if pad is None else _pair(pad)
        name = self._name("Conv")
        fan_in = cin // groups * kh * kw  # He init; `gain` says what feeds the conv
        w = self.normal((cout, cin // groups, kh, kw), np.sqrt(gain / fan_in))
        inputs = [x, self.param(f"{name}.weight", w)]
        if bias:
            inputs.append(self.param(f"{name}.bias", self.normal(cout, 0.01)))
        return self.op("Conv", inputs, name=name, kernel_shape=[kh, kw], strides=[sh, sw],
                       pads=[ph, pw, ph, pw], group=groups)

    def bn(self, x, c, gamma=1.0):
        name = self._name("BatchNormalization")
        # E[1/var] = ln 3 for var ~ U(0.5, 1.5); gamma ~ 0.95 keeps the scale.
        scale = self.param(f"{name}.scale", 0.95 * gamma * (1.0 + self.normal(c, 0.1)))
        bias = self.param(f"{name}.bias", self.normal(c, 0.05))
        mean = self.param(f"{name}.mean", self.normal(c, 0.05))
        var = self.param(f"{name}.var", self.rng.uniform(0.5, 1.5, c))
        return self.op("BatchNormalization", [x, scale, bias, mean, var], name=name, epsilon=self.bn_eps)

    def act(self, x, kind):
        if kind is None:
            return x
        if kind == "relu":
            return self.op("Relu", [x])
        if kind == "relu6":
            lo = self.shared_param("relu6.min", np.array(0.0))
            hi = self.shared_param("relu6.max", np.array(6.0))
            return self.op("Clip", [x, lo, hi])
        if kind == "silu":
            return self.op("Mul", [x, self.op("Sigmoid", [x])])
        if kind == "gelu":  # erf form, as opset 17 exporters write it
            e = self.op("Erf", [self.op("Div", [x, self.const(np.sqrt(2.0), np.float32)])])
            y = self.op("Mul", [x, self.op("Add", [e, self.const(1.0, np.float32)])])
            return self.op("Mul", [y, self.const(0.5, np.float32)])
        raise ValueError(kind)

    def cba(self, x, cin, cout, k, stride=1, groups=1, act="relu", gamma=1.0, pad=None, gain=RELU_GAIN):
        """Conv (no bias) -> BatchNormalization -> activation."""
        return self.act(self.bn(self.conv(x, cin, cout, k, stride, pad, groups, gain=gain), cout, gamma), act)

    def relu(self, x):
        return self.op("Relu", [x])

    def add(self, a, b):
        return self.op("Add", [a, b])

    def concat(self, xs, axis=1):
        return self.op("Concat", xs, axis=axis)

    def maxpool(self, x, k, stride, pad=0, ceil=0):
        ph, pw = _pair(pad)
        return self.op("MaxPool", [x], kernel_shape=list(_pair(k)), strides=list(_pair(stride)),
                       pads=[ph, pw, ph, pw], ceil_mode=ceil)

    def gap(self, x):
        return self.op("GlobalAveragePool", [x])

    def gemm(self, x, cin, cout, gain=1.0):
        name = self._name("Gemm")
        w = self.param(f"{name}.weight", self.normal((cout, cin), np.sqrt(gain / cin)))
        b = self.param(f"{name}.bias", self.normal(cout, 0.01))
        return self.op("Gemm", [x, w, b], name=name, transB=1)

    def linear(self, x, cin, cout, gain=1.0):
        """MatMul + Add over the last axis (weight stored [in, out])."""
        name = self._name("MatMul")
        w = self.param(f"{name}.weight", self.normal((cin, cout), np.sqrt(gain / cin)))
        y = self.op("MatMul", [x, w], name=name)
        return self.op("Add", [y, self.param(f"{name}.bias", self.normal(cout, 0.01))])

    def layernorm(self, x, c):
        name = self._name("LayerNormalization")
        scale = self.param(f"{name}.scale", 1.0 + self.normal(c, 0.1))
        bias = self.param(f"{name}.bias", self.normal(c, 0.05))
        return self.op("LayerNormalization", [x, scale, bias], name=name, axis=-1, epsilon=1e-5)

    # -- exporter-style flattens ------------------------------------------
    def flatten_gather(self, x):
        """x.view(x.size(0), -1): Shape -> Gather(0) -> Unsqueeze -> Concat([-1]) -> Reshape."""
        n = self.op("Gather", [self.op("Shape", [x]), self.const(0)], axis=0)
        n = self.op("Unsqueeze", [n, self.const([0])])
        return self.op("Reshape", [x, self.concat([n, self.const([-1])], axis=0)])

    def flatten_slice(self, x):
        """Shape -> Slice([0:1]) -> Concat([-1]) -> Reshape."""
        n = self.op("Slice", [self.op("Shape", [x]), self.const([0]), self.const([1]), self.const([0])])
        return self.op("Reshape", [x, self.concat([n, self.const([-1])], axis=0)])

    def flatten(self, x):
        return self.op("Flatten", [x], axis=1)

    # -- the model ---------------------------------------------------------
    def model(self, y, out_shape):
        for node in self.nodes:  # the last tensor becomes the graph output `output`
            node.input[:] = ["output" if i == y else i for i in node.input]
            node.output[:] = ["output" if o == y else o for o in node.output]
        graph = helper.make_graph(
            self.nodes, self.name,
            [helper.make_tensor_value_info("input", FLOAT, self.input_shape)],
            [helper.make_tensor_value_info("output", FLOAT, list(out_shape))],
            initializer=self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                 ir_version=IR_VERSION, producer_name="coldbrew-zoo", producer_version="1")


# -- ResNet ------------------------------------------------------------------
def _basic_block(g, x, cin, width, stride):
    y = g.cba(x, cin, width, 3, stride)
    y = g.cba(y, width, width, 3, act=None, gamma=RES_GAMMA)
    if stride != 1 or cin != width:
        x = g.cba(x, cin, width, 1, stride, act=None)
    return g.relu(g.add(y, x)), width


def _bottleneck(g, x, cin, width, stride):
    cout = width * 4
    y = g.cba(x, cin, width, 1)
    y = g.cba(y, width, width, 3, stride)  # stride on the 3x3 (torchvision v1.5)
    y = g.cba(y, width, cout, 1, act=None, gamma=RES_GAMMA)
    if stride != 1 or cin != cout:
        x = g.cba(x, cin, cout, 1, stride, act=None)
    return g.relu(g.add(y, x)), cout


def _resnet(name, seed, block, layers):
    g = Graph(name, seed)
    x = g.maxpool(g.cba("input", 3, 64, 7, 2), 3, 2, 1)
    cin = 64
    for i, (n, width) in enumerate(zip(layers, (64, 128, 256, 512))):
        for j in range(n):
            x, cin = block(g, x, cin, width, 2 if i > 0 and j == 0 else 1)
    x = g.flatten_gather(g.gap(x))
    return g.model(g.gemm(x, cin, 1000), [1, 1000])


def resnet18():
    return _resnet("resnet18", 18, _basic_block, (2, 2, 2, 2))


def resnet50():
    return _resnet("resnet50", 50, _bottleneck, (3, 4, 6, 3))


# -- MobileNet v1 / v2 -----------------------------------------------------
def mobilenet():
    g = Graph("mobilenet", 1)
    x, cin = g.cba("input", 3, 32, 3, 2), 32
    stack = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
    for cout, stride in stack:  # depthwise 3x3 then pointwise 1x1, each BN + ReLU
        x = g.cba(g.cba(x, cin, cin, 3, stride, groups=cin), cin, cout, 1)
        cin = cout
    x = g.flatten(g.gap(x))
    return g.model(g.gemm(x, 1024, 1000), [1, 1000])


def _position_grid_bias(g, x):
    """Detection-head-style position grid over the feature map, added as a bias:
    Range over H and W (from Shape), Expanded to the feature shape, scaled by a
    ConstantOfShape([N, C, 1, 1]) tensor. Depends on shapes only."""
    shape = g.op("Shape", [x])
    axes = []
    for i in (2, 3):
        size = g.op("Gather", [shape, g.const(i)], axis=0)
        pos = g.op("Cast", [g.op("Range", [g.const(0), size, g.const(1)])], to=FLOAT)
        axes.append(g.op("Div", [pos, g.op("Cast", [size], to=FLOAT)]))
    grid = g.add(g.op("Unsqueeze", [axes[0], g.const([1])]), axes[1])  # [H, W]
    grid = g.op("Expand", [grid, shape])  # [N, C, H, W]
    nc11 = g.concat([g.op("Shape", [x], end=2), g.const([1, 1])], axis=0)
    scale = g.op("ConstantOfShape", [nc11], value=numpy_helper.from_array(np.array([0.1], np.float32)))
    return g.add(x, g.op("Mul", [grid, scale]))


def mobilenet_v2():
    g = Graph("mobilenet_v2", 2)
    x, cin = g.cba("input", 3, 32, 3, 2, act="relu6"), 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride, hidden = (s if i == 0 else 1), cin * t
            residual = stride == 1 and cin == c
            y = x if t == 1 else g.cba(x, cin, hidden, 1, act="relu6", gain=LINEAR_GAIN)
            y = g.cba(y, hidden, hidden, 3, stride, groups=hidden, act="relu6")
            y = g.cba(y, hidden, c, 1, act=None, gamma=RES_GAMMA if residual else 1.0)  # linear bottleneck
            x, cin = (g.add(x, y) if residual else y), c
    x = g.cba(x, 320, 1280, 1, act="relu6", gain=LINEAR_GAIN)
    x = g.flatten(g.gap(_position_grid_bias(g, x)))
    return g.model(g.gemm(x, 1280, 1000), [1, 1000])


# -- SqueezeNet 1.1 ----------------------------------------------------------
def squeezenet():
    g = Graph("squeezenet", 11)
    x = g.maxpool(g.relu(g.conv("input", 3, 64, 3, 2, pad=0, bias=True)), 3, 2, ceil=1)
    cin = 64
    for fire in ((16, 64), (16, 64), "pool", (32, 128), (32, 128), "pool",
                 (48, 192), (48, 192), (64, 256), (64, 256)):
        if fire == "pool":
            x = g.maxpool(x, 3, 2, ceil=1)
            continue
        squeeze, expand = fire
        s = g.relu(g.conv(x, cin, squeeze, 1, bias=True))
        e1 = g.relu(g.conv(s, squeeze, expand, 1, bias=True))
        e3 = g.relu(g.conv(s, squeeze, expand, 3, bias=True))
        x, cin = g.concat([e1, e3]), 2 * expand
    x = g.relu(g.conv(x, 512, 1000, 1, bias=True, gain=1.0))  # classifier: a 1x1 conv
    return g.model(g.flatten(g.gap(x)), [1, 1000])


# -- ShuffleNet v2 x1.0 ------------------------------------------------------
def _channel_shuffle(g, x, groups=2):
    """view(n, groups, c // groups, h, w) -> transpose(1, 2) -> view(n, -1, h, w),
    with the target shapes computed from Shape/Gather/Div/Concat of x."""
    shape = g.op("Shape", [x])
    n, c, h, w = (g.op("Gather", [shape, g.const(i)], axis=0) for i in range(4))
    per_group = g.op("Div", [c, g.const(groups)])
    n, per_group, h, w = (g.op("Unsqueeze", [d, g.const([0])]) for d in (n, per_group, h, w))
    x = g.op("Reshape", [x, g.concat([n, g.const([groups]), per_group, h, w], axis=0)])
    x = g.op("Transpose", [x], perm=[0, 2, 1, 3, 4])
    return g.op("Reshape", [x, g.concat([n, g.const([-1]), h, w], axis=0)])


def _shuffle_unit(g, x, cin, cout, stride):
    half = cout // 2
    if stride == 1:
        x1, x2 = g.op("Split", [x, g.const([half, half])], n_out=2, axis=1)
        cin2 = half
    else:
        x1 = g.cba(x, cin, cin, 3, stride, groups=cin, act=None)
        x1 = g.cba(x1, cin, half, 1, gain=LINEAR_GAIN)
        x2, cin2 = x, cin
    y = g.cba(x2, cin2, half, 1)
    y = g.cba(y, half, half, 3, stride, groups=half, act=None)
    y = g.cba(y, half, half, 1, gain=LINEAR_GAIN)
    return _channel_shuffle(g, g.concat([x1, y]))


def shufflenet_v2():
    g = Graph("shufflenet_v2", 22)
    x = g.maxpool(g.cba("input", 3, 24, 3, 2), 3, 2, 1)
    cin = 24
    for repeats, cout in ((4, 116), (8, 232), (4, 464)):
        for i in range(repeats):
            x, cin = _shuffle_unit(g, x, cin, cout, 2 if i == 0 else 1), cout
    x = g.cba(x, 464, 1024, 1)
    x = g.op("ReduceMean", [x], axes=[2, 3], keepdims=0)  # x.mean([2, 3])
    return g.model(g.gemm(x, 1024, 1000), [1, 1000])


# -- GoogLeNet (Inception v1) ------------------------------------------------
def _inception(g, x, cin, c1, c3r, c3, c5r, c5, pool_proj):
    b1 = g.cba(x, cin, c1, 1)
    b2 = g.cba(g.cba(x, cin, c3r, 1), c3r, c3, 3)
    b3 = g.cba(g.cba(x, cin, c5r, 1), c5r, c5, 3)  # torchvision uses a 3x3 here
    b4 = g.cba(g.maxpool(x, 3, 1, 1, ceil=1), cin, pool_proj, 1)
    return g.concat([b1, b2, b3, b4]), c1 + c3 + c5 + pool_proj


def googlenet():
    g = Graph("googlenet", 7, bn_eps=1e-3)
    x = g.maxpool(g.cba("input", 3, 64, 7, 2), 3, 2, ceil=1)
    x = g.maxpool(g.cba(g.cba(x, 64, 64, 1), 64, 192, 3), 3, 2, ceil=1)
    cin = 192
    for block in ((64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64), 3,
                  (192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
                  (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128), 2,
                  (256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128)):
        if isinstance(block, int):  # max pool of that kernel size between stages
            x = g.maxpool(x, block, 2, ceil=1)
        else:
            x, cin = _inception(g, x, cin, *block)
    x = g.flatten_gather(g.gap(x))
    return g.model(g.gemm(x, cin, 1000), [1, 1000])


# -- AlexNet -----------------------------------------------------------------
def alexnet():
    g = Graph("alexnet", 12)
    x, cin = "input", 3
    for cout, k, stride, pad, pool in ((64, 11, 4, 2, True), (192, 5, 1, 2, True), (384, 3, 1, 1, False),
                                       (256, 3, 1, 1, False), (256, 3, 1, 1, True)):
        x, cin = g.relu(g.conv(x, cin, cout, k, stride, pad, bias=True)), cout
        if pool:
            x = g.maxpool(x, 3, 2)
    x = g.flatten(x)  # [1, 256 * 6 * 6]; the adaptive 6x6 pool is the identity at 224
    x = g.relu(g.gemm(x, 256 * 6 * 6, 4096, gain=2.0))
    x = g.relu(g.gemm(x, 4096, 4096, gain=2.0))
    return g.model(g.gemm(x, 4096, 1000, gain=0.25), [1, 1000])  # max pools raised the scale


# -- EfficientNet-B0 ---------------------------------------------------------
def _squeeze_excite(g, x, c, squeeze):
    s = g.act(g.conv(g.gap(x), c, squeeze, 1, bias=True), "silu")
    s = g.op("Sigmoid", [g.conv(s, squeeze, c, 1, bias=True, gain=SILU_GAIN)])
    return g.op("Mul", [x, s])


def efficientnet_b0():
    g = Graph("efficientnet_b0", 20, bn_eps=1e-3)
    x, cin = g.cba("input", 3, 32, 3, 2, act="silu"), 32
    for t, k, s, c, n in ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
                          (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)):
        for i in range(n):  # MBConv
            stride, hidden = (s if i == 0 else 1), cin * t
            residual = stride == 1 and cin == c
            y = x if t == 1 else g.cba(x, cin, hidden, 1, act="silu", gain=LINEAR_GAIN)
            y = g.cba(y, hidden, hidden, k, stride, groups=hidden, act="silu", gain=SILU_GAIN)
            y = _squeeze_excite(g, y, hidden, max(1, cin // 4))  # gates ~0.6, so 3x below
            y = g.cba(y, hidden, c, 1, act=None, gamma=RES_GAMMA if residual else 1.0, gain=3 * SILU_GAIN)
            x, cin = (g.add(x, y) if residual else y), c
    x = g.cba(x, 320, 1280, 1, act="silu", gain=LINEAR_GAIN)
    x = g.flatten_slice(g.gap(x))
    return g.model(g.gemm(x, 1280, 1000), [1, 1000])


# -- CRNN (OCR) --------------------------------------------------------------
CRNN_CLASSES = 37  # CTC blank + 10 digits + 26 letters


def crnn():
    """Conv stack that collapses the height of a 32x128 text line, then one
    pre-norm self-attention block and a feed-forward block over the width
    axis, then a per-timestep classifier: output [1, 31, 37] (raw scores)."""
    g = Graph("crnn", 31, input_shape=(1, 1, 32, 128))
    x, cin = "input", 1
    for cout, pool in ((32, (2, 2)), (64, (2, 2)), (128, None), (128, (2, 1)), (256, None), (256, (2, 1))):
        x, cin = g.cba(x, cin, cout, 3), cout
        if pool:
            x = g.maxpool(x, pool, pool)
    d = cin
    x = g.cba(x, d, d, 2, pad=0)  # [1, 256, 1, 31]
    x = g.op("Transpose", [g.op("Squeeze", [x, g.const([2])])], perm=[0, 2, 1])  # [1, T, 256]
    h = g.layernorm(x, d)
    q, k, v = (g.linear(h, d, d) for _ in range(3))
    scores = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 2, 1])]),
                          g.const(1.0 / np.sqrt(d), np.float32)])
    att = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    x = g.add(x, g.linear(att, d, d, gain=RES_GAMMA ** 2))  # small residual branches
    h = g.act(g.linear(g.layernorm(x, d), d, 2 * d, gain=2.0), "gelu")
    x = g.add(x, g.linear(h, 2 * d, d, gain=RES_GAMMA ** 2))
    return g.model(g.linear(g.layernorm(x, d), d, CRNN_CLASSES), [1, 31, CRNN_CLASSES])


def text_detector():
    """A DB-style OCR text detector: a strided conv backbone (1/4 .. 1/32),
    an FPN (1x1 laterals, nearest x2 upsampling, adds), the four levels
    smoothed, upsampled to 1/4 and concatenated, then a head of conv and
    two stride-2 transposed convs back to full resolution and a sigmoid:
    output [1, 1, 160, 160], the probability map a DB post-process
    thresholds at 0.3."""
    g = Graph("text_detector", 41, input_shape=(1, 3, 160, 160))
    x, cin, levels = "input", 3, []
    for k, cout in enumerate((16, 24, 32, 64, 96)):
        x = g.cba(g.cba(x, cin, cout, 3, 2), cout, cout, 3)
        cin = cout
        if k:
            levels.append((x, cout))  # 1/4, 1/8, 1/16, 1/32

    def up(y, f):
        scales = g.const([1.0, 1.0, float(f), float(f)], np.float32)
        return g.op("Resize", [y, "", scales], mode="nearest")

    inner = [g.conv(y, c, 32, 1, gain=1.0) for y, c in levels]
    for k in (2, 1, 0):  # top-down: each level plus the coarser one upsampled
        inner[k] = g.add(inner[k], up(inner[k + 1], 2))
    fused = g.concat([up(g.conv(y, 32, 8, 3, gain=1.0), 2 ** k) if k else g.conv(y, 32, 8, 3, gain=1.0)
                      for k, y in enumerate(inner)])
    h = g.cba(fused, 32, 8, 3)
    for cout in (8, 1):
        name = g._name("ConvTranspose")
        w = g.param(f"{name}.weight", g.normal((8, cout, 2, 2), np.sqrt(2.0 / 8)))
        bias = g.normal(cout, 0.01) - (1.5 if cout == 1 else 0.0)  # the map: mostly background
        h = g.op("ConvTranspose", [h, w, g.param(f"{name}.bias", bias)], name=name,
                 kernel_shape=[2, 2], strides=[2, 2])
        if cout > 1:
            h = g.relu(g.bn(h, cout))
    return g.model(g.op("Sigmoid", [h]), [1, 1, 160, 160])


MODELS = collections.OrderedDict((f.__name__, f) for f in (
    resnet18, resnet50, mobilenet, mobilenet_v2, squeezenet, shufflenet_v2,
    googlenet, alexnet, efficientnet_b0, crnn))
# models the tests and the precision benchmark also check, outside the zoo
# that the benchmarks time: real-model shapes of other tasks than classification
EXTRA_MODELS = collections.OrderedDict((f.__name__, f) for f in (text_detector,))


def build(name):
    """The zoo (or extra) model `name` as an onnx.ModelProto."""
    known = {**MODELS, **EXTRA_MODELS}
    if name not in known:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(known)}")
    return known[name]()


def save(name, path):
    onnx.save(build(name), path)


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python examples/zoo.py OUTDIR [names...]\nmodels: {', '.join(MODELS)} "
              f"(also: {', '.join(EXTRA_MODELS)})")
        return 0 if argv else 2
    outdir, names = argv[0], argv[1:] or list(MODELS)
    for name in names:
        if name not in MODELS and name not in EXTRA_MODELS:
            raise SystemExit(f"unknown model {name!r}; known: {', '.join({**MODELS, **EXTRA_MODELS})}")
    os.makedirs(outdir, exist_ok=True)
    for name in names:
        path = os.path.join(outdir, f"{name}.onnx")
        save(name, path)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
