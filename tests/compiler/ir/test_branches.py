"""compiler/ir/branches.py: which layers only feed one side of a branch
select (guards) and an order that computes each guard before the layers it
guards (in_guard_order), on small hand-made graphs."""
from coldbrew.compiler.ir.branches import SELECT, guards, in_guard_order
from coldbrew.compiler.ir.graph import Graph, Layer, Tensor


def _graph(layers, n_tensors, outputs, aliases=None):
    """layers: [(name, op, inputs, outputs)] over tensors 0..n_tensors-1 (0 is the input)."""
    g = Graph("g")
    for i in range(n_tensors):
        g.add_tensor(Tensor(f"t{i}", "float32", (4,), "input" if i == 0 else "intermediate"))
    g.inputs, g.outputs = [0], list(outputs)
    g.layers = [Layer(name, op, op, list(ins) + list(outs), len(outs)) for name, op, ins, outs in layers]
    g.aliases = dict(aliases or {})
    return g


def test_the_layers_of_each_side_and_nothing_shared():
    # t1 = cond(x); then: t2 = a(x), t3 = b(t2); else: t4 = c(x); shared: t5 = d(x) read by both sides
    g = _graph([("cond", "greater", [0], [1]), ("a", "mul", [0], [2]), ("b", "add", [2, 5], [3]),
                ("shared", "exp", [0], [5]), ("c", "sub", [0, 5], [4]),
                ("sel", SELECT, [1, 3, 4], [6]), ("out", "relu", [6], [7])], 8, [7])
    found = {g.layers[k].name: v for k, v in guards(g).items()}
    assert found == {"a": (1, True), "b": (1, True), "c": (1, False)}


def test_a_layer_whose_result_is_also_an_output_or_read_elsewhere_is_not_guarded():
    g = _graph([("cond", "greater", [0], [1]), ("a", "mul", [0], [2]), ("c", "sub", [0], [4]),
                ("sel", SELECT, [1, 2, 4], [6]), ("other", "add", [4, 6], [7])], 8, [7, 2])
    assert guards(g) == {}


def test_the_same_value_on_both_sides_is_not_guarded():
    g = _graph([("cond", "greater", [0], [1]), ("a", "mul", [0], [2]), ("sel", SELECT, [1, 2, 2], [3])], 4, [3])
    assert guards(g) == {}


def test_guarded_layers_move_after_the_layers_that_compute_their_condition():
    # the branches come first in the given order, the condition after them
    g = _graph([("a", "mul", [0], [2]), ("c", "sub", [0], [4]), ("x2", "neg", [0], [5]),
                ("cond", "greater", [5], [1]), ("sel", SELECT, [1, 2, 4], [6])], 7, [6])
    found = guards(g)
    assert {g.layers[k].name for k in found} == {"a", "c"}
    moved = in_guard_order(g, found)
    names = [layer.name for layer in g.layers]
    assert names == ["x2", "cond", "a", "c", "sel"]
    assert {names[k] for k in moved} == {"a", "c"} and all(v[0] == 1 for v in moved.values())


def test_an_alias_of_the_condition_counts_as_its_writer():
    # the select reads t3, bytes of t1 (an elided reshape): t1's writer comes first
    g = _graph([("a", "mul", [0], [2]), ("c", "sub", [0], [4]), ("cond", "greater", [0], [1]),
                ("sel", SELECT, [3, 2, 4], [6])], 7, [6], aliases={3: (1, 0)})
    moved = in_guard_order(g, guards(g))
    assert [layer.name for layer in g.layers] == ["cond", "a", "c", "sel"] and len(moved) == 2
