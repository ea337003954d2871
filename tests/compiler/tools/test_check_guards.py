"""Each guard of compiler/tools/check.py removed, one at a time, in a copy
of the module: a test of tests/compiler/tools/test_check.py that plants the fault it
guards against then fails. The check's own tests cannot pass a check that
lost a guard."""
import importlib.util
import inspect

import pytest

import test_check
from conftest import ROOT

# guard: (its lines in check.py, the lines without it, the test of test_check.py that must then fail)
GUARDS = {
    "NaN or infinity in ours": ("    if not np.all(np.isfinite(g)):\n", "    if False:\n",
                                "test_a_non_finite_value_fails"),
    "a reference not finite": ("    if not np.all(np.isfinite(r)):\n", "    if False:\n",
                               "test_a_reference_that_is_not_finite_fails"),
    "the output count": ("    if len(got) != len(ref):\n", "    if False:\n", "test_a_missing_or_extra_output_fails"),
    "shapes": ("    if r.shape != g.shape:\n", "    if False:\n", "test_a_shape_or_an_integer_that_differs_fails"),
    "integers exactly": ("(0.0, None) if not bad else", "(0.0, None) if True else",
                         "test_a_shape_or_an_integer_that_differs_fails"),
    "a scale per field": ("            if field.max() > SPREAD * field.min():\n", "            if False:\n",
                          "test_scores_beside_large_boxes_have_their_own_scale"),
    "ranked scores in order": ("    if order > tolerance:\n", "    if False:\n",
                               "test_ranked_rows_in_another_order_fail_unless_their_scores_tie"),
    "outputs that ignore the input": ("np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)]", "False]",
                                      "test_an_output_that_ignores_the_input_is_seen"),
    "ids from the vocabulary": ("                        found[inp.name] = rows[0]\n", "                        pass\n",
                                "test_ids_come_from_the_models_vocabulary"),
    "never all zeros": ("    if x.size and not x.any():\n", "    if False:\n", "test_ids_are_never_all_zero"),
    "masks with padding": ("        x[..., :max(1, (3 * shape[-1] + 3) // 4)] = 1 if shape else 0\n",
                           "        x[...] = 1\n", "test_ids_come_from_the_models_vocabulary"),
}


def without(lines, instead):
    """compiler/tools/check.py with `lines` replaced, as a module."""
    path = f"{ROOT}/compiler/tools/check.py"
    source = open(path).read()
    assert source.count(lines) == 1, f"the guard's lines are not in {path} once: {lines!r}"
    spec = importlib.util.spec_from_loader("check_without_a_guard", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source.replace(lines, instead), path, "exec"), module.__dict__)
    return module


def run(test):
    """Run a test of test_check.py (every parametrization of it)."""
    params = inspect.signature(test).parameters
    marks = getattr(test, "pytestmark", [])
    cases = [dict(zip([n.strip() for n in m.args[0].split(",")], v if isinstance(v, tuple) else (v,)))
             for m in marks if m.name == "parametrize" for v in m.args[1]] or [{}]
    for case in cases:
        test(**{k: v for k, v in case.items() if k in params})


@pytest.mark.parametrize("guard", list(GUARDS))
def test_the_check_fails_its_tests_without_each_guard(guard, monkeypatch):
    lines, instead, name = GUARDS[guard]
    run(getattr(test_check, name))  # passes with the guard
    monkeypatch.setattr(test_check, "check", without(lines, instead))
    with pytest.raises(Exception):  # an assertion, or the comparison breaking on what it no longer guards
        run(getattr(test_check, name))
