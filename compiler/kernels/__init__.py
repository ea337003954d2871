"""Kernel variants: several implementations per operator, each a separable
weight transform plus an execute kernel. A variant is made for one CPU's
vector unit (`variant.isa`, a targets.Vector: fp32 lanes, registers, FMA,
L1/L2): its vector width, register blocking, default parameters and search
space all come from it, so nothing here assumes one ISA. The contract, in
one place:

    variant.name                     unique, e.g. "conv2d.im2col_gemm"
    variant.isa                      the targets.Vector it was made for
    variant.applies(spec)            can it run this layer (shape, stride, groups, dilation ...)?
    variant.transformed_shape(spec, params)
                                     shape of its transformed weights (known at compile time;
                                     packing blocks are schedule parameters)
    variant.transform(spec, params)  TE: raw ONNX weights -> transformed weights (None = identity)
    variant.compute(spec, x, wt, params)
                                     TE: the execute computation; its main stage is named
                                     ANCHOR so the scheduler finds it after fusion. It computes
                                     a tile-aligned output (padded to the schedule's tiles, so no
                                     loop needs a boundary predicate) then crops it
    variant.schedule(sch, block, spec, params)
                                     explicit s_tir schedule of the anchor (fused epilogue
                                     blocks are attached by schedule_kernels)
    variant.space(spec)              the small parameter space searched by measurement, derived
                                     from the register file; its first entry is the default
                                     (the register/cache model's pick)

Specs describe a layer's anchor operator: ConvSpec for conv2d (NCHW or
blocked NCHW{b}c activations, OIHW raw weights), DenseSpec for x[M,K] @ w[K,N].
A variant runs one activation layout: `variant.blocked` variants read and
write the blocked ones (compiler/kernels/conv_blocked.py), the others NCHW.
"""
import functools
from dataclasses import dataclass

ANCHOR = "cb_anchor"


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
    # activation layouts (compiler/block_layout.py): 0 is NCHW, b is the
    # blocked NCHW{b}c ([N, C / b, H, W, b], channel c at [c // b, ..., c % b])
    in_block: int = 0
    out_block: int = 0

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
        return (self.h + self.pad[0] + self.pad[2] - (self.r - 1) * self.dilation[0] - 1) // self.stride[0] + 1

    @property
    def out_w(self):
        return (self.w + self.pad[1] + self.pad[3] - (self.s - 1) * self.dilation[1] - 1) // self.stride[1] + 1

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

    @property
    def input_shape(self):
        return (1,) * self.lead + (self.m, self.k)

    @property
    def output_shape(self):
        return (1,) * self.lead + (self.m, self.n)

    @property
    def weight_shape(self):
        return (self.k, self.n)

    @property
    def flops(self):
        return 2 * self.m * self.k * self.n


class Variant:
    """Base class; subclasses override what differs."""

    name = ""
    op = ""
    # the transform only moves values (packs, pads with zeros): narrow
    # weights can be stored in the transformed layout and merely widened
    transform_rearranges = True
    blocked = False  # writes the blocked activation layout (ConvSpec.out_block)

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

    def schedule_transform(self, sch):
        """Schedule the weight transform; False leaves it to the generic schedule."""
        return False


_MAKERS = {}  # name -> function(isa) -> Variant


def register(name, make):
    assert name not in _MAKERS, name
    _MAKERS[name] = make


@functools.lru_cache(maxsize=None)
def _made(isa):
    from . import conv, conv_blocked, dense  # noqa: F401  (registration)

    return {name: make(isa) for name, make in _MAKERS.items()}


def variants(isa, op=None):
    """Every variant made for the vector unit `isa` (a targets.Vector)."""
    return [v for v in _made(isa).values() if op is None or v.op == op]


def get(name, isa):
    made = _made(isa)
    if name not in made:
        raise KeyError(f"unknown kernel variant '{name}' (known: {', '.join(sorted(made))})")
    return made[name]


def applicable(spec, op, isa):
    blocked = bool(getattr(spec, "out_block", 0))
    return [v for v in variants(isa, op) if v.blocked == blocked and v.applies(spec)]
