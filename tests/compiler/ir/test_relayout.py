"""compiler/ir/relayout.py: a transform that only rearranges (pads, splits
into blocks, reorders) described from its result on 1..n, checked element
by element, and laid out both ways; anything more is no relayout."""
import numpy as np

from coldbrew.compiler.ir.relayout import fit, lay, probe, unlay


def _blocked(w, kb=8, cb=8):
    """OIHW -> [K/kb, C/cb, R, S, cb, kb], K and C zero-padded to the blocks."""
    k, c, r, s = w.shape
    kp, cp = -(-k // kb) * kb, -(-c // cb) * cb
    padded = np.zeros((kp, cp, r, s), w.dtype)
    padded[:k, :c] = w
    return padded.reshape(kp // kb, kb, cp // cb, cb, r, s).transpose(0, 2, 4, 5, 3, 1).copy()


def _packed(w, nb=16):
    """[K, N] -> [N/nb, K, nb] (a dense panel layout), N zero-padded."""
    k, n = w.shape
    padded = np.zeros((k, -(-n // nb) * nb), w.dtype)
    padded[:, :n] = w
    return padded.reshape(k, -1, nb).transpose(1, 0, 2).copy()


def test_blocked_and_packed_layouts_are_described_and_laid_out_both_ways():
    rng = np.random.default_rng(0)
    for shape, transform in [((10, 3, 3, 3), _blocked), ((24, 16, 1, 1), _blocked), ((1280, 1000), _packed),
                             ((7, 5), _packed)]:
        desc = fit(transform(probe(shape)), shape)
        assert desc is not None and desc.raw == shape, shape
        w = rng.standard_normal(shape).astype(np.float32)
        assert np.array_equal(lay(w, desc), transform(w)), shape
        assert np.array_equal(unlay(transform(w), desc), w), shape


def test_a_transform_that_computes_or_drops_values_is_no_relayout():
    shape = (16, 8, 3, 3)
    assert fit(_blocked(probe(shape)) * 2, shape) is None  # scaled (as Winograd's arithmetic is)
    dropped = _blocked(probe(shape))
    dropped[0, 0, 0, 0, 0, 1] = 0  # one value left out
    assert fit(dropped, shape) is None
    assert fit(_blocked(probe(shape)).astype(np.float16), shape) is None  # not the probe's float32
    twice = probe((4, 4)).copy()
    twice[0, 1] = twice[0, 0]  # a value read twice, another never
    assert fit(twice, (4, 4)) is None
