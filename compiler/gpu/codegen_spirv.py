"""Pass `codegen_spirv` (GPU targets, in place of codegen): every layer's
GPU-scheduled kernel -> SPIR-V compute shaders, validated, stored once each.

TVM lowers each layer for a GPU (thread launches, shared memory, barriers;
vectorization off, so the kernels are scalar) and splits it into its device
kernels, run in order (a layer may have several: a reduction, then what
uses it). coldbrew's GLSL emitter (glsl.py) writes each as a compute shader,
`glslangValidator` compiles it to SPIR-V 1.3 (Vulkan 1.1) and `spirv-val`
checks it: nothing is compiled at load time. Identical shaders (layers of
one shape and kind) are stored once; each layer records its dispatches:
shader, grid, and the tensors bound to its storage buffers.
"""
import os
import re
import shutil
import subprocess
import tempfile

from . import glsl, provenance
from ..ir.anchors import GPU_ANCHOR_RE, GPU_TVM_TARGET
from ..errors import CompileError
from . import conv as gpu_conv

NAME = "codegen_spirv"
TOOLS = {"glslangValidator": "glslang-tools", "spirv-val": "spirv-tools"}
KERNEL_RE = re.compile(r"^(?P<sym>.+)_kernel(?:_(?P<k>\d+))?$")


def _tools():
    missing = [f"{t} (Debian package {p})" for t, p in TOOLS.items() if not shutil.which(t)]
    if missing:
        raise CompileError(f"GPU bundles need {' and '.join(missing)}")


def bindable(func, symbol):
    """`func` with what a storage buffer binding needs of its parameters:
    every buffer at offset 0 (the runtime binds each tensor from its start;
    TVM's extern kernels, scatter_nd's, leave the offset a free variable,
    which would be a scalar kernel parameter) and a name of its own each
    (device parameters are matched to the layer's by name; a Split's
    outputs share one)."""
    import tvm

    fixed = {}
    for p in func.params:
        t = p.ty
        if type(getattr(t, "elem_offset", None)).__name__ == "Var":
            fixed[p] = tvm.tirx.decl_buffer(t.shape, t.dtype, p.name, elem_offset=0)
    func = func.specialize(fixed) if fixed else func
    names = [p.name for p in func.params]
    if len(set(names)) < len(names):  # the script printer gives every parameter a distinct name
        func = tvm.script.from_source(func.script())
        names = [p.name for p in func.params]
    if len(set(names)) < len(names):
        raise CompileError(f"GPU kernel {symbol}: parameters share the names {sorted(set(names))}")
    return func


def lower(kernels):
    """{symbol: PrimFunc} -> {symbol: [device PrimFunc, ...] in launch order}."""
    import tvm
    from tvm.tirx.build import split_host_device_mods

    target = tvm.target.Target(GPU_TVM_TARGET).with_host(tvm.target.Target({"kind": "llvm"}))
    mod = tvm.IRModule({s: f.with_attr("global_symbol", s) for s, f in kernels.items()})
    pipeline, _, finalize = tvm.tirx.get_default_tir_pipeline(target)
    try:
        with tvm.transform.PassContext(opt_level=3, config={"tirx.disable_vectorize": True}):
            mod = pipeline(tvm.tirx.transform.BindTarget(target)(mod))
            _, devices = split_host_device_mods(mod)
            devices = [finalize()(m) for m in devices.values()]
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise CompileError(f"GPU lowering failed: {msg[-1] if msg else type(e).__name__}") from None
    out = {s: [] for s in kernels}
    for dev in devices:
        for gv, f in dev.functions.items():
            m = KERNEL_RE.match(gv.name_hint)
            if not m or m.group("sym") not in out:
                raise CompileError(f"GPU lowering produced an unexpected kernel '{gv.name_hint}'")
            out[m.group("sym")].append((int(m.group("k") or 0), gv.name_hint, f))
    for s, ks in out.items():
        if not ks:
            raise CompileError(f"layer kernel {s} has no GPU launch (nothing bound to GPU threads)")
        ks.sort(key=lambda t: t[0])
    return {s: [(name, f) for _, name, f in ks] for s, ks in out.items()}


def compile_glsl(source, tmp, name):
    """GLSL -> validated SPIR-V bytes."""
    comp = os.path.join(tmp, "k.comp")
    spv = os.path.join(tmp, "k.spv")
    with open(comp, "w") as f:
        f.write(source)
    r = subprocess.run(["glslangValidator", "-V", "--target-env", "vulkan1.1", "-o", spv, comp],
                       capture_output=True, text=True)
    if r.returncode:
        raise CompileError(f"GPU kernel {name}: glslang rejected the shader: {r.stdout.strip()[-500:]}")
    r = subprocess.run(["spirv-val", "--target-env", "vulkan1.1", spv], capture_output=True, text=True)
    if r.returncode:
        raise CompileError(f"GPU kernel {name}: spirv-val rejected the shader: {(r.stdout + r.stderr).strip()[-500:]}")
    with open(spv, "rb") as f:
        return f.read()


