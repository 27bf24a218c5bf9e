"""The rounding error of a running sum's rescale, carried in its compensation.

A fused loop multiplies a running sum by its rescale ``r = exp(d)``, ``d = m_prev - m``, in every chunk where
the max moved (`OnlineState`). ``r`` is rounded to f32. Where the max rises by the same small step in every
chunk (a ramp, an ALiBi-like bias, a sorted row) ``d`` is the same every time, ``r`` rounds the same way every
time, and the relative errors add up with the number of chunks instead of staying near one rounding: a
softmax's ``l`` over a row of 2^20 values ``k * 1e-7`` was 4.5e-5 off on ``cpu`` and 3.0e-4 on the
interpreter, where the tolerance rule allows 2.0e-5 (found by a helper, 2026-12-06).

The error of ``r`` is ``lo = exp(d) - r = expm1(d) - (r - 1)``. Where ``|d| < SMALL_STEP``, ``r - 1`` is exact
in f32 (Sterbenz: ``r`` lies in [0.98, 1.02]) and ``expm1(d)`` is its series to the fourth power,
``d (1 + d (1/2 + d (1/6 + d/24))))``, within ``2**-30 |d|`` of it, so ``lo`` is known to far better than
``r``'s own rounding. A compensated running sum (Kahan: its true value is ``acc - comp``) then takes
``prev * lo`` into its compensation: ``comp' = comp * r - prev * lo`` gives ``acc' - comp' = (prev - comp) *
(r + lo)``, the rescale as if exact. Where ``|d|`` is larger, each rescale shrinks what was summed before by at
least ``exp(-SMALL_STEP)``, so an error made there fades: its contributions add up to about ``1 / |d|``
roundings, at most 64, against the rule's ``8 (1 + log2 n)``.

A state is corrected so only where every state rescaled by the same factor is too (`rescale_corrected`): the
quotient ``o / l`` of attention, both scaled by the same rounded factors, has their errors cancel, and
correcting ``l`` alone would leave ``o``'s.
"""
from __future__ import annotations

from typing import Callable

from ..semantics import ReduceOp, UnaryOp
from .expr import Unary
from .nodes import FusedLoop, OnlineState

SMALL_STEP = 2.0 ** -6
"""The largest ``|d|`` whose rescale error is carried (module docstring)."""

SERIES = (1.0, 0.5, 1.0 / 6.0, 1.0 / 24.0)
"""The coefficients of ``expm1(d) = d (1 + d (1/2 + d (1/6 + d/24)))`` for ``|d| < SMALL_STEP``, in Horner order."""


def exponent_of(st: OnlineState) -> object | None:
    """``d`` where `st`'s rescale is ``exp(d)``, else None."""
    r = st.rescale
    return r.x if isinstance(r, Unary) and r.op is UnaryOp.EXP else None


def rescale_corrected(s: FusedLoop, compensated: Callable[[OnlineState], bool]) -> frozenset[str]:
    """The states of `s` whose rescale error their compensation carries: sums rescaled by an ``exp(d)`` whose
    every state rescaled by that same factor is `compensated` (each backend's own rule for which running sums
    keep a compensation)."""
    out: set[str] = set()
    for st in s.states:
        if not (isinstance(st, OnlineState) and st.op is ReduceOp.SUM and st.carry is None
                and exponent_of(st) is not None and compensated(st)):
            continue
        partners = [o for o in s.states if o is not st and o.rescale == st.rescale]
        if all(isinstance(o, OnlineState) and compensated(o) for o in partners):
            out.add(st.acc.name)
    return frozenset(out)


__all__ = ["SERIES", "SMALL_STEP", "exponent_of", "rescale_corrected"]
