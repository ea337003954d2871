"""A Loop whose condition the data decides, run by the runtime.

legalize_onnx makes such a Loop one copy of its body between a START node
and an END node (onnx/loops.py `at_run_time`); the importer makes each of
them an opaque kernel (kernels/loops.py `emit_start`, `emit_end`) marked with LOOP:

- START (a value of the data it waits for, M, the first condition, the
  first carried values) -> (iteration number 0, trip count, condition,
  carried values): the loop's state, which the runtime then updates.
- END (iteration, trip, condition, carried values, then the body's
  condition, carried values and scan values) -> (the final carried values,
  each scan output at the loop's bound, the iteration count). The scan
  outputs' bytes are the runtime's to write (the kernel leaves them); the
  node's scan outputs are their first `count` rows (a counted size).

After extraction, `in_loop_order` puts each loop's body (the layers that
depend on its START and that its END depends on) between the two, every
other layer before or after, and `records` describes each loop for the
bundle (schemas/bundle.fbs `Loop`): after the body's last step the runtime
adds one to the iteration number, copies each carried value the body
computed onto the one the body reads (and the condition), each scan value
into its row of its scan output, and runs the body again while the
condition holds and the iteration number is below the trip count (a run
that would need more rows than a scan output holds fails, naming the
bound). `lifetimes` extends the memory plan's: a tensor the body reads
that was computed before the loop lives to the loop's end, since every
iteration reads it again.
"""
import json

from .branches import flow
from .graph import resolve

# a START or END kernel's attribute: JSON {"role", "loop" (its name), "carried", "scans", "most", and END's
# "key": what --bound takes for it (its first scan output, else its name)}
LOOP = "cb_loop"


def mark(layer, func):
    """The LOOP record of a START or END kernel `func` on its layer (None otherwise)."""
    value = (func.attrs or {}).get(LOOP) if func is not None else None
    layer.loop = json.loads(str(value)) if value is not None else None


def _pairs(graph):
    """[(start index, end index)] of the graph's loops, by name."""
    starts, ends = {}, {}
    for k, layer in enumerate(graph.layers):
        if layer.loop:
            (starts if layer.loop["role"] == "start" else ends)[layer.loop["loop"]] = k
    return [(starts[n], ends[n]) for n in ends]


def _bodies(graph, pairs, writers, readers):
    """Per loop, the indices of its body's layers."""
    n = len(graph.layers)
    after = [set() for _ in range(n)]  # layer -> layers it reads from
    before = [set() for _ in range(n)]
    for r, ks in readers.items():
        for k, _ in ks:
            for w in writers.get(r, ()):
                if w != k:
                    after[k].add(w)
                    before[w].add(k)

    def reach(k, edges):
        seen, todo = set(), [k]
        while todo:
            for j in edges[todo.pop()]:
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        return seen

    return [reach(s, before) & reach(e, after) for s, e in pairs]


def in_loop_order(graph):
    """graph.layers reordered (stably) so that each loop's body lies between
    its START and END, nothing else among them; the graph's `loops` set."""
    pairs = _pairs(graph)
    if not pairs:
        graph.loops = []
        return graph
    writers, readers = flow(graph)
    for k, layer in enumerate(graph.layers):  # a branch step waits for its condition's writer too
        if layer.guard is not None:
            readers.setdefault(resolve(graph, layer.guard[0])[0], []).append((k, -1))
    bodies = _bodies(graph, pairs, writers, readers)
    unit = list(range(len(graph.layers)))
    for (s, e), body in zip(pairs, bodies):
        for k in body | {s, e}:
            unit[k] = s
    members = {}
    for k in range(len(graph.layers)):
        members.setdefault(unit[k], []).append(k)
    deps = {u: set() for u in members}
    for r, ks in readers.items():
        for k, _ in ks:
            deps[unit[k]] |= {unit[w] for w in writers.get(r, ()) if unit[w] != unit[k]}
    order, done = [], set()
    while len(done) < len(members):
        u = min(u for u in members if u not in done and deps[u] <= done)
        done.add(u)
        ks = members[u]
        if unit[u] == u and len(ks) > 1:  # a loop: START, the body, END
            s = u
            e = next(e for s2, e in pairs if s2 == s)
            ks = [s] + [k for k in ks if k not in (s, e)] + [e]
        order += ks
    graph.layers = [graph.layers[k] for k in order]
    new = {k: i for i, k in enumerate(order)}
    graph.loops = [(new[s], new[e]) for s, e in pairs]
    return graph


def records(graph):
    """Per loop, what the bundle's Loop table holds: its steps and tensors."""
    out = []
    for s, e in graph.loops:
        end = graph.layers[e]
        n, k = end.loop["carried"], end.loop["scans"]
        a = end.args
        out.append(dict(start=s, first=s + 1, end=e, iteration=a[0], trip=a[1], cond=a[2],
                        carried_from=[a[3 + n]] + a[4 + n:4 + 2 * n], carried_to=[a[2]] + a[3:3 + n],
                        scan_from=a[4 + 2 * n:4 + 2 * n + k], scan_to=a[len(a) - 1 - k:len(a) - 1],
                        most=end.loop["most"], name=end.loop["key"],
                        at_least_once=graph.layers[s].loop.get("at_least_once", False)))
    return out


def lifetimes(graph, first, last):
    """The memory plan's lifetimes ({root: step}, changed in place) made to
    hold across each loop's iterations: a tensor computed before the body
    and read in it lives to the END; a scan output the runtime writes
    during the body, from the START."""
    for rec in records(graph):
        s, e = rec["start"], rec["end"]
        for r in list(last):
            if first.get(r, -1) <= s < last[r] < e:
                last[r] = e
        for t in rec["scan_to"]:
            r = resolve(graph, t)[0]
            first[r] = min(first.get(r, s), s)
