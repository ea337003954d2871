"""Dense / MatMul with constant weights: out[m, n] = sum_k x[m, k] * w[k, n].

packed_gemm   weights packed to [N / nb, K, nb]: nb consecutive outputs per load
"""
from tvm import te, tirx

from .contract import ANCHOR, Variant, register
from .schedule_util import attach_epilogue, intensity, padding_efficiency, ranked, register_blocks


class PackedGemm(Variant):
    """mb rows of x x nb outputs (a multiple of the vector) per register block."""

    name = "dense.packed_gemm"
    op = "dense"

    def transformed_shape(self, spec, params):
        nb = params["nb"]
        return ((spec.n + nb - 1) // nb, spec.k, nb)

    def transform(self, spec, params):
        nb = params["nb"]
        return lambda w: te.compute(
            self.transformed_shape(spec, params),
            lambda no, k, ni: tirx.if_then_else(no * nb + ni < spec.n, w[k, tirx.min(no * nb + ni, spec.n - 1)],
                                                tirx.const(0, spec.dtype)),
            name="cb_pack")

    def compute(self, spec, x, wt, params):
        nb = params["nb"]
        k = te.reduce_axis((0, spec.k), "k")
        np_ = (spec.n + nb - 1) // nb * nb
        lead = (0,) * spec.lead
        anchor = te.compute((spec.m, np_), lambda i, j: te.sum(x[lead + (i, k)] * wt[j // nb, k, j % nb], axis=k),
                            name=ANCHOR)
        return te.compute(spec.output_shape, lambda *ix: anchor[ix[-2], ix[-1]], name="cb_out")

    def space(self, spec):
        # rows must divide m (no row padding); a single row (a classifier)
        # streams the weights once, so its blocks are a few vectors wide
        lanes = self.isa.lanes
        blocks = [(mb, v) for mb, v in register_blocks(self.isa, (1, 2, 4, 8), 4) if spec.m % mb == 0]
        return [{"mb": mb, "nb": v * lanes} for mb, v in
                ranked([(intensity(mb, v) * padding_efficiency((spec.n, v * lanes)), (mb, v)) for mb, v in blocks])]

    def schedule(self, sch, block, spec, params):
        mb, nb, lanes = params["mb"], params["nb"], self.isa.lanes
        i, j, k = sch.get_loops(block)
        io, ii = sch.split(i, [None, mb])
        jo, ji = sch.split(j, [None, nb])
        jio, jiv = sch.split(ji, [None, lanes])
        sch.reorder(jo, io, k, ii, jio, jiv)
        par = sch.fuse(jo, io)
        sch.parallel(par)
        attach_epilogue(sch, block, par, lanes)
        sch.unroll(ii)
        sch.unroll(jio)
        sch.vectorize(jiv)
        sch.decompose_reduction(block, k)


register(PackedGemm.name, PackedGemm)
