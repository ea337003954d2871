"""If decided at run time: only the branch the condition takes runs.

legalize_onnx inlines both branches of an If whose condition is not a
constant and joins each pair of outputs with a Where named after SELECT.
The importer (passes/import_relax.py) makes each of those a select kernel
that never fuses with its neighbours (`emit_select`), so its layer's
arguments are always (condition, then value, else value, output).

After extraction, `guards` gives every layer whose results reach nothing
but one side of a select that select's condition and side: the runtime
executes the layer only when the condition's value, read as its step comes,
is that side (the step is a branch step; its weights wait for the first run
that takes its branch), and skips it as well where the step writing the
condition was skipped (an If inside a branch not taken).
`in_guard_order` puts each guarded layer after the layers that compute its
condition. The memory plan needs nothing more: its lifetimes count every
step, so both branches have their places, and a skipped step's output is
merely left unwritten (the select reads the side the condition took).
"""
import heapq

from .graph import resolve

SELECT = "cb_branch_select"


def select_te(cond, then_value, else_value):
    """The output the scalar `cond` selects, element by element."""
    from tvm import te, tirx

    def holds():
        return cond() if cond.dtype == "bool" else cond() != tirx.const(0, cond.dtype)

    return te.compute(then_value.shape, lambda *i: tirx.Select(holds(), then_value(*i), else_value(*i)),
                      name="cb_select")


OPAQUE = 8  # TVM's op pattern kOpaque: FuseOps fuses nothing into it or after it
APART = "cb_apart"  # a PrimFunc kept a layer of its own at every size (fuse_layers)


def emit_select(bb, cond, then_value, else_value):
    """The select kernel's call, its PrimFunc marked opaque; a scalar side
    beside a one-value vector is read as that vector (legalize_onnx pairs
    them)."""
    from tvm import relax

    from .relax import extents_of

    a, b = extents_of(then_value), extents_of(else_value)
    if a != b and sorted((tuple(a or ()), tuple(b or ()))) == [(), (1,)]:
        then_value, else_value = (bb.normalize(relax.op.reshape(v, [1])) if not extents_of(v) else v
                                  for v in (then_value, else_value))
    var = bb.emit_te(select_te, cond, then_value, else_value, primfunc_name_hint=SELECT)
    gv = bb.lookup_binding(var).args[0]
    bb.update_func(gv, bb.get()[gv].with_attr("op_pattern", OPAQUE))
    return var


def is_select(layer):
    return layer.op.startswith(SELECT) and len(layer.args) == 4 and layer.num_outputs == 1


def flow(graph):
    """(writers, readers): tensor root -> indices of the layers writing
    any part of it / [(layer index, argument position)] reading it."""
    writers, readers = {}, {}
    for k, layer in enumerate(graph.layers):
        n_in = len(layer.args) - layer.num_outputs
        for p, a in enumerate(layer.args):
            r = resolve(graph, a)[0]
            if p >= n_in:
                writers.setdefault(r, set()).add(k)
            elif graph.tensors[a].kind not in ("weight", "prepared"):
                readers.setdefault(r, []).append((k, p))
    return writers, readers


def guards(graph):
    """{layer index: (condition tensor, value)}: the layers that only feed
    the then side (value True) or the else side (False) of a select. Of
    nested Ifs, the innermost select's guard."""
    writers, readers = flow(graph)
    outputs = {resolve(graph, i)[0] for i in graph.outputs}
    layers = graph.layers
    out = {}
    for s, select in enumerate(layers):
        if not is_select(select):
            continue
        for side, value in ((1, True), (2, False)):
            only = set()
            for k in range(s - 1, -1, -1):
                roots = {resolve(graph, a)[0] for a in layers[k].args[len(layers[k].args) - layers[k].num_outputs:]}
                if roots & outputs or not roots:
                    continue
                uses = [u for r in roots for u in readers.get(r, [])]
                if uses and all(k2 in only or (k2 == s and p == side) for k2, p in uses):
                    only.add(k)
            for k in only:
                out.setdefault(k, (_condition(graph, select.args[0]), value))
    return out


def _condition(graph, cond):
    """The tensor a guard reads: the bytes a step writes (`cond`, or the
    tensor an elided reshape made it an alias of, one bool either way), so
    the runtime finds the step that writes it."""
    root = resolve(graph, cond)[0]
    t = graph.tensors[root]
    return root if t.dtype == "bool" and t.nbytes == 1 else cond


def in_guard_order(graph, guarded):
    """graph.layers reordered (stable: the given order wherever it can stay)
    so that every guarded layer comes after the writers of its condition;
    `guarded` re-keyed to the new indices."""
    writers, readers = flow(graph)
    n = len(graph.layers)
    after = [set() for _ in range(n)]  # layer -> layers that must come before it
    for r, ks in readers.items():
        for k, _ in ks:
            after[k] |= writers.get(r, set()) - {k}
    for k, (cond, _) in guarded.items():
        after[k] |= writers.get(resolve(graph, cond)[0], set()) - {k}
    waiting = [len(a) for a in after]
    then = [[] for _ in range(n)]
    for k, a in enumerate(after):
        for j in a:
            then[j].append(k)
    ready = [k for k in range(n) if not waiting[k]]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for j in then[k]:
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(ready, j)
    assert len(order) == n, "the layers' dependencies have a cycle"
    graph.layers = [graph.layers[k] for k in order]
    new = {k: i for i, k in enumerate(order)}
    return {new[k]: g for k, g in guarded.items()}
