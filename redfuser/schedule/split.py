"""Split reductions (flash decoding): a fused loop's axis cut into slices run by different programs.

When the parallel axes give too few programs to fill the machine (one query
row, a long key axis), the fused loop becomes two kernels:

1. **partial**: the grid of the unsplit kernel plus one more (last) dimension
   over `count` slices of `length` elements (a multiple of the `chunk`); each
   program runs the fused loop over its slice exactly as the unsplit kernel runs
   the whole axis (positions stay global, so masks and top-k indices are right)
   and stores its final states into scratch, ``<acc>_part[slice, ...]``;
2. **combine**: the unsplit grid; each program folds the slices' partial states
   in slice order, starting from the identity, with the merge rule derived for
   this cascade (`redfuser.fusion.merge.merge_rule`, see `states.merge_states`),
   then stores the needed states and runs the epilogue like the unsplit kernel.

The split count is the ``split`` option: ``None`` chooses (`auto_split`), 1 never
splits, n asks for n slices (fewer when the axis is short: slices are whole
chunks and never empty, so a split longer than the axis gives one slice per element).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..fusion.merge import merge_rule
from ..ir import BinaryOp, Buffer, Compute, DType, FusedLoop
from ..ir.sizes import SizeLike, ceil_div, divides, is_static, size_max
from ..ir.tile import nodes as t
from .fused import finish_states, layout_or_fail, loop_stop
from .layout import FusedBuilder, FusedLayout
from .options import ScheduleOptions
from .space import Dim, overhangs
from .states import (carried_names, initial_states, load_partials, merge_states, partial_buffers, store_partials,
                     update_states)

MIN_SLICE_CHUNKS = 4
"""An automatic split keeps at least this many chunks per slice (below that the combine outweighs the gain)."""


@dataclass(frozen=True)
class SplitPlan:
    """`count` slices of `length` elements of the fused axis, each walked in chunks of `chunk`."""

    count: int
    length: SizeLike
    chunk: int


def auto_split(programs: SizeLike, chunks: SizeLike, workers: int) -> int:
    """The automatic split count: 1 when `programs` already occupy the `workers` (cores or SMs),
    else enough slices for about two programs per worker, each slice at least `MIN_SLICE_CHUNKS` chunks.
    A grid of run-time size is taken to fill the machine (no split); an axis of run-time length is
    split as if long (a call with a shorter one leaves the last slices empty: a loop of no trip)."""
    if not is_static(programs):
        return 1
    if programs >= workers or (is_static(chunks) and chunks < 2 * MIN_SLICE_CHUNKS):
        return 1
    want = ceil_div(2 * workers, max(programs, 1))
    return max(1, min(want, chunks // MIN_SLICE_CHUNKS) if is_static(chunks) else want)


def plan_split(lay: FusedLayout, opts: ScheduleOptions) -> SplitPlan | None:
    """How to split `lay`'s fused loop under `opts` (None: run it unsplit)."""
    n = lay.fl.axis.extent
    if n == 0 or not lay.fl.states:
        return None
    requested = opts.split
    if requested is None:
        requested = auto_split(lay.programs(opts), ceil_div(n, lay.chunk(opts)), opts.workers)
    if requested <= 1:
        return None
    per = ceil_div(n, requested)
    chunk = opts.tile(opts.block_n, per)
    length = ceil_div(per, chunk) * chunk
    if not is_static(n):
        # a run-time length: `requested` slices, none shorter than an automatic split's shortest, so a short
        # axis is one slice's work (the slices past its end are empty loops)
        length = size_max(length, MIN_SLICE_CHUNKS * chunk) if opts.split is None else length
        return SplitPlan(requested, length, chunk)
    count = ceil_div(n, length)
    return SplitPlan(count, length, chunk) if count > 1 else None


def scratch_of(fl: FusedLoop, plan: SplitPlan) -> list[Buffer]:
    """The scratch buffers holding the slices' partial states."""
    return partial_buffers(fl.states, plan.count)


