"""The loop-carried states of a fused kernel: initial values, the per-chunk update, and the merge of partials.

A state is carried as one tile (an `OnlineState`, in its compute dtype) or two
(a `TopKState`: values in `rank_dtype`, i64 indices). Per chunk, in cascade
order, exactly as `OnlineState` / `TopKState` say:

    scaled = prev if no rescale else select(prev == identity, prev, prev * r)
    (or scaled = carry, for a shift-stable sum: OnlineState.carry)
    SUM:     new = scaled + partial          MAX/MIN: new = maximum/minimum(scaled, partial)
    top-k:   new = topk(chunk candidates, into prev * r)

where ``partial`` is the chunk's reduction of the term (a ``dot`` when the term is
a product such as ``exp(s - m) * v``). `merge_states` combines two partial
states of a split reduction by `redfuser.fusion.merge.merge_rule` -- the rule
derived for this very cascade: each side rescaled by its own scale expression
(side buffers ``<acc>_a``/``<acc>_b`` are the two partials, unsuffixed names the
values merged so far), then combined by the monoid (a top-k merge is one `TopK`
with one list as candidates and the other as the list).
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..fusion.merge import MergeStep
from ..ir import (Binary, BinaryOp, Buffer, BufferType, Cast, Const, DType, Expr, Load, OnlineState, Reduce,
                  ReduceOp, Select, TopKState, UnaryOp)
from ..ir.loop.expr import contraction
from ..ir.loop.rescale_error import SERIES, SMALL_STEP, exponent_of, rescale_corrected
from ..ir.sizes import is_static
from ..ir.tile import nodes as t
from ..ir.types import float32, int64
from .exprs import as_stored, compute_dtype, round_to, store_tile
from .layout import FusedBuilder
from .options import ScheduleOptions
from .reduce import COMBINE, compensable, compensated_add, reduce_axes, reduce_chunk
from .space import Dim, Fixed, Tiled, mask_tile, offsets, ordered, place
from .topk import candidate_indices, empty_list, rank_dtype, ranked_values, rescale_list, update_list

Carried = list[t.Value]
"""The flat list of carried tiles, state after state (two for a top-k)."""


def state_dtype(st: OnlineState | TopKState):
    """The dtype a state's values are carried in."""
    return rank_dtype(st.acc.dtype) if isinstance(st, TopKState) else compute_dtype(st.acc.dtype)


def split_carried(fb: FusedBuilder, flat: Carried | tuple[t.Value, ...]) -> list[tuple[t.Value, ...]]:
    """The flat carried list cut into one tuple per state."""
    out, i = [], 0
    for st in fb.lay.fl.states:
        n = 2 if isinstance(st, TopKState) else 1
        out.append(tuple(flat[i:i + n]))
        i += n
    return out


def compensated_states(fb: FusedBuilder) -> list[int]:
    """The states whose running value keeps a compensation across chunks (`reduce.compensated_add`): f32 sums
    of one value per row (a vector tile: a running sum, softmax's ``l``, the sum a running mean is read from)
    that are not a contraction and that no shift law carries. A 2-d accumulator tile (a GEMM's, layer norm +
    GEMM's column sums of ``w``) keeps its plain update, in place, where a compensation would cost as much
    again in tiles. Their compensations follow the states in the carried list."""
    axis = fb.lay.fl.axis.name
    return [j for j, st in enumerate(fb.lay.fl.states)
            if isinstance(st, OnlineState) and st.carry is None and compensable(st.op, st.term)
            and not contraction(st.term, axis) and sum(d.size > 1 for d in fb.state_dims(j)) <= 1]


def carried_names(fb: FusedBuilder, compensate: bool = False) -> tuple[str, ...]:
    names: list[str] = []
    for st in fb.lay.fl.states:
        names += [st.prev.name] + ([f"{st.indices.name}_prev"] if isinstance(st, TopKState) else [])
    if compensate:
        names += [f"{fb.lay.fl.states[j].prev.name}_comp" for j in compensated_states(fb)]
    return tuple(names)


