"""The product law: a running product over the reduced axis whose factors read a moving earlier result.

``prod over k of G(x_k) * exp(L(y))`` (``L`` linear in earlier results: ``exp(x - m)`` has ``L = -m``). After
``t`` elements the loop holds ``P_t = prod_{k <= t} G(x_k) * exp(L(y_t))``, every factor read with the running
``y_t``. When a chunk moves ``y_t`` to ``y'``, each of the ``t`` factors already multiplied in changes by
``exp(L(y') - L(y_t))``, so::

    P = P_t * exp(t * (L(y') - L(y_t)))          (the sum's rescale raised to the count)

and the chunk's own factors, read with ``y'``, multiply in as usual. This is `OnlineState.carry` of a
``prod`` state, over a count state of the elements seen (masked elements are not counted); two partial
products of a split reduction merge by the same law, each side raised to its own count (`fusion/merge.py`).

Numerics. ``L(y') - L(y_t)`` is a difference of two readings (``m_t - m'``: exact when the maxima are within
a factor of 2), so the exponent ``t * (L(y') - L(y_t))`` is off by a relative ``2^-24`` of itself (f32), and
the carried product by at most ``2^-24 * t * |L(y') - L(y_t)|`` relative, per move. For the product of
``exp(x - m)`` with ``m`` the running max of the x, every element counted in ``t`` has ``x_k <= m_t < m'``,
so ``t * |m' - m_t| <= sum_k |x_k - m'|``: within what the reference's own roundings of the arguments
``x_k - m'`` may already be off by, whatever the count. A ratio of other factors of y (``x / l``,
``x / max|x|``) has no such bound: a rounding of ``l_t / l'`` raised to ``t`` is ``t`` roundings, on every chunk
that moves ``l`` (``O(n^2 / chunk)`` in all), and a running ``l`` of 0 has no ratio; `separability._product`
refuses those, and a factor G(x) besides the exponential too: read with the running max, each factor is larger
than the reference's, and an unbounded G overflows the running product where the reference's stays finite.

Guards. While nothing was multiplied in (count 0) the state is the identity 1 and stays 1 (``exp(0 * NaN)``
would be NaN where the earlier result was still at its identity); a running product of 0 stays 0 (an
``exp(t * +inf)`` cannot turn it into NaN: the reference's factor there is ``G = 0`` times a finite value).
"""
from __future__ import annotations

from typing import Callable

from ..ir import Binary, BinaryOp, Cast, Const, DType, Expr, Load, Select, Unary, UnaryOp
from ..ir.types import bool_
from . import algebra as A
from .separability import rescale_exponent


def product_carry(online: A.Linear, prev: Load, count_prev: Expr, to_prev: Callable[[Expr], Expr],
                  to_new: Callable[[Expr], Expr], d: DType) -> Expr:
    """The running product `prev` carried to the earlier results' current values:
    ``where(count_prev == 0 or prev == 0, prev, prev * exp(count_prev * (L(y_now) - L(y_before))))``,
    the exponent computed in `d` (the rescale's dtype), the product in `prev`'s."""
    exponent = rescale_exponent(online, to_prev, d, to_new)
    assert exponent is not None, "a product law needs an online exponential"
    count = count_prev if count_prev.dtype == d else Cast(count_prev, d)
    factor: Expr = Unary(UnaryOp.EXP, Binary(BinaryOp.MUL, count, exponent, d), d)
    if factor.dtype != prev.dtype:
        factor = Cast(factor, prev.dtype)
    fresh = Binary(BinaryOp.EQ, count_prev, Const(0.0, count_prev.dtype), bool_)
    vanished = Binary(BinaryOp.EQ, prev, Const(0.0, prev.dtype), bool_)
    keep = Binary(BinaryOp.OR, fresh, vanished, bool_)
    return Select(keep, prev, Binary(BinaryOp.MUL, prev, factor, prev.dtype), prev.dtype)


__all__ = ["product_carry"]
