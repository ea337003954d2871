"""Pass `extract_layers`: the fused Relax module -> a coldbrew Graph.

Every `call_tir` binding of `main` becomes a layer whose kernel is the called
PrimFunc; Relax constants become weight tensors; tuple plumbing becomes
aliases. A model output that is not written by a layer (an input or a
constant passed straight through) gets a copy layer, so outputs always live
in the arena.
"""
import numpy as np

from ..errors import CompileError
from ..ir.graph import DTYPES, Graph, Layer, Tensor

NAME = "extract_layers"


def _copy_kernel(shape, dtype):
    from tvm import te

    src = te.placeholder(shape, dtype=dtype, name="src")
    dst = te.compute(shape, lambda *i: src(*i), name="dst")
    return te.create_prim_func([src, dst])


def _is_constant(expr):
    return type(expr).__name__ in ("GenericConst", "Constant") and hasattr(expr, "value")


def apply(mod, model_name, input_names, output_names, anchors=()):
    import tvm
    from tvm import relax

    main = mod["main"]
    g = Graph(model_name)
    env = {}  # relax Var -> tensor index, or tuple of indices

    def sinfo_tensor(ty, name, kind):
        try:
            shape = tuple(int(d) for d in ty.shape.values)
        except (AttributeError, TypeError):
            raise CompileError(f"value '{name}' has no static tensor type ({ty})") from None
        dtype = str(ty.dtype)
        if dtype not in DTYPES:
            raise CompileError(f"value '{name}' has unsupported dtype {dtype}")
        return Tensor(name, dtype, shape, kind)

    anchor_of = {a.const: a for a in anchors}

    def const_tensor(c):
        key = c  # constants hash by identity
        if key not in env:
            data = c.value.numpy()
            a = anchor_of.get(c)
            env[key] = g.add_tensor(Tensor(f"w{len(g.tensors)}", str(data.dtype), data.shape, "weight",
                                           np.ascontiguousarray(data), cached=a is not None and
                                           a.transform_func is not None, anchor=a))
        return env[key]

    def value_of(expr):
        if _is_constant(expr):
            return const_tensor(expr)
        if isinstance(expr, relax.Var):
            if expr not in env:
                raise CompileError(f"value '{expr.name}' is used before it is defined")
            return env[expr]
        if isinstance(expr, relax.Tuple):
            return tuple(value_of(f) for f in expr.fields)
        raise CompileError(f"unsupported Relax expression {type(expr).__name__}")

    for k, param in enumerate(main.params):
        t = sinfo_tensor(param.ty, input_names[k], "input")
        env[param] = g.add_tensor(t)
        g.inputs.append(env[param])

    call_tir = tvm.ir.Op.get("relax.call_tir")
    body = main.body
    for block in body.blocks:
        for binding in block.bindings:
            var, value = binding.var, binding.value
            if isinstance(value, relax.Call) and value.op.same_as(call_tir):
                func_name = value.args[0].name_hint
                args = [value_of(a) for a in value.args[1].fields]
                if any(isinstance(a, tuple) for a in args):
                    raise CompileError(f"kernel {func_name} takes a tuple argument")
                sinfo = var.ty
                outs = list(sinfo.fields) if isinstance(sinfo, relax.TupleType) else [sinfo]
                out_ids = [g.add_tensor(sinfo_tensor(s, f"{var.name}.{k}" if len(outs) > 1 else var.name,
                                                     "intermediate")) for k, s in enumerate(outs)]
                env[var] = tuple(out_ids) if isinstance(sinfo, relax.TupleType) else out_ids[0]
                g.kernels[func_name] = mod[func_name]
                op = func_name[len("fused_"):] if func_name.startswith("fused_") else func_name
                layer = Layer(f"L{len(g.layers)}", op, func_name, args + out_ids, len(out_ids))
                anchor = next((g.tensors[a].anchor for a in args if g.tensors[a].anchor is not None), None)
                if anchor is not None:
                    layer.name, layer.variant = anchor.id, anchor.variant.name
                    layer.params, layer.tuned = dict(anchor.params), anchor.tuned
                    layer.weight_form = "cached" if anchor.transform_func is not None else "raw"
                g.layers.append(layer)
            elif isinstance(value, relax.TupleGetItem):
                env[var] = value_of(value.tuple_value)[value.index]
            elif isinstance(value, (relax.Var, relax.Tuple)) or _is_constant(value):
                env[var] = value_of(value)
            else:
                op = getattr(value, "op", None)
                raise CompileError(f"unsupported Relax binding for '{var.name}': "
                                   f"{getattr(op, 'name', type(value).__name__)}")

    result = value_of(body.body)
    results = list(result) if isinstance(result, tuple) else [result]
    if len(results) != len(output_names):
        raise CompileError(f"model declares {len(output_names)} outputs, lowering produced {len(results)}")
    for idx, name in zip(results, output_names):
        t = g.tensors[idx]
        if t.kind != "intermediate" or idx in g.outputs:
            # pass-through output: copy it into an arena tensor of its own
            sym = f"copy_{len(g.kernels)}"
            g.kernels[sym] = _copy_kernel(t.shape, t.dtype)
            out = g.add_tensor(Tensor(name, t.dtype, t.shape, "output"))
            g.layers.append(Layer(f"L{len(g.layers)}", "copy", sym, [idx, out], 1))
            idx = out
        t = g.tensors[idx]
        t.kind, t.name = "output", name
        g.outputs.append(idx)
    return g


def run(c):
    c.graph = apply(c.mod, c.name, c.input_names, c.output_names, c.anchors)
    c.graph.notes += c.notes
    if c.on_gpu:  # the layers without a variant run TVM's GPU schedules, one dispatch stream
        for layer in c.graph.layers:
            if layer.variant == "generic":
                layer.variant = "gpu.dlight"
        c.graph.threads = 1
    else:
        c.graph.threads = c.threads
    return c