def initial_states(fb: FusedBuilder, compensate: bool = False) -> Carried:
    """Each state's identity: the monoid's neutral element, k empty slots for a top-k; with `compensate`,
    then a compensation of 0 for each of `compensated_states`."""
    out: Carried = []
    for j, st in enumerate(fb.lay.fl.states):
        dims = fb.state_dims(j)
        if isinstance(st, TopKState):
            out += empty_list(fb.kb, state_dtype(st), dims, st.acc.name)
        else:
            out.append(fb.kb.const(st.op.identity(st.acc.dtype), state_dtype(st), tuple(d.size for d in dims),
                                   hint=f"{st.acc.name}0"))
    if compensate:
        out += [fb.kb.const(0.0, float32, tuple(d.size for d in fb.state_dims(j)),
                            hint=f"{fb.lay.fl.states[j].acc.name}_comp0") for j in compensated_states(fb)]
    return out


def expose(fb: FusedBuilder, carried: Carried, final: bool) -> None:
    """Make the states' current tiles readable by later expressions (`final`: after the loop)."""
    for j, (st, vals) in enumerate(zip(fb.lay.fl.states, split_carried(fb, carried))):
        dims = fb.state_dims(j)
        if final:
            fb.lw.tiles.pop(st.prev.name, None)
        else:
            fb.lw.tiles[st.prev.name] = Tiled(vals[0], dims)
        if isinstance(st, TopKState):
            if final:  # a running top-k is readable only after the loop
                fb.lw.tiles[st.acc.name] = Tiled(vals[0], dims)
                fb.lw.tiles[st.indices.name] = Tiled(vals[1], dims)
        else:
            read = vals[0]
            if (final and st.acc.dtype.storage_only and st.op not in (ReduceOp.MAX, ReduceOp.MIN)
                    and st.acc.name in fb.read_later):
                # a later kernel reads this finished 16-bit sum as stored: this kernel's statements read that
                # value too, so that a max finished here by a monotone law (``max(x * 0.7 - sum(z))``) is the
                # max of the ``y`` the later kernels compute (with the f32 sum here, bf16 ``y - max(y)`` was
                # -0.5 at the max and a softmax's sum 0.88; found by a helper). Maxima and minima are not
                # rounded here: the loop's own sums shifted by their f32 value (`_already_narrow`)
                read = as_stored(fb.kb, read, st.acc.dtype)
            elif final and st.acc.dtype.storage_only and not _already_narrow(fb, st):
                # a finished 16-bit result keeps the f32 value the loop computed with, read as its buffer holds
                # it where a decision reads it (`exprs._decided`): a max or min anywhere in a decision's operand
                # (rounding is monotone: the max of numpy's rounded terms), a sum where it is the operand. A max
                # read rounded by arithmetic too made a bf16 softmax of ``x = logits * 1.5`` divide
                # ``exp(x - f16(m))`` by the sum of ``exp(x - m)``: probabilities up to 1.65
                fb.lw.unrounded.add(st.acc.name)
                if st.op in (ReduceOp.MAX, ReduceOp.MIN):
                    fb.lw.extrema.add(st.acc.name)
            fb.lw.tiles[st.acc.name] = Tiled(read, dims)


def _already_narrow(fb: FusedBuilder, st: OnlineState) -> bool:
    """Whether `st`'s f32 running value is always one of its dtype's values, so that reading it rounded
    (`exprs.as_stored`) would change nothing: a max or min, neither rescaled nor carried, of values of that
    dtype (a softmax's max of its f16 input row). Rounding it anyway made the sweep's ``exp(x - m)`` another
    value than the loop's, so that a row of one chunk computed its exponentials twice."""
    if st.op not in (ReduceOp.MAX, ReduceOp.MIN) or st.rescale is not None or st.carry is not None:
        return False
    return _narrow_values(st.term, st.acc.dtype, _computed(fb))


