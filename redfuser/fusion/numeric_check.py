"""The randomized identity check that backs every fusion decision.

The algebra is code and code has bugs; a wrong factorization would silently
produce a wrong kernel. So each `Decomposition` is checked on random points in
float64, treating every load (and loop index) as an independent variable:

1. reconstruction: ``F(x, y) == sum_j factor_j(y) * term_j(x, y) + addend(y)``;
2. separability of each part ``P_j = factor_j * term_j`` (or of ``F`` for max/min):
   ``P(x, y) * P(x0, y0) == P(x, y0) * P(x0, y)`` for products, and the additive
   analogue ``P(x, y) + P(x0, y0) == P(x, y0) + P(x0, y)`` for ``G + H`` forms.

Points where any side is not finite are skipped; fewer than a quarter of the points usable is a
failure. When that is the only failure, the check runs again on `RETRY_POINTS` points needing
`MIN_USABLE`: a causal mask shifted by -40 keeps about a fifth of the random (i, j) pairs, and a product
check needs four live points at once. (Not more points from the start: every extra point is one more
chance of a cancellation beyond `REL_TOL` in an expanded form such as ``(x - Y)^2``.)
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..ir import Binary, Cast, Const, Expr, IndexValue, Length, Load, Select, Unary
from ..ir.loop.expr import walk
from ..ir.semantics import BINARY_FUNCS, UNARY_FUNCS
from .grid_quantization import identity_inner
from .separability import Decomposition, FusionContext

POINTS = 96
RETRY_POINTS = 1024
MIN_USABLE = 32
REL_TOL = 1e-7


def _leaves(e: Expr) -> set[Expr]:
    return {n for n in walk(e) if isinstance(n, Load | IndexValue)}


def _in_order(leaves: set[Expr]) -> list[Expr]:
    """`leaves` in an order fixed by what they are: the random points are drawn leaf by leaf, and a set's
    order follows the process's string hashing, so the check (and the fusion decision resting on it) would
    differ from one run of the same program to the next."""
    return sorted(leaves, key=repr)


def evaluate64(e: Expr, values: dict[Expr, np.ndarray]) -> np.ndarray:
    """`e` in float64 with each leaf (load or index) given by `values`; float casts and roundings to the
    integer grid (``clip(rint(v), lo, hi)``, `grid_quantization`) are the identity."""
    return _evaluate(e, values, exact=True)


def _rounded(e: Expr, values: dict[Expr, np.ndarray]) -> np.ndarray:
    """`e` as the loop computes it: f32 arithmetic (f64 for f64 values), every cast rounding to its type."""
    return _evaluate(e, values, exact=False)


def _evaluate(e: Expr, values: dict[Expr, np.ndarray], exact: bool,
              rounds: Callable[[Cast], bool] | None = None) -> np.ndarray:
    """`e` at `values`: in float64 with casts exact (`exact`; those `rounds` selects rounding to their type
    nonetheless), or as the loop computes it."""
    def wide(dtype) -> type:
        return np.float64 if exact or (dtype.is_float and dtype.itemsize == 8) else np.float32

    def go(n: Expr) -> np.ndarray:
        return _evaluate(n, values, exact, rounds)

    if isinstance(e, Load | IndexValue):
        return values[e]
    if isinstance(e, Const):
        return np.asarray(e.value, dtype=np.bool_ if isinstance(e.value, bool) else wide(e.dtype))
    if isinstance(e, Length):      # (fusion sees a traced program: its lengths are the probes, ints)
        return np.asarray(e.count, dtype=wide(e.dtype))
    inner = identity_inner(e) if exact else None   # a quantization to the integer grid, like a float cast
    if inner is not None:
        return go(inner)
    if isinstance(e, Cast):
        x = go(e.x)
        if e.dtype.is_float:
            if exact and not (rounds is not None and rounds(e)):
                return x.astype(np.float64)
            return x.astype(e.dtype.numpy).astype(wide(e.dtype))
        x = x.astype(e.dtype.numpy)
        return x.astype(np.bool_ if e.dtype.is_bool else np.float64) if exact else x
    if isinstance(e, Unary):
        return UNARY_FUNCS[e.op](go(e.x))
    if isinstance(e, Binary):
        return BINARY_FUNCS[e.op](go(e.a), go(e.b))
    if isinstance(e, Select):
        return np.where(go(e.cond), go(e.a), go(e.b))
    raise TypeError(f"cannot evaluate {type(e).__name__}")


def rounds_differently(a: Expr, b: Expr, seed: int = 0) -> bool:
    """Whether two forms of one value (a term from the normal form, and the body as written) round apart in
    the loop's arithmetic at some of `POINTS` random points of magnitudes 0.1 to 1e4 (where both are finite):
    ``exp2(x log2(e) - m)`` against the algebra's ``exp(x - 0.693 m)``, ``x / 3`` against ``0.333 x``. Forms
    that only reorder exact operations (``0.125 s`` and ``s * 0.125``) do not."""
    both = _computed_pair(a, b, seed)
    if both is None:
        return False
    x, y = both
    finite = np.isfinite(x) & np.isfinite(y)
    return bool(np.any(x[finite] != y[finite]))


def agree(a: Expr, b: Expr, rounds: Callable[[Cast], bool], seed: int = 0) -> bool:
    """Whether two expressions are one value: in float64, casts exact except those `rounds` selects (which
    round to their type), at `POINTS` random points of magnitudes 0.1 to 1e4 of either sign, equal to 1e-9 of
    the larger magnitude at every point where both are finite, and finite at `MIN_USABLE` or more. Wide
    magnitudes tell ``minimum(x, 2.5) * 0.7`` from ``x * 0.7``, which agree near 1; `rounds` keeps a value
    rounded through e4m3 apart from the value itself."""
    both = _computed_pair(a, b, seed, rounds)
    if both is None:
        return False
    x, y = both
    finite = np.isfinite(x) & np.isfinite(y)
    if int(finite.sum()) < MIN_USABLE:
        return False
    x, y = x[finite], y[finite]
    return bool(np.all(np.abs(x - y) <= 1e-9 * np.maximum(np.abs(x), np.abs(y)) + 1e-300))


def _computed_pair(a: Expr, b: Expr, seed: int, rounds: Callable[[Cast], bool] | None = None
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """`a` and `b` at `POINTS` random points (the same leaf values for both): as the loop computes them, or
    with `rounds` in float64 with the casts it does not select exact (`_evaluate`); None where they cannot be
    evaluated."""
    rng = np.random.default_rng(seed)
    values = {}
    for leaf in _in_order(_leaves(a) | _leaves(b)):
        if isinstance(leaf, IndexValue):
            v = rng.integers(0, max(1, leaf.axis.extent), POINTS)
        elif leaf.dtype.is_bool:
            v = rng.random(POINTS) < 0.85
        elif leaf.dtype.is_int:
            v = rng.integers(-3, 4, POINTS)
        else:
            v = rng.standard_normal(POINTS) * 10.0 ** rng.uniform(-1, 4, POINTS)
        values[leaf] = np.asarray(v).astype(leaf.dtype.numpy).astype(
            np.float32 if leaf.dtype.is_float and leaf.dtype.itemsize < 8 else leaf.dtype.numpy)
    try:
        with np.errstate(all="ignore"):
            if rounds is None:
                x, y = np.broadcast_arrays(_rounded(a, values), _rounded(b, values))
            else:
                x, y = np.broadcast_arrays(_evaluate(a, values, True, rounds), _evaluate(b, values, True, rounds))
    except (TypeError, KeyError, ValueError):
        return None
    return x, y


def _sample(leaf: Expr, ctx: FusionContext, rng: np.random.Generator, n: int) -> np.ndarray:
    if isinstance(leaf, IndexValue):
        return rng.integers(0, max(1, leaf.axis.extent), n).astype(np.float64)
    if leaf.dtype.is_bool:
        return rng.random(n) < 0.85  # masks: both identity sides need the kept branch
    if isinstance(leaf, Load) and leaf.buffer.name in ctx.positive:
        return rng.uniform(0.5, 2.0, n)
    if leaf.dtype.is_int:
        return rng.integers(-3, 4, n).astype(np.float64)
    return rng.uniform(-1.5, 1.5, n)


class _TooFewPoints(Exception):
    """Fewer usable (finite) points than a check needs."""


def _close(a: np.ndarray, b: np.ndarray, ok: np.ndarray) -> bool:
    a, b, _ = np.broadcast_arrays(a, b, ok)   # a body of constants is one value: one per point all the same
    with np.errstate(all="ignore"):
        good = ok & np.isfinite(a) & np.isfinite(b)
        if good.sum() < (POINTS // 4 if len(ok) == POINTS else MIN_USABLE):
            raise _TooFewPoints
        return bool(np.all(np.abs(a - b)[good] <= REL_TOL * (np.abs(a) + np.abs(b))[good] + 1e-290))


def check(value: Expr, dec: Decomposition, ctx: FusionContext, seed: int = 0) -> str | None:
    """None when `dec` passes both identities on random points, else what failed."""
    for n in (POINTS, RETRY_POINTS):
        try:
            return _check(value, dec, ctx, seed, n)
        except _TooFewPoints:
            continue
    return "too few points where every side is finite"


def _check(value: Expr, dec: Decomposition, ctx: FusionContext, seed: int, n: int) -> str | None:
    rng = np.random.default_rng(seed)
    parts: list[Callable[[dict], np.ndarray]] = []
    for acc, factor in zip(dec.accumulators, dec.factors):
        parts.append(lambda v, t=acc.term, f=factor: evaluate64(t, v) * (1.0 if f is None else evaluate64(f, v)))
    leaves = set(_leaves(value))
    for acc, factor in zip(dec.accumulators, dec.factors):
        leaves |= _leaves(acc.term) | (_leaves(factor) if factor is not None else set())
    if dec.addend is not None:
        leaves |= _leaves(dec.addend)
    leaves = _in_order(leaves)
    x_leaves = {l for l in leaves if ctx.kind(l) == "x"}
    p = {l: _sample(l, ctx, rng, n) for l in leaves}
    # Leaves that read neither the reduced axis nor an earlier result are constants of the
    # reduction: they keep one value at all four points (x, y), (x0, y0), (x, y0), (x0, y).
    p0 = {l: (_sample(l, ctx, rng, n) if ctx.kind(l) in ("x", "y") else p[l]) for l in leaves}
    cross = {l: (p[l] if l in x_leaves else p0[l]) for l in leaves}     # (x, y0)
    cross0 = {l: (p0[l] if l in x_leaves else p[l]) for l in leaves}    # (x0, y)
    ok = np.ones(n, dtype=bool)
    with np.errstate(all="ignore"):
        total = sum(part(p) for part in parts) + (0.0 if dec.addend is None else evaluate64(dec.addend, p))
        if not _close(evaluate64(value, p), total, ok):
            return "the factorization does not reproduce the reduction's body"
        if dec.kind in ("independent", "shift-stable sum"):
            # A shift-stable sum's terms read u - c on purpose; its shift law is exact, so the body's
            # reconstruction is what there is to confirm.
            return None
        if dec.kind == "additive":
            f = lambda v: evaluate64(value, v)  # noqa: E731
            if not _close(f(p) + f(p0), f(cross) + f(cross0), ok):
                return "F(x, y) + F(x0, y0) != F(x, y0) + F(x0, y)"
            return None
        for part in parts:
            if not _close(part(p) * part(p0), part(cross) * part(cross0), ok):
                return "a term fails G(x)H(y)·G(x0)H(y0) == G(x)H(y0)·G(x0)H(y)"
    return None
