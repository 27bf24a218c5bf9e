"""The Tile IR `TopK` op on the GPU: k-lists in registers, merged across lanes by shuffles, across warps in shared memory.

Planning (`_plan`): the candidates are read in their own layout ``L`` (a load's
blocked layout; a default blocked one when they are lazy or a basis mixes the
ranked axis with another dim). The result ``O`` (`list_layout`) is ``L`` with the
axis sliced away -- its lane and warp bits become replicas -- and k slots of the
axis held in registers as the highest register bits: register ``row + nrow * j``
is slot j of the thread's row ``row``. The scheduler makes k a power of two on the
GPU (slots past the k the program asked for rank below them and are never stored).

Emission (`_topk`), for each of the thread's rows at once (vectors over rows):

1. per thread: the candidates along the axis in its registers go into a k-list
   one by one (`Ranker.insert`); where the index tile is affine (`affine.py`),
   the candidates are known to be real positions when it is non-negative, and
   to arrive in increasing index order when it grows along the axis and the
   thread's registers go up the axis (`_candidate_facts`); i64 indices cast
   from i32 positions are ranked as the i32 (sign extension keeps their order),
   which halves the index registers, selects and shuffles, and are widened after
   step 2 (`_ranks_as_i32`);
2. per lane bit along the axis: the partner lane's list arrives by ``shfl.bfly``
   and the two sorted lists merge (`Ranker.merge`); afterwards those lanes agree;
3. warp bits along the axis: each warp group writes its list to shared memory
   (one writer per element), a barrier, then every thread merges all groups'
   lists in group order;
4. the `acc` list (in ``O``; sorted first, as a rescaled list may have become
   unsorted where values collapsed) is merged in, and empty slots become (NaN, -1).

Lanes that replicate data are never combined, so no candidate counts twice. The
order is exactly `redfuser.ir.topk`'s (ties to the lower index, NaN below numbers,
empty slots last); see `topk_lists`.
"""
from __future__ import annotations

from ...ir import BackendError, BinaryOp
from ...ir.tile import nodes as t
from ...ir.simt.nodes import IntOp
from ...ir.types import int32, int64
from .context import Lowering, effect_rule
from .elementwise import defined_through_views
from .layouts import LANE_BITS, Layout, flat, log2
from .plan import plan_rule
from .topk_lists import Entry, KList, Ranker, shuffle_list
from .values import Regs, from_registers, gather, pieces


def candidate_layout(shape: tuple[int, ...], axis: int, warps: int) -> Layout:
    """As many thread bits on the rows as they fill, the rest on `axis` (the lowest lane bits), then registers.

    A thread's list registers are its rows times k, so spreading rows over threads keeps
    them few; the axis' thread bits are lane bits where possible (merges by shuffles, not
    shared memory); candidates along the axis in a thread's registers cost k comparisons each.
    """
    rank = len(shape)
    left = [log2(s) for s in shape]
    used = [0] * rank

    def take(d: int) -> tuple[int, ...]:
        basis = tuple(1 << used[d] if e == d else 0 for e in range(rank))
        used[d] += 1
        left[d] -= 1
        return basis

    rows = [d for d in reversed(range(rank)) if d != axis]
    bits = LANE_BITS + log2(warps)
    on_rows = min(sum(left[d] for d in rows), bits)
    thread = [take(axis) for _ in range(min(left[axis], bits - on_rows))]   # low lanes: shuffles, not shared memory
    for d in rows:
        while left[d] and len(thread) < bits:
            thread.append(take(d))
    thread += [(0,) * rank] * (bits - len(thread))
    regs = [take(d) for d in [axis] + rows for _ in range(left[d])]
    return Layout(tuple(shape), tuple(regs), tuple(thread[:LANE_BITS]), tuple(thread[LANE_BITS:]), "topk_in")


def list_layout(layout: Layout, axis: int, k: int) -> Layout:
    """The layout of a top-k result over candidates in `layout` (see the module docstring)."""
    def put(b: tuple[int, ...], c: int = 0) -> tuple[int, ...]:
        return b[:axis] + (c,) + b[axis + 1:]

    zero = (0,) * len(layout.shape)
    regs = [put(b) for b in layout.regs if not b[axis]] + [put(zero, 1 << j) for j in range(log2(k))]
    shape = put(layout.shape, k)
    return Layout(shape, tuple(regs), tuple(put(b) for b in layout.lanes), tuple(put(b) for b in layout.warps),
                  "topk")


