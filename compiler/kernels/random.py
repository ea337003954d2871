"""ONNX's random operators (RandomNormal, RandomNormalLike, RandomUniform,
RandomUniformLike): values from a counter-based generator, each entry a
hash of its index and the seed, so a run needs no state and a bundle gives
the same values every run (ONNX leaves them to the engine; a model that
scales the noise by 0, as a TTS voice run without noise does, computes
what every engine does). Normal values by Box-Muller from two uniforms.

Reference: `random_reference` (numpy, the same hash) beside the kernel.
"""
import numpy as np

_MIX = (0x7FEB352D, 0x846CA68B)  # a 32-bit integer hash's multipliers (xor-shift-multiply, three rounds)


def _hash(x, tirx):
    for m in _MIX:
        x = tirx.bitwise_xor(x, tirx.shift_right(x, tirx.const(16, "uint32"))) * tirx.const(m, "uint32")
    return tirx.bitwise_xor(x, tirx.shift_right(x, tirx.const(16, "uint32")))


def _uniform(index, seed, tirx):
    """A uniform value in (0, 1] of a uint32 counter."""
    bits = _hash(index * tirx.const(2, "uint32") + tirx.const(seed & 0xFFFFFFFF, "uint32"), tirx)
    return (tirx.Cast("float32", tirx.shift_right(bits, tirx.const(8, "uint32"))) + 1.0) * (1.0 / (1 << 24))


def random_te(like, shape, dtype, normal, a, b, seed):
    """Values of `shape` (or of tensor `like`'s, which sizes the kernel):
    normal (mean a, scale b) or uniform (low a, high b)."""
    from tvm import te, tirx

    shape = list(like.shape) if like is not None else shape

    def value(*i):
        flat = 0
        for k, d in enumerate(shape):
            flat = flat * d + i[k]
        n = tirx.Cast("uint32", flat)
        u1 = _uniform(n, seed, tirx)
        if not normal:
            return tirx.Cast(dtype, u1 * (b - a) + a)
        u2 = _uniform(n, seed + 1, tirx)
        z = tirx.sqrt(tirx.log(u1) * -2.0) * tirx.cos(u2 * (2 * np.pi))
        return tirx.Cast(dtype, z * b + a)

    return te.compute(shape, value, name="cb_random")


def random_reference(shape, normal, a, b, seed):
    """numpy: the kernel's values (float32)."""
    def uniform(n, s):
        x = (n * np.uint32(2) + np.uint32(s & 0xFFFFFFFF)).astype(np.uint32)
        for m in _MIX:
            x = ((x ^ (x >> np.uint32(16))) * np.uint32(m)).astype(np.uint32)
        x = x ^ (x >> np.uint32(16))
        return ((x >> np.uint32(8)).astype(np.float32) + np.float32(1)) * np.float32(1.0 / (1 << 24))

    with np.errstate(over="ignore"):
        n = np.arange(int(np.prod(shape)), dtype=np.uint32).reshape(shape)
        u1 = uniform(n, seed)
        if not normal:
            return u1 * np.float32(b - a) + np.float32(a)
        u2 = uniform(n, seed + 1)
        return (np.sqrt(np.log(u1) * np.float32(-2)) * np.cos(u2 * np.float32(2 * np.pi))) * np.float32(b) + \
            np.float32(a)
