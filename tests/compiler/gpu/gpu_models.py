"""Small models and helpers shared by the GPU compiler's tests
(tests/compiler/gpu/test_*.py): ONNX graphs with convolution chains, the
GPU passes run on them up to a chosen pass, and the shader tools."""
import os
import shutil
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

SPIRV_TOOLS = ("glslangValidator", "spirv-val")
# the shader tools are Debian packages (.ci/setup.sh); tests that run them need them
needs_tools = pytest.mark.skipif(not all(shutil.which(t) for t in SPIRV_TOOLS),
                                 reason="glslangValidator / spirv-val not installed (glslang-tools, spirv-tools)")
SPIRV_MAGIC = b"\x03\x02\x23\x07"  # little-endian
C = 16  # channels of the chain model: enough for Winograd (WINOGRAD_MIN_CHANNELS)


def make_model(nodes, inits, x_shape, outputs, name="m"):
    """`outputs`: {name: shape}."""
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs.items()],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


def _arr(rng, shape, scale=0.2):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def chain_model():
    """Three convolution chains on x [1, 16, 8, 8]:
    c0: conv + bias + residual (x) + relu;
    c1: conv + bias + relu + clip(-1, 3) (clamps intersect: [0, 3]);
    c2: depthwise 3x3 stride 2, no bias, no epilogue (the output)."""
    rng = np.random.default_rng(11)
    w = {"W0": _arr(rng, (C, C, 3, 3)), "B0": _arr(rng, (C,), 1.0), "W1": _arr(rng, (C, C, 3, 3)),
         "B1": _arr(rng, (C,), 1.0), "W2": _arr(rng, (C, 1, 3, 3))}
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inits += [numpy_helper.from_array(np.array(-1, np.float32), "lo"),
              numpy_helper.from_array(np.array(3, np.float32), "hi")]
    nodes = [helper.make_node("Conv", ["x", "W0", "B0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c0", "x"], ["a0"]),
             helper.make_node("Relu", ["a0"], ["r0"]),
             helper.make_node("Conv", ["r0", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Clip", ["r1", "lo", "hi"], ["k1"]),
             helper.make_node("Conv", ["k1", "W2"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2], group=C)]
    return make_model(nodes, inits, (1, C, 8, 8), {"y": (1, C, 4, 4)}, "chain"), w


def conv_sigmoid_model():
    """conv + bias, then a sigmoid (no clamp: ends the chain) -> y."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(_arr(rng, (8, 4, 3, 3)), "W"), numpy_helper.from_array(_arr(rng, (8,)), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["y"])]
    return make_model(nodes, inits, (1, 4, 6, 6), {"y": (1, 8, 6, 6)}, "conv_sigmoid")


def front(model):
    """The front end's result for target vulkan (recurrent cells unrolled)."""
    from coldbrew.compiler import Options, front_end

    return front_end(model, Options(target="vulkan"))


def gpu_compilation(model, stop, variants=None, weights="auto"):
    """The GPU passes from select_gpu_variants through `stop` on `model`
    (a Compilation, as compile_graph carries it for target vulkan)."""
    from coldbrew.compiler.gpu import select_gpu_variants
    from coldbrew.compiler.options import Choices
    from coldbrew.compiler.pipeline import GPU_PASSES, run

    c = front(model)
    c.choices = Choices(variants, weights)
    return run(GPU_PASSES, c, select_gpu_variants.NAME, stop)


def prim_funcs(mod):
    """{name: PrimFunc} of a module."""
    from tvm import relax

    return {gv.name_hint: f for gv, f in mod.functions.items() if not isinstance(f, relax.Function)}


def glsl_to_spirv(source, tmp_path, name="k"):
    """Compile GLSL with glslangValidator and check it with spirv-val, as
    the project's CI would: the SPIR-V bytes (asserts both tools accept)."""
    comp, spv = os.path.join(tmp_path, f"{name}.comp"), os.path.join(tmp_path, f"{name}.spv")
    with open(comp, "w") as f:
        f.write(source)
    r = subprocess.run(["glslangValidator", "-V", "--target-env", "vulkan1.1", "-o", spv, comp],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:]
    spirv_val(spv)
    with open(spv, "rb") as f:
        return f.read()


def spirv_val(path):
    r = subprocess.run(["spirv-val", "--target-env", "vulkan1.1", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
