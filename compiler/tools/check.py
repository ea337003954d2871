"""The output check every comparison with a reference uses (bench/corpus.py,
the benchmarks that check outputs, the tests' assert_close, `coldbrew
compare`): coldbrew's outputs against onnxruntime's, built so that it
cannot be fooled. Only numpy (and onnx, for `inputs`): bench/corpus.py's
replay loads it by path where no compiler is installed.

- Counts, names and shapes: a missing or extra output fails, so does a
  shape that differs.
- Integer and boolean outputs are equal, element for element.
- Finite values: NaN or infinity in ours where the reference has none
  fails; a reference that is itself not finite fails too (the input means
  nothing to the model, so nothing is checked).
- Scales: a float output's error is |ours - ref| over the scale of the
  values it sits among, at least 1. An output whose axis holds fields of
  different kinds (a detector's box coordinates beside its scores) has a
  scale per field: a short axis (2 to FIELDS long) whose slices' scales
  are SPREAD times apart or more gives each slice its own scale, and an
  element takes the smallest of its slices'.
- Ranked rows (a detector's top-k, sorted by score): rows are matched as a
  set (near-equal scores may come in either order, a near-tie at the end may
  make the cut either way), and the scores rank by rank must agree.
- Inputs that mean something (`inputs`): token ids drawn from the model's
  own vocabulary (the rows of the embedding its ids index), masks with a
  valid prefix, floats standard normal; the reference run on a second input
  (`unchanged_outputs`), a model whose outputs are the same for both is
  reported as such (its "match" would check nothing).
"""
import numpy as np

TOLERANCE = 1e-3
FIELDS = 128  # an axis this short or shorter may hold fields of different kinds
SPREAD = 10  # ... and does where its slices' scales are this far apart

# ops an id passes through unchanged on its way to the embedding it indexes
_ID_PASSTHROUGH = {"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Clip", "Expand", "Transpose"}


class Verdict:
    """The result of one comparison: the worst error (relative to scale) and
    every failure, in words. ok: no failure and the error within tolerance."""

    def __init__(self, error=0.0, failures=(), tolerance=TOLERANCE):
        self.error, self.failures, self.tolerance = error, list(failures), tolerance

    @property
    def ok(self):
        return not self.failures and self.error <= self.tolerance

    def message(self):
        if self.failures:
            return "; ".join(self.failures)
        return f"max error {self.error:.2e} of scale" + ("" if self.ok else f" > tolerance {self.tolerance}")

    def __repr__(self):
        return f"Verdict({'ok' if self.ok else 'FAIL'}: {self.message()})"


def compare(ref, got, tolerance=TOLERANCE, names=None, ranked=None):
    """ours (`got`) against the reference's outputs (`ref`), lists in output
    order. `ranked`: {"output": index, "score": column} of a top-k output."""
    ref, got = list(ref), list(got)
    names = list(names) if names else [f"output {k}" for k in range(len(ref))]
    if len(got) != len(ref):
        return Verdict(float("inf"), [f"{len(got)} outputs where the reference has {len(ref)}"], tolerance)
    worst, failures = 0.0, []
    for k, (r, g) in enumerate(zip(ref, got)):
        score = ranked["score"] if ranked and ranked["output"] == k else None
        err, why = one(r, g, tolerance, score)
        worst = max(worst, err)
        if why:
            failures.append(f"{names[k]}: {why}")
    return Verdict(worst, failures, tolerance)


