"""Choose kernel variants and weight forms from a device cost table.

    warm   per layer, the variant that executes fastest (warm, the plan's
           threads, fastest core class); weights cached
    cold   per layer, the (variant, weight form) with the least sequential
           cold cost: read (raw or transformed bytes) + transform (raw form)
           + first execution

Both are per-layer greedy choices for today's sequential runtime; the
pipelined scheduler (NNV12 Algorithm 1) builds on the same table and the
simulator (compiler/simulate.py).
"""
from .simulate import median_ms

OBJECTIVES = ("warm", "cold")


def choose(table, objective):
    """({anchor layer: variant}, {anchor layer: "raw" | "cached"}) for compile_model."""
    if objective not in OBJECTIVES:
        raise ValueError(f"plan objective must be one of {OBJECTIVES}, not {objective!r}")
    cls, threads = table["classes"][0]["name"], table["threads"]
    variants, forms = {}, {}
    for layer in table["layers"]:
        cands = layer["candidates"]
        if len(cands) < 2 and not any(c["has_transform"] for c in cands):
            continue  # nothing to choose
        options = []
        for c in cands:
            if objective == "warm":
                options.append((median_ms(c["execute_ms"], cls, threads), c["variant"], "cached"))
                continue
            first = median_ms(c["execute_first_ms"], cls, threads)
            options.append((c["read_ms"]["cached"]["median"] + first, c["variant"], "cached"))
            if c["has_transform"]:
                cost = c["read_ms"]["raw"]["median"] + median_ms(c["transform_ms"], cls, threads) + first
                options.append((cost, c["variant"], "raw"))
        _, variants[layer["name"]], forms[layer["name"]] = min(options)
    return variants, forms
