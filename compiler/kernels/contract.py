"""The variant contract (compiler/kernels/__init__.py describes it): the
anchor's stage name, the layer specs, the Variant base class and the
registry the variant modules add themselves to."""
from dataclasses import dataclass

ANCHOR = "cb_anchor"


def simplified(extent):
    """An extent sized at run time in the simplifier's form (the form Relax
    gives the same value: fused functions must agree on their buffers'
    shapes); an int as it is."""
    if isinstance(extent, int):
        return extent
    from tvm.sym import Analyzer

    return Analyzer().simplify(extent)


@dataclass(frozen=True)
class ConvSpec:
    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: tuple = (1, 1)
    pad: tuple = (0, 0, 0, 0)  # top, left, bottom, right
    dilation: tuple = (1, 1)
    groups: int = 1
    dtype: str = "float32"
    # activation layouts (compiler/passes/block_layout.py): 0 is NCHW, b is the
    # blocked NCHW{b}c ([N, C / b, H, W, b], channel c at [c // b, ..., c % b])
    in_block: int = 0
    out_block: int = 0
    # x on an integer grid (x = in_scale * q, |q| <= 255: a ConvInteger's
    # input less its zero point, a DequantizeLinear's output) and its weights
    # the model's integers (conv2d.pair_blocked); 0: any x
    in_scale: float = 0.0

    @classmethod
    def of_conv2d(cls, attrs, x_shape, w_shape, dtype="float32", in_block=0, out_block=0):
        """The spec of a Relax conv2d: its attributes, input shape (blocked where in_block) and OIHW weight shape."""
        n, c, h, w = (int(d) for d in x_shape[:4])
        pad = [int(p) for p in attrs.padding]
        return cls(n, c * (in_block or 1), h, w, int(w_shape[0]), int(w_shape[2]), int(w_shape[3]),
                   tuple(int(s) for s in attrs.strides), tuple(pad * 2 if len(pad) == 2 else pad),
                   tuple(int(d) for d in attrs.dilation), int(attrs.groups), dtype, in_block, out_block)

    @property
    def input_shape(self):
        if self.in_block:
            return (self.n, self.c // self.in_block, self.h, self.w, self.in_block)
        return (self.n, self.c, self.h, self.w)

    @property
    def output_shape(self):
        if self.out_block:
            return (self.n, self.k // self.out_block, self.out_h, self.out_w, self.out_block)
        return (self.n, self.k, self.out_h, self.out_w)

    @property
    def out_h(self):
        return simplified((self.h + self.pad[0] + self.pad[2] - (self.r - 1) * self.dilation[0] - 1)
                           // self.stride[0] + 1)

    @property
    def out_w(self):
        return simplified((self.w + self.pad[1] + self.pad[3] - (self.s - 1) * self.dilation[1] - 1)
                           // self.stride[1] + 1)

    @property
    def symbolic(self):
        """Whether its batch, rows or columns are sized at run time (TVM expressions)."""
        return not isinstance(self.n, int) or not isinstance(self.h, int) or not isinstance(self.w, int)

    @property
    def depthwise(self):
        return self.groups == self.c and self.k == self.c and self.groups > 1

    @property
    def weight_shape(self):
        return (self.k, self.c // self.groups, self.r, self.s)

    @property
    def flops(self):
        return 2 * self.n * self.k * self.out_h * self.out_w * (self.c // self.groups) * self.r * self.s


@dataclass(frozen=True)
class DenseSpec:
    m: int
    k: int
    n: int
    dtype: str = "float32"
    lead: int = 0  # unit axes before the rows: x [1, ..., 1, M, K] (a sequence of batch 1)
    # x on a quantized grid (a DequantizeLinear's output, its weights the
    # model's int8): x = in_scale * q with q + in_shift in [0, 255]; 0: any x
    in_scale: float = 0.0
    in_shift: int = 0
    # x [*batch, K] whose leading axes are not all units (a batch of
    # sequences): its m = prod(batch) rows taken flat, as they lie in memory
    batch: tuple = ()

    @property
    def symbolic(self):
        """Whether its rows are sized at run time (a TVM expression)."""
        return not isinstance(self.m, int)

    @property
    def input_shape(self):
        return self.batch + (self.k,) if self.batch else (1,) * self.lead + (self.m, self.k)

    @property
    def output_shape(self):
        return self.batch + (self.n,) if self.batch else (1,) * self.lead + (self.m, self.n)

    def x_row(self, i):
        """x's index (without its K axis) of flat row `i`."""
        if not self.batch:
            return (0,) * self.lead + (i,)
        index = []
        for j, d in enumerate(reversed(self.batch)):
            if not isinstance(d, int) and j == len(self.batch) - 1:  # a batch sized at run time, outermost:
                index.append(i)  # the rows' quotient by the axes inside it, whole
                break
            index.append(i % d if d > 1 else 0)
            i = i // d
        return tuple(reversed(index))

    def row_block(self, mb):
        """Whether mb rows (from a multiple of mb) are a box of x's leading
        axes: a block of rows that crossed a batch boundary part-way would
        need an output region that is no box (its epilogue cannot follow
        it)."""
        if self.m % mb:
            return False
        for d in reversed(self.batch):
            if mb <= d:
                return d % mb == 0
            if mb % d:
                return False
            mb //= d
        return True

    def out_row(self, ix):
        """The flat row of output index `ix` (without its N axis)."""
        if not self.batch:
            return ix[-1]
        row = 0
        for d, v in zip(self.batch, ix):
            row = row * d + v
        return row

    @property
    def weight_shape(self):
        return (self.k, self.n)

    @property
    def flops(self):
        return 2 * self.m * self.k * self.n


@dataclass(frozen=True)
class RecurrentSpec:
    """A recurrent cell's recurrence (compiler/kernels/recurrent.py): xw
    [seq, batch, dirs * gates * hidden] (the input projection, bias
    included) -> Y [seq, dirs, batch, hidden]; raw weights R with the
    recurrent bias as a last column, [dirs, gates * hidden, hidden + 1]."""
    kind: str  # "lstm", "gru", "rnn"
    seq: object  # an int, or a TVM expression: a sequence sized at run time (the kernel reads it from xw's shape)
    batch: int
    hidden: int
    dirs: int = 1
    reverse: bool = False  # one direction, run from the last step
    linear_before_reset: int = 0  # GRU
    activation: str = "Tanh"  # RNN: Tanh, Relu or Sigmoid
    dtype: str = "float32"
    quantize_h: bool = False  # h quantized per step as onnxruntime's DynamicQuantizeLSTM does (integer weights, scaled)
    int8_weights: bool = False  # quantize_h and R's integers fit int8, its bias column 0 (recurrent.int8_dot)

    @property
    def gates(self):
        return {"lstm": 4, "gru": 3, "rnn": 1}[self.kind]

    @property
    def input_shape(self):
        return (self.seq, self.batch, self.dirs * self.gates * self.hidden)

    @property
    def output_shape(self):
        return (self.seq, self.dirs, self.batch, self.hidden)

    @property
    def weight_shape(self):
        return (self.dirs, self.gates * self.hidden, self.hidden + 1)

    @property
    def flops(self):
        return 2 * self.seq * self.batch * self.dirs * self.gates * self.hidden * (self.hidden + 1)


class Variant:
    """Base class; subclasses override what differs."""

    name = ""
    op = ""
    # the transform only moves values (packs, pads with zeros): narrow
    # weights can be stored in the transformed layout and merely widened
    transform_rearranges = True
    blocked = False  # writes the blocked activation layout (ConvSpec.out_block)
    prescheduled = False  # a PrimFunc written scheduled (`kernel`), not a TE computation
    # computes a layer sized at run time: `compute` takes a spec whose extents
    # are symbolic (its choices made at the typical sizes, kernels/generic.py
    # size(), and only what holds at every size taken for granted)
    symbolic = False
    # reads its weights as the model's integers (int8, always the direct
    # form) and applies their scales itself: compute(spec, x, wt, params, scale)
    integer = False
    weight_dtype = "int8"  # an integer variant's stored weights (int16: 8-bit weights less a zero point)

    def __init__(self, isa):
        self.isa = isa

    def applies(self, spec):
        return True

    def transformed_shape(self, spec, params):
        return spec.weight_shape

    def transform(self, spec, params):
        return None  # identity

    def compute(self, spec, x, wt, params):
        raise NotImplementedError

    def schedule(self, sch, block, spec, params):
        raise NotImplementedError

    def space(self, spec):
        return [{}]

    def finish(self, func):
        """The scheduled PrimFunc, rewritten where a schedule primitive
        cannot say what the variant wants (an instruction TVM does not select)."""
        return func

    def schedule_transform(self, sch):
        """Schedule the weight transform; False leaves it to the generic schedule."""
        return False


MAKERS = {}  # name -> function(isa) -> Variant


def register(name, make):
    assert name not in MAKERS, name
    MAKERS[name] = make
