"""Recurrent cells (LSTM, GRU, RNN): the recurrence over time as one layer.

legalize_onnx leaves the input projection (x W^T + Wb for every step at
once) to a dense layer; a cell layer computes what is left, step by step:

    gates_t = xw_t + h_{t-1} R^T + Rb      h_t, c_t from the gates

Its raw weights are R with the recurrent bias as one more column,
[dirs, gates * H, H + 1] (ONNX's gate order: LSTM i o f c, GRU z r h, RNN
one), so a transform packs both. The kernel is one PrimFunc written with
TVM's IR builder: the time loop is serial; inside each step a parallel loop
over (direction, block of hidden units), where the block's units of every
gate are accumulated in vectors. Its arguments: xw [seq, batch, dirs *
gates * H] (seq sized at run time: the time loop's extent is xw's own),
the weights, h0 and c0 [dirs, batch, H]; it writes Y [seq,
dirs, batch, H], Y_h and Y_c [dirs, batch, H] (GRU and RNN use Y_c as
scratch: the reset hidden state of a GRU whose reset comes first). A
quantized LSTM's kernel takes one more input, the scales [dirs, gates * H]
of its integer weights (each gate's sum is scaled once), and writes a
fourth output, h_q [dirs, batch, H + 2], its state quantized (then the
row's scale and zero point); its weights are the model's int8 values,
which the kernel may read as int8 in place (direct: a quarter of the bytes
each step streams), widening them in registers, or multiply as integers.

recurrent.packed   weights packed to [dirs, H / nb, H + 1, gates, nb]: per
                   reduction step one broadcast of h and one vector load
                   per gate (the cold plan weighs the packing)
recurrent.rows     the raw weights read in place, row by row: dot products
                   along the contiguous H (no transform at all)
recurrent.int8_dot a quantized LSTM's int8 weights times its state's uint8
                   levels, four products per int32 lane (AVX-512 VNNI
                   vpdpbusd), packed [dirs, H / nb, H / 4, gates, nb, 4];
                   its scale input [dirs, 2, gates * H]: the weights'
                   scales and their rows' sums (the zero point's share)
"""
import numpy as np

from .build import Widened
from .contract import Variant, register
from .generic import TILE_SCOPE
from .dense import vpdpbusd, vpmaddwd

def _blocks(spec, nb):
    return (spec.hidden + nb - 1) // nb


class _Cell(Variant):
    op = "recurrent"
    transform_rearranges = False  # the direct (narrow in place) form is not offered
    prescheduled = True
    symbolic = True  # a sequence sized at run time: the time loop's extent is xw's

    def compute(self, spec, x, wt, params):
        raise NotImplementedError("a cell is a PrimFunc (kernel), not a TE computation")

    def schedule(self, sch, block, spec, params):
        pass

    def kernel(self, spec, params, weights="float32"):
        """The cell's PrimFunc(xw, w, h0, c0, [scale,] y, y_h, y_c, [h_q]),
        its weights (w) of dtype `weights`."""
        return _kernel(spec, self, params, weights)