def _computed(fb: FusedBuilder) -> frozenset[str]:
    """The buffers of `fb`'s fused loop that it holds in f32 whatever their type: its locals and states."""
    fl = fb.lay.fl
    return frozenset({local.out.name for local in fl.locals} | {b.name for s in fl.states for b in (s.acc, s.prev)})


def _narrow_values(e: Expr, d: DType, computed: frozenset[str]) -> bool:
    """Whether every value of `e`, as the kernels compute it in f32, is a value of dtype `d`: a load of a `d`
    buffer from memory (`computed` names the kernel's own tiles, which hold f32 values), a cast to `d`, a
    constant of `d`, and selects, maxima and minima of those."""
    if isinstance(e, Load):
        return e.buffer.dtype == d and e.buffer.name not in computed
    if isinstance(e, Cast):
        return e.dtype == d
    if isinstance(e, Const):
        return e.dtype == d or math.isnan(e.value) or round_to(e.value, d) == e.value   # (lowered as `d` rounds it)
    if isinstance(e, Select):
        return _narrow_values(e.a, d, computed) and _narrow_values(e.b, d, computed)
    if isinstance(e, Binary) and e.op in (BinaryOp.MAX, BinaryOp.MIN):
        return _narrow_values(e.a, d, computed) and _narrow_values(e.b, d, computed)
    return False


def _local_options(opts: ScheduleOptions, local: Reduce, dims: tuple[Dim, ...]) -> ScheduleOptions:
    """`opts` for a local reduction: one chunk of its whole contraction where its tile has one row and the
    contraction is at most `vector_k` (`options.VECTOR_K`: each key's row read whole, in memory order)."""
    last = local.reduce_axes[-1].extent if local.reduce_axes else None
    rows = [d for d in dims if d.size > 1]
    if (last is not None and is_static(last) and opts.block_k is not None and opts.block_k < last <= opts.vector_k
            and len(rows) <= 1):
        return replace(opts, block_k=last)
    return opts


