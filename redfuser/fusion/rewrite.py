"""Pass `fuse_cascade`: one cascade becomes one `FusedLoop` plus an epilogue.

Guarantees (for the members it fuses): every member's final value equals the
unfused reduction's in exact arithmetic (the fusion theorem; each factorization
is also confirmed numerically), the loop reads the reduced axis once, and
members it refuses stay ordinary reductions after the loop, with a reason.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..ir import (
    Axis,
    index_axes,
    Binary,
    BinaryOp,
    Buffer,
    Cast,
    Compute,
    Const,
    Expr,
    FusedLoop,
    IndexValue,
    Load,
    OnlineState,
    Program,
    Reduce,
    ReduceOp,
    Select,
    Unary,
    UnaryOp,
    format_expr,
    map_expr,
    rounded,
    walk,
    written,
)
from ..ir.loop.rewrite import state_exprs
from .cascade import Candidate, dependencies
from .gathered_reads import read_along as _read_along, recompute_gathered_reads
from .group import CascadeGroup
from ..ir.loop.rewrite import reads
from .loop_builder import LoopBuilder
from .member import Member
from .narrowing import Extremum
from .numeric_check import check
from .positivity import is_positive
from .algebra import Linear
from .own_centre import finish as finish_own_centre, own_centre_of, rounded_exponents, stabilize
from .separability import (Accumulator, Decomposition, FusionContext, Refusal, decompose, sums_at_least_one,
                           unbounded_exponential)
from .substitute import rename_axes
from .topk_order import list_order_refusal
from ..ir.types import bool_


def _fresh_axis_name(p: Program) -> str:
    used = {a.name for s in p.body for n in _all_exprs(s) for a in _axes_in(n)}
    used |= {a.name for s in p.body if isinstance(s, Compute | Reduce) for a in s.axes}
    used |= set(_buffers(p))      # (a parameter named j: `max over j of j[i0,j]` would read as nonsense)
    name, k = "j", 1
    while name in used:
        name, k = f"j{k}", k + 1
    return name


def _buffers(p: Program) -> dict[str, Buffer]:
    """Every buffer `p` has, by name: its inputs, outputs and what its statements write."""
    return {b.name: b for b in p.inputs + p.outputs} | {b.name: b for s in p.body for b in written(s)}


def _all_exprs(s) -> list[Expr]:
    if isinstance(s, FusedLoop):
        return [l.value for l in s.locals] + [st.term for st in s.states]
    return [s.value]


def _axes_in(e: Expr):
    for n in walk(e):
        if isinstance(n, Load):
            yield from (a for i in n.indices for a in index_axes(i))


def _constant(e: Expr) -> bool:
    """True when `e` reads no buffer and no loop index (the same for every element)."""
    return not any(isinstance(n, Load | IndexValue) for n in walk(e))


def _carried_only(factor: Expr | None) -> bool:
    """A factor of 0: a shift-stable family's lower power, carried only to move the higher ones
    (`centred._families`); it adds nothing to the value."""
    return isinstance(factor, Const) and factor.value == 0.0


def _epilogue_value(member: Member, dec: Decomposition, accs: list[Buffer | Expr],
                    unseen: list[Expr | None] | None = None) -> Expr:
    """``sum_j factor_j * acc_j + addend`` (or the body as written, `Decomposition.written`); with `unseen`,
    an accumulator whose running max never left -inf is NaN (what the reference's ``exp(-inf - -inf)``
    gives)."""
    d = member.out.dtype
    if dec.written is not None:   # an additive max/min: the body with the accumulator in place of its G
        (buf,) = accs
        load = Load(buf, member.axes) if isinstance(buf, Buffer) else buf
        g = dec.accumulators[0].G
        # rounded after each step as the reference rounds the body at the extreme element (in f16, the
        # max of ``x - lse`` then equals the element's own ``x - lse``, which ``lp == max(lp)`` compares)
        return rounded(map_expr(dec.written, lambda n: load if n == g else None))
    out: Expr | None = None
    for n, (buf, factor) in enumerate(zip(accs, dec.factors)):
        if _carried_only(factor):
            continue
        load: Expr = Load(buf, member.axes) if isinstance(buf, Buffer) else buf
        if unseen is not None and unseen[n] is not None:
            load = Select(unseen[n], Const(math.nan, d), load, d)
        if factor is None:
            part: Expr = load
        elif isinstance(factor, Binary) and factor.op is BinaryOp.DIV and isinstance(factor.a, Const) and factor.a.value == 1:
            part = Binary(BinaryOp.DIV, load, factor.b, d)
        else:
            part = Binary(BinaryOp.MUL, load, factor, d)
        out = part if out is None else Binary(BinaryOp.ADD, out, part, d)
    if dec.addend is not None:
        out = Binary(BinaryOp.ADD, out, dec.addend, d)
    return out


def _infinite_at_extreme(final: Expr, overflowed: Expr, there: Expr) -> Expr:
    """A centred sum's value where some ``u - c`` overflowed (or is -inf) and the body at that element is
    ±inf: that infinity, the reference's sum (its other terms are finite or the same infinity). The expanded
    sums meet it as ``0·inf`` (a focal loss ``Σ (1 - exp(x - m))(x - m)`` with a -inf logit: the fused loop
    gave NaN for numpy's -inf); where the body there is NaN the accumulators' guards already give NaN."""
    d = final.dtype
    there = there if there.dtype == d else Cast(there, d)
    infinite = Binary(BinaryOp.EQ, Unary(UnaryOp.ABS, there, d), Const(math.inf, d), bool_)
    return Select(Binary(BinaryOp.AND, overflowed, infinite, bool_), there, final, d)


def _where_live(b: LoopBuilder, member: Member, acc, unseen: Expr | None) -> Expr | None:
    """The guard that makes an accumulator NaN after the loop, for a term under ``where(c(x), ..., 0)``.

    Where the running max its exponent reads ends -inf or NaN, the reference's ``exp(s - m)`` is NaN
    for every element, but the where keeps its 0 for the elements it does not select: the reference
    is NaN only when some element of the row is selected. A max state of ``where(live, 1, 0)`` records
    that (the online loop cannot: a selected element seen before the NaN may have been rescaled to 0).
    """
    if acc.live is None:
        return unseen
    nan_row = b.nan_row(acc)
    guard = nan_row if unseen is None else unseen if nan_row is None else Binary(BinaryOp.OR, unseen, nan_row, bool_)
    if guard is None:
        return None
    d = acc.term.dtype
    flag_term = Select(acc.live, Const(1.0, d), Const(0.0, d), d)
    # An earlier member's flag over fewer axes (l's per row, for P·V's row of outputs) serves as it is.
    shared = next((st for st in b.states if isinstance(st, OnlineState) and st.op is ReduceOp.MAX
                   and st.term == flag_term and st.rescale is None and set(st.axes) <= set(member.axes)), None)
    if shared is not None:
        flag = Load(shared.acc, shared.axes)
    else:
        buf = b.state_for(member, Accumulator(ReduceOp.MAX, flag_term, Linear(), flag_term, Const(1.0, d)),
                          Buffer(f"{member.name}_live", member.out.type))
        flag = Load(buf, member.axes)
    seen = Binary(BinaryOp.GT, flag, Const(0.0, d), bool_)
    return Binary(BinaryOp.AND, guard, seen, bool_)


def fuse_cascade(p: Program, cand: Candidate) -> tuple[Program, CascadeGroup]:
    """Rewrite `p` so that the members of `cand` that factor run in one `FusedLoop`."""
    axis = Axis(_fresh_axis_name(p), cand.extent)
    first = cand.members[0]
    group = CascadeGroup(tuple(m.name for m in cand.members), axis,
                         f"{first.reduce_axis.extent} elements, reduced by {', '.join(m.name for m in cand.members)}")
    b = LoopBuilder(axis, taken=_buffers(p))
    fused: list[Member] = []
    after_loop: set[str] = set()   # results that exist only once the loop is over (a top-k's lists)
    refused: dict[str, str] = {}
    unfused: set[str] = set()      # every buffer a refused member writes (a top-k's indices too)
    notes: list[str] = []
    extrema: list[Extremum] = []   # fused running max/min members read as they are (bounds narrowing casts)
    at_least_one: set[str] = set()   # fused sums of exp(e - max e), at least 1 (bound a later exp(... - log S))
    for member in cand.members:
        name = member.name
        value = rename_axes(member.value, {member.reduce_axis.name: axis})
        blocked = sorted(reads(member.stmt) & (unfused | after_loop))
        if blocked:
            unfused.update(out.name for out in written(member.stmt))
            refused[name] = (f"`{name}` reads `{blocked[0]}`, which is not fused, so it needs its final value"
                             if blocked[0] in unfused else
                             f"`{name}` reads the top-k result `{blocked[0]}`, which is only known after the pass")
            group.decompositions[name] = Refusal(refused[name])
            continue
        # Earlier results stay atoms for the algebra (their final values after the loop, their running
        # values inside it: `running`), so they are never expanded into accumulator polynomials.
        earlier = {st.acc.name for st in b.states if isinstance(st, OnlineState)} | set(b.epilogue_values)
        ctx = FusionContext(axis.name, frozenset(earlier), frozenset(b.positive),
                            maxima=frozenset(n for n, v in b.running_extrema().items() if v < 0),
                            extrema=tuple(extrema), at_least_one=frozenset(at_least_one))
        value = rounded_exponents(value, ctx)
        dec = decompose(value, member.order_op, ctx, name)
        unstable = None
        if isinstance(dec, Decomposition) and dec.expanded and member.order_op is ReduceOp.SUM and not member.is_topk:
            # Expanded terms can cancel: keep them centred on a running statistic where the body allows.
            online_states = tuple(st for st in b.states if isinstance(st, OnlineState))
            delta = Load(Buffer(f"{name}_delta", member.out.type), member.axes)
            dec, unstable = stabilize(dec, value, ctx, online_states, b.running, axis, name, delta)
            if unstable is not None:
                # A multiplied-out difference with no stable form would cancel: a second pass is exact.
                dec = Refusal(f"`{name}` has no shift-stable fused form, and its expanded sums would cancel "
                              f"where the data is close to the earlier result: {unstable}; so a second pass")
        if isinstance(dec, Decomposition):
            dec = unbounded_exponential(value, ctx, name) or dec
        if isinstance(dec, Decomposition):
            failure = check(value, dec, ctx)
            if failure:
                dec = Refusal(f"`{name}`: the factorization failed its numeric identity check ({failure}); "
                              "kept unfused (this is a RedFuser bug worth reporting)")
        if isinstance(dec, Decomposition) and member.is_topk:
            why = list_order_refusal(member, value, dec, frozenset(earlier))
            if why is not None:
                dec = Refusal(why)
        group.decompositions[name] = dec
        if isinstance(dec, Refusal):
            refused[name] = dec.reason
            unfused.update(out.name for out in written(member.stmt))
            continue
        fused.append(member)
        if member.is_topk:
            after_loop |= {member.out.name, member.indices.name}
        unseen = [_where_live(b, member, acc, b.unseen(acc)) for acc in dec.accumulators]
        for n, acc in enumerate(dec.accumulators):
            if not _carried_only(dec.factors[n]):
                guard = b.centred_nan_guard(member, acc, value, lambda e: ctx.kind(e) in ("x", "mixed"))
                if guard is not None:
                    unseen[n] = guard if unseen[n] is None else Binary(BinaryOp.OR, unseen[n], guard, bool_)
        direct = (len(dec.accumulators) == 1 and dec.factors[0] is None and dec.addend is None
                  and unseen[0] is None)
        extremum = member.order_op in (ReduceOp.MAX, ReduceOp.MIN) and not member.is_topk
        if direct and dec.kind == "independent" and extremum:
            extrema.append(Extremum(name, member.axes, member.order_op, value))
        if member.order_op is ReduceOp.SUM and not member.is_topk and sums_at_least_one(value, ctx):
            at_least_one.add(name)
        accs = []
        for n, acc in enumerate(dec.accumulators):
            if acc.shift is not None:
                lower = [accs[j] for j in acc.shift.lower]
                accs.append(b.centred_state(member, acc, lower, Buffer(f"{name}_acc", member.out.type)))
                group.state_of[(name, n)] = accs[-1].name
                continue
            if (acc.op is ReduceOp.SUM and not member.is_topk and not direct and not acc.online.terms
                    and not acc.powers.factors and _constant(acc.term)):
                # A sum of a constant needs no loop-carried state: it is extent * constant.
                accs.append(Binary(BinaryOp.MUL, Const(float(axis.extent), acc.term.dtype), acc.term, acc.term.dtype))
                continue
            suggested = member.out if direct else Buffer(f"{name}_acc", member.out.type)
            nan_row = b.nan_row(acc) if member.is_topk else None
            indices = Buffer(f"{member.indices.name}_acc", member.indices.type) if nan_row is not None else None
            if acc.op is ReduceOp.PROD and acc.online.terms:
                accs.append(b.product_state(member, acc, suggested))   # the product law
            else:
                accs.append(b.state_for(member, acc, suggested, indices))
            group.state_of[(name, n)] = accs[-1].name
            if indices is not None:
                # A NaN met in a late chunk would keep earlier positions; the reference's NaN row keeps 0..k-1.
                rank = IndexValue(member.axes[member.rank], member.indices.dtype)
                fixed = Select(nan_row, rank, Load(indices, member.axes), member.indices.dtype)
                b.epilogue.append(Compute(member.indices, member.axes, fixed, loc=member.loc))
        read = accs
        if isinstance(dec, Decomposition) and own_centre_of(dec) is not None:
            read = finish_own_centre(b, member, dec, accs)   # delta = c - k Y after the loop; infinite top powers
        if not (direct and isinstance(accs[0], Buffer) and accs[0] == member.out):
            # Inside the loop later members read the running value; after it, the exact one.
            running_value = _epilogue_value(member, dec, read)
            b.epilogue_values[name] = (member.axes, b.running(running_value))
            if not member.is_topk and is_positive(b.running(running_value), frozenset(b.positive)):
                b.positive.add(name)
            final = _epilogue_value(member, dec, read, unseen)
            if name in b.extreme_terms and member.order_op is ReduceOp.SUM:
                final = _infinite_at_extreme(final, *b.extreme_terms[name])
            b.epilogue.append(Compute(member.out, member.axes, final, loc=member.loc))
        if dec.expanded:
            notes.append(f"`{name}` was expanded into {len(dec.accumulators)} accumulated terms; exact in real "
                         "arithmetic, but terms of opposite sign can cancel in floating point when they are large "
                         "compared with their sum (no term multiplies out a difference of the reduced values and an "
                         "earlier result, which would have been centred or refused)")
    group.notes = tuple(notes)
    group.reason = "; ".join(refused.values()) or None
    if len(fused) < 2 and not (len(cand.members) == len(fused) == 1):   # (a lone one: `cascade.swept_later`)
        group.fused = False
        if group.reason is None:
            group.reason = "fewer than two reductions of the cascade factor, so there is nothing to fuse"
        return p, group
    p = recompute_gathered_reads(p, {id(m.stmt) for m in fused}, _state_exprs(b), b.epilogue, axis)
    locals_ = _pull_locals(p, fused, b, axis)
    loop = FusedLoop(axis, tuple(l for _, l in locals_), tuple(b.states), loc=first.loc)
    group.fused, group.fused_members = True, tuple(m.name for m in fused)
    group.locals = tuple(l.out.name for _, l in locals_)
    group.states, group.epilogue = loop.states, tuple(b.epilogue)
    return _place(p, {id(m.stmt) for m in fused} | {id(s) for s, _ in locals_}, loop, b.epilogue), group


def _state_exprs(b: LoopBuilder) -> list[Expr]:
    """Every expression the fused loop's states compute per chunk: terms, rescales, carries."""
    return [e for st in b.states for e in state_exprs(st)]


def _pull_locals(p: Program, fused: list[Member], b: LoopBuilder, axis: Axis) -> list[tuple[Reduce, Reduce]]:
    """Reductions read only by the loop, along its axis at one fixed dim: computed per chunk inside it."""
    fused_ids = {id(m.stmt) for m in fused}
    outputs = {o.name for o in p.outputs}
    used_elsewhere = set()
    for s in p.body:
        if id(s) not in fused_ids:
            used_elsewhere |= reads(s)
    for e in b.epilogue:
        used_elsewhere |= reads(e)
    exprs = _state_exprs(b)
    found = []
    for s in p.body:
        if not isinstance(s, Reduce) or s.out.name in outputs or s.out.name in used_elsewhere:
            continue
        loads = [n for e in exprs for n in walk(e) if isinstance(n, Load) and n.buffer.name == s.out.name]
        dims = {_read_along(n.indices, axis) for n in loads}
        if len(dims) != 1 or -1 in dims or not all(_tiles_with(n, s) for n in loads):
            continue
        d = dims.pop()
        renamed = rename_axes(s.value, {s.axes[d].name: axis})
        new_axes = tuple(axis if k == d else a for k, a in enumerate(s.axes))
        found.append((s, replace(s, axes=new_axes, value=renamed)))
    return found


def _tiles_with(load: Load, local: Reduce) -> bool:
    """Whether `load` reads `local` at its own axes, as a per-chunk tile of the loop: every index an axis, or index
    0 of a length-1 dim. Row 1 of a matmul (``(a @ b)[1, :]``) is not: the scheduler keeps a local's dims as the
    kernel's axes and cannot pick one row of them (fuzz: seed 46, example 632, an internal error); computed
    before the loop, the reduction is read from memory at any position."""
    return all(isinstance(i, Axis) or a.extent == 1
               for i, a in zip(load.indices, local.axes))


def _place(p: Program, removed: set[int], loop: FusedLoop, epilogue: list[Compute]) -> Program:
    """Put the loop where all its inputs exist; move what needs its results after it."""
    positions = [k for k, s in enumerate(p.body) if id(s) in removed]
    lo, hi = min(positions), max(positions)
    produced = {b.name for b in loop.outs} | {e.out.name for e in epilogue}
    before, after = [], []
    for s in p.body[lo:hi + 1]:
        if id(s) in removed:
            continue
        if reads(s) & produced:
            after.append(s)
            produced |= {b.name for b in written(s)}
        else:
            before.append(s)
    body = list(p.body[:lo]) + before + [loop] + list(epilogue) + after + list(p.body[hi + 1:])
    return replace(p, body=tuple(body))


__all__ = ["fuse_cascade", "dependencies", "format_expr"]
