"""Dense / MatMul with constant weights: out[m, n] = sum_k x[m, k] * w[k, n].

packed_gemm   weights packed to [N / NB, K, NB]: NB consecutive outputs per load
"""
from tvm import te, tirx

from . import ANCHOR, Variant, register
from .schedule_util import VEC, attach_epilogue

NB = 16


class PackedGemm(Variant):
    name = "dense.packed_gemm"
    op = "dense"

    def transformed_shape(self, spec):
        return ((spec.n + NB - 1) // NB, spec.k, NB)

    def transform(self, spec):
        return lambda w: te.compute(
            self.transformed_shape(spec),
            lambda no, k, ni: tirx.if_then_else(no * NB + ni < spec.n, w[k, tirx.min(no * NB + ni, spec.n - 1)],
                                                tirx.const(0, spec.dtype)),
            name="cb_pack")

    def compute(self, spec, x, wt, params):
        k = te.reduce_axis((0, spec.k), "k")
        np_ = (spec.n + NB - 1) // NB * NB
        anchor = te.compute((spec.m, np_), lambda i, j: te.sum(x[i, k] * wt[j // NB, k, j % NB], axis=k), name=ANCHOR)
        return te.compute((spec.m, spec.n), lambda i, j: anchor[i, j], name="cb_out")

    def space(self, spec):
        return [{"mb": 4}, {"mb": 2}, {"mb": 1}, {"mb": 8}]

    def schedule(self, sch, block, spec, params):
        mb = params.get("mb", 4)
        mb = next(b for b in (mb, 4, 2, 1) if spec.m % b == 0)
        i, j, k = sch.get_loops(block)
        io, ii = sch.split(i, [None, mb])
        jo, ji = sch.split(j, [None, NB])
        jio, jiv = sch.split(ji, [None, VEC])
        sch.reorder(jo, io, k, ii, jio, jiv)
        par = sch.fuse(jo, io)
        sch.parallel(par)
        attach_epilogue(sch, block, par)
        sch.unroll(ii)
        sch.unroll(jio)
        sch.vectorize(jiv)
        sch.decompose_reduction(block, k)


register(PackedGemm())
