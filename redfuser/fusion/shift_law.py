"""The shift law as Loop IR: how a shift-stable accumulator's state is updated and merged.

`fusion/centred.py` decides the form (which centre, which powers); this module writes the loop's side
of it as ordinary arithmetic on loop-carried state, for `LoopBuilder`:

- `loop_term`: the term each element adds, ``u - c_run`` in place of the centred atom;
- `centre_move`: ``d = c_before - c_now`` (0 while nothing was seen);
- `carry_expr`: ``T_k(now) = exp(alpha d) * sum_{j <= k} C(k, j) d^(k - j) T_j(before)`` (`OnlineState.carry`);
  the merge of split reductions maps its prev-buffers to each side (`fusion/merge.py`);
- `centre_unseen`, `overflows` / `overflow_condition`: where the reference's terms are NaN though the
  loop's sums are not: a max/min centre that never left its identity (``-inf - -inf``), or an ``u - c``
  that overflowed in ``exp(alpha (u - c)) (u - c)^k`` (``0 * inf``), which the loop cannot see against a
  moving centre.
"""
from __future__ import annotations

from math import comb
from typing import Callable

from ..ir import Binary, BinaryOp, Cast, Const, DType, Expr, Load, ReduceOp, Select, Unary, UnaryOp, map_expr
from ..ir.types import bool_
from .centred import Centre, Shift


def centre_now(centre: Centre, count: Load | None) -> Expr:
    """The running centre after this chunk, inside the loop: the running max (0 while it is at its
    identity, as exponentials read it), or ``S / n`` (0 before any element)."""
    if centre.op is ReduceOp.SUM:
        return _mean(centre.source, count, centre.marker.dtype)
    d = centre.source.dtype
    ident = Const(centre.op.identity(d), d)
    return Select(Binary(BinaryOp.EQ, centre.source, ident, bool_), Const(0.0, d), centre.source, d)


def _mean(total: Expr, count: Expr, d: DType, empty_is_zero: bool = True) -> Expr:
    """``S / n`` (0 while ``n`` is 0, where `empty_is_zero`) in the count's dtype, then in the centred values'
    dtype `d`: a 16-bit sum's count is an f32 state (exact to 2^24 elements, where f16 counts exactly only
    to 2048 and bf16 to 256), and its mean is rounded to `d` once, as the reference's ``S / N`` is."""
    w = count.dtype
    s = total if total.dtype == w else Cast(total, w)
    mean: Expr = Binary(BinaryOp.DIV, s, count, w)
    if empty_is_zero:
        mean = Select(Binary(BinaryOp.EQ, count, Const(0.0, w), bool_), Const(0.0, w), mean, w)
    return mean if w == d else Cast(mean, d)


def _values_dtype(centre: Centre) -> DType:
    """The dtype ``u - c`` is computed in: the centred values' (a mean's state may be wider: `_mean`), or the
    running max/min's own."""
    return centre.marker.dtype if centre.op is ReduceOp.SUM else centre.source.dtype


def centre_move(centre: Centre, count: Load | None, to_prev: Callable[[Expr], Expr]) -> Expr:
    """``d = c_before - c_now``: 0 while nothing was seen before the chunk (the accumulators hold
    nothing to move, or only the reference's NaN)."""
    d = _values_dtype(centre)
    now = centre_now(centre, count)
    if centre.op is ReduceOp.SUM:
        n_prev = to_prev(count)
        before: Expr = _mean(to_prev(centre.source), n_prev, d, empty_is_zero=False)   # (`empty` below)
        empty = Binary(BinaryOp.EQ, n_prev, Const(0.0, n_prev.dtype), bool_)
    else:
        before = to_prev(centre.source)
        empty = Binary(BinaryOp.EQ, before, Const(centre.op.identity(d), d), bool_)
    return Select(empty, Const(0.0, d), Binary(BinaryOp.SUB, before, now, d), d)