def update_states(fb: FusedBuilder, kdim: Dim, carried: Carried) -> Carried:
    """One chunk (`kdim`) of the fused loop: the locals, then every state in cascade order."""
    kb, lw, lay = fb.kb, fb.lw, fb.lay
    fl = lay.fl
    fb.binding[lay.fused_key] = kdim
    expose(fb, carried, final=False)
    for i, local in enumerate(fl.locals):
        b = fb.bind(i, local.axes)
        dims = fb.dims(b, local.axes)
        if isinstance(local, Reduce):
            value = reduce_axes(lw, _local_options(fb.opts, local, dims), local.op, local.value, dims, b,
                                local.reduce_axes,
                                fb.local_order + i, hint=local.out.name).value
        else:
            value = place(kb, lw.lower(local.value, b), dims)
        lw.tiles[local.out.name] = Tiled(value, dims)
    own = len(_state_of(fb))
    compensated = compensated_states(fb)
    comps = dict(zip(compensated, carried[own:])) if len(carried) > own else {}
    by_name = {st.acc.name: j for j, st in enumerate(fl.states)}
    corrected = rescale_corrected(fl, lambda st: by_name[st.acc.name] in compensated) if comps else frozenset()
    news: Carried = []
    new_comps: Carried = []
    for j, (st, prev) in enumerate(zip(fl.states, split_carried(fb, carried))):
        b = fb.bind(lay.state_stmt(j), st.axes + (fl.axis,))
        dims, d = fb.state_dims(j), state_dtype(st)
        r = place(kb, lw.lower_as(st.rescale, d, b), dims) if st.rescale is not None else None
        if isinstance(st, TopKState):
            rows = fb.row_dims(j)
            cand = ordered(rows + (kdim,))
            values = place(kb, ranked_values(lw, st.term, b), cand)
            acc = (prev[0] if r is None else rescale_list(kb, prev[0], r), prev[1])
            news += update_list(kb, values, candidate_indices(kb, kdim, cand), rows, kdim, acc, dims,
                                fb.rank_dim(j), st.acc.name, loc=fl.loc)
            continue
        acc = prev[0]
        comp = comps.get(j)
        if st.carry is not None:   # a shift-stable sum moves to its new centre (OnlineState.carry)
            acc = place(kb, lw.lower_as(st.carry, d, b), dims)
        elif r is not None:
            scaled = kb.binary(BinaryOp.MUL, acc, r, hint=f"{st.acc.name}_scaled")
            # the identity stays put (-inf * 0 must stay -inf; 0 * NaN must stay 0)
            empty = kb.binary(BinaryOp.EQ, acc, kb.const(st.op.identity(st.acc.dtype), d, r.shape))
            acc = kb.select(empty, acc, scaled, hint=f"{st.acc.name}_rescaled")
            if comp is not None:   # (the compensation is part of the sum: it scales with it, 0 stays 0)
                none = kb.binary(BinaryOp.EQ, comp, kb.const(0.0, d, r.shape))
                comp = kb.select(none, comp, kb.binary(BinaryOp.MUL, comp, r), hint=f"{st.acc.name}_comp_scaled")
                if st.acc.name in corrected:    # (and the rescale's own rounding error: `rescale_error`)
                    step = place(kb, lw.lower_as(exponent_of(st), d, b), dims)
                    comp = kb.binary(BinaryOp.SUB, comp, _rescale_residual(kb, prev[0], step, r),
                                     hint=f"{st.acc.name}_comp_exact")
        if comp is None:
            new = reduce_chunk(lw, st.op, st.term, dims, kdim, b, acc, hint=st.acc.name)
        else:
            partial = reduce_chunk(lw, st.op, st.term, dims, kdim, b, None, hint=st.acc.name)
            new, comp = compensated_add(kb, acc, comp, partial, hint=st.acc.name)
            new_comps.append(comp)
        lw.tiles[st.acc.name] = Tiled(new, dims)
        news.append(new)
    return news + new_comps


def _rescale_residual(kb, prev: t.Value, step: t.Value, r: t.Value) -> t.Value:
    """``prev * (exp(step) - r)`` where ``|step| < SMALL_STEP`` and `prev` is finite, else 0: the part of the exact
    rescale its f32 rounding `r` lost (`ir.loop.rescale_error`; the interpreter computes the same)."""
    d = prev.dtype
    series = kb.const(SERIES[-1], d, step.shape)
    for c in SERIES[-2::-1]:
        series = kb.binary(BinaryOp.ADD, kb.const(c, d, step.shape), kb.binary(BinaryOp.MUL, step, series))
    one, zero = kb.const(1.0, d, r.shape), kb.const(0.0, d, r.shape)
    lo = kb.binary(BinaryOp.SUB, kb.binary(BinaryOp.MUL, step, series), kb.binary(BinaryOp.SUB, r, one),
                   hint="rescale_lo")
    small = kb.binary(BinaryOp.LT, kb.unary(UnaryOp.ABS, step), kb.const(SMALL_STEP, d, step.shape))
    finite = kb.binary(BinaryOp.LT, kb.unary(UnaryOp.ABS, prev), kb.const(float("inf"), d, prev.shape))
    use = kb.binary(BinaryOp.AND, small, finite)
    return kb.select(use, kb.binary(BinaryOp.MUL, prev, kb.select(use, lo, zero)), zero, hint="rescale_lost")


# -- split reductions: partial states in scratch, and their merge ----------------------------------
def partial_buffers(states: tuple[OnlineState | TopKState, ...], count: int) -> list[Buffer]:
    """The scratch buffers of `count` slices' partial states (``[count, *state shape]``), flat like `Carried`."""
    out: list[Buffer] = []
    for st in states:
        out.append(Buffer(f"{st.acc.name}_part", BufferType(state_dtype(st), (count,) + st.acc.shape)))
        if isinstance(st, TopKState):
            out.append(Buffer(f"{st.indices.name}_part", BufferType(int64, (count,) + st.indices.shape)))
    return out


