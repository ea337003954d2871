"""Schedule helpers shared by the variants: the register-block model,
epilogue attachment, generic schedules for layers without an anchor. Vector
widths are always passed in (`lanes`, from the target's vector unit)."""
from tvm import s_tir


def round_up(n, m):
    return (n + m - 1) // m * m


def register_blocks(isa, rows, max_vectors):
    """Register blocks (r, v) of an outer-product tile: r broadcast values
    times v vectors of the other operand, accumulated in r * v registers.
    One step of the reduction also holds the v vectors it loaded and one
    broadcast, and the compiler wants one register spare, so a block fits
    when r * v + v + 2 <= the register file (16 on AVX2, 32 on AVX-512 and
    NEON)."""
    return [(r, v) for v in range(1, max_vectors + 1) for r in rows if r * v + v + 2 <= isa.registers]


def intensity(r, v):
    """FMAs per operand loaded in one reduction step of an r x v block."""
    return r * v / (r + v)


def l1_fit(isa, nbytes):
    """Score factor of a block whose reused operand takes `nbytes`: full
    while it stays in (three quarters of) L1, less once every reuse streams
    it from L2. Winograd and the GEMMs rank their blocks with it."""
    return 1.0 if nbytes <= isa.l1d_kb * 1024 * 3 // 4 else 0.7


def padding_efficiency(*pairs):
    """Useful fraction of padded extents: pairs of (extent, tile)."""
    eff = 1.0
    for extent, tile in pairs:
        eff *= extent / round_up(extent, tile)
    return eff


def ranked(options, limit=5):
    """Distinct parameter dicts from (score, params) pairs, best first (ties
    keep their order)."""
    out = []
    for _, p in sorted(options, key=lambda o: -o[0]):
        if p not in out:
            out.append(p)
    return out[:limit]


def blocks_in_order(sch):
    root = sch.get_sblock("root") if _has_root(sch) else None
    return list(sch.get_child_blocks(root)) if root is not None else []


def _has_root(sch):
    try:
        sch.get_sblock("root")
        return True
    except Exception:
        return False


def pad_stage(sch):
    """The layer's zero-padding stage ("cb_pad"), or None when it has none."""
    try:
        return sch.get_sblock("cb_pad")
    except (s_tir.ScheduleError, ValueError):
        return None


def pad_pass(sch, lanes):
    """The padding stage, if the layer has one, as its own parallel pass."""
    pad = pad_stage(sch)
    if pad is not None:
        generic_block(sch, pad, lanes)


def block_name(sch, block):
    return sch.get(block).name_hint


def attach_epilogue(sch, out_block, loop, lanes):
    """Fuse what follows `out_block` (bias, activation, residual add ... as
    FuseOps put them in the same function) into the tile loop `loop`.

    Intermediate epilogue blocks are inlined into the last one, which is
    computed per tile right after the tile is produced; the tile itself then
    lives in local memory. Without an epilogue, a local cache of the tile is
    written back per tile instead."""
    order = [b for b in blocks_in_order(sch)]
    names = [block_name(sch, b) for b in order]
    idx = names.index(block_name(sch, out_block))
    epilogue = order[idx + 1:]
    for b in epilogue[:-1]:
        try:
            sch.compute_inline(b)
        except s_tir.ScheduleError:
            sch.reverse_compute_at(b, loop)
    if epilogue:
        last = epilogue[-1]
        sch.reverse_compute_at(last, loop)
        sch.set_scope(out_block, 0, "local")
    else:
        last = sch.cache_write(out_block, 0, "local")
        # the write-back block is the consumer now; move it under the tile
        sch.reverse_compute_at(last, loop)
    vectorize_inner(sch, last, lanes)
    return last


def vectorize_inner(sch, block, lanes):
    loops = sch.get_loops(block)
    if not loops:
        return
    inner = loops[-1]
    extent = _extent(sch, inner)
    if extent is None or extent < 2:
        return
    if extent % lanes == 0 and extent > lanes:
        _, inner = sch.split(inner, [None, lanes])
    if extent % lanes == 0 or extent <= 16:
        sch.vectorize(inner)


def _extent(sch, loop):
    try:
        return int(sch.get(loop).extent)
    except Exception:
        return None


def generic(sch, lanes):
    """A reasonable schedule for non-anchor kernels (pooling, elementwise,
    reductions, data movement, weight transforms): inline intermediate
    injective stages (pads, reshapes, broadcasts) into their consumers, then
    run the outer loops of each remaining block in parallel and vectorize
    contiguous inner loops of elementwise blocks."""
    blocks = blocks_in_order(sch)
    for b in blocks[:-1]:
        try:
            sch.compute_inline(b)
        except s_tir.ScheduleError:
            pass
    for block in blocks_in_order(sch):
        try:
            generic_block(sch, block, lanes)
        except s_tir.ScheduleError:
            pass


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
    if elementwise and extents[spatial - 1] % lanes == 0 and extents[spatial - 1] >= lanes:
        io, iv = sch.split(inner, [None, lanes])
        sch.vectorize(iv)
        if not outer:
            outer = [io]
    if not outer:
        outer = [inner]
    par = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    sch.parallel(par)
