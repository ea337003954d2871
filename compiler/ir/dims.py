"""Input dimensions declared as ranges (compiler/options.py Dim), as the
symbolic sizes TVM carries through Relax and TIR: one int64 variable per
Dim, the extents computed from them, each extent's largest value over the
declared ranges (the memory plan's size) and its program (how a run
computes it from the sizes of its inputs: schemas/bundle.fbs
Tensor.shape_program).

TVM is imported inside the functions."""
import re

END, ADD, SUB, MUL, FLOORDIV, FLOORMOD, MIN, MAX, DIM, NEG = range(-1, -11, -1)


def variables(dims):
    """{Dim: tir.Var} for the declared Dims, each named after its Dim: the
    variable is the size / the Dim's step (extent() is the size), so every
    extent computed from it is a multiple of the step where it is one (a
    page of 32 * h rows halved five times is h rows, exactly)."""
    from tvm import tirx as tir

    out, used = {}, set()
    for d in dims:
        name = re.sub(r"\W", "_", d.name)
        while name in used:
            name += "_"
        used.add(name)
        out[d] = tir.Var(name, "int64")
    return out


def extent(d, var):
    """The size of Dim `d` from its variable."""
    return var * d.step if d.step > 1 else var


def is_extent(e, d, var):
    """Whether `e` is the very extent of Dim `d` (an input axis that carries it)."""
    from tvm_ffi import structural_equal

    return not isinstance(e, int) and structural_equal(e, extent(d, var))


def is_static(extents):
    """Whether every extent is a constant."""
    return all(hasattr(e, "value") or isinstance(e, int) for e in extents)


def is_plain(extent):
    """Whether an extent is a constant or one size variable, not an
    expression (an exporter's min(1000000000, batch), on which fused
    functions' buffers disagree once a variant computes it)."""
    from tvm import tirx

    return isinstance(extent, (int, tirx.IntImm, tirx.Var))


def clamped(extent):
    """Whether an extent holds a min or a max (a slice's bound clamped to
    its axis where the importer could not tell it lies within)."""
    from tvm import tirx

    if isinstance(extent, (tirx.Min, tirx.Max)):
        return True
    return any(clamped(getattr(extent, f)) for f in ("a", "b", "value") if hasattr(getattr(extent, f, None), "ty"))


def _read(extents, dims):
    """{var: Dim} of the variables the extents read, matched to the Dims by
    name (passes may rebuild a variable: the same name, another object)."""
    from tvm.tirx.analysis import undefined_vars

    by_name = {v.name: d for d, v in dims.items()}
    out = {}
    for e in extents:
        for v in ([] if isinstance(e, int) or hasattr(e, "value") else undefined_vars(e)):
            if v.name not in by_name:
                raise ValueError(f"extent {e} reads '{v.name}', which is not a declared input dimension")
            out[v] = by_name[v.name]
    return out


def _analyzer(extents, dims, sizes=None):
    """An analyzer knowing each variable the extents read: its range, or
    its value where `sizes` ({Dim: size}) gives one."""
    import tvm
    from tvm.sym import Analyzer

    a = Analyzer()
    for v, d in _read(extents, dims).items():
        if sizes is None:
            a.bind(v, tvm.ir.Range(d.min // d.step, d.max // d.step + 1))
        else:
            a.bind(v, tvm.tirx.IntImm("int64", sizes[d] // d.step))
    return a


def proved(conditions, extents, dims):
    """Whether every condition (a TVM boolean over the extents' variables)
    holds at every size the declared ranges allow; False where a variable
    is not a declared one."""
    try:
        a = _analyzer(extents, dims)
    except ValueError:
        return False
    return all(bool(c) if isinstance(c, bool) else a.can_prove(c) for c in conditions)


def largest(extents, dims):
    """The largest value of each extent over the declared ranges (ints)."""
    a = _analyzer(extents, dims)
    out = []
    for e in extents:
        if isinstance(e, int) or hasattr(e, "value"):
            out.append(int(e))
            continue
        bound = a.const_int_bound(e).max_value
        if bound >= 2**62:
            raise ValueError(f"extent {e} has no bound over the declared ranges")
        out.append(int(bound))
    return tuple(out)


def at(extents, dims, sizes):
    """Each extent's value where every Dim takes its size from `sizes` ({Dim: int})."""
    a = _analyzer(extents, dims, sizes)
    return tuple(int(e) if isinstance(e, int) else int(a.simplify(e)) for e in extents)


def typical(extents, dims):
    """Each extent at the Dims' typical sizes."""
    return at(extents, dims, {d: d.typical for d in dims})


def program(extents, tensor_of):
    """The postfix words computing `extents` (schemas/bundle.fbs
    Tensor.shape_program); `tensor_of(var)` is the dim tensor of a variable."""
    from tvm import tirx as tir

    ops = {tir.Add: ADD, tir.Sub: SUB, tir.Mul: MUL, tir.FloorDiv: FLOORDIV, tir.FloorMod: FLOORMOD,
           tir.Min: MIN, tir.Max: MAX}
    words = []

    def emit(e):
        if isinstance(e, int) or isinstance(e, tir.IntImm):
            n = int(e)
            words.extend([-n, NEG] if n < 0 else [n])
        elif isinstance(e, tir.Var):
            words.extend([DIM, tensor_of(e)])
        elif type(e) in ops:
            a, b = (e.b, e.a) if isinstance(e, tir.Mul) and isinstance(e.b, tir.IntImm) else (e.a, e.b)
            emit(a), emit(b)  # a constant factor first: an input's axis reads `step DIM t MUL`
            words.append(ops[type(e)])
        elif isinstance(e, tir.Cast):
            emit(e.value)
        else:
            raise ValueError(f"extent {e} is not arithmetic a run can compute ({type(e).__name__})")

    for e in extents:
        emit(e)
        words.append(END)
    return words
