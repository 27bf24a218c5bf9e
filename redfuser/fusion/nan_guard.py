"""Pass `read_extrema_safely`: after the loop, exponentials read a running max as the loop does.

Inside a fused loop a running max is read as 0 inside exponentials while it still holds its identity
(`LoopBuilder.safe`: ``exp(x - where(m == -inf, 0, m))``), so that a chunk of -inf does not make the
running sum NaN. The statements after the loop read the final ``m`` as it is: softmax's output is
``exp(x - m) / sum`` with ``sum = where(m == -inf, nan, sum_acc)``. Where the loop's last chunk is its
only one (a row that fits one tile), the two exponentials differ only in that guard, so the scheduler
cannot share them and computes each element's exponential twice.

This pass reads such a max safely in a statement whose value is NaN whenever the max is at its
identity, because a NaN guard (`LoopBuilder.unseen`'s ``where(m == -inf, nan, ...)``) reaches the
value through NaN-propagating arithmetic only. There the replaced read changes nothing: where the max
is at its identity the value is NaN either way, and elsewhere ``where(m == -inf, 0, m)`` is ``m``.

Guarantees: every value is unchanged (NaN stays NaN); only reads of running maxima (or minima) inside
exponentials of statements after a fused loop are replaced, and never inside a condition.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..ir import (
    Binary,
    BinaryOp,
    Cast,
    Compute,
    Const,
    Expr,
    FusedLoop,
    Load,
    OnlineState,
    Program,
    ReduceOp,
    Select,
    Unary,
    UnaryOp,
    map_expr,
)
from ..ir.semantics import WIDE_MATH
from ..ir.types import bool_
from .substitute import rename_axes

_PROPAGATING_BINARY = frozenset({BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.DIV})
"""Binary ops whose result is NaN when either operand is (not ``**``: ``1 ** nan`` is 1)."""

_PROPAGATING_UNARY = frozenset({UnaryOp.NEG, UnaryOp.ABS, UnaryOp.EXP, UnaryOp.EXP2, UnaryOp.LOG, UnaryOp.LOG2,
                                UnaryOp.SQRT, UnaryOp.RSQRT, UnaryOp.FLOOR, UnaryOp.CEIL, UnaryOp.TRUNC,
                                UnaryOp.RINT}) | WIDE_MATH

_EXPONENTIALS = frozenset({UnaryOp.EXP, UnaryOp.EXP2})


def running_extrema(states) -> dict[str, float]:
    """The max/min states among `states` and their identities (what they hold before any element is seen)."""
    return {st.acc.name: st.op.identity(st.acc.dtype) for st in states
            if isinstance(st, OnlineState) and st.op in (ReduceOp.MAX, ReduceOp.MIN)}


def sums_of_exponentials(states) -> frozenset[str]:
    """The running sums among `states` whose term is an exponential: such a sum is 0 exactly while every term
    it has seen was ``exp(-inf)`` (a row masked so far)."""
    return frozenset(st.acc.name for st in states if isinstance(st, OnlineState) and st.op is ReduceOp.SUM
                     and isinstance(st.term, Unary) and st.term.op is UnaryOp.EXP)


def read_logs_safely(e: Expr, sums: frozenset[str]) -> Expr:
    """`e` reading ``log(l)`` of each running sum of exponentials `l` in `sums` as ``log(where(l == 0, 1, l))``:
    0 while the sum is still 0, as a running max at its identity reads as 0 (`read_safely`). A term
    ``exp(x - m - log(l))`` over a chunk masked so far was ``exp(-inf + inf)``, NaN, and stayed NaN through
    every later rescale (fuzz seed 111, example 1432: a softmax written as ``exp(y - log(sum(exp(y))))`` of a
    row whose first keys are masked). Exact: while ``l`` is 0 every term read so far is ``exp(-inf)``, 0 for
    any finite offset, and the rescale reads the previous sum as it was (``log(0)``: a factor 0 on a state
    that is still 0)."""

    def fix(n: Expr) -> Expr | None:
        if isinstance(n, Unary) and n.op is UnaryOp.LOG and isinstance(n.x, Load) and n.x.buffer.name in sums:
            empty = Binary(BinaryOp.EQ, n.x, Const(0.0, n.x.dtype), bool_)
            return Unary(UnaryOp.LOG, Select(empty, Const(1.0, n.x.dtype), n.x, n.x.dtype), n.dtype)
        return None

    return map_expr(e, fix)


def read_safely(e: Expr, extrema: dict[str, float], only: frozenset[Load] | None = None) -> Expr:
    """`e` reading each running max/min of `extrema` (name -> identity) as 0 while it holds its identity:
    ``where(m == identity, 0, m)``. With `only`, just the reads in it."""

    def fix(n: Expr) -> Expr | None:
        if isinstance(n, Load) and n.buffer.name in extrema and (only is None or n in only):
            is_identity = Binary(BinaryOp.EQ, n, Const(extrema[n.buffer.name], n.dtype), bool_)
            return Select(is_identity, Const(0.0, n.dtype), n, n.dtype)
        return None

    return map_expr(e, fix)


def read_extrema_safely(p: Program) -> Program:
    """`p` with the statements after its fused loops reading running maxima safely where that cannot
    change their value (see the module docstring)."""
    extrema: dict[str, float] = {}
    guards: dict[str, tuple[tuple[str, ...], frozenset[Load]]] = {}   # buffer -> (its axes, reads at identity)
    body = []
    for s in p.body:
        if isinstance(s, FusedLoop):
            extrema.update(running_extrema(s.states))
        elif isinstance(s, Compute) and extrema:
            guard = _guard_reads(s.value, extrema)
            if guard is not None:
                guards[s.out.name] = (tuple(a.name for a in s.axes), guard)
            nan_when = _nan_when(s.value, extrema, guards)
            if nan_when:
                s = replace(s, value=_rewrite(s.value, extrema, nan_when))
        body.append(s)
    return replace(p, body=tuple(body))


def _is_guard(e: Expr) -> bool:
    return isinstance(e, Select) and isinstance(e.a, Const) and isinstance(e.a.value, float) and math.isnan(e.a.value)


def _guard_reads(e: Expr, extrema: dict[str, float]) -> frozenset[Load] | None:
    """For ``where(c, nan, x)`` with `c` an OR of ``m[...] == identity`` over running extrema: those reads."""
    if not _is_guard(e):
        return None
    found: set[Load] = set()

    def atoms(c: Expr) -> bool:
        if isinstance(c, Binary) and c.op is BinaryOp.OR:
            return atoms(c.a) and atoms(c.b)
        if (isinstance(c, Binary) and c.op is BinaryOp.EQ and isinstance(c.a, Load) and c.a.buffer.name in extrema
                and isinstance(c.b, Const) and c.b.value == extrema[c.a.buffer.name]):
            found.add(c.a)
            return True
        return False

    return frozenset(found) if atoms(e.cond) else None


def _nan_when(e: Expr, extrema: dict[str, float], guards: dict) -> frozenset[Load]:
    """Reads ``m[...]`` such that `e` is NaN whenever one of them holds its identity."""
    if not e.dtype.is_float:
        return frozenset()
    if isinstance(e, Select):
        return _guard_reads(e, extrema) or frozenset()
    if isinstance(e, Load) and e.buffer.name in guards:
        axes, reads = guards[e.buffer.name]
        mapping = dict(zip(axes, e.indices))
        return frozenset(rename_axes(r, mapping) for r in reads)
    if isinstance(e, Binary) and e.op in _PROPAGATING_BINARY:
        return _nan_when(e.a, extrema, guards) | _nan_when(e.b, extrema, guards)
    if isinstance(e, Unary) and e.op in _PROPAGATING_UNARY:
        return _nan_when(e.x, extrema, guards)
    if isinstance(e, Cast):
        return _nan_when(e.x, extrema, guards)
    return frozenset()


def _rewrite(e: Expr, extrema: dict[str, float], reads: frozenset[Load], inside_exp: bool = False) -> Expr:
    """`e` with the `reads` inside its exponentials read safely; conditions are left as they are (a guard's
    own test must not change)."""
    if isinstance(e, Load):
        return read_safely(e, extrema, reads) if inside_exp else e
    if isinstance(e, Unary | Cast):
        inner = inside_exp or (isinstance(e, Unary) and e.op in _EXPONENTIALS)
        x = _rewrite(e.x, extrema, reads, inner)
        return e if x is e.x else replace(e, x=x)
    if isinstance(e, Binary | Select):              # a select's condition stays as it is
        a, b = _rewrite(e.a, extrema, reads, inside_exp), _rewrite(e.b, extrema, reads, inside_exp)
        return e if (a is e.a and b is e.b) else replace(e, a=a, b=b)
    return e
