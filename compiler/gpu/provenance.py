"""A GPU kernel's failure in words about the model: the ONNX operator and
node whose value the kernel computes, then what the GPU path lacks.

Kernels are named by TVM (fused_cast_reshape_cast1); the value a layer
computes keeps the name of the model's tensor (import_relax binds each
node's result under its output's name), so a kernel is traced to the call
that binds it in the Relax main function, or to its layer's output tensor,
and from the tensor's name to the node that makes it.
"""
from ..errors import CompileError


def _node(proto, tensor):
    """'Cast node "Cast_12"' for the node making `tensor`, or None."""
    for n in proto.graph.node if proto is not None else ():
        if tensor in n.output:
            return f"{n.op_type} node '{n.name or tensor}'"
    return None


def _by_operator(proto, kernel):
    """The nodes of the operator a kernel is named after ("topk" -> the TopK
    nodes), where its value has no name of the model's."""
    words = set(kernel.lower().split("_"))
    ops = {n.op_type for n in proto.graph.node if n.op_type.lower() in words} if proto is not None else set()
    return [f"{op} node(s) " + ", ".join(f"'{n.name}'" for n in proto.graph.node if n.op_type == op)
            for op in sorted(ops)]


def bound_to(mod, symbol):
    """The names of the values bound to calls of the kernel `symbol` in `mod`'s main."""
    from tvm import relax

    names = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            args = getattr(b.value, "args", ())
            if args and isinstance(args[0], relax.GlobalVar) and args[0].name_hint == symbol:
                names.append(b.var.name)
    return names


def written_by(graph, symbol):
    """The model tensors the layers of kernel `symbol` write (their sources, else names)."""
    return [graph.tensors[i].source or graph.tensors[i].name
            for layer in graph.layers if layer.kernel == symbol for i in layer.args[-layer.num_outputs:]]


def refuse(proto, tensors, kernel, what):
    """A CompileError naming the node(s) computing `tensors` (by kernel
    `kernel`), and `what` the GPU path lacks."""
    nodes = [n for n in (_node(proto, t.split("@")[0]) for t in tensors) if n] or _by_operator(proto, kernel)
    who = ", ".join(dict.fromkeys(nodes)) if nodes else f"the layer of kernel {kernel} (no ONNX node keeps its name)"
    raise CompileError(f"{who} cannot run on the GPU: {what}") from None


def per_kernel(proto, tensors_of, kernels, attempt, what):
    """Run `attempt(kernels)` ({symbol: PrimFunc}); where it fails for the
    whole batch, find the kernel it fails on alone and refuse the node of
    the tensors `tensors_of(symbol)` names (`what`: what the GPU path could
    not do)."""
    try:
        return attempt(kernels)
    except Exception as whole:
        for symbol, func in kernels.items():
            try:
                attempt({symbol: func})
            except Exception as e:
                refuse(proto, tensors_of(symbol), symbol, f"{what} its kernel {symbol} ({_last(e)})")
        raise CompileError(f"{what} the layers' kernels ({_last(whole)})") from None


def _last(e):
    lines = str(e).strip().splitlines()
    return lines[-1] if lines else type(e).__name__
