"""The generic schedule: every layer without a variant, and the variants'
non-anchor blocks (pooling, elementwise, reductions, data movement, weight
transforms). Vector widths are always passed in (`lanes`).

A kernel sized at run time has symbolic extents. The schedule's heuristic
choices (tile widths, whether a read is affine, whether a loop is worth
running in parallel) are made at the sizes the plan is weighed for:
`typical_sizes` holds them ({variable name: value}, set by the pass while
it schedules) and `size(extent)` reads an extent there. What correctness
rests on (a split into whole vectors) is proved for every size instead:
`multiple(extent, m)`."""
import contextlib
import contextvars

import numpy as np
import tvm
from tvm import s_tir, tirx

_TYPICAL = contextvars.ContextVar("typical_sizes", default={})

# The scope of kernels' register tiles and scratch on the CPU: TVM gives a
# "global" buffer of constant size under 1 KB a stack slot, which LLVM
# promotes to registers, and a "local" one a call of the runtime's workspace
# allocator at every entry to the loop that holds it (for a max pool's
# vector of 8 outputs: 385 -> 66 us at 64 x 111 x 111, AVX2, 2 threads).
TILE_SCOPE = "global"


@contextlib.contextmanager
def typical_sizes(sizes):
    """Schedule with the run-time sizes at these values ({variable name: value})."""
    token = _TYPICAL.set(dict(sizes))
    try:
        yield
    finally:
        _TYPICAL.reset(token)


def size(extent):
    """An extent's value: a constant's, or a symbolic one's at the typical sizes."""
    if isinstance(extent, int) or isinstance(extent, tirx.IntImm):
        return int(extent)
    from tvm.sym.analyzer import Analyzer
    from tvm.tirx.analysis import undefined_vars

    ana, sizes = Analyzer(), _TYPICAL.get()
    for v in undefined_vars(extent):
        if v.name not in sizes:
            raise ValueError(f"extent {extent}: no typical size for '{v.name}'")
        ana.bind(v, tirx.IntImm(str(v.ty), sizes[v.name]))
    return int(ana.simplify(extent))

def multiple(extent, m):
    """Whether `extent` is a multiple of `m` at every size (a constant's
    remainder; a symbolic one's by the simplifier's modular analysis:
    W * 32 is a multiple of 16, W * 2 is not known to be)."""
    if isinstance(extent, int) or isinstance(extent, tirx.IntImm):
        return int(extent) % m == 0
    from tvm.sym.analyzer import Analyzer

    mod = Analyzer().modular_set(extent)
    return mod.coeff % m == 0 and mod.base % m == 0


def proved(condition):
    """Whether a condition on extents holds at every size (a Python bool as it is)."""
    if isinstance(condition, bool):
        return condition
    from tvm.sym.analyzer import Analyzer

    return bool(Analyzer().can_prove(condition))


def _fusable(sch, loops):
    """The outer loops to fuse into one parallel loop: all of them, or where
    some are sized at run time the leading constant ones (at least one): an
    index taken apart by a symbolic extent (fused // (H * 4)) hides from the
    schedule which rows a block writes, and later blocks cannot be placed."""
    if all(_static(sch.get(lp).extent) for lp in loops):
        return loops
    lead = next((k for k, lp in enumerate(loops) if not _static(sch.get(lp).extent)), len(loops))
    if lead and all(int(sch.get(lp).extent) == 1 for lp in loops[:lead]):
        return [loops[lead]]  # unit leading axes (a batch of one): the first sized at run time is the parallel one
    return loops[:max(lead, 1)]


def _of(var, n):
    """The value n in `var`'s integer type (an int64 axis of a kernel sized at run time)."""
    return tirx.IntImm(str(var.ty), int(n))


def _static(extent):
    return isinstance(extent, int) or isinstance(extent, tirx.IntImm)


def blocks_in_order(sch):
    root = sch.get_sblock("root") if _has_root(sch) else None
    return list(sch.get_child_blocks(root)) if root is not None else []


def _has_root(sch):
    try:
        sch.get_sblock("root")
        return True
    except Exception:
        return False


