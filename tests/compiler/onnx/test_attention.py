"""compiler/onnx/attention.py: a decoder block's fused operators (two
RotaryEmbeddings over projected queries and keys, weights and caches as
initializers, then a grouped-query Attention with a KV cache and a run-time
boolean mask with a fully-masked row) become plain operators and compute
what ONNX's reference computes. (ONNX's node tests cover each operator's
forms alone: tests/compiler/test_onnx_node.py.)"""
import numpy as np
import onnx
from conftest import assert_close
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import coldbrew
from coldbrew.compiler import compile_model
from coldbrew.compiler.onnx.attention import FUSED
from coldbrew.compiler.passes import legalize_onnx

F, S, PAST, HEADS, KV_HEADS, D = TensorProto.FLOAT, 4, 3, 4, 2, 4


def block():
    rng = np.random.default_rng(3)
    angles = np.arange(16)[:, None] * (0.5 ** np.arange(D // 2))[None, :]
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in (
        ("wq", rng.standard_normal((16, HEADS * D))), ("wk", rng.standard_normal((16, KV_HEADS * D))),
        ("wv", rng.standard_normal((16, KV_HEADS * D))), ("cos", np.cos(angles)), ("sin", np.sin(angles)))]
    nodes = [helper.make_node("MatMul", ["x", f"w{p}"], [p]) for p in "qkv"]
    nodes += [helper.make_node("RotaryEmbedding", [p, "cos", "sin", "pos"], [f"{p}r"], num_heads=h)
              for p, h in (("q", HEADS), ("k", KV_HEADS))]
    nodes.append(helper.make_node("Attention", ["qr", "kr", "v", "mask", "past_k", "past_v"],
                                  ["y", "present_k", "present_v"], q_num_heads=HEADS, kv_num_heads=KV_HEADS))
    cache = [1, KV_HEADS, PAST, D]
    g = helper.make_graph(nodes, "block", [
        helper.make_tensor_value_info("x", F, [1, S, 16]),
        helper.make_tensor_value_info("pos", TensorProto.INT64, [1, S]),
        helper.make_tensor_value_info("mask", TensorProto.BOOL, [S, PAST + S]),
        helper.make_tensor_value_info("past_k", F, cache), helper.make_tensor_value_info("past_v", F, cache)],
        [helper.make_tensor_value_info("y", F, [1, S, HEADS * D]),
         *(helper.make_tensor_value_info(n, F, [1, KV_HEADS, PAST + S, D]) for n in ("present_k", "present_v"))],
        inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 24)])


def test_decoder_block_matches_the_reference():
    model, rng = block(), np.random.default_rng(4)
    mask = rng.random((S, PAST + S)) < 0.7
    mask[2] = False  # a query that attends no key: a zero row, not NaN
    feeds = {"x": rng.standard_normal((1, S, 16)).astype(np.float32), "pos": np.array([[3, 4, 5, 6]]),
             "mask": mask, **{n: rng.standard_normal((1, KV_HEADS, PAST, D)).astype(np.float32)
                               for n in ("past_k", "past_v")}}
    legal = legalize_onnx.apply(onnx.ModelProto.FromString(model.SerializeToString()))
    assert not {n.op_type for n in legal.graph.node} & set(FUSED)
    want = ReferenceEvaluator(model).run(None, feeds)
    got = coldbrew.load(compile_model(model)).run(None, feeds)
    assert not np.isnan(got[0]).any() and np.all(got[0][0, 2] == 0)
    for g, w in zip(got, want):
        assert_close(g, w)
