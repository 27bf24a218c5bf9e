"""A fused loop (plus the epilogue nests that read its states pointwise) as one kernel.

The layout (`layout.py`): axes every state shares go to the grid, the last of
them tiled by ``block_m``; axes only some states have stay whole in the tile.
One ``for`` walks the fused axis in chunks of ``block_n``, carrying the states
and updating them per chunk as `states.py` says (online states and running
top-k lists alike). After the loop the epilogue runs on the final tiles; only
values needed outside the kernel are stored. A split reduction (`split.py`)
reuses the same pieces: the loop over one slice, then a merge kernel that ends
like this one.
"""
from __future__ import annotations

from ..ir import Binary, BinaryOp, Compute, Const, DType, FusedLoop, InternalError, ReduceOp, TopKState
from ..ir.sizes import SizeLike, is_static
from ..ir.tile import nodes as t
from .chunks import chunk_loop
from .exprs import as_stored, store_tile
from .layout import FusedBuilder, FusedLayout, fused_layout
from .masked import LiveBound, live_bound
from .options import ScheduleOptions
from .space import Dim, Tiled, place
from .states import Carried, carried_names, expose, initial_states, split_carried, update_states
from .unify import Unfusable, unify


def layout_or_fail(fl: FusedLoop, epilogue: list[Compute]) -> FusedLayout:
    """The kernel layout of `fl` and `epilogue` (an internal error when they cannot share a kernel)."""
    try:
        return fused_layout(fl, epilogue)
    except Unfusable as why:
        raise InternalError(f"cannot tile fused loop over {fl.axis.name}: {why}", pass_name="schedule") from None


def finish_states(fb: FusedBuilder, final: Carried, needed: set[str]) -> None:
    """After the loop (or the merge): store the needed states, then run and store the epilogue."""
    lay, kb, lw = fb.lay, fb.kb, fb.lw
    expose(fb, final, final=True)
    for j, (st, vals) in enumerate(zip(lay.fl.states, split_carried(fb, final))):
        outs = [st.acc] + ([st.indices] if isinstance(st, TopKState) else [])
        for buf, value in zip(outs, vals):
            if buf.name in needed:   # (the unrounded tile: `expose` gave later reads the rounded one)
                store_tile(kb, buf, Tiled(value, fb.state_dims(j)), fb.positions(j))
    for j, c in enumerate(lay.epilogue):
        if lay.sweep_key is not None and j == len(lay.epilogue) - 1:
            _sweep(fb, j, c, needed)
            continue
        b = fb.bind(lay.epilogue_stmt(j), c.axes)
        dims = fb.dims(b, c.axes)
        value = place(kb, lw.lower(c.value, b), dims)
        if c.out.dtype.storage_only and c.out.name in fb.read_later:
            # a later kernel reads it rounded, as numpy holds it: this kernel's statements read that value too, so
            # that all read one (bf16 ``max(e) / l`` here and ``e / l`` in a later kernel: ``q >= max(q)`` marked
            # no element where this ``l`` was the f32 sum and that one its rounding; found by a helper)
            value = as_stored(kb, value, c.out.dtype)
        elif c.out.dtype.storage_only:   # (a decision of a later statement reads it rounded: `exprs._decided`)
            lw.unrounded.add(c.out.name)
        lw.tiles[c.out.name] = Tiled(value, dims)
        if c.out.name in needed:
            store_tile(kb, c.out, lw.tiles[c.out.name], [b[a.name] for a in c.axes])


def _sweep(fb: FusedBuilder, j: int, c: Compute, needed: set[str]) -> None:
    """The last epilogue statement over its own axis (`layout._sweep_key`), chunk by chunk after the loop."""
    if c.out.name not in needed:
        return
    lay, kb, lw = fb.lay, fb.kb, fb.lw
    n = lay.classes.extent[lay.sweep_key]
    size = lay.sweep_chunk(fb.opts)

    def chunk(dim: Dim, carried: list[t.Value]) -> tuple[t.Value, ...]:
        fb.binding[lay.sweep_key] = dim
        b = fb.bind(lay.epilogue_stmt(j), c.axes)
        dims = fb.dims(b, c.axes)
        store_tile(kb, c.out, Tiled(place(kb, lw.lower(c.value, b), dims), dims), [b[a.name] for a in c.axes])
        return ()

    chunk_loop(kb, lay.sweep_key, fb.fused_order, n, n, size, (), chunk, hint=lay.sweep_key,
               peel_ragged=fb.opts.peel_ragged)


def fused_kernel(fl: FusedLoop, epilogue: list[Compute], needed: set[str], name: str, opts: ScheduleOptions,
                 index: DType, later_reads: set[str] | frozenset[str] = frozenset()) -> t.TileKernel:
    """The kernel of `fl` and `epilogue`; stores exactly the buffers named in `needed` (`later_reads`: those a
    later kernel reads)."""
    fb = FusedBuilder(layout_or_fail(fl, epilogue), name, opts, index)
    fb.read_later = frozenset(later_reads)
    n = fl.axis.extent
    size = fb.lay.chunk(opts)
    stop = loop_stop(fb, n, size)
    several = not (is_static(n) and n <= size)     # (one chunk: nothing to compensate)
    final = chunk_loop(fb.kb, fb.lay.fused_key, fb.fused_order, n, stop, size, tuple(initial_states(fb, several)),
                       lambda kdim, carried: update_states(fb, kdim, carried), hint=fb.lay.fused_key,
                       arg_hints=carried_names(fb, several), peel_ragged=opts.peel_ragged)
    finish_states(fb, list(final), needed)
    return fb.finish()