def partial_kernel(lay: FusedLayout, plan: SplitPlan, name: str, opts: ScheduleOptions, index: DType) -> t.TileKernel:
    """Kernel 1: the fused loop over slice ``pid_split`` of the axis; its final states go to scratch."""
    fb = FusedBuilder(lay, name, opts, index, split=plan.count)
    kb, n = fb.kb, lay.fl.axis.extent
    assert fb.split_pid is not None
    start = kb.binary(BinaryOp.MUL, fb.split_pid, kb.const(plan.length, index), hint="slice_start")
    stop: int | t.Value = plan.length
    if overhangs(plan.count * plan.length, n):
        # The last slice overhangs the axis: every slice stops at the axis's end, so no program walks a
        # chunk wholly past it, and when the axis is whole chunks no lane needs a bounds mask at all.
        left = kb.binary(BinaryOp.SUB, kb.const(n, index), start, hint="slice_left")
        stop = kb.binary(BinaryOp.MIN, left, kb.const(plan.length, index), hint="slice_stop")
    # The masked stop of the whole axis (`fused.loop_stop`: with `skip_exact` a scan of the dead chunks), as
    # the unsplit loop takes it, cut to this slice: a slice wholly past it walks nothing and leaves its states'
    # identities for the merge (`skip_masked=True` did nothing once split, the GPU's automatic split included)
    live = loop_stop(fb, n, plan.chunk)
    if live is not n and not (is_static(live) and is_static(n) and live == n):    # (no mask: n itself)
        ahead = kb.binary(BinaryOp.SUB, live if isinstance(live, t.Value) else kb.const(live, index), start,
                          hint="slice_live")
        ahead = kb.binary(BinaryOp.MAX, ahead, kb.const(0, index))
        stop = kb.binary(BinaryOp.MIN, stop if isinstance(stop, t.Value) else kb.const(stop, index), ahead,
                         hint="slice_stop")
    with kb.loop(0, stop, plan.chunk, tuple(initial_states(fb, True)), hint=lay.fused_key,
                 arg_hints=carried_names(fb, True)) as lp:
        base = kb.binary(BinaryOp.ADD, start, lp.iv, hint=f"{lay.fused_key}_base")
        kdim = Dim(lay.fused_key, fb.fused_order, plan.chunk, n, base, not divides(plan.chunk, n))
        lp.yield_(*update_states(fb, kdim, list(lp.args)))
    store_partials(fb, list(lp.results), scratch_of(lay.fl, plan), fb.split_pid)
    return fb.finish()


def combine_kernel(lay: FusedLayout, plan: SplitPlan, needed: set[str], name: str, opts: ScheduleOptions,
                   index: DType, later_reads: frozenset[str] = frozenset()) -> t.TileKernel:
    """Kernel 2: fold the slices' partial states by the merge rule, then the epilogue (`later_reads`: the
    buffers a later kernel reads)."""
    fb = FusedBuilder(lay, name, opts, index)
    fb.read_later = later_reads
    steps = merge_rule(lay.fl)  # derived from this cascade's own rescale expressions
    buffers = scratch_of(lay.fl, plan)
    with fb.kb.loop(0, plan.count, 1, tuple(initial_states(fb)), hint="slice", arg_hints=carried_names(fb)) as lp:
        part = load_partials(fb, buffers, lp.iv)
        lp.yield_(*merge_states(fb, steps, list(lp.args), part))
    finish_states(fb, list(lp.results), needed)
    return fb.finish()


def split_kernels(fl: FusedLoop, epilogue: list[Compute], needed: set[str], plan: SplitPlan, name: str,
                  opts: ScheduleOptions, index: DType,
                  later_reads: set[str] | frozenset[str] = frozenset()) -> tuple[t.TileKernel, t.TileKernel]:
    """The partial and combine kernels of a split fused loop (named ``<name>_partial``, ``<name>_combine``)."""
    lay = layout_or_fail(fl, epilogue)
    return (partial_kernel(lay, plan, f"{name}_partial", opts, index),
            combine_kernel(lay, plan, needed, f"{name}_combine", opts, index, frozenset(later_reads)))
