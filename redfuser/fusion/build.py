"""Turning normal forms back into Loop IR expressions that read well and evaluate safely.

``coeff * prod atom**p * exp(linear)`` becomes e.g. ``exp(0.125 * s - m) * v / l``:
positive powers multiply, negative powers divide, and everything inside one
exponential stays inside it (``exp(s - m)``, never ``exp(s) * exp(-m)``).
"""
from __future__ import annotations

from fractions import Fraction

from ..ir import Binary, BinaryOp, Cast, Const, DType, Expr, Unary, UnaryOp
from .algebra import LN2, Linear, Monomial, Product, Sum


def _snap(lin: Linear) -> Linear:
    """Round coefficients that are within rounding of a dyadic number to it (1.0000000000000002 -> 1)."""
    snap = lambda c: round(c * 64) / 64 if abs(c * 64 - round(c * 64)) < 1e-9 * max(1.0, abs(c * 64)) else c  # noqa: E731
    return Linear(tuple((m, snap(c)) for m, c in lin.terms), snap(lin.constant))


def cast_to(e: Expr, dtype: DType) -> Expr:
    if e.dtype == dtype:
        return e
    if isinstance(e, Const):
        return Const(float(e.value), dtype)
    return Cast(e, dtype)


def _mul(a: Expr | None, b: Expr, d: DType) -> Expr:
    return b if a is None else Binary(BinaryOp.MUL, a, b, d)


def _pow(atom: Expr, p: Fraction, d: DType) -> Expr:
    base = cast_to(atom, d)
    if p == 1:
        return base
    if p == Fraction(1, 2):
        return Unary(UnaryOp.SQRT, base, d)
    return Binary(BinaryOp.POW, base, Const(float(p), d), d)


def monomial_expr(m: Monomial, d: DType, coeff: float = 1.0) -> Expr:
    """``coeff * m`` with negative powers as one division at the end."""
    negate = coeff == -1.0 and bool(m.factors)
    num: Expr | None = None if coeff == 1.0 or negate else Const(coeff, d)
    den: Expr | None = None
    for atom, p in m.factors:
        if p > 0:
            num = _mul(num, _pow(atom, p, d), d)
        else:
            den = _mul(den, _pow(atom, -p, d), d)
    if num is None:
        num = Const(1.0, d)
    out = num if den is None else Binary(BinaryOp.DIV, num, den, d)
    return Unary(UnaryOp.NEG, out, d) if negate else out


def linear_expr(lin: Linear, d: DType) -> Expr:
    """``sum c_b * monomial_b + constant``, positive terms first, then subtractions."""
    items = sorted(lin.terms, key=lambda mc: mc[1] < 0)
    out: Expr | None = None
    for m, c in items:
        if out is None:
            out = monomial_expr(m, d, c)
        elif c < 0:
            out = Binary(BinaryOp.SUB, out, monomial_expr(m, d, -c), d)
        else:
            out = Binary(BinaryOp.ADD, out, monomial_expr(m, d, c), d)
    if lin.constant or out is None:
        k = Const(abs(lin.constant), d)
        if out is None:
            return Const(lin.constant, d)
        out = Binary(BinaryOp.SUB if lin.constant < 0 else BinaryOp.ADD, out, k, d)
    return out


def _base2(lin: Linear) -> Linear | None:
    """`lin / ln 2` when every coefficient is a small dyadic multiple of ln 2 (the body used ``exp2``)."""
    coeffs = [c for _, c in lin.terms] + ([lin.constant] if lin.constant else [])
    scaled = [c / LN2 for c in coeffs]
    if all(abs(k * 64 - round(k * 64)) < 1e-9 * max(1.0, abs(k * 64)) for k in scaled):
        return lin.scale(1.0 / LN2)
    return None


def product_expr(t: Product, d: DType) -> Expr:
    """One product: ``exp(linear) * coeff * monomial`` (the exp first: it carries the range).

    An exponent that came from ``exp2`` is written back as ``exp2``, so it rounds like the reference.
    """
    body = monomial_expr(t.mono, d, t.coeff) if (t.mono.factors or t.coeff != 1.0) else None
    if t.exponent.is_zero:
        return body if body is not None else Const(1.0, d)
    base2 = _base2(t.exponent)
    if base2 is not None:
        e = Unary(UnaryOp.EXP2, linear_expr(_snap(base2), d), d)
    else:
        e = Unary(UnaryOp.EXP, linear_expr(t.exponent, d), d)
    if body is None:
        return e
    if isinstance(body, Binary) and body.op is BinaryOp.DIV and isinstance(body.a, Const) and body.a.value == 1.0:
        return Binary(BinaryOp.DIV, e, body.b, d)
    return Binary(BinaryOp.MUL, e, body, d)


def sum_expr(s: Sum, d: DType) -> Expr:
    """A whole normal form as an expression (0 for the empty sum)."""
    out: Expr | None = None
    for t in s:
        if out is not None and t.coeff < 0:
            out = Binary(BinaryOp.SUB, out, product_expr(Product(-t.coeff, t.mono, t.exponent), d), d)
        else:
            e = product_expr(t, d)
            out = e if out is None else Binary(BinaryOp.ADD, out, e, d)
    return out if out is not None else Const(0.0, d)
