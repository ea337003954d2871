"""Schedule primitives shared by the variants: the register-block model,
epilogue attachment, padding stages. Vector widths are always passed in
(`lanes`, from the target's vector unit)."""
from tvm import s_tir, tirx

from .generic import TILE_SCOPE, blocks_in_order, generic_block, size, vectorize_inner


def round_up(n, m):
    """n up to a multiple of m (an extent sized at run time in the simplifier's form)."""
    if isinstance(n, int):
        return (n + m - 1) // m * m
    from tvm.sym import Analyzer

    return Analyzer().simplify((n + m - 1) // m * m)


def register_blocks(isa, rows, max_vectors, extra=0, live_broadcasts=False):
    """Register blocks (r, v) of an outer-product tile: r broadcast values
    times v vectors of the other operand, accumulated in r * v registers.
    One step of the reduction also holds the v vectors it loaded and one
    broadcast, and the compiler wants one register spare, so a block fits
    when r * v + v + 2 <= the register file (16 on AVX2, 32 on AVX-512 and
    NEON; AVX2's 4 x 3 block, which fills all 16, ran a 96 -> 24 channel
    3x3 convolution 1.2x slower than 3 x 3 over rows padded to its tiles).
    `extra`: registers the kernel's step holds besides (a product before
    its add, say); `live_broadcasts`: the r broadcasts stay live, not one
    (values the next steps read again). A block of one vector holds at
    most registers // 2 + 1 rows (docs/kernels.md: its broadcasts, loaded
    ahead, spilled AVX2's 10 x 1)."""
    return [(r, v) for v in range(1, max_vectors + 1) for r in rows
            if r * v + v + (r if live_broadcasts else 1) + 1 + extra <= isa.registers
            and (v > 1 or r <= isa.registers // 2 + 1)]


def intensity(r, v, v_cost=1):
    """FMAs per operand loaded in one reduction step of an r x v block,
    a load of one of the v vectors counted as `v_cost` loads."""
    return r * v / (r + v_cost * v)


L2_STREAMED = 1.5  # L1 loads a vector streamed from L2 costs (fitted: docs/kernels.md, "Weights streamed from L2")


def streamed_cost(isa, nbytes):
    """L1 loads one vector of an `nbytes` operand the tiles sweep again and again costs: 1 in L1, else L2_STREAMED."""
    return 1 if in_l1(isa, nbytes) else L2_STREAMED


def l1_fit(isa, nbytes):
    """Score factor of a block whose reused operand takes `nbytes`: full in
    L1, less once every reuse streams it from L2 (Winograd's, the GEMMs')."""
    return 1.0 if in_l1(isa, nbytes) else 0.7


def in_l1(isa, nbytes):
    """Whether an operand of `nbytes` stays in L1 (three quarters of it)."""
    return nbytes <= isa.l1d_kb * 1024 * 3 // 4


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


def fuse_parallel(sch, *loops):
    """`loops` (consecutive, outermost first) fused into one parallel loop.
    Where some are sized at run time, the first of those goes outermost and
    is fused with the constant ones, any other stays serial inside: the
    fused index is then taken apart by constants only (an index divided by
    a symbolic extent hides from the schedule which rows a block writes)."""
    symbolic = [lp for lp in loops if not isinstance(sch.get(lp).extent, tirx.IntImm)]
    if symbolic:
        fused = [symbolic[0]] + [lp for lp in loops if lp not in symbolic]
        sch.reorder(*fused, *symbolic[1:])
        loops = fused
    par = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    sch.parallel(par)
    return par


PAD = "cb_pad"  # the name of a layer's zero-padding stage and of the padded input it writes


def pad_stage(sch):
    """The layer's zero-padding stage (PAD), or None when it has none."""
    try:
        return sch.get_sblock(PAD)
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
    written back per tile instead; so too where the epilogue writes more
    than the anchor makes (a zero-padding for the next layer: computed per
    tile it would write only the tiles, never the border), and the epilogue
    is then a pass of its own over its whole output."""
    order = [b for b in blocks_in_order(sch)]
    names = [block_name(sch, b) for b in order]
    idx = names.index(block_name(sch, out_block))
    _inline_epilogue_inputs(sch, out_block, order[:idx])
    epilogue = order[idx + 1:]
    for b in epilogue[:-1]:
        try:
            sch.compute_inline(b)
        except s_tir.ScheduleError:
            sch.reverse_compute_at(b, loop)
    if epilogue and _written(sch, epilogue[-1]) > _written(sch, out_block):
        generic_block(sch, epilogue[-1], lanes)
        epilogue = []
    alone = None
    if epilogue:
        last = epilogue[-1]
        try:
            sch.reverse_compute_at(last, loop)
            sch.set_scope(out_block, 0, TILE_SCOPE)
        except s_tir.ScheduleError:  # sized at run time, the tiles' cover of a cropped row unproved: its own pass
            alone, epilogue = last, []
    if not epilogue:
        last = sch.cache_write(out_block, 0, TILE_SCOPE)
        # the write-back block is the consumer now; move it under the tile
        sch.reverse_compute_at(last, loop)
    vectorize_inner(sch, last, lanes)
    if alone is not None:  # scheduled after the tile's own blocks, which need the scope's regions plain
        generic_block(sch, alone, lanes)
    return last


def _written(sch, block):
    """How many elements the buffer `block` writes holds."""
    n = 1
    for d in sch.get(block).writes[0].source.shape:
        n *= size(d)
    return n


def _inline_epilogue_inputs(sch, out_block, before):
    """Inline the blocks ahead of the anchor that only the epilogue reads (an
    integer product's zero point cast to float, say): computed at the root,
    they would keep the epilogue from moving under the tile loop."""
    feeds, todo = set(), [out_block]
    while todo:
        for p in sch.get_producers(todo.pop()):
            if block_name(sch, p) not in feeds:
                feeds.add(block_name(sch, p))
                todo.append(p)
    for b in before:
        if block_name(sch, b) not in feeds:
            try:
                sch.compute_inline(b)
            except s_tir.ScheduleError:
                pass