def one(ref, got, tolerance=TOLERANCE, score=None, same_nonfinite=False):
    """(error, failure or None) of one output; `score`: the score column of
    ranked rows. `same_nonfinite`: a reference value that is NaN or
    infinite is no failure where ours is the same (an intermediate tensor: an
    attention mask's -inf), and is left out of the error."""
    r, g = np.asarray(ref), np.asarray(got)
    if r.shape != g.shape:
        return float("inf"), f"shape {list(g.shape)} where the reference has {list(r.shape)}"
    if r.dtype.kind in "biu" or g.dtype.kind in "biu":
        bad = int(np.count_nonzero(r != g))
        return (0.0, None) if not bad else (float("inf"), f"{bad} of {r.size} integer values differ")
    if not r.size:
        return 0.0, None
    r, g = r.astype(np.float64), g.astype(np.float64)
    if same_nonfinite and not np.all(np.isfinite(r)):
        odd = ~np.isfinite(r)
        if not np.array_equal(r[odd], g[odd], equal_nan=True):
            return float("inf"), "NaN or infinite values where the reference has other values"
        r, g = np.where(odd, 0.0, r), np.where(odd, 0.0, g)
    if not np.all(np.isfinite(r)):
        return float("inf"), (f"the reference itself has {np.count_nonzero(~np.isfinite(r))} NaN or infinite values "
                              "(the input means nothing to the model)")
    if not np.all(np.isfinite(g)):
        return float("inf"), f"{np.count_nonzero(~np.isfinite(g))} NaN or infinite values where the reference has none"
    if score is not None:
        return ranked(r, g, score, tolerance)
    err = float(np.max(np.abs(g - r) / scales(r)))
    return err, None if err <= tolerance else f"max error {err:.2e} of scale > {tolerance}"


def scales(r):
    """Each element's scale (an array broadcast to r's shape), at least 1:
    the whole output's largest |value|, or where a short axis holds fields
    of different kinds (its slices' largest values, at least 1, an order of
    magnitude apart or more) the largest of the element's slice along it
    (the smallest such over the axes)."""
    a = np.abs(r)
    s = np.full(r.shape, max(1.0, float(a.max())))
    for axis, n in enumerate(r.shape):
        if 2 <= n <= FIELDS:
            others = tuple(k for k in range(r.ndim) if k != axis)
            field = np.maximum(1.0, a.max(axis=others, keepdims=True))
            if field.max() > SPREAD * field.min():
                s = np.minimum(s, field)
    return s


def ranked(r, g, score, tolerance=TOLERANCE):
    """(error, failure or None) of rows ranked by the score in column
    `score`: each reference row matched to a row of ours within tolerance
    (fields compared at their own scales); a row may go unmatched only
    where its score is within tolerance of the last kept score; the
    scores, rank by rank, agree."""
    r, g = (a.reshape(-1, a.shape[-1]) for a in (r, g))
    scale = np.maximum(1.0, np.abs(r).max(axis=0))
    cut = min(r[:, score].min(), g[:, score].min()) + tolerance
    free = np.ones(len(g), bool)
    worst = 0.0
    for k, row in enumerate(r):
        diff = np.max(np.abs(g - row) / scale, axis=1)
        diff[~free] = np.inf
        m = int(np.argmin(diff))
        if diff[m] <= tolerance:
            free[m] = False
            worst = max(worst, float(diff[m]))
        elif row[score] > cut:
            return float(diff[m]), f"reference row {k} (score {row[score]:.4g}) has no match"
    if np.any(g[free, score] > cut):
        return float("inf"), "a row of ours above the cut matches no reference row"
    order = float(np.max(np.abs(g[:, score] - r[:, score]) / scale[score]))
    if order > tolerance:
        return order, f"the scores rank by rank differ by {order:.2e} (rows out of order)"
    return worst, None