MAX_GPU_TOPK = 32
"""The largest k (after rounding up to a power of two) the GPU lowering compiles: each thread keeps its k-lists
in registers and the insertion and merge networks are unrolled, so registers and compile time grow with k
(and k²): k = 64 took 45 s to lower and k = 128 200 s (the fuzzer's long campaign, example 5850: a top-1000
routing ran past 30 minutes on `simulate`). Larger k is refused with a `BackendError` (cpu and interpret
compile any k)."""


@plan_rule(t.TopK)
def _plan(p, op: t.TopK, depth: int) -> None:
    if op.k > MAX_GPU_TOPK:
        raise BackendError(f"top-k of more than {MAX_GPU_TOPK} values per row is not compiled for the GPU backends "
                           f"(k = {op.k} after rounding up to a power of two): the k-lists live in registers and "
                           "their networks are unrolled; use backend='cpu' or 'interpret' for a larger k",
                           op="topk", loc=op.loc)
    layout = candidate_layout(op.x.shape, op.axis, p.plan.warps)
    p.plan.reduce_in[op.out.name] = layout
    out = list_layout(layout, op.axis, op.k)
    p.concrete(op.out, out)
    p.concrete(op.out_indices, out)


class _Rows:
    """How a thread's registers of the candidate layout split into rows (kept bits) and axis positions."""

    def __init__(self, layout: Layout, axis: int) -> None:
        kept = [i for i, b in enumerate(layout.regs) if not b[axis]]
        folded = [i for i, b in enumerate(layout.regs) if b[axis]]
        order = kept + folded
        self.sources = [sum(1 << order[n] for n in range(len(order)) if j >> n & 1) for j in range(layout.num_regs)]
        self.rows = 1 << len(kept)            # rows per thread
        self.positions = 1 << len(folded)     # candidates per row per thread
        self.width = min(self.rows, 16)       # rows per vector
        self.groups = self.rows // self.width


def _candidate_facts(lw: Lowering, op: t.TopK, layout: Layout, rows: _Rows) -> tuple[bool, bool]:
    """``(real, ascending)``: every candidate index is >= 0, and a thread's candidate ``a + 1`` has a larger
    index than candidate ``a`` in every row. Both from the index tile's affine form: non-negative; and a
    positive stride along the axis with the thread's positions (its register bits along the axis) increasing."""
    form = lw.plan.affine.of(op.indices)
    if form is None:
        return False, False
    coords = [layout.reg_coord(rows.sources[a * rows.rows])[op.axis] for a in range(rows.positions)]
    ascending = form.strides[op.axis] > 0 and all(x < y for x, y in zip(coords, coords[1:]))
    return form.nonneg, ascending


def _ranks_as_i32(lw: Lowering, op: t.TopK) -> bool:
    """Whether `op`'s i64 indices are i32 values sign-extended (a cast from i32 under broadcasts, expand_dims and
    permutes: the positions a scheduler builds), so that ranking their i32 truncations is exact."""
    made = defined_through_views(lw, op.indices)
    return op.indices.dtype == int64 and isinstance(made, t.Cast) and made.x.dtype == int32


def _own_lists(lw: Lowering, op: t.TopK, layout: Layout, rows: _Rows, ranker: Ranker) -> list[KList]:
    """Step 1: each thread's candidates, per row vector, into sorted k-lists."""
    b = lw.b
    xs = gather(b, lw.get(op.x, layout), rows.sources, layout)
    ids = gather(b, lw.get(op.indices, layout), rows.sources, layout)
    real, ascending = _candidate_facts(lw, op, layout, rows)
    narrow = _ranks_as_i32(lw, op)
    lists = []
    for g in range(rows.groups):
        lst: KList | None = None
        for a in range(rows.positions):
            at = a * rows.rows + g * rows.width
            index = pieces(b, ids, at, rows.width)
            c = Entry(pieces(b, xs, at, rows.width), b.cast(index, int32) if narrow else index,
                      True if real else None)
            lst = ranker.single(c, op.k) if lst is None else ranker.insert(lst, c, later=ascending)
        lists.append(lst)
    return lists


