"""bench/corpus.py's inputs for a voice ("tts"): phoneme ids laid out as
piper's frontend writes a sentence, and their lengths, at any size."""
import os
import sys

import numpy as np

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench", "corpus"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import corpus  # noqa: E402  (bench/corpus.py)


def _voice():
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Identity", ["input"], ["y"])], "g",
                          [helper.make_tensor_value_info("input", TensorProto.INT64, [1, "n"]),
                           helper.make_tensor_value_info("input_lengths", TensorProto.INT64, [1]),
                           helper.make_tensor_value_info("scales", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, [1, "n"])])
    entry = {"categories": ["tts"], "inputs": {
        "input": {"shape": [1, 41], "range": [4, 151], "draw": "phonemes"},
        "input_lengths": {"shape": [1], "draw": "lengths"},
        "scales": {"shape": [3], "fill": [0.0, 1.0, 0.0]}}}
    return entry, helper.make_model(g)


def test_a_voice_gets_a_sentence_of_phonemes_and_its_length():
    entry, model = _voice()
    for n in (41, 22, 3):
        x = corpus.feeds(corpus.sized(entry, {"input": [1, n]}), model)
        ids = x["input"][0]
        assert x["input"].dtype == np.int64 and ids.shape == (n,) and x["input_lengths"].tolist() == [n]
        assert ids[0] == corpus.PIPER_BOS and ids[-1] == corpus.PIPER_EOS
        assert (ids[1:-1:2] == corpus.PIPER_PAD).all()  # each phoneme followed by PAD
        phonemes = ids[2:2 + 2 * ((n - 3) // 2):2]
        assert ((phonemes == corpus.PIPER_SPACE) | ((phonemes >= 4) & (phonemes < 151))).all()
        assert n < 41 or corpus.PIPER_SPACE in phonemes[:-1] and phonemes[-1] != corpus.PIPER_SPACE
    assert x["scales"].tolist() == [0.0, 1.0, 0.0]
    a, b = (corpus.feeds(entry, model, seed)["input"] for seed in (0, 1))
    assert not np.array_equal(a, b) and np.array_equal(a, corpus.feeds(entry, model, 0)["input"])
