"""Pass `extract_layers`: the fused Relax module -> a coldbrew Graph.

Every `call_tir` binding of `main` becomes a layer whose kernel is the called
PrimFunc; Relax constants become weight tensors; tuple plumbing becomes
aliases. A model output that is not written by a layer (an input or a
constant passed straight through) gets a copy layer, so outputs always live
in the arena.
"""
import re

import numpy as np

from ..errors import CompileError
from ..ir import dims, loops
from ..ir.forms import DTYPES
from ..ir.graph import BLOCKED_MARK, Graph, Layer, Tensor
from ..ir.relax import is_const
from ..kernels.counted import COUNTS

NAME = "extract_layers"


def _copy_kernel(shape, dtype):
    from tvm import te

    src = te.placeholder(shape, dtype=dtype, name="src")
    dst = te.compute(shape, lambda *i: src(*i), name="dst")
    return te.create_prim_func([src, dst])


def apply(mod, model_name, input_names, output_names, anchors=(), sources=(), variables=None):
    """The coldbrew Graph of `mod`'s main function: a tensor per value, a
    layer per call_tir (an anchor's layer named and typed after it).
    `sources`: the model's tensor names; a layer's output named as one of
    them (import_relax, block_layout; "." written "_") records it as its
    source. `variables` ({Dim: tir var}): the sizes set at run time, each
    a dim tensor."""
    from tvm import relax

    named = {n.replace(".", "_"): n for n in sources}  # a Relax variable's name has "_" for "."
    x = _Extractor(mod, model_name, anchors, {**named, **{n: n for n in sources}}, variables or {})
    main = mod["main"]
    for k, param in enumerate(main.params):
        x.env[param] = x.g.add_tensor(x.tensor(param.ty, input_names[k], "input"))
        x.g.inputs.append(x.env[param])
    for block in main.body.blocks:
        for binding in block.bindings:
            var, value = binding.var, binding.value
            if isinstance(value, relax.Call) and value.op.same_as(x.call_tir):
                x.kernel_layer(var, value)
            elif isinstance(value, relax.TupleGetItem):
                x.env[var] = x.value_of(value.tuple_value)[value.index]
            elif isinstance(value, (relax.Var, relax.Tuple)) or is_const(value):
                x.env[var] = x.value_of(value)
            else:
                op = getattr(value, "op", None)
                raise CompileError(f"unsupported Relax binding for '{var.name}': "
                                   f"{getattr(op, 'name', type(value).__name__)}")
    x.outputs(main.body.body, output_names)
    x.g.variables = dict(x.variables)
    for var in x.variables.values():  # every declared size, taken by a kernel or not: the shapes read them
        x.dim_of(var)
    _counted_first(x.g)
    _unique_sources(x.g)
    return x.g


def _counted_first(g):
    """CompileError unless every layer sized by a counted Dim comes after
    the layer that counts it (a run sizes tensors by a count once its
    kernel has run)."""
    from tvm.tirx.analysis import undefined_vars

    writer = {o: k for k, layer in enumerate(g.layers) for o in layer.args[len(layer.args) - layer.num_outputs:]}
    counted = {g.variables[t.dim].name: (i, writer.get(t.count, len(g.layers)))
               for i, t in enumerate(g.tensors) if t.kind == "dim" and t.count is not None}
    if not counted:
        return
    for k, layer in enumerate(g.layers):
        for a in layer.args:
            t = g.tensors[a]
            names = {v.name for e in (t.extents or ()) if not isinstance(e, int) and not hasattr(e, "value")
                     for v in undefined_vars(e)}
            names |= {g.variables[t.dim].name} if t.kind == "dim" else set()
            late = [n for n in names if n in counted and counted[n][1] >= k and a != counted[n][0]
                    and writer.get(a) != counted[n][1]]
            if late:
                raise CompileError(f"layer {layer.name} ({layer.op}) is sized by how many entries "
                                   f"'{g.tensors[counted[late[0]][0]].name}' holds before that is counted")


def _unique_sources(g):
    """A source only where one tensor holds it: two values that took one
    name (a rewrite's intermediate and its result) cannot say which holds
    the model's tensor, so neither claims it."""
    held = {}
    for t in g.tensors:
        if t.source:
            held[(t.source, t.layout)] = held.get((t.source, t.layout), 0) + 1
    for t in g.tensors:
        if t.source and held[(t.source, t.layout)] > 1:
            t.source, t.layout = "", ""


MAX_SYMBOL = 120  # characters of a kernel's symbol


