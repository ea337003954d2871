"""compiler/ir/loops.py on small hand-made graphs: each loop's body (what
depends on its START and what its END depends on) put between the two with
nothing else among them; its records for the bundle; the memory plan's
lifetimes held across iterations."""
from coldbrew.compiler.ir import loops
from coldbrew.compiler.ir.graph import Graph, Layer, Tensor


def _graph(layers, n_tensors, outputs):
    """layers: [(name, loop record or None, inputs, outputs)] over tensors 0..n-1 (0 is the input)."""
    g = Graph("g")
    for i in range(n_tensors):
        g.add_tensor(Tensor(f"t{i}", "float32", (4,), "input" if i == 0 else "intermediate"))
    g.inputs, g.outputs = [0], list(outputs)
    for name, loop, ins, outs in layers:
        g.layers.append(Layer(name, name, name, list(ins) + list(outs), len(outs)))
        g.layers[-1].loop = loop
    return g


START = {"role": "start", "loop": "L", "carried": 1, "most": -1}
END = {"role": "end", "loop": "L", "carried": 1, "scans": 0, "most": -1, "key": "L"}


def _decoder():
    """pre = f(x); START(x) -> (it 2, trip 3, cond 4, h 5); body: a = g(h, pre), c = k(a);
    other = u(x) (independent of the loop); END(it, trip, cond, h, c, a) -> (h_end 8, count 9);
    post = v(h_end, other)."""
    return _graph([("pre", None, [0], [1]), ("start", START, [0], [2, 3, 4, 5]), ("other", None, [0], [11]),
                   ("g", None, [5, 1], [6]), ("k", None, [6], [7]),
                   ("end", END, [2, 3, 4, 5, 7, 6], [8, 9]), ("post", None, [8, 11], [10])], 12, [10])


def test_the_body_lies_between_start_and_end_and_nothing_else_does():
    g = loops.in_loop_order(_decoder())
    names = [x.name for x in g.layers]
    s, e = g.loops[0]
    assert names[s:e + 1] == ["start", "g", "k", "end"], names
    assert names.index("pre") < s and names.index("post") > e and "other" not in names[s:e + 1]


def test_the_records_name_the_state_and_the_carried_pairs():
    g = loops.in_loop_order(_decoder())
    (r,) = loops.records(g)
    assert (r["iteration"], r["trip"], r["cond"], r["name"], r["most"]) == (2, 3, 4, "L", -1)
    assert r["carried_from"] == [7, 6] and r["carried_to"] == [4, 5] and r["scan_from"] == [] == r["scan_to"]
    assert (r["start"], r["first"], r["end"]) == (g.loops[0][0], g.loops[0][0] + 1, g.loops[0][1])


def test_what_the_body_reads_from_before_it_lives_to_the_end():
    g = loops.in_loop_order(_decoder())
    s, e = g.loops[0]
    k = [x.name for x in g.layers].index("g")
    first = {1: s - 1, 5: s, 6: k}
    last = {1: k, 5: e, 6: e}  # pre's value is last read by g, inside the body
    loops.lifetimes(g, first, last)
    assert last == {1: e, 5: e, 6: e}


def test_a_graph_without_loops_keeps_its_order():
    g = _graph([("a", None, [0], [1]), ("b", None, [1], [2])], 3, [2])
    assert [x.name for x in loops.in_loop_order(g).layers] == ["a", "b"] and g.loops == []
