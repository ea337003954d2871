"""Narrow weights' numbers: what fp16 and int8 store for fp32 weights, the
fp32 values they widen back to, and the error between (used by the passes
select_variants and plan_weights, and by the error and cost measurements).
"""
import numpy as np

from .forms import NARROW

FP16_MAX = 65504.0


def fits_fp16(w):
    """Every value of `w` within the fp16 range."""
    return not w.size or float(np.max(np.abs(w))) <= FP16_MAX


def narrow_weights(raw, precision, axis, scale=None):
    """(stored arrays, widened fp32 weights) of `raw` in `precision`: [fp16
    values] or [int8 values, fp32 scale per entry of `axis`] (`scale`
    where given, else max |w| / 127). The widened weights are what the
    transform kernel computes from the stored ones."""
    raw = np.asarray(raw, np.float32)
    if precision == "fp16":
        q = raw.astype(np.float16)
        return [q], q.astype(np.float32)
    other = tuple(d for d in range(raw.ndim) if d != axis)
    if scale is None:
        peak = np.max(np.abs(raw), axis=other) if raw.size else np.zeros(raw.shape[axis], np.float32)
        scale = np.where(peak > 0, peak / np.float32(127), np.float32(1)).astype(np.float32)
    shape = [1] * raw.ndim
    shape[axis] = -1
    s = scale.reshape(shape)
    q = np.clip(np.rint(raw / s), -127, 127).astype(np.int8)
    return [q, scale], q.astype(np.float32) * s


def model_scale(raw, axis, scales, bound=127):
    """A scale per entry of `axis` under which `raw` is exactly int8 values
    (integers within +-bound) times the scale, taken from `scales` (the
    model's own: those of the int8 weights its DequantizeLinear nodes
    widened, one per tensor or one per channel), or None. Channels past a
    per-channel scale's length (padding) must be zero."""
    raw = np.asarray(raw, np.float32)
    n = raw.shape[axis] if raw.ndim else 0
    shape = [1] * raw.ndim
    if raw.ndim:
        shape[axis] = -1
    for s in scales:
        s = np.asarray(s, np.float32).reshape(-1)
        if s.size == 1:
            per = np.full(n, s[0], np.float32)
        elif s.size <= n and not np.any(np.take(raw, np.arange(s.size, n), axis=axis)):
            per = np.concatenate([s, np.ones(n - s.size, np.float32)])
        else:
            continue
        if np.any(per <= 0) or not _exact(_corner(raw, axis), per.reshape(shape), bound):
            continue  # a small corner first: most scales fail there, cheaply
        if _exact(raw, per.reshape(shape), bound):
            return per
    return None


def _corner(raw, axis):
    """`raw` cut to its first two entries along every axis but `axis`."""
    return raw[tuple(slice(None) if d == axis else slice(0, 2) for d in range(raw.ndim))]


def _exact(raw, scale, bound=127):
    q = np.rint(raw / scale)
    return bool(np.all(np.abs(q) <= bound) and np.array_equal(q.astype(np.float32) * scale, raw))


def weight_error(raw, wide):
    """max |w' - w| / max |w| (0 for all-zero weights)."""
    peak = float(np.max(np.abs(raw))) if raw.size else 0.0
    return float(np.max(np.abs(wide - raw))) / peak if peak > 0 else 0.0


def choice(table, name, default):
    """`table`'s entry for `name`, else its "*" entry, else `default`."""
    return table.get(name, table.get("*", default))


def direct_layers(form, precision):
    """anchor id -> the narrow precision ("fp16", "int8") in which `form` and
    `precision` (as plan_weights takes them) ask for the direct form, else None:
    select_variants makes those kernels."""
    forms = form if isinstance(form, dict) else {"*": form}
    precisions = precision if isinstance(precision, dict) else {"*": precision}

    def direct(aid):
        p = choice(precisions, aid, "fp32")
        return p if choice(forms, aid, "cached") == "direct" and p in NARROW else None
    return direct
