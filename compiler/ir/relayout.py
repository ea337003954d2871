"""Transformed weights that only rearrange the raw ones, described so that
another reader can lay them out back (schemas/bundle.fbs `Relayout`).

A variant's transform that packs or blocks its weights (pads with zeros,
splits axes into blocks, reorders them) maps each axis j of the stored
form to one axis of the raw weights with a multiplier: the raw index on
raw axis a is sum(mult_j * i_j) over the stored axes j on a, and a stored
element whose raw index falls past an axis's end is padding (zero).

    desc = fit(gather, raw_shape)   the description of a transform, from its
                                    result on 1..n (0: padding); None if none fits
    stored = lay(raw, desc)         raw -> stored form (numpy)
    raw = unlay(stored, desc)       stored form -> raw

A multi-target bundle stores a weight once in the first CPU target's
form; a GPU section whose shaders read the raw weights gets that form and
its description, and the runtime lays it back out as it uploads
(compiler/bundle/multi.py, runtime/src/vulkan/vulkan_weights.c).
"""
from typing import NamedTuple

import numpy as np

PROBE_MAX = 1 << 24  # float32 counts 1..n exactly up to 2^24


class Relayout(NamedTuple):
    raw: tuple      # the raw weight's shape
    stored: tuple   # the stored form's shape
    axes: tuple     # per stored axis: the raw axis it walks
    mults: tuple    # per stored axis: its step on that raw axis


def probe(raw_shape):
    """The input whose transform `fit` reads: 1..n in raw order (float32)."""
    n = int(np.prod(raw_shape))
    return np.arange(1, n + 1, dtype=np.float32).reshape(raw_shape) if n < PROBE_MAX else None


def _raw_index(desc):
    """Per stored element: the raw weight's flat index, -1 for padding."""
    nd = len(desc.stored)
    flat, valid = np.zeros(desc.stored, np.int64), np.ones(desc.stored, bool)
    for a, extent in enumerate(desc.raw):
        comp = np.zeros(desc.stored, np.int64)
        for j in (j for j in range(nd) if desc.axes[j] == a and desc.mults[j]):
            comp += desc.mults[j] * np.arange(desc.stored[j], dtype=np.int64).reshape([-1 if k == j else 1
                                                                                         for k in range(nd)])
        valid &= comp < extent
        flat = flat * extent + comp
    return np.where(valid, flat, -1)


def fit(gather, raw_shape):
    """The Relayout whose stored form of 1..n is `gather` (a transform's
    result on probe(raw_shape)), or None when the transform does more than
    rearrange (or an axis's step cannot be seen): checked element by element."""
    raw_shape, g = tuple(int(d) for d in raw_shape), np.asarray(gather)
    if g.dtype != np.float32 or g.size == 0 or g.flat[0] != 1 or not raw_shape:
        return None
    strides = [int(np.prod(raw_shape[a + 1:])) for a in range(len(raw_shape))]
    axes, mults = [], []
    for j, size in enumerate(g.shape):
        step = 0
        if size > 1:
            at = [0] * g.ndim
            at[j] = 1
            step = int(g[tuple(at)]) - 1
            if step <= 0:
                return None
        a = next((a for a in range(len(raw_shape)) if raw_shape[a] > 1 and step % strides[a] == 0), 0)
        axes.append(a)
        mults.append(step // strides[a] if step else 0)
    desc = Relayout(raw_shape, tuple(g.shape), tuple(axes), tuple(mults))
    n = int(np.prod(raw_shape))
    if not np.array_equal(_raw_index(desc) + 1, g.astype(np.int64)) or np.unique(g[g > 0]).size != n:
        return None  # more than a rearrangement, or not every raw value kept
    return desc


def lay(raw, desc):
    idx = _raw_index(desc)
    return np.where(idx >= 0, np.asarray(raw).reshape(-1)[np.maximum(idx, 0)], 0).astype(raw.dtype)


def unlay(stored, desc):
    idx = _raw_index(desc)
    out = np.zeros(int(np.prod(desc.raw)), np.asarray(stored).dtype)
    keep = idx >= 0
    out[idx[keep]] = np.asarray(stored).reshape(-1)[keep.reshape(-1)]
    return out.reshape(desc.raw)