def vectorize_inner(sch, block, lanes):
    loops = sch.get_loops(block)
    if not loops:
        return
    inner = loops[-1]
    extent, whole = _extent(sch, inner), multiple(sch.get(inner).extent, lanes)
    if extent is None or extent < 2:
        return
    if whole and extent > lanes:
        _, inner = sch.split(inner, [None, lanes])
    if whole or (extent <= 16 and _static(sch.get(inner).extent)):
        sch.vectorize(inner)


def _extent(sch, loop):
    try:
        return size(sch.get(loop).extent)
    except Exception:
        return None


# A parallel loop costs a launch of the pool and moves the layer's data
# between cores' caches (a few microseconds: a 6,144-value Relu ran 8.6 us
# per call on two threads, 5.1 us on one); below this many iterations
# (scalar, all loops of the block) a block runs on the launching thread.
MIN_PARALLEL_WORK = 32768


def _parallel(sch, block, loop, work=None):
    """Run `loop` in parallel unless `block` (of `work` iterations, where
    given) is too little work for it."""
    ext = [_extent(sch, lp) for lp in sch.get_loops(block)] if work is None else [work]
    if None in ext or _product(ext) >= MIN_PARALLEL_WORK:
        sch.parallel(loop)


def generic(sch, lanes, registers=16):
    """A reasonable schedule for non-anchor kernels (pooling, elementwise,
    reductions, data movement, weight transforms): inline intermediate
    injective stages (pads, reshapes, broadcasts) into their consumers, then
    run the outer loops of each remaining block in parallel and vectorize
    contiguous inner loops of elementwise blocks; a reduction whose output
    rows are whole vectors (a MatMul of two activations, a sum over
    channels) is register-blocked (`reduction_block`), one over whole
    vectors of its contiguous last axes vectorized per lane
    (`row_reduction_block`), one of a whole tensor to a few values cut into
    parallel chunks too (`whole_reduction_block`)."""
    blocks = blocks_in_order(sch)
    for b in blocks[:-1]:
        try:
            sch.compute_inline(b)
        except s_tir.ScheduleError:
            pass
    for block in blocks_in_order(sch):
        try:
            if not (whole_reduction_block(sch, block, lanes) or reduction_block(sch, block, lanes, registers)
                    or row_reduction_block(sch, block, lanes)):
                generic_block(sch, block, lanes)
        except s_tir.ScheduleError:
            pass
    for block in blocks_in_order(sch):
        _init_first(sch, block)


def _init_first(sch, block):
    """A reduction over an extent set at run time, which may be empty (a
    sum over a count of 0): its init before its loops (inside the parallel
    ones), where TVM's lowering puts it at the first step, which an empty
    reduction never takes."""
    from tvm import tirx

    loops = sch.get_loops(block)
    if sch.get(block).init is None or all(_static(sch.get(lp).extent) for lp in loops):
        return
    first = next((lp for lp in loops if sch.get(lp).kind != tirx.ForKind.PARALLEL), None)
    if first is not None:
        try:
            sch.decompose_reduction(block, first)
        except s_tir.ScheduleError:
            pass


def _read_along(sch, block, axis):
    """Whether some operand of `block`'s reduction (an input read along a
    reduced axis) is read along its iteration axis `axis` in its last
    (contiguous) dimension (a per-row value, such as a mean, is not)."""
    from tvm.tirx.analysis import undefined_vars

    b = sch.get(block)
    var = b.iter_vars[axis].var
    reduced = [iv.var for iv in b.iter_vars if iv.iter_type == 2]

    def uses(expr, vs):
        return any(u.same_as(v) for u in undefined_vars(expr) for v in vs)

    return any(uses(r.region[-1].min, [var]) and any(uses(d.min, reduced) for d in r.region)
               for r in _reads(sch, block))


def _reads(sch, block):
    """`block`'s input regions (not those of buffers it writes)."""
    b = sch.get(block)
    written = {w.source.name for w in b.writes}
    return [r for r in b.reads if r.source.name not in written and r.region]