def vocabularies(model):
    """{integer input: the number of rows of the embedding its values index}
    for the inputs that reach a Gather's indices (through casts, reshapes
    and constant picks) whose data is computed from constants alone (a
    quantized table too): the ids a model of words or bytes can be given."""
    import onnx

    g = model.graph
    const = {i.name for i in g.initializer}
    for n in g.node:  # in graph order: what is computed from constants alone
        if n.op_type == "Constant" or (n.input and all(i in const for i in n.input if i)):
            const.update(n.output)
    shapes = {i.name: tuple(i.dims) for i in g.initializer}
    inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
    for v in inferred:
        shapes[v.name] = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim)
    users = {}
    for n in g.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    found = {}
    for inp in g.input:
        todo, seen = [inp.name], set()
        while todo and inp.name not in found and inp.name not in const:
            t = todo.pop()
            for n in users.get(t, []):
                if n.op_type == "Gather" and n.input[1] == t and n.input[0] in const:
                    axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                    rows = shapes.get(n.input[0], ())[axis:axis + 1]
                    if rows and rows[0] > 0:
                        found[inp.name] = rows[0]
                        break
                picked = n.op_type in ("Gather", "Slice") and n.input[0] == t and all(i in const for i in n.input[1:])
                if (n.op_type in _ID_PASSTHROUGH and n.input[0] == t or picked) and n.output[0] not in seen:
                    seen.add(n.output[0])
                    todo.append(n.output[0])
    return found


def inputs(model, spec, seed=0):
    """{input: array} for every input of the ONNX `model` (its initializers
    excluded): `spec` is {input: {"shape", "fill", "bind", "range", "draw"}}
    (the corpus manifest's; a float input's range draws it uniformly, "draw":
    "strokes" a text line's dark strokes on a light page); otherwise
    floats standard normal, a mask (a name
    holding "mask") a valid prefix of three quarters then padding, ids drawn
    from the model's vocabulary (never all zeros), any other integer input
    refused until its range is given."""
    rng = np.random.default_rng(seed)
    vocab = vocabularies(model)
    inits = {i.name for i in model.graph.initializer}
    out = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        want = spec.get(i.name, {})
        dtype = _dtype(i.type.tensor_type.elem_type)
        if "bind" in want:
            out[i.name] = np.array(want["bind"], dtype)
            continue
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in i.type.tensor_type.shape.dim]
        shape = want.get("shape") or dims
        out[i.name] = _draw(i.name, shape, dtype, want, vocab.get(i.name), rng)
    return out


def _draw(name, shape, dtype, want, vocab, rng):
    if "fill" in want:
        return np.full(shape, want["fill"], dtype)
    if np.issubdtype(dtype, np.floating):
        if want.get("draw") == "strokes":  # a text line: dark strokes on a light page (a recognizer reads noise as blank)
            return _strokes(shape, rng).astype(dtype)
        if "range" in want:  # an image of values in [low, high), say
            return rng.uniform(*want["range"], size=shape).astype(dtype)
        return rng.standard_normal(shape).astype(dtype)
    if "mask" in name.lower():
        x = np.zeros(shape, dtype)
        x[..., :max(1, (3 * shape[-1] + 3) // 4)] = 1 if shape else 0
        return x if shape else np.ones((), dtype)
    low, high = want["range"] if "range" in want else (0, vocab)
    if high is None:
        raise ValueError(f"integer input '{name}' indexes no embedding: give its range in the manifest "
                         '("range": [low, high))')
    x = rng.integers(low, high, size=shape).astype(dtype)
    if x.size and not x.any():
        x.flat[0] = high - 1
    return x


def _strokes(shape, rng):
    """1.0 with dark (0.0) rectangles the size of pen strokes over the last two axes."""
    x = np.ones(shape, np.float32)
    h, w = shape[-2], shape[-1]
    for _ in range(max(1, w // 6)):
        y0, x0 = rng.integers(h // 8, h - h // 8), rng.integers(0, w - 2)
        x[..., y0:y0 + rng.integers(2, max(3, h // 3)), x0:x0 + rng.integers(2, max(3, h // 4))] = 0.0
    return x


def _dtype(elem_type):
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def unchanged_outputs(a, b):
    """The indices of the outputs equal in `a` and `b` (a model's outputs
    for two different inputs): all of them when the model's outputs do not
    depend on its input."""
    return [k for k, (x, y) in enumerate(zip(a, b)) if np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)]
