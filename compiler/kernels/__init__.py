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

A variant whose loops carry a dependence TE cannot say (a recurrent cell's
time loop) is `prescheduled`: `variant.kernel(spec, params)` gives its
PrimFunc, written scheduled with TVM's IR builder, in place of compute and
schedule (compiler/kernels/recurrent.py).

Specs describe a layer's anchor operator: ConvSpec for conv2d (NCHW or
blocked NCHW{b}c activations, OIHW raw weights), DenseSpec for x[M,K] @ w[K,N],
RecurrentSpec for a recurrent cell's recurrence.
A variant runs one activation layout: `variant.blocked` variants read and
write the blocked ones (compiler/kernels/conv_blocked.py), the others NCHW.
"""
import functools

from .contract import ANCHOR, ConvSpec, DenseSpec, RecurrentSpec, Variant, register  # noqa: F401  (the contract, re-exported)
from .contract import MAKERS


@functools.lru_cache(maxsize=None)
def _made(isa):
    from . import conv, conv_blocked, dense, recurrent  # noqa: F401  (registration)

    return {name: make(isa) for name, make in MAKERS.items()}


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
