"""Every zoo model compiles and its bundle matches onnxruntime."""
import os
import sys

import numpy as np
import pytest

import coldbrew
from conftest import ROOT, assert_close, ort_run

sys.path.insert(0, os.path.join(ROOT, "examples"))
import zoo  # noqa: E402

NAMES = list(zoo.MODELS)


def test_zoo_has_the_paper_models():
    for name in ("resnet18", "resnet50", "mobilenet", "mobilenet_v2", "squeezenet", "shufflenet_v2",
                 "googlenet", "alexnet", "efficientnet_b0", "crnn"):
        assert name in NAMES


def test_zoo_is_deterministic():
    assert zoo.build("squeezenet").SerializeToString() == zoo.build("squeezenet").SerializeToString()


@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_matches_onnxruntime(name, tmp_path):
    from coldbrew.compiler import compile_model

    model = zoo.build(name)
    path = tmp_path / f"{name}.brew"
    compile_model(model, str(path))
    sess = coldbrew.load(str(path))
    rng = np.random.default_rng(11)
    feeds = {i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in sess.get_inputs()}
    ours = sess.run(None, feeds)
    ref = ort_run(model, feeds)
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert_close(a, b)
