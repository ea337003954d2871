"""Pass `schedule_kernels`: explicit schedules for every kernel after fusion.

A function holding an anchor (select_variants) gets its variant's schedule,
with the fused epilogue attached to the anchor's tiles (and the variant's
finish: instructions no schedule primitive selects); every other function
gets the generic schedule (parallel outer loops, vectorized inner loops).
A schedule that fails leaves the function as lowered (correct, slower) and is
reported in the graph's notes and, by the compile, as a
ScheduleFallbackWarning (warn_fallbacks).
"""
import warnings

from ..errors import ScheduleFallbackWarning
from ..ir.anchors import ANCHOR_RE
from ..kernels import ANCHOR
from ..kernels.generic import generic, typical_sizes

NAME = "schedule_kernels"
FAILED = "schedule failed"  # the notes of kernels whose variant's schedule raised


def apply(mod, anchors, isa, variables=None):
    """`isa`: the target's vector unit (targets.Vector), for the generic
    schedule; `variables` ({Dim: var}): sizes set at run time, scheduled
    for their typical values."""
    with typical_sizes({v.name: d.typical // d.step for d, v in (variables or {}).items()}):
        return _schedule(mod, anchors, isa)


def _schedule(mod, anchors, isa):
    from tvm import relax, s_tir

    by_index = {a.index: a for a in anchors}
    notes = []
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            continue
        m = ANCHOR_RE.search(gv.name_hint)
        sch = s_tir.Schedule(func)
        finish = _unchanged
        try:
            if m and by_index[int(m.group(1))].variant.prescheduled:
                continue  # written scheduled (a recurrent cell)
            if m:
                a = by_index[int(m.group(1))]
                a.variant.schedule(sch, sch.get_sblock(ANCHOR), a.spec, a.params)
                finish = a.variant.finish
            else:
                generic(sch, isa.lanes, isa.registers)
        except Exception as e:  # TVM raises several error types from schedule primitives
            sch, finish, used = s_tir.Schedule(func), _unchanged, "generic schedule used"
            try:
                generic(sch, isa.lanes, isa.registers)
            except Exception:  # the generic schedule failed too: the function as lowered (correct, slower)
                sch, used = s_tir.Schedule(func), "left unscheduled"
            notes.append(f"{gv.name_hint}: {FAILED} ({type(e).__name__}: {str(e).splitlines()[0][:120]}), "
                         f"{used}")
        mod[gv] = finish(sch.mod["main"])
    return mod, notes


def warn_fallbacks(notes):
    """A ScheduleFallbackWarning naming every kernel `notes` (a compile's)
    report as failed, where there is one: outside the passes, which run
    with warnings silenced (errors.quiet)."""
    failed = [n for n in notes if FAILED in n]
    if failed:
        warnings.warn(ScheduleFallbackWarning(
            f"{len(failed)} kernel(s) run on the generic schedule (correct, slower; a coldbrew bug: please report it "
            f"with the model): " + "; ".join(failed)), stacklevel=3)


def _unchanged(func):
    return func


def run(c):
    c.mod, notes = apply(c.mod, c.anchors, c.target.vector, c.dims)
    c.notes += notes
    return c