def _gathers_along(sch, block, axis):
    """Whether some input of `block` is read at a stride other than 0 or 1
    along its iteration axis `axis` (a pixel shuffle's x // 2 and x % 2, a
    transpose's column read down a row, a nearest Resize's floor(x * s)),
    as far as the simplifier proves with every axis in its range: a vector
    of such reads is gathered one lane at a time, slower than the scalar
    loop."""
    from tvm.ir import Range
    from tvm.sym.analyzer import Analyzer
    from tvm.tirx.analysis import undefined_vars

    ivs = sch.get(block).iter_vars
    var = ivs[axis].var
    ext = size(ivs[axis].dom.extent)
    at = tirx.Var("at", str(ivs[axis].dom.extent.ty))

    def shifted(expr, offset):  # expr with the axis at `at + offset`
        ana = Analyzer()
        ana.bind(var, at + offset)
        return ana.simplify(expr)

    ana = Analyzer()
    for iv in ivs:
        if not iv.var.same_as(var):
            ana.bind(iv.var, iv.dom)
    ana.bind(at, Range.from_min_extent(0, max(ext - 1, 1)))
    for r in _reads(sch, block):
        for d, rng in enumerate(r.region):
            if not any(u.same_as(var) for u in undefined_vars(rng.min)):
                continue
            step = ana.simplify(shifted(rng.min, 1) - shifted(rng.min, 0))
            if d < len(r.region) - 1 or not (isinstance(step, tirx.IntImm) and step.value in (0, 1)):
                return True
    return False


def _copies(sch, block):
    """Whether `block` only moves values (its store is a load, a cast of one,
    or a load or a constant by a condition: a transpose, a layout change, a
    pad, a nearest Resize), not computes with them: a gathered vector of
    such a block is all loads; one that computes (a linear Resize) keeps its
    arithmetic in vectors."""
    def moved(v):
        if isinstance(v, tvm.ir.TensorLoad):
            return True
        if isinstance(v, tirx.Cast):
            return moved(v.value)
        if isinstance(v, tvm.ir.Call) and v.op.name.endswith("if_then_else"):
            return all(moved(a) or isinstance(a, (tirx.FloatImm, tirx.IntImm)) for a in v.args[1:])
        return False

    store = sch.get(block).body
    return isinstance(store, tirx.stmt.BufferStore) and moved(store.value)


def _mostly_contiguous(sch, block, axis, samples=4):
    """Whether every input of `block` is read at consecutive addresses
    along `axis` for most steps (checked at a few points of the other
    axes: a blocked layout's channels are consecutive but for the step
    from one block to the next, which no simplifier proves)."""
    from tvm.sym.analyzer import Analyzer

    ivs = sch.get(block).iter_vars
    rng = np.random.default_rng(0)
    reads = _reads(sch, block)
    steps, ext = [], size(ivs[axis].dom.extent)
    for _ in range(samples):
        point = {iv.var: int(rng.integers(size(iv.dom.min), size(iv.dom.min) + size(iv.dom.extent))) for iv in ivs}
        for k in range(min(ext - 1, 16)):
            addrs = []
            for v in (k, k + 1):
                ana = Analyzer()
                for iv in ivs:
                    ana.bind(iv.var, _of(iv.var, v if iv.var.same_as(ivs[axis].var) else point[iv.var]))
                addrs.append([_flat(ana, r) for r in reads])
            steps += [b - a for a, b in zip(*addrs) if a is not None and b is not None]
    return bool(steps) and sum(s in (0, 1) for s in steps) * 4 >= len(steps) * 3


