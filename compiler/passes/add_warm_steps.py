"""Pass `add_warm_steps` (continuous mode only): give each layer whose plan
variant is not the warm-fastest one that variant as an alternate.

The cold plan picks variants for the first run (cheap to prepare); later
runs want the variants that execute fastest (papers/nnv12-cold-inference.txt
section 3.5). The warm graph is the same model compiled with the warm
plan's variants and every weight cached. Layer k of both graphs computes
the same activations, so a warm layer's non-weight arguments map, in order,
onto the cold layer's tensors; its weights join the cold graph as weights of
their own (unless the plan ships the same bytes already), which write_bundle places after every weight the plan needs (the
first run never reads them). Its kernel joins the code under a `warm_`
symbol. A layer whose arguments do not line up keeps no alternate (a note
says so), never a wrong one.
"""
import hashlib

import numpy as np

from ..ir.graph import Tensor

NAME = "add_warm_steps"


def _activations(graph, layer):
    return [i for i in layer.args if graph.tensors[i].kind in ("input", "output", "intermediate")]


def _key(t):
    return t.dtype, tuple(t.shape), hashlib.sha256(np.ascontiguousarray(t.data).tobytes()).digest()


def apply(cold, warm, warm_threads):
    cold.warm_threads = warm_threads
    if len(cold.layers) != len(warm.layers):
        cold.notes.append(f"continuous mode: the warm plan has {len(warm.layers)} layers, the cold "
                          f"{len(cold.layers)}; no warm alternates")
        return cold
    # a warm weight equal to one the plan already ships (a bias) is not stored twice
    shipped = {_key(t): i for i, t in enumerate(cold.tensors) if t.kind == "weight"}
    for c, w in zip(cold.layers, warm.layers):
        if (w.variant, w.params) == (c.variant, c.params):
            continue
        mine, theirs = _activations(cold, c), _activations(warm, w)
        same = len(mine) == len(theirs) and all(
            (cold.tensors[a].shape, cold.tensors[a].dtype) == (warm.tensors[b].shape, warm.tensors[b].dtype)
            for a, b in zip(mine, theirs))
        if c.name != w.name or not same:
            cold.notes.append(f"continuous mode: layer {c.name}'s warm variant {w.variant} does not line up "
                              f"with the plan's layer; it keeps {c.variant}")
            continue
        to_cold = dict(zip(theirs, mine))
        args = []
        for i in w.args:
            if i in to_cold:
                args.append(to_cold[i])
                continue
            t = warm.tensors[i]
            if _key(t) not in shipped:
                shipped[_key(t)] = cold.add_tensor(Tensor(f"{t.name}.warm", t.dtype, tuple(t.shape), "weight",
                                                          np.ascontiguousarray(t.data), cached=True))
            args.append(shipped[_key(t)])
        sym = f"warm_{w.kernel}"
        cold.kernels[sym] = warm.kernels[w.kernel]
        c.warm = {"variant": w.variant, "kernel": sym, "args": args, "params": dict(w.params)}
    return cold


def run(c):
    """Pass entry: later runs' thread count, and continuous mode's alternates
    from c.warm_graph (the warm plan's lowering) where there is one."""
    c.graph.warm_threads = c.choices.later_threads
    if c.warm_graph is not None:
        c.graph = apply(c.graph, c.warm_graph, c.choices.warm[1])
    return c
