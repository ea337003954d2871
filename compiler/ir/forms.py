"""Weight precisions and weight forms: the one vocabulary the passes, the
bundle, the cost table, the simulator and the scheduler share.

A layer's weights are stored at a precision (PRECISIONS: fp32, or a NARROW
one widened to fp32 on the first run or read narrow in place) and in a
form: "raw" (the model's weights; the layer's transform runs on the first
run), "cached" (transformed at compile time) or "direct" (narrow weights
read in place by the layer's own kernel). The cost table, the simulator
and the scheduler name a (form, precision) pair with one word, the cost
form: raw, cached, fp16 (cached, fp16), int8 (raw, int8), direct (direct,
fp16), direct_int8 (direct, int8).
"""
# the bundle's dtype table: index = schema DType
DTYPES = ["float32", "float16", "float64", "int8", "int16", "int32", "int64",
          "uint8", "uint16", "uint32", "uint64", "bool"]

# weight precisions a bundle can store (compiler/passes/plan_weights.py) and their dtypes
PRECISIONS = {"fp32": "float32", "fp16": "float16", "int8": "int8"}
NARROW = ("fp16", "int8")
# what a bundle may store: the precisions, and an integer convolution's int16
# (8-bit weights less their zero point, conv2d.pair_blocked; never asked for)
STORED = {**PRECISIONS, "int16": "int16"}
PRECISION_OF_DTYPE = {DTYPES.index(d): p for p, d in STORED.items()}  # schema DType -> precision

# a narrow precision's direct form (weights read in place by their own kernel)
DIRECT_FORMS = {"fp16": "direct", "int8": "direct_int8"}

# a narrow cost form -> (form, precision) of the plan
_NARROW_FORMS = {"fp16": ("cached", "fp16"), "int8": ("raw", "int8"),
                 **{d: ("direct", p) for p, d in DIRECT_FORMS.items()}}

# the cost table's byte count of each cost form
FORM_BYTES = {"raw": "raw_bytes", "cached": "transformed_bytes", "fp16": "fp16_bytes", "int8": "int8_bytes",
              **{d: f"{d}_bytes" for d in DIRECT_FORMS.values()}}


def cost_form(form, precision, narrow_costed=True):
    """The cost form of weights stored in `form` at `precision`.
    `narrow_costed`: whether the cost table has the layer's narrow forms
    (variant layers only; a generic layer's narrow weights cost as fp32)."""
    if form == "direct":
        return DIRECT_FORMS.get(precision, f"direct_{precision}")
    return precision if precision in NARROW and narrow_costed else form


def is_narrow_form(cost):
    """Whether a cost form stores the weights narrow."""
    return cost in _NARROW_FORMS


def is_direct(cost):
    return cost in DIRECT_FORMS.values()


def plan_form(cost):
    """(form, precision) of a cost form: the inverse of cost_form."""
    return _NARROW_FORMS.get(cost, (cost, "fp32"))
