"""Pass `fold_constants`: fold everything computable at compile time
(compiler/onnx/fold.py says what and how)."""
from ..onnx.fold import apply

NAME = "fold_constants"


def run(c):
    c.proto = apply(c.proto, c.qdq_scales)
    return c