def symbol(func_name):
    """The kernel's symbol in the code: its function's name, or where fusion
    made that long (an unrolled recurrent cell fuses hundreds of operators
    into one name) its start and a hash of the whole, so the name stays
    unique, stable and short."""
    if len(func_name) <= MAX_SYMBOL:
        return func_name
    import hashlib

    return f"{func_name[:MAX_SYMBOL - 13]}_{hashlib.sha256(func_name.encode()).hexdigest()[:12]}"


class _Extractor:
    """The Graph being built and what maps Relax values onto its tensors."""

    def __init__(self, mod, model_name, anchors, sources, variables):
        import tvm

        self.mod, self.g, self.sources, self.variables = mod, Graph(model_name), sources, variables
        self.dim_tensor = {}  # variable name -> the dim tensor holding its value
        self.bindings = {}  # kernel function name -> the bindings of its size variables seen, in order
        self.env = {}  # relax Var (or constant) -> tensor index, or tuple of indices
        self.anchor_of = {a.const: a for a in anchors}
        self.call_tir = tvm.ir.Op.get("relax.call_tir")

    def tensor(self, ty, name, kind):
        """A Tensor of a Relax tensor type (a dtype the bundle has; its
        shape static, or of the declared dims' variables: sized at run time)."""
        extents = getattr(getattr(ty, "shape", None), "values", None)
        if extents is None or (not dims.is_static(extents) and not self.variables):
            raise CompileError(f"value '{name}' has no static tensor type ({ty})")
        dtype = str(ty.dtype)
        if dtype not in DTYPES:
            raise CompileError(f"value '{name}' has unsupported dtype {dtype}")
        if dims.is_static(extents):
            return Tensor(name, dtype, tuple(int(d) for d in extents), kind)
        try:
            shape = dims.largest(extents, self.variables)
        except ValueError as e:
            raise CompileError(f"value '{name}': {e}") from None
        return Tensor(name, dtype, shape, kind, extents=tuple(extents))

    def dim_of(self, var):
        """The dim tensor of a declared dim's variable."""
        if var.name not in self.dim_tensor:
            d = next((d for d, v in self.variables.items() if v.name == var.name), None)
            if d is None:
                raise CompileError(f"a kernel takes the size '{var}', which is not a declared input dimension")
            self.dim_tensor[var.name] = self.g.add_tensor(Tensor(d.name, "int64", (), "dim", dim=d))
        return self.dim_tensor[var.name]

    def const_tensor(self, c):
        if c not in self.env:  # constants hash by identity
            data, a = c.value.numpy(), self.anchor_of.get(c)
            self.env[c] = self.g.add_tensor(Tensor(f"w{len(self.g.tensors)}", str(data.dtype), data.shape, "weight",
                                                   np.ascontiguousarray(data), cached=a is not None and
                                                   a.transform_func is not None, anchor=a))
        return self.env[c]

    def value_of(self, expr):
        from tvm import relax

        if is_const(expr):
            return self.const_tensor(expr)
        if isinstance(expr, relax.Var):
            if expr not in self.env and any(v.name == expr.name for v in self.variables.values()):
                return self.dim_of(expr)  # a size set at run time, handed to the kernel
            if expr not in self.env:
                raise CompileError(f"value '{expr.name}' is used before it is defined")
            return self.env[expr]
        if isinstance(expr, relax.Tuple):
            return tuple(self.value_of(f) for f in expr.fields)
        if isinstance(expr, relax.ShapeExpr):  # a model output that is a shape (Shape of a sized tensor)
            return self.shape_tensor(expr)
        import tvm
        from tvm import tirx

        if tvm.ir.is_prim_expr(expr):
            if not isinstance(expr, tirx.Var):
                raise CompileError(f"a kernel takes the size {expr}, computed from the input dimensions: "
                                   f"not supported yet")
            return self.dim_of(expr)
        raise CompileError(f"unsupported Relax expression {type(expr).__name__}")

    def shape_tensor(self, shape):
        """A tensor holding the values of `shape` (sizes set at run time among
        them), written by a layer of its own."""
        from tvm import te, tirx
        from tvm.tirx.analysis import undefined_vars

        values = [tirx.Cast("int64", v) for v in shape.values]
        variables = list({v.name: v for e in values for v in undefined_vars(e)}.values())

        def pick(i):
            out = values[-1]
            for k in range(len(values) - 2, -1, -1):
                out = tirx.Select(i == k, values[k], out)
            return out

        out = te.compute((len(values),), lambda i: pick(i), name="cb_shape")
        sym = f"shape_{len(self.g.kernels)}"
        self.g.kernels[sym] = te.create_prim_func([*variables, out])
        t = self.g.add_tensor(Tensor(sym, "int64", (len(values),), "intermediate"))
        self.g.layers.append(Layer(f"L{len(self.g.layers)}", "shape", sym, [self.dim_of(v) for v in variables] + [t],
                                   1))
        return t

    def kernel_layer(self, var, call):
        """The layer of `var = call_tir(kernel, args)`, its outputs' tensors."""
        from tvm import relax

        g, func_name = self.g, call.args[0].name_hint
        args = [self.value_of(a) for a in call.args[1].fields]
        if any(isinstance(a, tuple) for a in args):
            raise CompileError(f"kernel {func_name} takes a tuple argument")
        ty = var.ty
        outs = list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]
        out_ids = [g.add_tensor(self.sourced(self.tensor(t, f"{var.name}.{k}" if len(outs) > 1 else var.name,
                                                     "intermediate"))) for k, t in enumerate(outs)]
        self.env[var] = tuple(out_ids) if isinstance(ty, relax.TupleType) else out_ids[0]
        sym = self.symbol_for(func_name, args + out_ids)
        g.kernels[sym] = self.mod[func_name]
        op = func_name[len("fused_"):] if func_name.startswith("fused_") else func_name
        layer = Layer(f"L{len(g.layers)}", op, sym, args + out_ids, len(out_ids))
        anchor = next((g.tensors[a].anchor for a in args if g.tensors[a].anchor is not None), None)
        if anchor is not None:
            layer.name, layer.variant = anchor.id, anchor.variant.name
            layer.params, layer.tuned = dict(anchor.params), anchor.tuned
            layer.weight_form = "cached" if anchor.transform_func is not None else "raw"
        g.layers.append(layer)
        loops.mark(layer, self.mod[func_name])
        counts = (self.mod[func_name].attrs or {}).get(COUNTS)
        if counts is not None:  # its last output is a size the data sets (kernels/counted.py)
            var = next(v for v in self.variables.values() if v.name == str(counts))
            g.tensors[self.dim_of(var)].count = out_ids[-1]

    def symbol_for(self, func_name, args):
        """The kernel's symbol at a call: one symbol per binding of its size
        variables to the Dims of the tensors it is called with (TVM merges
        kernels equal but for their variables' names: a conv's epilogue over
        the phonemes and over the frames), so each symbol's calling contract
        (graph.signatures) holds the largest bytes of its own calls."""
        from tvm import tirx

        binding = {}
        for p, a in zip(self.mod[func_name].params, args):
            for own, e in zip(getattr(p, "shape", ()), self.g.tensors[a].extents or ()):
                if isinstance(own, tirx.Var) and isinstance(e, tirx.Var) and own.name != e.name:
                    binding[own.name] = e.name
        seen = self.bindings.setdefault(func_name, [])
        key = sorted(binding.items())
        if key not in seen:
            seen.append(key)
        sym = symbol(func_name if seen.index(key) == 0 else f"{func_name}_as{seen.index(key)}")
        if binding:
            self.g.sizes_as[sym] = binding
        return sym

    def sourced(self, t):
        """`t` with its source and layout, where its name gives them."""
        name, mark, layout = t.name.rpartition(BLOCKED_MARK)
        name, layout = (name, layout) if mark and re.fullmatch(r"NCHW\d+c", layout) else (t.name, "")
        if name in self.sources:
            t.source, t.layout = self.sources[name], layout
        return t

    def outputs(self, body, output_names):
        """The model's outputs, named; one that is not a layer's own output
        (an input, a weight, an output twice) gets a copy layer."""
        g = self.g
        result = self.value_of(body)
        results = list(result) if isinstance(result, tuple) else [result]
        if len(results) != len(output_names):
            raise CompileError(f"model declares {len(output_names)} outputs, lowering produced {len(results)}")
        for idx, name in zip(results, output_names):
            t = g.tensors[idx]
            if t.kind != "intermediate" or idx in g.outputs:
                sym = f"copy_{len(g.kernels)}"
                g.kernels[sym] = _copy_kernel(t.extents or t.shape, t.dtype)
                out = g.add_tensor(Tensor(name, t.dtype, t.shape, "output", extents=t.extents))
                g.layers.append(Layer(f"L{len(g.layers)}", "copy", sym, [idx, out], 1))
                idx = out
            t = g.tensors[idx]
            t.kind, t.name, t.source, t.layout = "output", name, name, ""
            g.outputs.append(idx)


def run(c):
    names = [o for n in c.proto.graph.node for o in n.output] if c.proto is not None else ()
    c.graph = apply(c.mod, c.name, c.input_names, c.output_names, c.anchors, names, c.dims)
    c.graph.notes += c.notes
    if c.on_gpu:  # the layers without a variant run TVM's GPU schedules, one dispatch stream
        for layer in c.graph.layers:
            if layer.variant == "generic":
                layer.variant = "gpu.dlight"
        c.graph.threads = 1
    else:
        c.graph.threads = c.choices.threads
    return c
