"""Pass `plan_branches`: an If decided at run time runs only the branch its
condition takes. Every layer that only feeds one side of a branch select
becomes a branch step guarded by the select's condition, and the layers are
ordered so that each condition is computed before the steps it guards
(compiler/ir/branches.py says how)."""
from ..ir.branches import guards, in_guard_order

NAME = "plan_branches"


def apply(graph):
    found = guards(graph)
    if found:
        for k, guard in in_guard_order(graph, found).items():
            graph.layers[k].guard = guard
    return graph


def run(c):
    c.graph = apply(c.graph)
    return c
