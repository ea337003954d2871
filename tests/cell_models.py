"""Small ONNX models of one recurrent cell (LSTM, GRU, RNN), for the tests
of the cell kernels and of the unrolled cells."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper


def cell_model(op, direction="forward", seq=5, batch=1, inp=10, hid=24, states=False, name="cell", seed=7,
               scale=0.3, **attrs):
    """One `op` node over x [seq, batch, inp] with seeded W, R, B (and the
    inputs h0, c0 given `states`); outputs y, yh (and yc for an LSTM)."""
    rng = np.random.default_rng(seed)
    gates, dirs = {"LSTM": 4, "GRU": 3, "RNN": 1}[op], 2 if direction == "bidirectional" else 1
    shapes = {"W": (dirs, gates * hid, inp), "R": (dirs, gates * hid, hid), "B": (dirs, 2 * gates * hid)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) * scale).astype(np.float32), n) for n, s in shapes.items()]
    names = ["x", "W", "R", "B"] + (["", "h0"] + (["c0"] if op == "LSTM" else []) if states else [])
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, inp])]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [dirs, batch, hid]) for n in names[5:]]
    outs = ["y", "yh"] + (["yc"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, name=name, hidden_size=hid, direction=direction, **attrs)
    g = helper.make_graph([node], "cell", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [seq, dirs, batch, hid])] +
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, [dirs, batch, hid]) for o in outs[1:]],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