def carry_expr(shift: Shift, prevs: list[Load], move: Expr, rescale: Expr | None) -> Expr:
    """The shift law: ``R * sum_{j <= k} C(k, j) d^(k - j) T_j`` with ``R = exp(alpha d) * rescale``
    (``rescale * T_k`` where ``d`` is 0).

    ``d^(k - j)`` is formed before ``R`` multiplies it, so that an overflowing move gives
    ``0 * inf = NaN`` exactly where the reference's terms ``exp(u - c) (u - c)^k`` do.

    It is computed in the sums' dtype (f32 for 16-bit values, whose running sums are f32), the move cast to
    it: in the centre's 16-bit dtype each chunk's shifted sums were rounded to 16 bits (an f16 variance of
    65 536 elements in chunks of 8 was 42% off in the interpreter, which evaluates the carry as typed)."""
    d = prevs[-1].dtype
    if move.dtype != d:
        move = Cast(move, d)
    r: Expr | None = rescale
    if shift.alpha:
        scaled = move if shift.alpha == 1.0 else Binary(BinaryOp.MUL, Const(shift.alpha, d), move, d)
        e = Unary(UnaryOp.EXP, scaled, d)
        r = e if r is None else Binary(BinaryOp.MUL, e, r, d)
    k = shift.degree
    out: Expr | None = None
    for j, prev in enumerate(prevs):
        coef: Expr | None = None
        for _ in range(k - j):
            coef = move if coef is None else Binary(BinaryOp.MUL, coef, move, d)
        if comb(k, j) != 1:
            coef = Binary(BinaryOp.MUL, Const(float(comb(k, j)), d), coef, d)
        if r is not None:
            coef = r if coef is None else Binary(BinaryOp.MUL, r, coef, d)
        part = prev if coef is None else Binary(BinaryOp.MUL, coef, prev, d)
        if coef is not None and not shift.alpha and j < k:
            # a lower sum that is exactly 0 (sum (x - c) about the mean itself) adds nothing in exact arithmetic;
            # times a coefficient that overflowed (2d past f32, an infinite move of a mean whose sum overflowed)
            # it was NaN, where numpy's plain powers (x - c)**k are inf (the variance of [3e38, -3e38, 0, 0])
            part = Select(Binary(BinaryOp.EQ, prev, Const(0.0, d), bool_), Const(0.0, d), part, d)
        out = part if out is None else Binary(BinaryOp.ADD, out, part, d)
    # A centre that did not move leaves the sums as they are: 0 * T_j would turn a lower power that an
    # infinite element made infinite (sum (x - m) = -inf beside a -inf x) into NaN.
    own = prevs[-1] if rescale is None else Binary(BinaryOp.MUL, rescale, prevs[-1], d)
    return Select(Binary(BinaryOp.EQ, move, Const(0.0, d), bool_), own, out, d)


def centre_unseen(shift: Shift) -> Expr:
    """True where a running max/min centre ended at its identity (every element was its -inf/+inf)."""
    source = shift.centre.source
    return Binary(BinaryOp.EQ, source, Const(shift.centre.op.identity(source.dtype), source.dtype), bool_)


def overflows(shift: Shift) -> bool:
    """Whether the reference's term is NaN where some ``u - c`` overflows: ``exp(alpha w) * w^k`` with
    ``alpha w -> -inf`` is ``0 * inf``. The loop sees ``u - c`` only against the running centre, so it
    keeps the reduced values' other extreme to tell (see `overflow_condition`)."""
    op = shift.centre.op
    return shift.degree > 0 and ((op is ReduceOp.MAX and shift.alpha > 0) or (op is ReduceOp.MIN and shift.alpha < 0))


def overflow_condition(shift: Shift, extreme: Load) -> Expr:
    """True where the reference's ``u - c`` is infinite for the element farthest from the centre
    (`extreme`: the running min of ``u`` for a max centre, the running max for a min centre); the
    subtraction rounds exactly as the reference's does for that element."""
    d = extreme.dtype
    far = Const(float("-inf") if shift.centre.op is ReduceOp.MAX else float("inf"), d)
    return Binary(BinaryOp.EQ, Binary(BinaryOp.SUB, extreme, shift.centre.source, d), far, bool_)


def loop_term(shift: Shift, count: Load | None) -> Expr:
    """The accumulated term as the loop evaluates it: ``u - c_run`` for the marker."""
    d = _values_dtype(shift.centre)
    if shift.centre.op is ReduceOp.SUM:
        w: Expr = Binary(BinaryOp.SUB, shift.centre.u, centre_now(shift.centre, count), d)
    else:
        w = Binary(BinaryOp.SUB, shift.centre.u, shift.centre.source, d)
    marker = shift.centre.marker
    return map_expr(shift.term, lambda n: w if n == marker else None)


__all__ = ["centre_now", "centre_move", "carry_expr", "loop_term", "centre_unseen", "overflows", "overflow_condition"]
