"""Bundles with narrow weights, checked: the output error against
onnxruntime, the plan's steps, the inspector's text (test_precision.py,
passes/test_plan_weights.py)."""
import numpy as np

import coldbrew
from conftest import ort_run
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.compiler.tools.inspect import describe
from coldbrew.compiler.measure.error import output_error


TOL = {"fp16": 1e-2, "int8": 6e-2}  # max |y' - y| / max |y| against onnxruntime fp32


def _error_against_onnxruntime(model, data, seed=11):
    sess = coldbrew.load(data)
    rng = np.random.default_rng(seed)
    feeds = {i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in sess.get_inputs()}
    ours, ref = sess.run(None, feeds), ort_run(model, feeds)
    return output_error([ref], [ours])


def _steps(data):
    b = read_bytes(data)[0]
    return b, list(b.plan.steps)


def describe_bytes(data):
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".brew") as f:
        f.write(data)
        f.flush()
        return describe(f.name)