class Packed(_Cell):
    name = "recurrent.packed"

    def transformed_shape(self, spec, params):
        nb = params["nb"]
        return (spec.dirs, _blocks(spec, nb), spec.hidden + 1, spec.gates, nb)

    def transform(self, spec, params):
        from tvm import te, tirx

        nb, h = params["nb"], spec.hidden
        return lambda w: te.compute(
            self.transformed_shape(spec, params),
            lambda d, jb, k, g, v: tirx.if_then_else(jb * nb + v < h, w[d, g * h + tirx.min(jb * nb + v, h - 1), k],
                                                     tirx.const(0, spec.dtype)),
            name="cb_pack")

    def space(self, spec):
        lanes, regs = self.isa.lanes, self.isa.registers
        options = []
        for nb in (lanes // 2, lanes, 2 * lanes, 4 * lanes):
            vectors = max(1, nb // lanes)
            if spec.gates * vectors + vectors + 2 > regs or (nb < lanes and spec.hidden > nb):
                continue
            fill = spec.hidden / (_blocks(spec, nb) * nb)
            tasks = min(1.0, spec.dirs * _blocks(spec, nb) / 4)  # keep the threads busy
            chains = min(1.0, spec.gates * vectors / 8)  # independent sums hide the FMA latency (2 units x 4 cycles)
            options.append((fill * tasks * chains * min(nb, lanes) / lanes, {"nb": nb}))
        return [p for _, p in sorted(options, key=lambda o: -o[0])]


class Rows(_Cell):
    name = "recurrent.rows"

    def space(self, spec):
        return [{"nb": 8}, {"nb": 4}, {"nb": 16}]


class Int8Dot(_Cell):
    name = "recurrent.int8_dot"
    integer = True
    per = 4  # products per int32 lane
    lanes = 16  # int32 lanes of one vpdpbusd

    def applies(self, spec):
        return self.isa.int8_dot and spec.quantize_h and spec.int8_weights

    def transformed_shape(self, spec, params):
        nb, per = params["nb"], self.per
        return (spec.dirs, _blocks(spec, nb), (spec.hidden + per - 1) // per, spec.gates, nb, per)

    def transform(self, spec, params):
        from tvm import te, tirx

        nb, h = params["nb"], spec.hidden

        def pack(w):
            def value(d, jb, kk, g, v, ki):
                unit, k = jb * nb + v, kk * self.per + ki
                inside = tirx.all(unit < h, k < h)
                return tirx.if_then_else(inside, w[d, g * h + tirx.min(unit, h - 1), tirx.min(k, h - 1)],
                                         tirx.const(0, w.dtype))
            return te.compute(self.transformed_shape(spec, params), value, name="cb_pack")
        return pack

    def space(self, spec):
        options = []
        for nb in (32, 64, 16):
            if spec.gates * nb // 16 + 3 > self.isa.registers:
                continue
            fill = spec.hidden / (_blocks(spec, nb) * nb)
            tasks = min(1.0, spec.dirs * _blocks(spec, nb) / 4)
            options.append((fill * tasks, {"nb": nb}))
        return [p for _, p in sorted(options, key=lambda o: -o[0])]


class PairDot(Int8Dot):
    """recurrent.int8_dot's integers where there is no VNNI (AVX2): the
    levels and weights widened to int16, two products per int32 lane
    (vpmaddwd), exact as int8_dot (255 x 128 x 2 fits an int32 lane)."""
    name = "recurrent.pair_dot"
    per = 2  # products per int32 lane
    lanes = 8  # int32 lanes of one (256-bit) vpmaddwd

    def applies(self, spec):
        return self.isa.isa in ("avx2", "avx512") and spec.quantize_h and spec.int8_weights

    def space(self, spec):
        options = []
        for nb in (16, 8, 32):
            if spec.gates * nb // self.lanes + 4 > self.isa.registers:
                continue
            fill = spec.hidden / (_blocks(spec, nb) * nb)
            tasks = min(1.0, spec.dirs * _blocks(spec, nb) / 4)
            options.append((fill * tasks, {"nb": nb}))
        return [p for _, p in sorted(options, key=lambda o: -o[0])]


register(Packed.name, Packed)
register(Rows.name, Rows)
register(Int8Dot.name, Int8Dot)
register(PairDot.name, PairDot)

CELL_ATTR = "cb_cell"  # the placeholder kernel's attribute: its RecurrentSpec's fields, as JSON


def placeholder(spec):
    """The cell's kernel before a variant is chosen (import_relax makes the
    cell layer with it; select_variants replaces it): the raw weights read
    in place, one unit per task, four lanes (any vector unit has them),
    marked with its spec."""
    import dataclasses
    import json
    from types import SimpleNamespace

    func = _kernel(spec, Rows(SimpleNamespace(lanes=4, registers=16)), {"nb": 1})
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    fields["seq"] = spec.seq if isinstance(spec.seq, int) else None  # sized at run time: xw's
    return func.with_attr(CELL_ATTR, json.dumps(fields))


# ---- the kernel ----

def _kernel(spec, variant, params, weights="float32"):
    import dataclasses

    from tvm import tirx
    from tvm_ffi import structural_map
    from tvm.script.ir_builder import IRBuilder
    from tvm.tirx.script import builder as T

    own = {v: tirx.Var(v.name, "int64") for v in size_vars(spec.seq)}  # the PrimFunc's own, named as the dims
    if not isinstance(spec.seq, int):
        spec = dataclasses.replace(spec, seq=structural_map(spec.seq, (tirx.Var, lambda v: own.get(v, v))) if own
                                   else tirx.Var(spec.seq.name, "int64"))  # a variable itself: xw's shape binds it
    f32, h, dirs, gates = spec.dtype, spec.hidden, spec.dirs, spec.gates
    nb = params["nb"]
    blocks = _blocks(spec, nb)
    shape_w = (variant.transformed_shape(spec, params) if variant.transform(spec, params) is not None
               else spec.weight_shape)
    state = (dirs, spec.batch, h)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("main")
            factors = (dirs, 2, gates * h) if variant.integer else (dirs, gates * h)
            scale = (("scale", factors),) if spec.quantize_h else ()
            ins = (("xw", spec.input_shape), ("w", shape_w), ("h0", state), ("c0", state), *scale)
            outs = (("y", spec.output_shape), ("y_h", state), ("y_c", state)) + (
                (("h_q", (dirs, spec.batch, h + 2)),) if spec.quantize_h else ())
            b = {name: T.arg(name, T.Buffer(shape, weights if name == "w" else f32)) for name, shape in ins}
            for v in own.values():  # call_te's order: the inputs, the sizes, the outputs
                T.arg(v.name, v)
            b.update({name: T.arg(name, T.Buffer(shape, f32)) for name, shape in outs})
            with T.serial(0, spec.seq) as s:
                phases = ([(0, 1), (2,)] if spec.kind == "gru" and not spec.linear_before_reset
                          else [tuple(range(gates))])
                phases = [QUANTIZE] + phases if spec.quantize_h else phases
                for phase in phases:
                    if phase == QUANTIZE:  # a whole row per direction: its range found once
                        with T.parallel(0, dirs) as p:
                            _step(T, spec, variant, b, s, p, 0, h, phase)
                        continue
                    with T.parallel(0, dirs * blocks) as p:
                        _step(T, spec, variant, b, s, p // blocks, p % blocks, nb, phase)
            with T.parallel(0, dirs) as d:
                with T.serial(0, spec.batch) as n:
                    with T.vectorized(0, h) as i:
                        T.buffer_store(b["y_h"], b["y"][_last(spec, d), d, n, i], [d, n, i])
    return ib.get()


def size_vars(seq):
    """The variables a cell's kernel takes as int64 arguments after its
    buffers (call_tir's tir_vars), in name order: those of a sequence
    length sized at run time that is an expression (xw's shape binds one
    that is a variable)."""
    from tvm import tirx
    from tvm.tirx.analysis import undefined_vars

    return [] if isinstance(seq, (int, tirx.Var)) else sorted(undefined_vars(seq), key=lambda v: v.name)


QUANTIZE = "quantize"  # the quantized cell's phase that writes h_q


def _reversed(spec, d):
    from tvm import tirx

    return d == 1 if spec.dirs == 2 else tirx.const(spec.reverse, "bool")


def _last(spec, d):
    from tvm import tirx

    zero = tirx.const(0, "int32" if isinstance(spec.seq, int) else str(spec.seq.ty))
    return tirx.Select(_reversed(spec, d), zero, spec.seq - 1)


def _step(T, spec, variant, b, s, d, jb, nb, gates):
    """One time step of direction d for the hidden units of block jb:
    accumulate `gates` (all of them, or one phase of a GRU whose reset
    comes first), then update the state."""
    from tvm import tirx

    h = spec.hidden
    rev = _reversed(spec, d)
    t = tirx.Select(rev, spec.seq - 1 - s, s)
    tp = tirx.Select(rev, t + 1, t - 1)
    y = b["y"]

    def previous(n, k):  # h_{t-1}[n, k]
        return tirx.if_then_else(s == 0, b["h0"][d, n, k], y[tp, d, n, k])

    if gates == QUANTIZE:  # h_{t-1} as the quantized cell multiplies it, the direction's whole rows
        with T.serial(0, spec.batch) as n:
            value, level, q = _quantized_row(T, spec, variant.isa.lanes, lambda k: previous(n, k))
            with T.vectorized(0, h) as i:  # the integer variant multiplies the levels themselves
                T.buffer_store(b["h_q"], level(i) if variant.integer else value(i), [d, n, i])
            T.buffer_store(b["h_q"], q[2], [d, n, h])
            T.buffer_store(b["h_q"], q[3], [d, n, h + 1])
        return
    reset_phase = gates == (2,)
    source = (lambda n, k: b["y_c"][d, n, k]) if reset_phase else previous
    source = (lambda n, k: b["h_q"][d, n, k]) if spec.quantize_h else source
    with T.serial(0, spec.batch) as n:
        acc = T.decl_buffer((spec.gates, nb), spec.dtype, scope=TILE_SCOPE)
        w = b["w"] if b["w"].dtype == spec.dtype else Widened(b["w"])  # int8 in place: widened per load
        if variant.integer:
            _dot_int8(T, spec, variant, b, acc, (d, n, jb), nb, gates)
        else:
            _accumulate(T, spec, variant, w, acc, d, jb, nb, gates, lambda k: source(n, k))
        if spec.quantize_h and not variant.integer:  # the integer weights' scales, once per sum
            for g in gates:
                with T.vectorized(0, nb) as v:
                    row = g * h + tirx.min(jb * nb + v, h - 1)
                    T.buffer_store(acc, acc[g, v] * b["scale"][d, row], [g, v])
        with (T.vectorized if h % nb == 0 else T.serial)(0, nb) as v:
            i = jb * nb + v
            if h % nb == 0:
                _update(T, spec, b, acc, gates, (d, n, t, i, v), s == 0, previous(n, i))
            else:
                with T.If(i < h):
                    with T.Then():
                        i = tirx.min(i, h - 1)
                        _update(T, spec, b, acc, gates, (d, n, t, i, v), s == 0, previous(n, i))


def _quantized_row(T, spec, lanes, hk):
    """h_{t-1}'s row as onnxruntime's quantized LSTM multiplies it: quantized
    to uint8 over the row (DynamicQuantizeLinear: the range through 0 in
    255 steps, the zero point and values rounded half to even), each value
    then (q - zero point) * scale; zeros where the row is all zero. Each
    step's first phase writes it to h_q, a fourth output (scratch), a task
    per direction; the range is found per lane, then across the lanes."""
    from tvm import tirx

    f32 = spec.dtype
    q = T.decl_buffer((4,), f32, scope=TILE_SCOPE)  # min, max, then scale, zero point
    part = T.decl_buffer((2, lanes), f32, scope=TILE_SCOPE)  # min and max per lane
    with T.vectorized(0, lanes) as l:
        T.buffer_store(part, tirx.const(0, f32), [0, l])
        T.buffer_store(part, tirx.const(0, f32), [1, l])
    chunks, tail = divmod(spec.hidden, lanes)
    if chunks:
        with T.serial(0, chunks) as c:
            with T.vectorized(0, lanes) as l:
                T.buffer_store(part, tirx.min(part[0, l], hk(c * lanes + l)), [0, l])
                T.buffer_store(part, tirx.max(part[1, l], hk(c * lanes + l)), [1, l])
    for j in range(tail):
        T.buffer_store(part, tirx.min(part[0, j], hk(chunks * lanes + j)), [0, j])
        T.buffer_store(part, tirx.max(part[1, j], hk(chunks * lanes + j)), [1, j])
    low, high = part[0, 0], part[1, 0]
    for j in range(1, lanes):
        low, high = tirx.min(low, part[0, j]), tirx.max(high, part[1, j])
    T.buffer_store(q, low, [0])
    T.buffer_store(q, high, [1])
    T.buffer_store(q, (q[1] - q[0]) / tirx.const(255, f32), [2])
    T.buffer_store(q, tirx.Select(q[2] > 0, tirx.min(tirx.max(tirx.nearbyint(-q[0] / tirx.max(q[2], tirx.const(
        1e-30, f32))), tirx.const(0, f32)), tirx.const(255, f32)), tirx.const(0, f32)), [3])
    zero, top = tirx.const(0, f32), tirx.const(255, f32)

    def level(k):
        return tirx.min(tirx.max(tirx.nearbyint(hk(k) / tirx.max(q[2], tirx.const(1e-30, f32))) + q[3], zero), top)

    def value(k):
        return tirx.Select(q[2] > 0, (level(k) - q[3]) * q[2], zero)

    return value, level, q


def _dot_int8(T, spec, variant, b, acc, at, nb, gates):
    """acc[g, v] for g in `gates` from the integers (recurrent.int8_dot,
    pair_dot): the row's uint8 levels (h_q) times the int8 weights, four
    products per int32 lane (vpdpbusd) or, widened to int16, two
    (vpmaddwd), then (sum - zero point x the weight row's sum) x the row's
    scale x the weights' scale."""
    from tvm import tirx

    d, n, jb = at
    h, hq, w, f = spec.hidden, b["h_q"], b["w"], b["scale"]
    per, lanes = variant.per, variant.lanes
    level = "uint8" if per == 4 else "int16"
    groups, chunks = (h + per - 1) // per, (h + 15) // 16
    levels = T.decl_buffer((chunks * 16,), level, scope=TILE_SCOPE)
    with T.serial(0, chunks) as c:
        with T.vectorized(0, 16) as l:
            k = c * 16 + l
            T.buffer_store(levels, tirx.if_then_else(k < h, tirx.Cast(level, hq[d, n, tirx.min(k, h - 1)]),
                                                     tirx.const(0, level)), [k])
    total = T.decl_buffer((spec.gates, nb), "int32", scope=TILE_SCOPE)
    for g in gates:
        with T.vectorized(0, nb) as v:
            T.buffer_store(total, tirx.const(0, "int32"), [g, v])
    with T.serial(0, groups) as kk:
        these = levels.vload([kk * per], f"{level}x{per}")
        for g in gates:
            for c in range(0, nb, lanes):
                here = total.vload([g, c], f"int32x{lanes}")
                weights = w.vload([d, jb, kk, g, c, 0], f"int8x{lanes * per}")
                dot = vpdpbusd(here, these, weights) if per == 4 else here + vpmaddwd(these, weights)
                T.buffer_store(total, dot, [g, tirx.Ramp(c, 1, lanes)])
    for g in gates:
        with T.vectorized(0, nb) as v:
            row = g * h + tirx.min(jb * nb + v, h - 1)
            centred = tirx.Cast(spec.dtype, total[g, v]) - hq[d, n, h + 1] * f[d, 1, row]
            T.buffer_store(acc, centred * hq[d, n, h] * f[d, 0, row], [g, v])


def _accumulate(T, spec, variant, w, acc, d, jb, nb, gates, hk):
    """acc[g, v] = Rb + sum_k h[k] R[g, jb * nb + v, k] for g in `gates`."""
    from tvm import tirx

    h = spec.hidden
    if isinstance(variant, Packed):
        for g in gates:
            with T.vectorized(0, nb) as v:
                T.buffer_store(acc, w[d, jb, h, g, v], [g, v])
        with T.serial(0, h) as k:
            x = hk(k)
            for g in gates:
                with T.vectorized(0, nb) as v:
                    T.buffer_store(acc, acc[g, v] + x * w[d, jb, k, g, v], [g, v])
        return
    lanes = variant.isa.lanes
    chunks, tail = divmod(h, lanes)
    part = T.decl_buffer((lanes,), spec.dtype, scope=TILE_SCOPE)
    for g in gates:
        with T.serial(0, nb) as v:
            row = g * h + tirx.min(jb * nb + v, h - 1)
            with T.vectorized(0, lanes) as l:
                T.buffer_store(part, tirx.const(0, spec.dtype), [l])
            if chunks:
                with T.serial(0, chunks) as c:
                    with T.vectorized(0, lanes) as l:
                        k = c * lanes + l
                        T.buffer_store(part, part[l] + hk(k) * w[d, row, k], [l])
            for j in range(tail):
                k = chunks * lanes + j
                T.buffer_store(part, part[j] + hk(k) * w[d, row, k], [j])
            total = w[d, row, h]
            for j in range(lanes):
                total = total + part[j]
            T.buffer_store(acc, total, [g, v])


def _update(T, spec, b, acc, gates, at, first, hp):
    """The state update of unit i (at: direction, batch row, time, unit,
    lane) from its accumulated gates; hp: h_{t-1} of the unit."""
    from tvm import tirx

    d, n, t, i, v = at
    h, x = spec.hidden, b["xw"]
    col = d * spec.gates * h + i

    def xg(g):
        return x[t, n, col + g * h]

    def a(g):
        return xg(g) + acc[g, v]

    if spec.kind == "lstm":  # i o f c
        cp = tirx.if_then_else(first, b["c0"][d, n, i], b["y_c"][d, n, i])
        c = sigmoid(a(2)) * cp + sigmoid(a(0)) * tanh(a(3))
        # c is an expression reading y_c: h is stored first, while y_c still holds c_{t-1}
        T.buffer_store(b["y"], sigmoid(a(1)) * tanh(c), [t, d, n, i])
        T.buffer_store(b["y_c"], c, [d, n, i])
    elif spec.kind == "rnn":
        T.buffer_store(b["y"], _activation(spec.activation, a(0)), [t, d, n, i])
    elif gates == (0, 1):  # GRU, reset first, phase 1: z kept in y, r * h_{t-1} in y_c
        T.buffer_store(b["y"], sigmoid(a(0)), [t, d, n, i])
        T.buffer_store(b["y_c"], sigmoid(a(1)) * hp, [d, n, i])
    else:
        if gates == (2,):  # phase 2: acc holds (r * h) Rh^T + Rbh
            z, cand = b["y"][t, d, n, i], tanh(a(2))
        else:  # linear before reset: r * (h Rh^T + Rbh)
            z, cand = sigmoid(a(0)), tanh(xg(2) + sigmoid(a(1)) * acc[2, v])
        T.buffer_store(b["y"], cand + z * (hp - cand), [t, d, n, i])


def _activation(name, x):
    from tvm import tirx

    if name == "Relu":
        return tirx.max(x, tirx.const(0, "float32"))
    return sigmoid(x) if name == "Sigmoid" else tanh(x)


def exp(x):
    """e^x (float32) in arithmetic LLVM vectorizes, where the exp intrinsic
    is one libm call per lane (an LSTM's five per unit and step were most
    of its time): x = n ln2 + f with |f| <= ln2 / 2, e^f by its series to
    f^7 (Cephes' expf coefficients, relative error about 1e-7), 2^n put in
    the exponent's bits; x clamped to +-87 (e^x and 2^n stay finite)."""
    from tvm import tirx

    def c(v):
        return tirx.const(v, "float32")

    x = tirx.max(tirx.min(x, c(87.0)), c(-87.0))
    n = tirx.floor(x * c(1.44269504088896341) + c(0.5))
    f = x - n * c(0.693359375) + n * c(2.12194440e-4)  # ln2 in two parts: n ln2 exact to fp32
    poly = c(1.9875691500e-4)
    for k in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        poly = poly * f + c(k)
    two_n = tirx.reinterpret("float32", tirx.shift_left(tirx.Cast("int32", n) + 127, 23))
    return (poly * f * f + f + c(1.0)) * two_n


def sigmoid(x):
    """1 / (1 + e^-x) through exp(): absolute error about 1e-7."""
    from tvm import tirx

    one = tirx.const(1.0, "float32")
    return one / (one + exp(-x))


def tanh(x):
    """1 - 2 / (e^2x + 1) through exp(): absolute error about 2e-7."""
    from tvm import tirx

    one = tirx.const(1.0, "float32")
    return one - tirx.const(2.0, "float32") / (exp(x + x) + one)


# ---- reference ----

def reference(spec, xw, w, h0, c0, scale=None):
    """(Y, Y_h, Y_c) in numpy from the raw weights [dirs, gates * H, H + 1]
    (Y_c: LSTM's cell state; zeros for GRU and RNN); a quantized cell's
    each scaled by `scale` [dirs, gates * H] per row."""
    h = spec.hidden
    w = w if scale is None else w * scale[:, :, None]
    y = np.zeros(spec.output_shape, np.float32)
    yh, yc = np.zeros_like(h0), np.zeros_like(c0)
    act = {"Tanh": np.tanh, "Relu": lambda v: np.maximum(v, 0), "Sigmoid": _sigmoid}[spec.activation]
    for d in range(spec.dirs):
        r, rb = w[d, :, :h], w[d, :, h]
        hp, cp = h0[d], c0[d]
        steps = range(spec.seq - 1, -1, -1) if (spec.reverse or d == 1) else range(spec.seq)
        for t in steps:
            x = xw[t, :, d * spec.gates * h:(d + 1) * spec.gates * h]
            if spec.kind == "lstm":
                g = x + (_fake_quantized(hp) if spec.quantize_h else hp) @ r.T + rb
                i, o, f, c = (g[:, k * h:(k + 1) * h] for k in range(4))
                cp = _sigmoid(f) * cp + _sigmoid(i) * np.tanh(c)
                hp = _sigmoid(o) * np.tanh(cp)
            elif spec.kind == "rnn":
                hp = act(x + hp @ r.T + rb)
            else:
                z = _sigmoid(x[:, :h] + hp @ r[:h].T + rb[:h])
                rg = _sigmoid(x[:, h:2 * h] + hp @ r[h:2 * h].T + rb[h:2 * h])
                if spec.linear_before_reset:
                    cand = np.tanh(x[:, 2 * h:] + rg * (hp @ r[2 * h:].T + rb[2 * h:]))
                else:
                    cand = np.tanh(x[:, 2 * h:] + (rg * hp) @ r[2 * h:].T + rb[2 * h:])
                hp = (1 - z) * cand + z * hp
            y[t, d] = hp
        yh[d] = hp
        if spec.kind == "lstm":
            yc[d] = cp
    return y, yh, yc


def _fake_quantized(h):
    """Each row of h quantized to uint8 as DynamicQuantizeLinear does, then
    (q - zero point) * scale."""
    out = np.zeros_like(h)
    for n, row in enumerate(h):
        lo, hi = min(row.min(), 0.0), max(row.max(), 0.0)
        scale = np.float32((hi - lo) / 255)
        if scale > 0:
            zero = np.clip(np.rint(-lo / scale), 0, 255)
            out[n] = (np.clip(np.rint(row / scale) + zero, 0, 255) - zero) * scale
    return out


def _sigmoid(v):
    return 1 / (1 + np.exp(-v))