def _state_of(fb: FusedBuilder) -> list[int]:
    """For each flat carried entry, the number of its state."""
    return [j for j, st in enumerate(fb.lay.fl.states) for _ in range(2 if isinstance(st, TopKState) else 1)]


def store_partials(fb: FusedBuilder, carried: Carried, buffers: list[Buffer], split: t.Value) -> None:
    """Store this slice's final states at slice index `split` of their partial buffers."""
    for j, value, buf in zip(_state_of(fb), carried, buffers):
        store_tile(fb.kb, buf, Tiled(value, fb.state_dims(j)), fb.positions(j, [Fixed(split, buf.shape[0])]))


def load_partials(fb: FusedBuilder, buffers: list[Buffer], split: t.Value) -> Carried:
    """Slice `split`'s partial states, loaded onto the states' dims."""
    out: Carried = []
    index = [i for st in fb.lay.fl.states for i in ((False, True) if isinstance(st, TopKState) else (False,))]
    for j, buf, is_index in zip(_state_of(fb), buffers, index):
        off = offsets(fb.kb, buf, fb.positions(j, [Fixed(split, buf.shape[0])]))
        # a top-k list's slots past k (a power-of-two rank dim on the GPU) are masked: empty (index -1)
        v = fb.kb.load(buf, off.value, mask_tile(fb.kb, off.dims), -1 if is_index else 0, hint=buf.name)
        out.append(place(fb.kb, Tiled(v, off.dims), fb.state_dims(j)))
    return out


def merge_states(fb: FusedBuilder, steps: tuple[MergeStep, ...], a: Carried, b: Carried) -> Carried:
    """`a` merged with `b` by the cascade's merge rule (see the module docstring)."""
    kb, lw, fl = fb.kb, fb.lw, fb.lay.fl
    sides = list(zip(fl.states, split_carried(fb, a), split_carried(fb, b)))
    for j, (st, va, vb) in enumerate(sides):
        dims = fb.state_dims(j)
        lw.tiles[f"{st.acc.name}_a"], lw.tiles[f"{st.acc.name}_b"] = Tiled(va[0], dims), Tiled(vb[0], dims)
    merged: Carried = []
    for j, (step, (st, va, vb)) in enumerate(zip(steps, sides)):
        bind = fb.bind(fb.lay.state_stmt(j), st.axes)
        dims, d = fb.state_dims(j), state_dtype(st)
        parts = []
        for side, scale, carry in ((va, step.scale_a, step.carry_a), (vb, step.scale_b, step.carry_b)):
            value = side[0]
            if carry is not None:   # each side shifted to the merged centre (OnlineState.carry)
                value = place(kb, lw.lower_as(carry, d, bind), dims)
            elif scale is not None:
                r = place(kb, lw.lower_as(scale, d, bind), dims)
                if isinstance(st, TopKState):
                    value = rescale_list(kb, value, r)
                else:
                    scaled = kb.binary(BinaryOp.MUL, value, r, hint=f"{st.acc.name}_scaled")
                    empty = kb.binary(BinaryOp.EQ, value, kb.const(st.op.identity(st.acc.dtype), d, r.shape))
                    value = kb.select(empty, value, scaled, hint=f"{st.acc.name}_rescaled")
            parts.append((value,) + side[1:])
        if isinstance(st, TopKState):
            axis = dims.index(fb.rank_dim(j))
            new = kb.topk(parts[1][0], parts[1][1], axis, fb.rank_dim(j).size, parts[0], hint=st.acc.name)
            merged += new
            continue
        value = kb.binary(COMBINE[st.op], parts[0][0], parts[1][0], hint=f"{st.acc.name}_merged")
        lw.tiles[st.acc.name] = Tiled(value, dims)
        merged.append(value)
    return merged