def _as_regs(lw: Lowering, lists: list[KList], out: Layout, op: t.TopK) -> tuple[Regs, Regs]:
    """Lists (per row group) as the result tiles in `out`: register ``row + rows * j`` is slot j."""
    k = op.k
    values = [lists[g][j].value for j in range(k) for g in range(len(lists))]
    indices = [lists[g][j].index for j in range(k) for g in range(len(lists))]
    return (from_registers(lw.b, out, op.out.dtype, values),
            from_registers(lw.b, out, op.out_indices.dtype, indices))


def _from_regs(lw: Lowering, values: Regs, indices: Regs, rows: _Rows, k: int) -> list[KList]:
    """The inverse of `_as_regs`."""
    b = lw.b
    return [tuple(Entry(pieces(b, values, j * rows.rows + g * rows.width, rows.width),
                        pieces(b, indices, j * rows.rows + g * rows.width, rows.width)) for j in range(k))
            for g in range(rows.groups)]


def _across_warps(lw: Lowering, lists: list[KList], out: Layout, bits: list[int], quiet: int, rows: _Rows,
                  op: t.TopK, ranker: Ranker) -> list[KList]:
    """Step 3: each group of warps (thread bits `bits`) writes its lists, then every thread merges them all."""
    b = lw.b
    values, indices = _as_regs(lw, lists, out, op)
    numel, groups = out.numel, 1 << len(bits)
    nbits = len(out.thread_bases)
    group = b.thread_field(lw.tid, [(1 << bits.index(i)) * numel if i in bits else 0 for i in range(nbits)])
    where = b.thread_field(lw.tid, [flat(x, out.shape) for x in out.thread_bases])
    mine = b.arith(BinaryOp.ADD, group, where)
    writer = None
    if quiet:
        quiet_bits = b.int_op(IntOp.AND, lw.tid, b.const_of(quiet, int32))
        writer = b.binary(BinaryOp.EQ, quiet_bits, b.const_of(0, int32))
    arenas = [(lw.arena(r.dtype, groups * numel), r) for r in (values, indices)]
    b.barrier()
    for alloc, regs in arenas:
        for r in range(out.num_regs):
            at = b.arith(BinaryOp.ADD, mine, b.const_of(flat(out.reg_coord(r), out.shape), int32))
            b.store_shared(alloc, at, pieces(b, regs, r, 1), mask=writer)
    b.barrier()
    merged: list[KList] | None = None
    for g in range(groups):
        parts = []
        for alloc, regs in arenas:
            loaded = []
            for r in range(out.num_regs):
                at = b.arith(BinaryOp.ADD, where, b.const_of(g * numel + flat(out.reg_coord(r), out.shape), int32))
                loaded.append(b.load_shared(alloc, at, other=0))
            parts.append(from_registers(b, out, regs.dtype, loaded))
        theirs = _from_regs(lw, parts[0], parts[1], rows, op.k)
        merged = theirs if merged is None else [ranker.merge(m, x) for m, x in zip(merged, theirs)]
    return merged


@effect_rule(t.TopK)
def _topk(lw: Lowering, op: t.TopK) -> None:
    layout, out = lw.plan.reduce_in[op.out.name], lw.planned(op.out)
    axis, b = op.axis, lw.b
    rows = _Rows(layout, axis)
    ranker = Ranker(b)
    lists = _own_lists(lw, op, layout, rows, ranker)
    thread = layout.thread_bases
    lanes = [i for i in range(5) if thread[i][axis]]
    for bit in lanes:
        lists = [ranker.merge(lst, shuffle_list(b, lst, 1 << bit)) for lst in lists]
    lists = [ranker.widen(lst, op.out_indices.dtype) for lst in lists]
    warps = [i for i in range(5, len(thread)) if thread[i][axis]]
    if warps:
        quiet = sum(1 << i for i, x in enumerate(thread) if not any(x)) | sum(1 << i for i in lanes)
        lists = _across_warps(lw, lists, out, warps, quiet, rows, op, ranker)
    if op.acc is not None:
        acc = _from_regs(lw, lw.get(op.acc, out), lw.get(op.acc_indices, out), rows, op.k)
        lists = [ranker.merge(lst, ranker.sort(a)) for lst, a in zip(lists, acc)]
    values, indices = _as_regs(lw, [ranker.normalize(lst) for lst in lists], out, op)
    lw.bind(op.out, values)
    lw.bind(op.out_indices, indices)


__all__ = ["list_layout"]