def _bindings(layer, func, device_params, kernel):
    """Tensor indices for a device kernel's parameters: each `<buffer>_ptr`
    parameter is the layer function's parameter of that buffer name."""
    names = [p.name for p in func.params]
    out = []
    for p in device_params:
        base = p[:-4] if p.endswith("_ptr") else p
        if names.count(base) != 1:
            raise CompileError(f"GPU kernel {kernel}: parameter '{p}' matches no single argument of its layer")
        out.append(layer.args[names.index(base)])
    return out


def _check_int64(graph, layer, binds):
    """Shaders compute integers in 32 bits: an int64 constant they read must fit."""
    for i in binds:
        t = graph.tensors[i]
        if t.dtype == "int64" and t.data is not None and t.data.size and \
                (int(t.data.min()) < -2**31 or int(t.data.max()) >= 2**31):
            raise CompileError(f"layer {layer.name} ({layer.op}) reads the int64 constant '{t.source or t.name}' "
                               "with values beyond 32 bits; GPU shaders compute integers in 32 bits")


def _generic_dispatch(layer, anchor, name=None):
    """A shape-generic variant's launch (`name`, else the anchor's): (name,
    source, local size, grid, bindings, push words). Layer args: input,
    weights, bias, [residual], output."""
    v = gpu_conv.get(name or anchor.variant.name)
    x, w, b, *res, out = layer.args
    if layer.transform:  # raw weights: the shader reads what the runtime's transform prepares
        w = layer.transform_args[1]
    return (v.name, v.source(), v.local_size, v.grid(anchor.conv), [x, w, b, res[0] if res else out, out],
            gpu_conv.push(anchor.conv, anchor.epilogue))


def apply(graph, target, anchors=(), proto=None):
    """Sets each layer's `dispatches` [(shader index, grid, bindings, push
    words)]; returns (spirv segment bytes, [Shader record dict]). A layer
    the GPU path cannot compile is refused naming its node (`proto`: the
    ONNX model)."""
    _tools()
    by_layer = {a.id: a for a in anchors}
    kernels = {s: bindable(f, s) for s, f in _copies(graph.kernels).items() if not GPU_ANCHOR_RE.search(s)}
    lowered = provenance.per_kernel(proto, lambda s: provenance.written_by(graph, s), kernels, lower,
                                    "the GPU lowering fails on")
    shaders, by_source, blob = [], {}, bytearray()
    with tempfile.TemporaryDirectory() as tmp:
        for layer in graph.layers:
            try:
                _dispatch(graph, layer, by_layer, kernels, lowered, (shaders, by_source, blob), tmp)
            except CompileError as e:
                provenance.refuse(proto, provenance.written_by(graph, layer.kernel), layer.kernel, str(e))
    return bytes(blob), shaders


def _copies(kernels):
    """`kernels` with extract_layers' copy kernels (made after schedule_gpu,
    for a model output that no layer writes) given GPU threads (dlight's
    fallback rule: one element per thread)."""
    import tvm
    from tvm.s_tir import dlight

    made = {s: f for s, f in kernels.items() if s.startswith("copy_")}
    if not made:
        return kernels
    with tvm.target.Target(GPU_TVM_TARGET):
        scheduled = dlight.ApplyDefaultSchedule(dlight.gpu.Fallback())(tvm.IRModule(made))
    return {**kernels, **{s: scheduled[s] for s in made}}


def _dispatch(graph, layer, by_layer, kernels, lowered, out, tmp):
    """`layer`'s dispatches, its new shaders added to `out` (records, index by source, segment)."""
    first = []
    if layer.name in by_layer:
        anchor = by_layer[layer.name]
        launches = [_generic_dispatch(layer, anchor)]
        cold = gpu_conv.get(anchor.variant.name).first_run
        if cold and not layer.transform:  # numbered first: a first run needs its pipeline first
            first = [_generic_dispatch(layer, anchor, cold)]
    else:
        launches = []
        for name, dev in lowered[layer.kernel]:
            sh = glsl.emit(dev, name)
            launches.append((name, sh.source, sh.local_size, sh.grid,
                             _bindings(layer, kernels[layer.kernel], sh.params, name), []))
    layer.first_dispatches = [_shader_for(graph, layer, launch, out, tmp) for launch in first]
    layer.dispatches = [_shader_for(graph, layer, launch, out, tmp) for launch in launches]


def _shader_for(graph, layer, launch, out, tmp):
    """One launch as (shader index, grid, bindings, push words), its shader
    compiled and added to `out` unless an identical one is there."""
    shaders, by_source, blob = out
    name, source, local_size, grid, binds, push = launch
    _check_int64(graph, layer, binds)
    if source not in by_source:
        spirv = compile_glsl(source, tmp, name)
        by_source[source] = len(shaders)
        shaders.append({"name": name, "offset": len(blob), "size": len(spirv),
                        "local_size": list(local_size), "bindings": len(binds)})
        blob += spirv
        blob += bytes(-len(blob) % 16)
    return by_source[source], list(grid), binds, push


def run(c):
    c.spirv = apply(c.graph, c.target, c.anchors, c.proto)
    return c
