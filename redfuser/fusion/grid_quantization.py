"""Integer-grid quantization inside a cascade: ``clip(rint(c·B(x) / a), lo, hi)`` with ``a = max |B|``.

Per-token int8 (or int4) quantization as users write it:

    s = rf.max(rf.abs(x), axis=-1, keepdims=True) / 127
    q = rf.clip(rf.rint(x / s), -127, 127)
    out = (q @ w) * s

``rint`` rounds, so the algebra does not look through it; but it rounds *to a grid*, exactly as a cast to
float8_e4m3fn rounds to e4m3's values, and the FP8 rule (docs/fusion.md, "Quantization inside a cascade")
holds for it too: the loop rounds with the running absmax ``a_t <= a``, and rescales its accumulator by
``a_prev / a`` when the absmax grows. Each element's rounding stays within half a grid step at its own
scale, ``a_t / c <= a / c``, so the fused and the unfused programs obey one bound against the exact product
(``|result - x·w·s| <= s Σ_k |w_k| · 1/2`` in grid units, in the output ``s Σ |w_k| a/(2c)``).

The clip must not bind, or the two programs would clip different values. It never binds when the rounded
value is ``c·B / a`` with ``a`` a running max of ``|B|`` (so ``|c·B/a_t| <= |c|`` for every element seen,
in the loop and after it) and ``lo <= -|c|``, ``|c| <= hi``: `grid_quantization` checks exactly that
form, and then both programs compute ``rint(c·B/a)``. A clip that could bind, a floor or ceil (a whole grid
step of error), or a scale that is not such an absmax is not this form and stays unfused.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..ir import Binary, BinaryOp, Const, Expr, Load, ReduceOp, Unary, UnaryOp
from ..ir.loop.expr import walk
from . import algebra as A
from .substitute import value_at

if TYPE_CHECKING:
    from .separability import FusionContext


@dataclass(frozen=True)
class GridRounding:
    """``clip(rint(inner), lo, hi)`` (no clip: ``lo = -inf``, ``hi = inf``)."""

    inner: Expr
    lo: float
    hi: float


def grid_rounding(e: Expr) -> GridRounding | None:
    """`e` as a rounding to the integer grid, optionally clipped by constants (``minimum``/``maximum`` of a
    constant in either order, as ``rf.clip`` traces), or None."""
    lo, hi = -float("inf"), float("inf")
    while isinstance(e, Binary) and e.op in (BinaryOp.MIN, BinaryOp.MAX):
        const = e.b if isinstance(e.b, Const) else e.a if isinstance(e.a, Const) else None
        if const is None or isinstance(const.value, bool):
            return None
        value = float(const.value)
        if e.op is BinaryOp.MIN:
            hi = min(hi, value)
        else:
            lo = max(lo, value)
        e = e.a if const is e.b else e.b
    if isinstance(e, Unary) and e.op is UnaryOp.RINT and e.dtype.is_float:
        return GridRounding(e.x, lo, hi)
    return None


def grid_quantization(atom: Expr, ctx: "FusionContext") -> A.Monomial | None:
    """For a `grid_rounding` of ``c·B(x)·a**-1`` with ``a`` a running max of ``|B|`` whose clip cannot bind:
    ``a**-1``, the running-maxima factor that scales the accumulator online (as `separability._quantization`
    returns for an FP8 cast). None for anything else."""
    g = grid_rounding(atom)
    if g is None:
        return None
    scaled = absmax_scaled(g.inner, ctx)
    if scaled is None:
        return None
    a, c = scaled
    if not (g.lo <= -c and c <= g.hi):
        return None
    return A.Monomial.of({a: A.Power(-1)})


def absmax_scaled(value: Expr, ctx: "FusionContext") -> tuple[Load, float] | None:
    """``(a, |c|)`` where `value` is ``c·B(x) / a`` with ``a`` a running max of ``|B|`` itself (so that
    ``|c·B / a_t| <= |c|`` for every element the loop has seen, whatever its running ``a_t``); None for
    anything else: a signed max (``max(x)``: ``x / a_t`` grows without bound while ``a_t`` is small), a max of
    another value (``max(x * x)``), a constant or an earlier result beside ``a``."""
    if any(isinstance(n, Binary | Unary) and n.dtype.storage_only and ctx.kind(n) == "y" for n in walk(value)):
        # a scale computed in 16 bits from the running max (f16 ``448 / a``): an early small ``a_t`` overflows
        # it (448 / 1e-3 is inf in f16: the row came out NaN where numpy's final scale is finite) or makes it
        # subnormal; numpy computes it once, from the final ``a`` (found by a helper, hunt_quant/04)
        return None
    inner = ctx.normal_form(value, signs=False)
    if len(inner) != 1 or not inner[0].exponent.is_zero:
        return None
    t = inner[0]
    ys = [(a, p) for a, p in t.mono.factors if ctx.kind(a) not in ("x", "c")]
    xs = A.Monomial.of({a: p for a, p in t.mono.factors if ctx.kind(a) == "x"})
    cs = [a for a, p in t.mono.factors if ctx.kind(a) == "c"]
    if len(ys) != 1 or cs or ys[0][1] != A.Power(-1):
        return None
    (a, _), = ys
    extremum = next((ext for ext in ctx.extrema if isinstance(a, Load) and ext.name == a.buffer.name), None)
    if extremum is None or extremum.op is not ReduceOp.MAX:
        return None
    body = value_at(extremum.axes, extremum.body, a.indices)
    if not (isinstance(body, Unary) and body.op is UnaryOp.ABS):
        return None
    b = ctx.normal_form(body.x, signs=False)
    if len(b) != 1 or not b[0].exponent.is_zero or abs(b[0].coeff) == 0:
        return None
    if b[0].mono != xs:                                # the rounded value is c·B/a for a's own B
        return None
    return a, abs(t.coeff / b[0].coeff)


def identity_inner(e: Expr) -> Expr | None:
    """The value a grid rounding rounds, for the numeric identity check (which, as for casts, takes the
    rounding as the identity); None for any other expression."""
    g = grid_rounding(e)
    return g.inner if g is not None else None


__all__ = ["GridRounding", "absmax_scaled", "grid_quantization", "grid_rounding", "identity_inner"]