def _affine_lanes(sch, block, axis, lanes, samples=3):
    """The widest vector, `lanes` or a power-of-two fraction of it, over
    which every input of `block` is read at one constant step per vector
    along `axis` (from a vector-aligned start; sampled at a few points of the
    other axes). An index with a shorter period (x % 8 under 16 lanes, a
    rotary embedding's halves) is not one vector access at the full width;
    LLVM's code for such a 16-lane gather was seen wrong on AVX-512 (values
    of the other half) while 8 lanes were right. `lanes` where no narrower
    width helps (a nearest Resize's floor(x * s) has no period)."""
    from tvm.sym.analyzer import Analyzer

    ivs = sch.get(block).iter_vars
    ext, reads = size(ivs[axis].dom.extent), _reads(sch, block)
    rng = np.random.default_rng(0)
    points = [{iv.var: int(rng.integers(size(iv.dom.min), size(iv.dom.min) + size(iv.dom.extent))) for iv in ivs}
              for _ in range(samples)]
    addrs = []  # per point, per k along the axis: the reads' flat offsets
    for point in points:
        row = []
        for k in range(min(ext, 2 * lanes)):
            ana = Analyzer()
            for iv in ivs:
                ana.bind(iv.var, _of(iv.var, k if iv.var.same_as(ivs[axis].var) else point[iv.var]))
            row.append([_flat(ana, r) for r in reads])
        addrs.append(row)

    def affine(w):
        for row in addrs:
            for g in range(0, len(row) - w + 1, w):
                for j in range(len(reads)):
                    col = [row[g + i][j] for i in range(w)]
                    if None in col:
                        return True  # not a constant address: the simplifier's proof decides (_gathers_along)
                    if len({b - a for a, b in zip(col, col[1:])}) > 1:
                        return False
        return True

    width = lanes
    while width > 2 and not affine(width):
        width //= 2
    return width if affine(width) else lanes


def _flat(ana, region):
    """The flat element offset of `region`'s first element under `ana`'s bindings (None: not a constant)."""
    offset = 0
    for rng, dim in zip(region.region, region.source.shape):
        v = ana.simplify(rng.min)
        if not isinstance(v, tirx.IntImm):
            return None
        offset = offset * size(dim) + v.value
    return offset


def _transposed(sch, block, loops, spatial, lanes):
    """A block that gathers along its last axis (a transpose, a layout
    change, a pixel shuffle) in tiles: `lanes` values of the last axis
    inside the nearest outer axis along which the inputs are read
    contiguously, so each cache line read serves `lanes` outputs in a row
    and each line written is written whole. The tile is unrolled (a vector
    of gathered lanes costs more than the scalar loads). Returns the loops
    left outside the tile (to run in parallel), or None when no such axis."""
    axis = next((a for a in range(spatial - 2, -1, -1)
                 if _extent(sch, loops[a]) > 1 and _mostly_contiguous(sch, block, a)), None)
    if axis is None:
        return None
    io, ii = sch.split(loops[spatial - 1], [None, lanes])
    outer = [lp for k, lp in enumerate(loops[:spatial - 1]) if k != axis]
    sch.reorder(*outer, io, loops[axis], ii)
    sch.unroll(ii)
    return outer + [io]


def row_reduction_block(sch, block, lanes):
    """Schedule a reduction over its last, contiguous axes (a softmax's max
    and sum, a normalization's mean, a global pooling over H and W fused
    into one) whose extent is a multiple of the vector: per parallel row,
    one partial result per lane accumulated over the row's vectors
    (rfactor), then the lanes combined. A row sized at run time that is
    not a multiple of the vector takes the widest part of one it is a
    multiple of at every size, down to 4 lanes (a mean over 6 x 2W: 4
    lanes, 4.5x faster than the scalar sum it had). False (nothing done)
    for other blocks."""
    spatial, ext = _reduction_shape(sch, block)
    if spatial is None or spatial == 0:
        return False
    lanes = _row_lanes(sch, block, spatial, lanes)
    if not _reduced_multiple(sch, block, spatial, lanes) or ext[-1] < 2 * lanes:
        return False
    loops = _fused_reduction(sch, block, spatial)
    _, ki = sch.split(loops[-1], [None, lanes])
    partial = sch.rfactor(ki, spatial)
    outer = sch.get_loops(block)[:spatial]
    par = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    _parallel(sch, partial, par)
    _lanes_in_registers(sch, partial, par)
    return True


