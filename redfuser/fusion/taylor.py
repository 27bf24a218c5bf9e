"""A polynomial sum in Taylor form around the compiler's own running mean: every polynomial body is stable.

`own_centre.py` centres a body on *one* root ``k Y``: ``sum (x - Y)^K`` becomes powers of ``delta = c - k Y``
times centred power sums. Some polynomial bodies have no single root that every term vanishes at:

- ``(x - Y) * (x + L)`` is 0 at ``x = Y`` and at ``x = -L``; one ``delta`` keeps only one of the two
  differences uncancelled (the other comes back as ``delta * (Y + L) = delta Y + delta L``);
- ``(x - Y)^2 + x`` leaves ``sum x`` beside the powers, and ``x = w + delta + Y`` gives ``N (delta + Y)``,
  which cancels when ``Y`` is far from the data's mean.

Taylor's formula needs no root. For a body ``p(x)`` that is a polynomial of degree ``D <= 8`` in one
reduced value ``x`` (its coefficients may read earlier results and constants) and any centre ``c``:

    sum_i p(x_i) = sum_{j <= D} p^(j)(c) / j! * sum_i (x_i - c)^j

The centre is the running mean of ``x`` (a running sum and an exact running count, as in `own_centre.py`),
the power sums ``sum (x - c)^j`` move with it by the shift law, and each coefficient ``p^(j)(c) / j!`` is the
*derivative of the expression as the user wrote it*, evaluated once after the loop at ``x = c_final``:
``(c - Y) * (c + L)``, ``(c + L) + (c - Y)`` and ``1`` for the first body above. Each coefficient is computed
as the reference computes the body at a point near the data (``(x_i - Y) * (x_i + L)``), so it cancels
no more than the reference does; the power sums are centred, so ``sum (x - c)`` is near 0 and small, not a
difference of large sums. The expanded normal form would instead compute ``c^2 + c L - c Y - Y L``.

A factor that is no polynomial in ``x`` and does not read ``Y`` (the softmax weight ``exp(x - m)``) stays
outside the expansion: ``sum W p(x) = sum_j p^(j)(c) / j! * sum W (x - c)^j``. The formula is exact for every
``c``, so the randomized identity check confirms it with the centre drawn as a free variable. Bodies this does
not cover (a non-polynomial factor that reads ``Y``, two reduced values, degree above 8) are refused by
`rewrite.py` when they multiply out such a difference.
"""
from __future__ import annotations

from dataclasses import replace
from math import factorial

from ..ir import Axis, Binary, BinaryOp, Buffer, BufferType, Cast, Const, Expr, Load, ReduceOp, Unary, UnaryOp, map_expr
from ..ir.loop.expr import walk
from . import algebra as A
from .centred import _MAX_DEGREE, Centre, _families, change_variables
from .separability import Decomposition, FusionContext


def taylor_sum(value: Expr, ctx: FusionContext, pair: tuple[Expr, Expr], axis: Axis, name: str,
               delta: Load) -> Decomposition | str:
    """`value`'s sum in Taylor form around the compiler's own running mean of the reduced value ``x`` of
    `pair` (``x``, the earlier result ``Y`` it is subtracted from), or why not (the reason names what the body
    has that a polynomial in ``x`` has not). A factor of the body that is no polynomial in ``x`` but does not
    read ``Y`` (``exp(x - m)`` of a softmax) is a *weight* ``W``: ``sum W p(x) = sum_j p^(j)(c)/j! sum W (x - c)^j``,
    the weighted power sums moved by the shift law like unweighted ones (and rescaled with ``m``). `delta` is
    the buffer slot `own_centre.py` would use (the member's type and axes); here it holds the final mean."""
    d = value.dtype
    x, y = pair
    if not isinstance(x, Load):
        return f"{_words(x)} is not a value loaded from an input"
    weight, polynomial = _weight_and_polynomial(value, x)
    if any(A.reads(w, lambda n: n == y) for w in weight):
        return f"a factor that is no polynomial in {_words(x)} reads {_words(y)} too"
    others = sorted({_words(n) for n in walk(polynomial) if isinstance(n, Load) and n != x and ctx.kind(n) == "x"})
    if others:
        return f"it reads {others[0]} beside {_words(x)}, and a Taylor form needs one reduced value"
    coefficients = _coefficients(polynomial, x)
    if isinstance(coefficients, str):
        return coefficients
    mean = Load(Buffer(f"{name}_mean", delta.buffer.type), delta.indices)
    marker = Load(Buffer(f"__centre_taylor_{name}", BufferType(d, (axis.extent,))), (axis,))
    placeholder = Load(Buffer(f"__own_sum_{name}", mean.buffer.type), mean.indices)
    centre = Centre(ReduceOp.SUM, "", x, placeholder, mean, x, marker, own=Const(0.0, d), delta=mean, taylor=True)
    moved = change_variables(ctx.normal_form(value), centre, ctx, exponents=False)
    inner = replace(ctx, states=ctx.states | {mean.buffer.name})
    dec = _families(moved, centre, inner, name, d) if moved is not None else None
    if dec is None:
        return "the algebra could not write it as power sums of the centred values"
    degrees = [acc.shift.degree for acc in dec.accumulators]
    if degrees != list(range(len(degrees))) or len(degrees) > len(coefficients):
        return "its terms do not form one family of powers of the centred values"
    factors = tuple(_at(coefficients[j], x, mean) for j in range(len(degrees)))
    return replace(dec, factors=factors)


