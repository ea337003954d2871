"""The compiler on bad input, in CI: a fixed subset of the seeded zoo-model
mutations of tests/fuzz/mutate_models.py (the full 1000-case run is that
script). Every case ends in a bundle or a CompileError with a message:
no traceback, no crash, no hang."""
import os
import sys

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "fuzz"))
import mutate_models  # noqa: E402

CASES = 2 * len(mutate_models.MUTATORS) * 2  # every mutator twice on each of two small zoo models


def test_mutated_models_end_in_a_bundle_or_a_compile_error():
    lines = []
    counts, failures = mutate_models.run(["squeezenet", "crnn"], CASES, seed=7, timeout=300, report=lines.append)
    print("\n".join(lines))
    assert not failures, "\n\n".join(f"case {k} ({m}: {what}): {kind}\n{detail}" for k, m, what, kind, detail in failures)
    assert sum(counts.values()) == CASES
    assert counts.get("compile_error", 0) >= CASES // 2, counts  # the mutations do break the models
