"""Pass `plan_branches`: control flow decided at run time.

An If runs only the branch its condition takes: every layer that only
feeds one side of a branch select becomes a branch step guarded by the
select's condition, and the layers are ordered so that each condition is
computed before the steps it guards (compiler/ir/branches.py says how).
A Loop the data stops runs its body's steps again while its condition
holds: each body is put between its loop's START and END steps
(compiler/ir/loops.py)."""
from ..ir.branches import guards, in_guard_order
from ..ir.loops import in_loop_order

NAME = "plan_branches"


def apply(graph):
    found = guards(graph)
    if found:
        for k, guard in in_guard_order(graph, found).items():
            graph.layers[k].guard = guard
    return in_loop_order(graph)


def run(c):
    c.graph = apply(c.graph)
    return c