def _weight_and_polynomial(value: Expr, x: Load) -> tuple[list[Expr], Expr]:
    """The factors of `value` (a product, divisions by what does not read `x` included) that are no
    polynomial in `x`, and the product of the others (`value` itself where every factor is one)."""
    factors = _factors(value)
    polynomial = [not isinstance(derivative(f, x), str) for f in factors]
    weight = [f for f, p in zip(factors, polynomial) if not p]
    if not weight:
        return [], value
    rest = [f for f, p in zip(factors, polynomial) if p]
    poly: Expr = Const(1.0, value.dtype)
    for f in rest:
        poly = _mul(poly, f)
    return weight, poly


def _factors(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op is BinaryOp.MUL:
        return _factors(e.a) + _factors(e.b)
    if isinstance(e, Binary) and e.op is BinaryOp.DIV:
        return _factors(e.a) + [Binary(BinaryOp.DIV, Const(1.0, e.dtype), e.b, e.dtype)]
    return [e]


def _at(coefficient: Expr, x: Load, mean: Load) -> Expr | None:
    """The coefficient with `x` replaced by the centre; None for the factor 1."""
    out = map_expr(coefficient, lambda n: mean if n == x else None)
    return None if isinstance(out, Const) and out.value == 1.0 else out


def _coefficients(value: Expr, x: Load) -> list[Expr] | str:
    """``p^(j) / j!`` as expressions in `x`, for ``j = 0 .. D``, or why `value` is no polynomial in `x`."""
    out = [value]
    current = value
    for j in range(1, _MAX_DEGREE + 2):
        current = derivative(current, x)
        if isinstance(current, str):
            return current
        if _is_zero(current):
            return out
        if j > _MAX_DEGREE:
            break
        out.append(_scale(current, 1.0 / factorial(j)))
    return f"it is a polynomial of degree above {_MAX_DEGREE} in {_words(x)}"


def derivative(e: Expr, x: Load) -> Expr | str:
    """``d e / d x`` as an expression tree shaped like `e` (the product rule keeps each factor as written),
    or why `e` is no polynomial in `x`."""
    d = e.dtype
    if not _reads(e, x):
        return Const(0.0, d)
    if e == x:
        return Const(1.0, d)
    widening = e.dtype.is_float and e.x.dtype.is_float and e.dtype.numpy.itemsize >= e.x.dtype.numpy.itemsize \
        if isinstance(e, Cast) else False
    if widening:
        inner = derivative(e.x, x)
        return inner if isinstance(inner, str) else _cast(inner, d)
    if isinstance(e, Unary) and e.op is UnaryOp.NEG:
        inner = derivative(e.x, x)
        return inner if isinstance(inner, str) else _neg(inner)
    if isinstance(e, Binary) and e.op in (BinaryOp.ADD, BinaryOp.SUB):
        a, b = derivative(e.a, x), derivative(e.b, x)
        if isinstance(a, str) or isinstance(b, str):
            return a if isinstance(a, str) else b
        return _add(a, _neg(b) if e.op is BinaryOp.SUB else b)
    if isinstance(e, Binary) and e.op is BinaryOp.MUL:
        a, b = derivative(e.a, x), derivative(e.b, x)
        if isinstance(a, str) or isinstance(b, str):
            return a if isinstance(a, str) else b
        return _add(_mul(a, e.b), _mul(e.a, b))
    if isinstance(e, Binary) and e.op is BinaryOp.DIV and not _reads(e.b, x):
        a = derivative(e.a, x)
        return a if isinstance(a, str) else _div(a, e.b)
    if (isinstance(e, Binary) and e.op is BinaryOp.POW and isinstance(e.b, Const)
            and float(e.b.value).is_integer() and 0 <= e.b.value <= _MAX_DEGREE):
        a = derivative(e.a, x)
        if isinstance(a, str):
            return a
        n = int(e.b.value)
        lower = (Const(1.0, d) if n == 1 else e.a if n == 2
                 else Binary(BinaryOp.POW, e.a, Const(float(n - 1), e.b.dtype), d))
        return _mul(_scale(lower, float(n)), a)
    op = e.op.value if isinstance(e, Unary | Binary) else type(e).__name__.lower()
    return f"it applies '{op}' to {_words(x)}, which no polynomial does"


def _reads(e: Expr, x: Load) -> bool:
    return A.reads(e, lambda n: n == x)


def _is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0.0


def _is_one(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 1.0


def _add(a: Expr, b: Expr) -> Expr:
    if _is_zero(a):
        return b
    if _is_zero(b):
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(float(a.value) + float(b.value), a.dtype)
    return Binary(BinaryOp.ADD, a, b, a.dtype)


def _neg(a: Expr) -> Expr:
    if isinstance(a, Const):
        return Const(-float(a.value), a.dtype)
    return Unary(UnaryOp.NEG, a, a.dtype)


def _mul(a: Expr, b: Expr) -> Expr:
    if _is_zero(a) or _is_zero(b):
        return Const(0.0, a.dtype)
    if _is_one(a):
        return b
    if _is_one(b):
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(float(a.value) * float(b.value), a.dtype)
    return Binary(BinaryOp.MUL, a, b, a.dtype)


def _div(a: Expr, b: Expr) -> Expr:
    if _is_zero(a):
        return a
    return Binary(BinaryOp.DIV, a, b, a.dtype)


def _scale(a: Expr, k: float) -> Expr:
    return a if k == 1.0 else _mul(Const(k, a.dtype), a)


def _cast(a: Expr, d) -> Expr:
    return Const(float(a.value), d) if isinstance(a, Const) else Cast(a, d)


def _words(e: Expr) -> str:
    from ..ir import format_expr

    return format_expr(e)


__all__ = ["taylor_sum", "derivative"]
