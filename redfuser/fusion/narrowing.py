"""A narrowing float cast inside a cascade: ``cast(G(x)·H(y))`` with the rounding moved.

FlashAttention's own numerics: ``(p.astype(f16) @ v) / l`` and ``(p / l).astype(bf16) @ v`` with
``p = exp(s - m)``. The cast rounds, so the algebra does not look through it; yet in exact arithmetic
``cast(G·H) = G·H``, and the fused loop may evaluate the cast at a different, equally legitimate point:

- H's *online* part (``exp(-m)``) at its running value: the loop rounds ``cast(G(x)·exp(e(x) - e(m_t)))``
  and rescales the accumulator per chunk like any online factor;
- H's *deferred* part (``1/l``) after the loop: the rounding moves before the normalization.

Each side rounds every term once, relatively (plus a subnormal floor), so both are within the same
bound of the exact sum (docs/fusion.md, "Narrowing casts inside a cascade"). What is not the same is
overflow: the loop rounds values at least as large as the reference's (``m_t <= m``, ``1/l`` not yet
applied), so the cast must be shown never to overflow where the reference does not. `split_narrowing`
proves that from the program (``exp(e(x) - e(m_t)) <= 1`` where ``m`` is the running max of exactly
``e(x)``, and ``|G(x)|`` bounded by the target's largest finite value) and refuses otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

from ..ir import (Axis, Binary, BinaryOp, Cast, Const, DType, Expr, Load, ReduceOp, Select, Unary, UnaryOp,
                  format_expr, walk)
from . import algebra as A
from .build import product_expr
from .substitute import value_at

if TYPE_CHECKING:
    from .separability import Decomposition, FusionContext


@dataclass(frozen=True)
class Extremum:
    """An earlier member of the cascade that is a running max or min of a body read along the loop."""

    name: str
    axes: tuple[Axis, ...]
    op: ReduceOp
    body: Expr


@dataclass(frozen=True)
class NarrowedCast:
    """How a narrowing cast ``cast(G(x)·H(y))`` joins the loop.

    `g_atom` is the cast with H taken out (what `explain` and the numeric check call G), `online_atom`
    the cast the loop evaluates (H's online part inside, at its running value), `online` H's online
    exponent and `deferred` the factors of H applied after the loop.
    """

    g_atom: Expr
    online_atom: Expr
    online: A.Linear
    deferred: A.Monomial


def split_narrowing(atom: Cast, p: A.Power, ctx: "FusionContext", name: str) -> NarrowedCast | str:
    """`atom` (a narrowing float cast that reads both x and y, raised to `p`) as a `NarrowedCast`, or
    why it cannot join the loop, in words."""
    where = f"in `{name}`, the cast {format_expr(atom)}"
    if p.denominator != 1 or p < 1:
        return f"{where} is raised to the power {p}; only positive integer powers of a rounded value are fused"
    inner = ctx.normal_form(atom.x, signs=False)
    if len(inner) != 1:
        return f"{where} rounds a sum of {len(inner)} terms, which does not factor into G(x)·H(y)"
    t = inner[0]
    g: dict = {}
    deferred: dict = {}
    for a, q in t.mono.factors:
        kind = ctx.kind(a)
        if kind == "mixed" and isinstance(a, Select):
            return (f"{where} rounds the where {format_expr(a)}; a where inside a narrowing cast is not taken "
                    "apart (not fused yet): mask the scores with -inf before the max, or round outside the where")
        if kind == "mixed":
            return (f"{where} rounds {format_expr(a)}, which mixes the reduced values with an earlier result "
                    "and does not factor into G(x)·H(y)")
        (deferred if kind == "y" else g)[a] = q
    parts = A.split_exponent(t.exponent, ctx.kind)
    if isinstance(parts, A.Monomial):
        return f"{where} has an exponential that does not split into exp(x)·exp(y)"
    x_lin, y_lin = parts
    src = atom.x.dtype
    bound = exp_bound(x_lin, y_lin, ctx)
    if bound is not None:
        return f"{where}: {bound}, and the rounded value with it"
    big = g_bound(t.coeff, A.Monomial.of(g))
    limit = float(ml_dtypes.finfo(atom.dtype.numpy).max)
    if not big <= limit:
        shown = format_expr(product_expr(A.Product(t.coeff, A.Monomial.of(g)), src))
        return (f"{where} would round {atom.dtype} values larger than the reference's (before the running max "
                f"is final and before the factor after the loop), and |{shown}| is not bounded by {atom.dtype}'s "
                f"largest finite value {limit:g} (its inputs' types allow {big:g}), so the loop could overflow to "
                "inf where the reference stays finite; cast a value whose range fits")
    g_atom = Cast(product_expr(A.Product(t.coeff, A.Monomial.of(g), x_lin), src), atom.dtype)
    online_atom = Cast(product_expr(A.Product(t.coeff, A.Monomial.of(g), x_lin + y_lin), src), atom.dtype)
    return NarrowedCast(g_atom, online_atom, y_lin.scale(float(p)), A.Monomial.of(deferred).power(p))


def distribute_cast(atom: Cast, ctx: "FusionContext") -> Select | None:
    """``cast(where(c, a, b)·h)`` as ``where(c, cast(a·h), cast(b·h))`` (exact: the where picks one value
    and the cast rounds it), for a cast of one product holding one where whose condition reads no earlier
    result, so that the where is taken apart like any other (`separability._x_select`) and each branch's
    cast is split by `split_narrowing`. None for any other cast. A constant branch with nothing to
    multiply (``where(mask, exp(s - m), 0)``) is rounded here, so that its 0 stays a 0."""
    inner = ctx.normal_form(atom.x, signs=False)
    if len(inner) != 1:
        return None
    t = inner[0]
    wheres = [a for a, q in t.mono.factors if isinstance(a, Select) and q == 1 and ctx.kind(a) == "mixed"
              and ctx.kind(a.cond) in ("x", "c")]
    if len(wheres) != 1:
        return None
    (where,) = wheres
    rest = A.Product(t.coeff, A.Monomial.of({a: q for a, q in t.mono.factors if a != where}), t.exponent)
    src = atom.x.dtype

    def branch(e: Expr) -> Expr:
        if rest == A.Product() and isinstance(e, Const):
            return Const(float(np.asarray(e.value, src.numpy).astype(atom.dtype.numpy)), atom.dtype)
        return Cast(e if rest == A.Product() else Binary(BinaryOp.MUL, e, product_expr(rest, src), src), atom.dtype)

    return Select(where.cond, branch(where.a), branch(where.b), atom.dtype)


def exp_bound(x_lin: A.Linear, y_lin: A.Linear, ctx: "FusionContext", overflow_only: bool = False) -> str | None:
    """None when ``exp(x_lin + y_lin)`` is at most 1 wherever the loop evaluates it with the running
    values of y, else why not: each y term must be ``-c·m`` for a running max ``m`` of a body ``e``
    (``+c·m`` for a running min), or ``-c·log S`` for a running sum ``S`` that is at least 1
    (`FusionContext.at_least_one`: a softmax's denominator), and the x part ``Σ c·e`` plus a constant
    ``<= 0``, compared in normal form, so that the exponent is ``Σ c·(e(x_k) - m_t) + constant <= 0`` for
    every element seen so far (``m_t`` already includes the current chunk). Where it is not, the running
    value of the max, below its final one, can make the loop's exponential overflow to inf where the
    reference's is finite (``exp(y - max x)`` with a large ``y`` before the max of ``x``). With
    `overflow_only`, terms whose running value only makes the exponent smaller than the reference's
    (``+c·max``, ``-c·min``) are left out: they cannot make the loop overflow where the reference does not."""
    if overflow_only:
        y_lin = A.Linear.of({mono: c for mono, c in y_lin.terms if not _lowers_exponent(mono, c, ctx)})
        if y_lin.is_zero:
            return None
    rest = _exp_rest(x_lin, y_lin, ctx)
    if isinstance(rest, str):
        return rest
    if rest.terms or rest.constant > 0:
        return ("its exponential's reduced part is not the very body its running max reduces (compared in normal "
                "form), so exp(e(x) - max e) cannot be shown <= 1 inside the loop, where it could overflow")
    return None


def _lowers_exponent(mono: A.Monomial, c: float, ctx: "FusionContext") -> bool:
    """Whether the term ``c·mono`` of an exponent is ``+c·max`` or ``-c·min`` of a running extremum: its running
    value makes the exponent smaller than the reference's final one, never larger."""
    if len(mono.factors) != 1 or mono.factors[0][1] != 1 or not isinstance(mono.factors[0][0], Load):
        return False
    name = mono.factors[0][0].buffer.name
    op = next((e.op for e in ctx.extrema if e.name == name), None)
    return op is not None and (op is ReduceOp.MAX) == (c > 0)


def attains_one(x_lin: A.Linear, y_lin: A.Linear, ctx: "FusionContext") -> bool:
    """Whether ``exp(x_lin + y_lin)`` is at most 1 in the loop (`exp_bound`) and exactly 1 at the element
    that holds the running max (``exp(e - max e)``): a running sum of it is then at least 1."""
    rest = _exp_rest(x_lin, y_lin, ctx)
    return not isinstance(rest, str) and not rest.terms and rest.constant == 0 and not y_lin.is_zero


def _exp_rest(x_lin: A.Linear, y_lin: A.Linear, ctx: "FusionContext") -> A.Linear | str:
    """``x_lin`` less the bodies of the running extrema `y_lin` subtracts (each times its coefficient), or why
    `y_lin` is not made of such extrema and logs of sums at least 1."""
    extrema = {e.name: e for e in ctx.extrema}
    expected = A.Linear()
    for mono, c in y_lin.terms:
        atom, power = mono.factors[0] if len(mono.factors) == 1 else (None, None)
        if (c < 0 and power == 1 and isinstance(atom, Unary) and atom.op is UnaryOp.LOG
                and isinstance(atom.x, Load) and atom.x.buffer.name in ctx.at_least_one):
            continue        # -c·log S <= 0
        ext = extrema.get(atom.buffer.name) if isinstance(atom, Load) and power == 1 else None
        if ext is None or (ext.op is ReduceOp.MAX) != (c < 0):
            return ("its exponential is not of the form exp(c·(e(x) - max e)) with the running max of e, so it is "
                    "not bounded by 1 inside the loop, where it could overflow")
        body = A.as_linear(ctx.normal_form(value_at(ext.axes, ext.body, atom.indices), signs=False))
        if body is None:
            return f"the body of `{ext.name}` is not a linear form, so exp(e(x) - {ext.name}) cannot be shown <= 1"
        expected = expected + body.scale(-c)
    return _unrounded(x_lin, ctx) + expected.scale(-1.0)


def _unrounded(lin: A.Linear, ctx: "FusionContext") -> A.Linear:
    """`lin` with each explicit rounding point of a computed value (``f32(x * c)``, `own_centre.rounded_exponents`)
    read as the value it rounds: the bound compares an exponent with a max's body, and the max, computed in the
    same type, holds the same rounded values, so ``exp(f32(x * c) - max(x * c))`` is at most 1 as its unrounded
    form is."""
    out = A.Linear(constant=lin.constant)
    for mono, c in lin.terms:
        atom, power = mono.factors[0] if len(mono.factors) == 1 else (None, None)
        inner = (A.as_linear(ctx.normal_form(atom.x, signs=False))
                 if isinstance(atom, Cast) and power == 1 and atom.dtype == atom.x.dtype else None)
        out = out + (inner.scale(c) if inner is not None else A.Linear.of({mono: c}))
    return out


def g_bound(coeff: float, g: A.Monomial) -> float:
    """An upper bound of ``|coeff · G|`` from the types of G's atoms (inf when there is none)."""
    out = abs(coeff)
    for a, q in g.factors:
        if q.denominator != 1 or q < 0:
            return math.inf
        out *= _range(a) ** int(q)
    return out


def _range(e: Expr) -> float:
    """The largest magnitude `e` can take, from its operations and its inputs' types."""
    if isinstance(e, Const):
        return abs(float(e.value))
    if isinstance(e, Unary) and e.op in (UnaryOp.ABS, UnaryOp.NEG):
        return _range(e.x)
    if isinstance(e, Select):
        return max(_range(e.a), _range(e.b))
    if isinstance(e, Cast) and (A.is_widening(e) or not e.x.dtype.is_float):
        return min(_range(e.x), _dtype_range(e.dtype))
    return _dtype_range(e.dtype)


def _dtype_range(d: DType) -> float:
    if d.is_bool:
        return 1.0
    if d.is_float:
        return float(ml_dtypes.finfo(d.numpy).max)
    return float(np.iinfo(d.numpy).max)


def rescale_dtype(online: A.Linear, powers: A.Monomial, d: DType) -> DType:
    """The type to compute an accumulator's rescale in: `d`, or the widest float its running values have.

    A narrowing cast makes the reduction narrow (``f16(exp(s - m)) @ v`` is an f16 sum) while ``m`` stays
    f32: ``exp(m_prev - m)`` must subtract the f32 maxima, not their f16 roundings (an error of
    ``|m|·2^-11`` in the exponent)."""
    atoms = [a for mono, _ in online.terms for a, _ in mono.factors] + [a for a, _ in powers.factors]
    wider = [a.dtype for a in atoms if a.dtype in A.FLOAT_RANK and d in A.FLOAT_RANK
             and A.FLOAT_RANK[a.dtype] > A.FLOAT_RANK[d]]
    return max(wider, key=A.FLOAT_RANK.__getitem__, default=d)


def rounding_factor(dec: "Decomposition", online_atom: Expr) -> Expr | None:
    """The factor applied after the loop to the accumulator whose term holds `online_atom`."""
    return next((f for acc, f in zip(dec.accumulators, dec.factors) if online_atom in walk(acc.term)), None)


def moved_rounding_line(g_atom: Expr, online_atom: Expr, deferred: Expr | None) -> str:
    """`explain`'s line for a narrowing cast that joined the loop."""
    after = f"; {format_expr(deferred)} is applied after the loop" if deferred is not None else ""
    moved = "before normalization" if deferred is not None else "before the running values are final"
    return (f"rounding moved {moved}: G's cast {format_expr(g_atom)} is evaluated in the loop as "
            f"{format_expr(online_atom)}, with the running values of the earlier results, and the accumulator is "
            f"rescaled per chunk{after}. Exact algebra (the cast is transparent to it); both sides round each term "
            "once, within one bound (docs/fusion.md, \"Narrowing casts inside a cascade\")")


__all__ = ["Extremum", "NarrowedCast", "attains_one", "distribute_cast", "exp_bound", "g_bound", "split_narrowing",
           "rescale_dtype", "rounding_factor", "moved_rounding_line"]