def whole_reduction_block(sch, block, lanes, chunks=(16, 8, 4, 2)):
    """Schedule a reduction of a whole tensor to a few values (a quantizer's
    min and max, a global sum): the reduced axes as one, cut into parallel
    chunks (rfactor), each chunk accumulated per lane in registers (a
    second rfactor), then the partials combined. Taken where the output
    has at most 4 values and every chunk holds at least 4 vectors. False
    (nothing done) for other blocks."""
    spatial, ext = _reduction_shape(sch, block)
    if spatial is None or _product(ext[:spatial]) > 4:
        return False
    count = ext[-1]
    p = next((c for c in chunks if _reduced_multiple(sch, block, spatial, c * lanes) and count >= 4 * c * lanes), None)
    if p is None:
        return False
    red = _fused_reduction(sch, block, spatial)[-1]
    po, _, _ = sch.split(red, [p, None, lanes])
    chunk = sch.rfactor(po, spatial)
    loops = sch.get_loops(chunk)
    _parallel(sch, chunk, loops[spatial])
    partial = sch.rfactor(loops[-1], spatial + 1)
    _lanes_in_registers(sch, partial, loops[spatial])
    return True


def _reduction_shape(sch, block):
    """(number of output loops, loop extents with the trailing reduced loops'
    extents multiplied into one) of a block whose loops are its iterators,
    output axes first; (None, None) for other blocks."""
    loops = sch.get_loops(block)
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    spatial = next((k for k, kind in enumerate(kinds) if kind != 0), len(kinds))
    ext = [_extent(sch, lp) for lp in loops]
    if (spatial == len(kinds) or len(loops) != len(kinds) or any(k != 2 for k in kinds[spatial:])
            or None in ext):
        return None, None
    return spatial, ext[:spatial] + [_product(ext[spatial:])]


def _reduced_multiple(sch, block, spatial, m):
    """Whether the block's reduced loops (after its `spatial` output loops) hold a multiple of m iterations."""
    return multiple(_product([sch.get(lp).extent for lp in sch.get_loops(block)[spatial:]]), m)