def loop_stop(fb: FusedBuilder, n: SizeLike, size: int) -> SizeLike | t.Value:
    """Where the fused loop over the axis of length `n`, in chunks of `size`, may stop under the options:
    `live_stop` with ``skip_masked``, `exact_live_stop` with ``skip_exact``, else `n` itself."""
    opts = fb.opts
    return live_stop(fb, n) if opts.skip_masked else exact_live_stop(fb, n, size) if opts.skip_exact else n


def live_stop(fb: FusedBuilder, n: SizeLike, bound: LiveBound | None = None) -> SizeLike | t.Value:
    """Where this program's walk of the fused axis may stop (`masked.live_bound`, or `bound` where the caller
    has it): after the last chunk a row of its tile can see, clamped to ``[0, n]``; `n` when the loop has no
    such mask."""
    lay, kb = fb.lay, fb.kb
    bound = live_bound(lay.fl, lay.classes, lay.fused_key) if bound is None else bound
    row = fb.binding.get(bound.row_key) if bound is not None else None
    if row is None:
        return n
    if isinstance(row, Dim):     # rows base .. base + size - 1 of the axis
        if row.base is None:
            if is_static(n):
                return max(0, min(n, row.size + bound.offset))
            return kb.binary(BinaryOp.MIN, kb.const(max(0, row.size + bound.offset), kb.index_dtype),
                             kb.const(n, kb.index_dtype), hint="live_stop")
        last, past = row.base, row.size + bound.offset
    else:                        # one row per program
        last, past = row.index, 1 + bound.offset
    stop = kb.binary(BinaryOp.ADD, last, kb.const(past, kb.index_dtype), hint="live_end")
    stop = kb.binary(BinaryOp.MAX, stop, kb.const(0, kb.index_dtype))
    return kb.binary(BinaryOp.MIN, stop, kb.const(n, kb.index_dtype), hint="live_stop")


def exact_live_stop(fb: FusedBuilder, n: SizeLike, size: int) -> SizeLike | t.Value:
    """`live_stop`, moved past every dead chunk where a load that could make a dead term differ from its
    identity (`masked.LiveBound.unsafe`: ``v`` in ``P @ V``) is not finite: a scan of the dead chunks before
    the loop, summing ``0 * load`` (NaN exactly where some element is inf or NaN), so the loop's result is
    the unskipped loop's for every input. `n` (no skipping) where an unsafe value is one the loop computes
    (a local) rather than loads."""
    lay, kb, lw = fb.lay, fb.kb, fb.lw
    bound = live_bound(lay.fl, lay.classes, lay.fused_key)
    if bound is None:
        return n
    local_names = {local.out.name for local in lay.fl.locals}
    if any(load.buffer.name in local_names for _, load in bound.unsafe):
        return n
    live = live_stop(fb, n, bound)
    if not bound.unsafe or (is_static(live) and is_static(n) and live == n):
        return live
    ix = kb.index_dtype
    start = live if isinstance(live, t.Value) else kb.const(live, ix)
    count = kb.binary(BinaryOp.SUB, kb.const(n, ix), start, hint="dead")
    with kb.loop(0, count, size, (start,), hint="scan", arg_hints=("seen_end",)) as lp:
        base = kb.binary(BinaryOp.ADD, start, lp.iv, hint="scan_base")
        fb.binding[lay.fused_key] = Dim(lay.fused_key, fb.fused_order, size, n, base, True)
        bad: t.Value | None = None
        for j, load in bound.unsafe:
            st = lay.fl.states[j]
            b = fb.bind(lay.state_stmt(j), st.axes + (lay.fl.axis,))
            x = lw.lower(Binary(BinaryOp.MUL, load, Const(0.0, load.dtype), load.dtype), b).value
            while x.shape:
                x = kb.reduce(ReduceOp.SUM, x, len(x.shape) - 1)
            nan = kb.binary(BinaryOp.NE, x, x, hint="not_finite")
            bad = nan if bad is None else kb.binary(BinaryOp.OR, bad, nan)
        end = kb.binary(BinaryOp.ADD, base, kb.const(size, ix), hint="scan_end")
        lp.yield_(kb.select(bad, end, lp.args[0], hint="seen_end"))
    (seen,) = lp.results
    return kb.binary(BinaryOp.MIN, seen, kb.const(n, ix), hint="live_stop")


def joins(fl: FusedLoop, epilogue: list[Compute], candidate: Compute) -> bool:
    """Whether `candidate` can run in `fl`'s kernel after `epilogue`: it reads the kernel's tiles pointwise
    and adds no axis of its own, or adds one axis as the kernel's closing sweep (`layout._sweep_key`)."""
    try:
        classes = unify(fl, epilogue + [candidate])
        lay = fused_layout(fl, epilogue, classes)
        sweep = fused_layout(fl, epilogue + [candidate], classes).sweep_key
    except Unfusable:
        return False
    if lay.sweep_key is not None:
        return False   # a sweep ends the kernel
    known = set(lay.grid_keys) | set(lay.whole_keys) | ({lay.tiled_key} if lay.tiled_key else set())
    known |= {sweep} if sweep is not None else set()
    me = lay.epilogue_stmt(len(epilogue))
    # a length-1 axis of its own (it reads the kernel's tiles at index 0 there: a batch of one) is a fixed 0
    return all(lay.classes.of(me, a) in known or a.extent == 1 for a in candidate.axes)
