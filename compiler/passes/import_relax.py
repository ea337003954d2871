"""Pass `import_relax`: ONNX (shapes fixed, constants folded) -> TVM Relax module."""
import onnx

from ..errors import CompileError
from ..ir.ops import graph_inputs

NAME = "import_relax"


def apply(model):
    from tvm.relax.frontend.onnx import from_onnx

    shapes, dtypes = {}, {}
    for inp in graph_inputs(model):
        tt = inp.type.tensor_type
        shapes[inp.name] = [d.dim_value for d in tt.shape.dim]
        dtypes[inp.name] = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name
    try:
        return from_onnx(model, shape_dict=shapes, dtype_dict=dtypes, keep_params_in_input=False,
                         sanitize_input_names=False)
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise CompileError(f"importing the ONNX graph failed: {msg[-1] if msg else type(e).__name__}") from None


def run(c):
    c.mod = apply(c.proto)
    c.name = c.proto.graph.name or "model"
    return c