def _row_lanes(sch, block, spatial, lanes):
    """The vector a row reduction sums in: the target's, or for a row sized
    at run time that is not a multiple of it, the widest half or quarter (4
    lanes at least) it is a multiple of at every size."""
    fixed = all(isinstance(sch.get(lp).extent, tirx.IntImm) for lp in sch.get_loops(block)[spatial:])
    if fixed or _reduced_multiple(sch, block, spatial, lanes):
        return lanes
    return next((w for w in (lanes // 2, lanes // 4) if w >= 4 and _reduced_multiple(sch, block, spatial, w)), lanes)


def _product(values):
    out = 1
    for v in values:
        out *= v
    return out


def _fused_reduction(sch, block, spatial):
    """The block's loops with its reduced ones fused into the last."""
    loops = sch.get_loops(block)
    if len(loops) > spatial + 1:
        return list(loops[:spatial]) + [sch.fuse(*loops[spatial:])]
    return list(loops)


def _lanes_in_registers(sch, partial, loop):
    """An rfactor block whose last loop is the lane (its new output axis) and
    the one before it the reduction: under `loop`, accumulated in a local
    vector, reduction outer, lanes vectorized."""
    sch.compute_at(partial, loop)
    sch.set_scope(partial, 0, TILE_SCOPE)
    lane, step = sch.get_loops(partial)[-2:]
    sch.reorder(step, lane)
    sch.vectorize(lane)
    sch.decompose_reduction(partial, step)


def reduction_block(sch, block, lanes, registers):
    """Schedule a reduction block whose loops are its output's axes, then the
    reduced ones, and whose last output axis is a multiple of the vector:
    a tile of mb rows x nv vectors of that axis per parallel task,
    accumulated in registers (a local tile) over the reduction, each step
    one broadcast per row and one load per vector (as dense.packed_gemm,
    here for operands that are both activations). False (nothing done) for
    other blocks."""
    loops = sch.get_loops(block)
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    spatial = next((k for k, kind in enumerate(kinds) if kind != 0), len(kinds))
    ext = [_extent(sch, lp) for lp in loops]
    if (spatial == 0 or spatial == len(kinds) or len(loops) != len(kinds) or any(k != 2 for k in kinds[spatial:])
            or None in ext or 2 * ext[spatial - 1] < lanes):  # padded to one vector: at most half wasted
        return False
    if not _read_along(sch, block, spatial - 1):
        return False  # vectors along it would gather (a reduction over the contiguous axis: row_reduction_block)
    if not multiple(sch.get(loops[spatial - 1]).extent, lanes):
        if not _static(sch.get(loops[spatial - 1]).extent):
            return False
        # a row of whole vectors and a few values more (100 keys): padded to whole vectors
        sch.pad_einsum(block, [1] * (spatial - 1) + [lanes] + [1] * (len(kinds) - spatial))
        loops = sch.get_loops(block)
    nv = next(v for v in (4, 3, 2, 1) if multiple(sch.get(loops[spatial - 1]).extent, v * lanes))
    rows = sch.get(loops[spatial - 2]).extent if spatial >= 2 else 1
    mb = next(m for m in range(16, 0, -1) if multiple(rows, m) and m * nv + nv + 2 <= registers)
    red = loops[spatial:]
    jo, jio, jiv = sch.split(loops[spatial - 1], [None, nv, lanes])
    if spatial >= 2:
        io, ii = sch.split(loops[spatial - 2], [None, mb])
        outer = list(loops[:spatial - 2]) + [io, jo]
        sch.reorder(*outer, *red, ii, jio, jiv)
        sch.unroll(ii)
    else:
        outer = [jo]
        sch.reorder(jo, *red, jio, jiv)
    sch.unroll(jio)
    par = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    _parallel(sch, block, par)
    tile = sch.cache_write(block, 0, TILE_SCOPE)
    sch.reverse_compute_at(tile, par)
    sch.vectorize(jiv)
    _, v = sch.split(sch.get_loops(tile)[-1], [None, lanes])
    sch.vectorize(v)
    sch.decompose_reduction(block, red[0])
    return True


def generic_block(sch, block, lanes):
    loops = sch.get_loops(block)
    if not loops:
        return
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    spatial = 0
    for k in kinds:  # leading data-parallel block iters (0 = data parallel)
        if k != 0:
            break
        spatial += 1
    spatial = min(spatial, len(loops))
    extents = [_extent(sch, lp) for lp in loops]
    if spatial == 0 or None in extents:
        return
    elementwise = spatial == len(loops)
    inner = loops[spatial - 1]
    outer = list(loops[:spatial - 1])
    ext = extents[spatial - 1]
    tiled, whole = None, multiple(sch.get(inner).extent, lanes)
    if (elementwise and whole and ext >= lanes and _copies(sch, block)
            and _gathers_along(sch, block, spatial - 1)):
        # a transpose: tiles inside the axis read contiguously, no vectors along the last axis
        tiled = _transposed(sch, block, loops, spatial, lanes)
    if tiled:
        outer = tiled
    else:
        width = lanes  # the vector: no wider than the period of a gathered read
        if elementwise and ext >= lanes and _gathers_along(sch, block, spatial - 1):
            width = _affine_lanes(sch, block, spatial - 1, lanes)
        if elementwise and ext >= 2 * lanes and not whole and _static(sch.get(inner).extent):
            # whole vectors, then the last few values on their own (a row of 6,625; a row sized at run
            # time stays scalar: TVM partitions only constant loops)
            inner = sch.loop_partition(inner, [ext // lanes * lanes, None])[0]
            ext, whole = ext // lanes * lanes, True
        if elementwise and whole and ext >= lanes:
            io, iv = sch.split(inner, [None, width])
            sch.vectorize(iv)
            outer = outer or [io]
    if not outer:
        outer = [inner]
    fused = _fusable(sch, outer) if len(outer) > 1 else outer
    par = sch.fuse(*fused) if len(fused) > 1 else fused[0]
    _parallel(sch, block, par, _product(extents))
