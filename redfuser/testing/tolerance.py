"""The one tolerance rule for comparing a kernel's result with the numpy reference.

Every comparison against the reference (the undecorated body run on numpy
arrays) goes through `assert_close`, so "equal within tolerance" means one thing
across the whole suite.

The rule
--------
For a result computed in floating dtype `d` whose longest chain of accumulation
has `n` terms (the length of the reduction or matmul contraction feeding it;
1 for purely elementwise results)::

    rtol = C * eps(d) * (1 + log2(max(n, 1)))          with C = 8
    atol = rtol * max|finite reference|

and a finite element passes when ``|actual - expected| <= atol + rtol * |expected|``.
Integer and bool results must be equal exactly (``rtol = atol = 0``).

Why this shape. Summing `n` terms in any order whose combining tree has depth
`log2(n)` (pairwise, blocked, tiled, a tree across threads, an online loop over
chunks) has an error bound ``~ eps * (1 + log2 n) * sum|terms|``; the reference
and the kernel use different orders, so their difference is bounded by the same
shape. `C` absorbs what the bound leaves out: both sides' errors add, a few
elementwise roundings per term, and ``exp`` turning an absolute error in its
argument into a relative error of the same size in its result (a softmax over
scores of magnitude `|s|` loses about ``|s| * eps``). Measured on f32 attention
over 256 keys (a chunked online softmax against the reference, 10 draws each):
the worst error is ``1.0 * eps * 9 * max|o|`` for unit-normal q, k, v and
``3.4 * eps * 9 * max|o|`` when q and k have standard deviation 3 (scores of
std 9); C = 8 passes both with margin. Scores beyond about +-60 need a looser,
explicitly scaled tolerance.

Why `atol` scales with the reference's magnitude. A sum of terms of mixed sign
cancels: its result can be far smaller than its terms, while the rounding error
stays proportional to the terms. Near-zero outputs (an attention output
coordinate averaging values of both signs) would fail any purely relative test,
so the absolute slack is the relative one times the largest finite value of the
reference. Callers who know that intermediates were larger than every output
pass ``scale=`` (the largest intermediate magnitude) to widen `atol` honestly.

What a real bug looks like (it must fail). Dropping one of 256 attention keys
changes the output by about ``|v|/256 ~ 4e-3`` relative to its magnitude; a wrong
softmax scale changes it by percent. The f32 tolerance at ``n = 256`` is
``8.6e-6``: more than 400 times below the smallest such bug.

The numbers, ``rtol`` at ``n = 1 / 256 / 4096``:

    float32        eps 1.19e-7   9.5e-7 / 8.6e-6 / 1.2e-5   bugs are caught
    float16        eps 9.77e-4   7.8e-3 / 0.070  / 0.10     catches gross bugs only
    bfloat16       eps 7.81e-3   0.0625 / 0.56   / 0.81     a smoke test
    float8_e4m3fn  eps 0.125     1.0    / 9.0    / 13       no check on values

Low-precision tolerances are wide because the reference itself rounds every
intermediate to the low precision. Hunt for bugs in float32; run f16/bf16/f8
to check that dtypes flow, NaN/inf positions match and nothing is wildly off.
NaN positions and infinities (with their sign) must match exactly for every
dtype, because a masked row (all ``-inf``) must give the reference's NaN and
nowhere else.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

C = 8
"""The safety factor of the rule (see the module docstring for how it was chosen)."""


def _numpy_dtype(dtype: object) -> np.dtype:
    """A numpy dtype from anything naming one: numpy/ml_dtypes types, ``rf.float32``, an IR `DType`."""
    numpy = getattr(dtype, "numpy", None)
    if isinstance(numpy, np.dtype):  # redfuser.ir.DType
        return numpy
    return np.dtype(dtype)


def eps(dtype: object) -> float:
    """Machine epsilon of a floating dtype (0 for integer and bool dtypes)."""
    d = _numpy_dtype(dtype)
    if d.kind in "biu":
        return 0.0
    return float(ml_dtypes.finfo(d).eps)


def tolerance(dtype: object, reduction_length: int, magnitude: float = 1.0) -> tuple[float, float]:
    """``(rtol, atol)`` for results in `dtype` accumulated over `reduction_length` terms.

    ``rtol = C * eps(dtype) * (1 + log2(max(n, 1)))`` and ``atol = rtol * magnitude``,
    where `magnitude` is the largest finite value of the reference (what
    `assert_close` passes; the default 1 gives atol relative to that maximum).
    Integer and bool dtypes give ``(0.0, 0.0)``: they must match exactly.
    """
    rtol = C * eps(dtype) * (1.0 + math.log2(max(int(reduction_length), 1)))
    return rtol, rtol * float(magnitude)


def _as_f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def _where(mask: np.ndarray, limit: int = 5) -> str:
    idx = np.argwhere(mask)
    shown = ", ".join(str(tuple(int(i) for i in row)) for row in idx[:limit])
    more = f" and {len(idx) - limit} more" if len(idx) > limit else ""
    return f"{shown}{more}"


def assert_close(actual: object, expected: object, dtype: object, reduction_length: int,
                 err_msg: str = "", *, scale: float | None = None, any_nonfinite: bool = False) -> None:
    """Assert `actual` equals the reference `expected` under the tolerance rule of this module.

    Checks, in order: same shape and dtype; NaN exactly where `expected` has NaN;
    infinities exactly where `expected` has them, with the same sign; finite values
    within ``atol + rtol * |expected|`` with ``(rtol, atol) = tolerance(dtype,
    reduction_length, max(max|finite expected|, scale or 0))``.
    Raises `AssertionError` naming the first offending positions.

    `any_nonfinite`: where both are non-finite, any NaN or infinity matches any other. For random
    programs fed infinities: where an infinity meets a value the tolerance lets round differently -- a
    sum that cancels to exactly 0 under one summation order or storage rounding and to 2^-11 under
    another -- the result is NaN (``inf * 0``) or an infinity (``inf * tiny``) by that rounding alone.
    Non-finite exactly where the reference is, and every finite value, are still checked.
    """
    actual, expected = np.asarray(actual), np.asarray(expected)
    prefix = f"{err_msg}\n" if err_msg else ""
    if actual.shape != expected.shape:
        raise AssertionError(f"{prefix}shape {actual.shape} differs from the reference's {expected.shape}")
    if actual.dtype != expected.dtype:
        raise AssertionError(f"{prefix}dtype {actual.dtype} differs from the reference's {expected.dtype}")
    if actual.size == 0:
        return
    if expected.dtype.kind in "biu":
        bad = actual != expected
        if bad.any():
            raise AssertionError(f"{prefix}{int(bad.sum())} of {bad.size} values differ at {_where(bad)}")
        return
    a, e = _as_f64(actual), _as_f64(expected)
    if any_nonfinite:
        both = ~np.isfinite(a) & ~np.isfinite(e)
        a[both] = e[both] = np.nan
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    if (nan_a != nan_e).any():
        raise AssertionError(f"{prefix}NaN positions differ: actual NaN where the reference is not at "
                             f"[{_where(nan_a & ~nan_e)}]; reference NaN where actual is not at "
                             f"[{_where(nan_e & ~nan_a)}]")
    inf_a, inf_e = np.isinf(a), np.isinf(e)
    wrong_inf = (inf_a | inf_e) & ~(nan_a | nan_e) & ((inf_a != inf_e) | (inf_e & (a != e)))
    if wrong_inf.any():
        first = tuple(np.argwhere(wrong_inf)[0])
        raise AssertionError(f"{prefix}infinities differ at [{_where(wrong_inf)}]; first: actual {float(a[first])}, "
                             f"reference {float(e[first])}")
    finite = np.isfinite(e)
    if not finite.any():
        return
    magnitude = max(float(np.max(np.abs(e[finite]))), float(scale or 0.0))
    rtol, atol = tolerance(dtype, reduction_length, magnitude)
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite positions were checked above
        err = np.where(finite & np.isfinite(a), np.abs(a - e), np.where(finite, np.inf, 0.0))
    bad = err > atol + rtol * np.abs(np.where(finite, e, 0.0))
    if bad.any():
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), err.shape))
        raise AssertionError(
            f"{prefix}{int(bad.sum())} of {bad.size} values outside the tolerance (dtype {_numpy_dtype(dtype)}, "
            f"reduction length {reduction_length}: rtol {rtol:.3g}, atol {atol:.3g}) at [{_where(bad)}]; "
            f"worst at {worst}: actual {float(a[worst])!r}, reference {float(e[worst])!r}, "
            f"|diff| {float(err[worst]):.3g}")
