"""The one tolerance rule for comparing a kernel's result with the numpy reference.

Every comparison against the reference (the undecorated body run on numpy arrays, or its float64
evaluation, `wide_reference`) goes through `assert_close`, so "equal within tolerance" means one thing
across the whole suite.

The rule
--------
For a result of floating dtype `d` whose longest chain of accumulation has `n` terms (the length of the
reduction or matmul contraction feeding it; 1 for elementwise results), ``M`` the largest finite value of
the reference (or the caller's ``scale=``), a finite element passes when
``|actual - expected| <= atol + rtol * |expected|`` with::

    float32, float64:      rtol = C * eps(d) * (1 + log2 n)                     C = 8
                           atol = rtol * M
    f16, bf16, e4m3:       r32  = C * eps(float32) * (1 + log2 n)
                           rtol = r32 + (1 + R) * u                              u = eps(d) / 2
                           atol = (r32 + (R - 1) * u) * M  +  (1 + R) * smallest_subnormal(d) / 2

where ``R`` is the number of roundings to `d` on the way to the output (keyword ``roundings``, below).
Integer and bool results must be equal exactly. NaN positions and infinities (with their sign) must match
exactly for every dtype: a masked row (all ``-inf``) must give the reference's NaN and nowhere else.

float32: why ``eps * log2 n``
-----------------------------
Summing `n` terms in any order whose combining tree has depth ``log2 n`` (pairwise, blocked, tiled, a tree
across threads, an online loop over chunks) has an error bound ``~ eps * (1 + log2 n) * sum|terms|``; the
reference and the kernel use different orders, so their difference has the same shape. `C` absorbs both
sides' errors, a few elementwise roundings per term, and ``exp`` turning an absolute error in its argument
into a relative one of the same size. Measured on f32 attention over 256 keys (a chunked online softmax
against the reference, 10 draws each): the worst error is ``1.0 * eps * 9 * M`` for unit-normal q, k, v and
``3.4 * eps * 9 * M`` for q, k of standard deviation 3 (scores of std 9). ``atol`` scales with ``M`` because
a sum of mixed signs cancels: its rounding error stays proportional to its terms, not to its result.
Callers who know an intermediate was larger than every output pass ``scale=`` (that magnitude).

f16, bf16, e4m3: count the roundings
------------------------------------
Compiled kernels treat f16/bf16/e4m3 as storage types (docs/cpu-backend.md): they load, compute in f32 and
round once on store. numpy rounds every intermediate to the narrow type instead. So the kernel is
``k = fl_d(y (1 + theta))`` with ``theta`` at f32 level (the ``r32`` part), while a reference that rounds
``R`` times is ``y`` plus ``R`` rounding errors, each at most ``u`` relative to the value it rounds
(``u = 2^-11`` f16, ``2^-8`` bf16, ``2^-4`` e4m3). The last rounding of each side (the kernel's store, the
reference's final one) is relative to the output element: ``2u |r|``. Each of the ``R - 1`` earlier ones
reaches the output either relatively (an elementwise chain, a sum of positive terms) or absolutely,
through a sum that cancels or an ``exp``: at most ``u (|r| + M)``. Adding up gives the rule's
``(1 + R) u |r| + (R - 1) u M``.

What counts as a rounding:

- every op numpy evaluates in `d` (``x - m``, ``exp``, ``/``, ``*`` by a Python scalar, which numpy also
  rounds to `d`: ``0.125`` is exact in f16, ``1/sqrt(128)`` is not);
- a numpy sum or matmul over `d` counts once where numpy accumulates in f32: ``np.add.reduce`` of f16 along
  the contiguous last axis (pairwise, in f32: ``np.full(4096, 0.3, float16).sum()`` is 1229, the exact
  value rounded once) and every f16 matmul. It counts once per added term where numpy accumulates in `d`:
  f16 sums over any other axis (row by row in f16: the same 4096 values summed along axis 0 of a column
  give 1024) and **every bf16 sum** (ml_dtypes' ``add.reduce`` is sequential in bf16: 128). numpy's bf16
  matmul returns f32, so bf16 attention is an f32 result, checked by the f32 rule;
- an intermediate the kernel itself stores in `d` where the reference does not round (a value passed
  between kernels, the f16 operand of a tensor-core product);
- a rounded argument of ``exp`` of magnitude ``|a|`` is amplified ``|a|`` times (``exp(a (1 + u)) =
  exp(a) (1 + |a| u)``): with unit-scale scores the count covers it, with scores of ~10 add ``|a|``.

A rounding moved by fusion
--------------------------
A narrowing cast inside a fused cascade (``(p / l).astype(bf16) @ v``) rounds each term once on both
sides, but different values: the loop rounds ``exp(s - m_t)`` with the running max and divides by ``l``
afterwards. Their difference is bounded by the terms' magnitudes, not by the output's (a ``P·V`` that
cancels is much smaller than ``Σ|p v|``): `rounded_terms_bound` gives ``2u·Σ|t w| + σ·Σ|w|`` per element,
passed to `assert_close` as ``bound=`` on top of this rule (docs/fusion.md, "Narrowing casts inside a
cascade", has the derivation and its measured margins).

Which reference
---------------
- **The float64 body, rounded once** (`wide_reference`): the tight check, and the only one for bf16
  reductions. ``R = 1`` plus the kernel's own intermediate roundings: 2 for f16 (one of margin; on the GPU
  the tensor-core P operand of attention is rounded to f16), 1 for bf16, +3 for MoE routing (the kernel
  rounds its exp values, the kept weights and their sum, as the body does). Keep the body's Python
  scalars exact in `d` (attention heads of 16, 64, 256) or count their rounding.
- **The float64 body from numpy's rounded value on**, for a body that takes the max or min of a 16-bit value
  it computes (``x = logits * 1.5``, ``x - mean(x)``): the kernels compute that value as numpy does where it
  meets its max (docs/fusion.md, `fusion.numpy_extrema`), half an ulp of ``x`` from its exact value, which
  moves ``exp(x - m)`` by far more than R roundings of the result: ``wide_reference(softmax, logits * 1.5)``.
- **numpy's own low-precision body**: ``R`` = the roundings on its path (softmax 4, log-softmax 5,
  attention / causal / decoding 7, MoE routing 6) at unit-scale inputs. Good for f16; for bf16 sums it
  checks nothing (below).

Measurements
------------
Worst ``|error| / tolerance`` (must be below 1) of the compiled kernels, over 2-3 seeds and inputs of
scale 1 and 3 (rows ``N(0, 9)``; q, k ``N(0, 3)``, so scores of std 3), on the ``cpu`` backend and on
``simulate`` (n = 64 and 256, small tiles), n being the row length, the key count or the expert count;
attention 32 queries (causal: n queries, head 16), decoding 1 query, 4 heads of 64, MoE 256-512 tokens.
The last column is the smallest ratio the same output times 1.01 reaches (a 1% error; must exceed 1)::

    against wide_reference                       n = 64    256   1024   4096  16384    x1.01
    f16  (R = 2; MoE 5)      softmax                 0.09  0.12  0.49  0.39  0.41       4.7
                             log_softmax             0.00  0.28  0.45  0.43  0.42       5.1
                             attention               0.44  0.40  0.24  0.30     -       4.9
                             causal                  0.35  0.44  0.33  0.32     -       5.0
                             decoding                0.00  0.03  0.00  0.15  0.04       4.9
                             MoE routing             0.18  0.18  0.18  0.17  0.18       2.0
    bf16 (R = 1; MoE 4)      softmax                 0.00  0.98  1.00  0.99  1.00       1.57
                             log_softmax             0.00  0.00  1.00  1.00  1.00       1.69
                             MoE routing             0.22  0.22  0.23  0.22  0.23       0.49  (x1.05: 1.7)
    bf16 -> f32 (f32 rule)   attention               0.04  0.07  0.18  0.14     -     403
                             causal                  0.03  0.05  0.08  0.09     -     403
                             decoding                0.04  0.03  0.03  0.04  0.04     350
    against numpy's f16 body, R = path count
    f16                      softmax (4)             0.18  0.18  0.23  0.17  0.13       2.45
                             log_softmax (5)         0.19  0.19  0.17  0.16  0.16       2.03
                             attention (7)           0.43  0.52  0.46  0.45     -       1.37
                             causal (7)              0.23  0.40  0.52  0.66     -       1.35
                             decoding (7)            0.49  0.35  0.35  0.51  0.81       1.30
                             MoE routing (6)         0.23  0.23  0.24  0.25  0.23       1.68
    against numpy's bf16 body, R = path count
    bf16                     softmax (4)             0.65  2.08  9.95 19.8  26.4        0.29
                             log_softmax (5)         0.19  0.38  1.52  3.49  6.01       0.36

Reading it:

- f16 against the float64 body: a correct kernel uses at most half the tolerance (margin 2.0), a 1%
  error exceeds it 4.7 times (MoE routing 2.0 times).
- bf16 against the float64 body: differences are whole ulps. Both sides round values that differ by an
  f32 error, far below a bf16 ulp, so a correct kernel is at most one ulp away, and ``R = 1`` allows
  exactly one ulp at the bottom of a binade (``2u |r|``, the 1.00 above) and up to two at its top. A 1%
  error is 1.3 to 2.6 ulps and exceeds the tolerance 1.57 times; no looser constant can keep that. bf16
  MoE routing rounds three intermediates itself (up to 1.2%): a 1% error passes there, 5% fails.
- f16 against numpy's f16 body: the window is narrow (the body rounds 4-7 times, a 1% error is 20 u):
  margin 1.2 at worst, a 1% error 1.3 times over. Larger scores push it over: decoding with head 128 (its
  scale ``1/sqrt(128)`` is not an f16) at n = 16384 and causal attention with head 32 at n = 4096, both
  with scores of std 3, reached 1.30 and 1.12 at ``R = 7``: count the exp argument (``R = 7 + |s|max``)
  or use the float64 body.
- bf16 against numpy's bf16 body: numpy's sequential bf16 sum loses the row (20-26 times the tolerance
  at n >= 4096 for a correct kernel) and no rule separates a 1% error from it: compare with
  `wide_reference`.

Planted bugs (`tests/test_tolerance.py`, compiled on ``cpu`` unless said; ratio to the tolerance):
attention over 64 keys with one key dropped, f16 262 and bf16 21 000; with its softmax scale 1% off, f16
10.5 and bf16 1 380; f16 softmax over 4096 whose running sum is held in bf16 (an online loop over chunks
of 64) 5.3, the same loop in f32 0.005; every workload's output times 1.01 as in the table, on ``simulate``
too (f16 softmax and attention, bf16 softmax).

Defaults
--------
Without ``roundings``, `default_roundings` assumes 8 for f16 (attention's path plus one: a 1% error in the
largest outputs still fails, ``16 u = 0.78%``) and 16 for bf16, where numpy's sums add in bf16 and no
count lets 1% fail anyway. Random programs (up to 5 steps, `redfuser.testing.strategies.programs`) rely on
these: over 8000 of them, numpy's body against the same program computed the kernels' way (f32, rounded
on store) needed at most ``R = 4`` in f16 and ``R = 6.7`` in bf16 (a bf16 sum of 196 terms); 400 simulated
and 300 compiled ones pass.

float8_e4m3fn: ``u = 1/16``, so the default ``R = 8`` allows ``56% |r| + 44% M``: it checks NaN and
infinity positions, signs, and that values are within about a factor of two of the reference, no more.
"""
from __future__ import annotations

import math
from typing import Callable

import ml_dtypes
import numpy as np

C = 8
"""The safety factor of the float32 part of the rule (see the module docstring for how it was chosen)."""

ROUNDINGS = {"float16": 8, "bfloat16": 16, "float8_e4m3fn": 8}
"""Roundings assumed on the way to an output when the caller does not say (module docstring, "Defaults")."""

_EPS32 = 2.0**-23


def _numpy_dtype(dtype: object) -> np.dtype:
    """A numpy dtype from anything naming one: numpy/ml_dtypes types, ``rf.float32``, an IR `DType`."""
    numpy = getattr(dtype, "numpy", None)
    if isinstance(numpy, np.dtype):  # redfuser.ir.DType
        return numpy
    return np.dtype(dtype)


_ML_FLOATS = {np.dtype(t).name for t in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)}


def _is_float(d: np.dtype) -> bool:
    return d.kind == "f" or (d.kind == "V" and d.itemsize <= 2 and d.name in _ML_FLOATS)


def eps(dtype: object) -> float:
    """Machine epsilon of a floating dtype (0 for integer and bool dtypes)."""
    d = _numpy_dtype(dtype)
    if d.kind in "biu":
        return 0.0
    return float(ml_dtypes.finfo(d).eps)


def is_low_precision(dtype: object) -> bool:
    """Whether `dtype` is a floating type narrower than float32 (f16, bf16, e4m3): a storage type."""
    d = _numpy_dtype(dtype)
    return d.kind not in "biu" and eps(d) > _EPS32


def default_roundings(dtype: object) -> int:
    """The roundings `tolerance` assumes for `dtype` when the caller gives none (8 for e4m3 and others)."""
    return ROUNDINGS.get(_numpy_dtype(dtype).name, 8)


def tolerance(dtype: object, reduction_length: int, magnitude: float = 1.0, *,
              roundings: int | None = None) -> tuple[float, float]:
    """``(rtol, atol)`` for results in `dtype` accumulated over `reduction_length` terms.

    float32 and wider: ``rtol = C * eps(dtype) * (1 + log2(max(n, 1)))``, ``atol = rtol * magnitude``.
    f16, bf16, e4m3 (unit roundoff ``u = eps/2``), with ``R = roundings`` (default `default_roundings`)::

        r32  = C * eps(float32) * (1 + log2(max(n, 1)))         the f32 arithmetic both sides share
        rtol = r32 + (1 + R) * u
        atol = (r32 + (R - 1) * u) * magnitude + (1 + R) * smallest_subnormal / 2

    `R` counts the times a value on the way to the output is rounded to `dtype`: the reference's
    roundings (its last one included) and any the kernel adds by storing an intermediate in `dtype`;
    a rounded exp argument of magnitude ``|a|`` counts ``|a|`` times. `magnitude` is the largest
    finite value of the reference (what `assert_close` passes). Integer and bool dtypes give
    ``(0.0, 0.0)``: they must match exactly. The module docstring derives and measures the rule.
    """
    d = _numpy_dtype(dtype)
    if d.kind in "biu":
        return 0.0, 0.0
    log_n = 1.0 + math.log2(max(int(reduction_length), 1))
    if not is_low_precision(d):
        rtol = C * eps(d) * log_n
        return rtol, rtol * float(magnitude)
    r = default_roundings(d) if roundings is None else int(roundings)
    if r < 0:
        raise ValueError(f"roundings must be >= 0, got {roundings}")
    finfo = ml_dtypes.finfo(d)
    u, r32 = float(finfo.eps) / 2, C * _EPS32 * log_n
    rtol = r32 + (1 + r) * u
    atol = (r32 + max(r - 1, 0) * u) * float(magnitude) + (1 + r) * float(finfo.smallest_subnormal) / 2
    return rtol, atol


def rounded_terms_bound(cast_dtype: object, magnitude: np.ndarray, weight: np.ndarray, reduction_length: int,
                        *, roundings: int = 0) -> np.ndarray:
    """Per output element, how far two evaluations of ``Σ_k cast(t_k)·w_k`` may differ when each rounds
    every term to `cast_dtype` once, but at a different point (docs/fusion.md, "Narrowing casts inside a
    cascade": the fused loop rounds ``t_k`` scaled by a running value and rescales afterwards).

    Each side's rounding of term ``k`` is at most ``u |t_k w_k| + σ/2 |w_k|`` from the exact term (``u``
    the cast's unit roundoff, ``σ`` its smallest subnormal; a scale ``<= 1`` applied after the rounding
    keeps both parts), so the two differ by at most ``2u S + σ W`` with ``S = Σ_k |t_k w_k|``
    (`magnitude`, float64) and ``W = Σ_k |w_k|`` (`weight`). Added: the f32 arithmetic both share on
    ``S`` (``r32 S``, as in `tolerance`) and `roundings` further roundings to `cast_dtype` of values
    bounded by ``S`` (an accumulator or matmul result stored in that type: ``roundings · u · S``).
    Pass it to `assert_close` as ``bound=``, on top of the output type's own tolerance.
    """
    d = _numpy_dtype(cast_dtype)
    finfo = ml_dtypes.finfo(d)
    u, sigma = float(finfo.eps) / 2, float(finfo.smallest_subnormal)
    r32 = C * _EPS32 * (1.0 + math.log2(max(int(reduction_length), 1)))
    return (2 + roundings) * u * _as_f64(magnitude) + r32 * _as_f64(magnitude) + sigma * _as_f64(weight)


def wide_reference(body: Callable, *args: object) -> object:
    """The numpy body evaluated in float64: floating array arguments widened to float64, each output
    rounded once to the dtype the body gives on the original arguments (returned like the body's own).

    The reference for a low-precision kernel where numpy's own evaluation in that precision is too coarse
    to check it (numpy adds bf16 values one at a time in bf16: ``np.full(4096, 0.3, bfloat16).sum()`` is
    128, not 1232). Compare with ``roundings=2`` for f16 and 1 for bf16, plus the roundings of the
    kernel's own intermediate stores (module docstring, "Which reference"). Python
    scalars stay exact here where numpy would round them to the narrow dtype (`x * 0.125` on f16 rounds
    0.125 to f16 first), so a body whose constants do not fit the narrow type differs by that rounding.
    """
    with np.errstate(all="ignore"):
        narrow = body(*args)
        wide = body(*(_widen(a) for a in args))
    if isinstance(narrow, tuple | list):
        return tuple(_round_like(w, n) for w, n in zip(wide, narrow))
    return _round_like(wide, narrow)


def _widen(a: object) -> object:
    if isinstance(a, np.ndarray) and _is_float(a.dtype):
        return a.astype(np.float64)
    return a


def _round_like(wide: object, narrow: object) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(wide).astype(np.asarray(narrow).dtype)


def _as_f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def _where(mask: np.ndarray, limit: int = 5) -> str:
    idx = np.argwhere(mask)
    shown = ", ".join(str(tuple(int(i) for i in row)) for row in idx[:limit])
    more = f" and {len(idx) - limit} more" if len(idx) > limit else ""
    return f"{shown}{more}"


def assert_close(actual: object, expected: object, dtype: object, reduction_length: int,
                 err_msg: str = "", *, scale: float | None = None, any_nonfinite: bool = False,
                 roundings: int | None = None, bound: np.ndarray | None = None) -> None:
    """Assert `actual` equals the reference `expected` under the tolerance rule of this module.

    Checks, in order: same shape and dtype; NaN exactly where `expected` has NaN;
    infinities exactly where `expected` has them, with the same sign; finite values
    within ``atol + rtol * |expected|`` with ``(rtol, atol) = tolerance(dtype,
    reduction_length, max(max|finite expected|, scale or 0), roundings=roundings)``.
    Raises `AssertionError` naming the first offending positions.

    `dtype` is the output's dtype, or a narrower one the reference rounded the output's inputs to on the
    way (a bf16 program whose matmul gives f32). `roundings` counts the roundings to an f16/bf16/e4m3
    `dtype` on the way to the output (module docstring); float32 and wider ignore it.

    `bound`: a per-element error the caller derived and may add on top (`rounded_terms_bound`); finite and
    >= 0 where the reference is finite, and `scale` finite and >= 0 (`ValueError` otherwise: a NaN or
    infinite one would accept any result).

    `any_nonfinite`: where both are non-finite, any NaN or infinity matches any other. For random
    programs fed infinities: where an infinity meets a value the tolerance lets round differently -- a
    sum that cancels to exactly 0 under one summation order or storage rounding and to 2^-11 under
    another -- the result is NaN (``inf * 0``) or an infinity (``inf * tiny``) by that rounding alone.
    Non-finite exactly where the reference is, and every finite value, are still checked.
    """
    if scale is not None and not (math.isfinite(float(scale)) and float(scale) >= 0):
        raise ValueError(f"assert_close: scale must be a finite magnitude >= 0, got {scale!r} (an infinite one "
                         "would accept any result)")
    actual, expected = np.asarray(actual), np.asarray(expected)
    prefix = f"{err_msg}\n" if err_msg else ""
    if actual.shape != expected.shape:
        raise AssertionError(f"{prefix}shape {actual.shape} differs from the reference's {expected.shape}")
    if actual.dtype != expected.dtype:
        raise AssertionError(f"{prefix}dtype {actual.dtype} differs from the reference's {expected.dtype}")
    if expected.dtype.kind == "c":    # (the rule below compares reals: a complex imaginary part was dropped)
        raise AssertionError(f"{prefix}complex values ({expected.dtype}) are outside the tolerance rule: RedFuser "
                             "kernels compute no complex numbers")
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
    rtol, atol = tolerance(dtype, reduction_length, magnitude, roundings=roundings)
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite positions were checked above
        err = np.where(finite & np.isfinite(a), np.abs(a - e), np.where(finite, np.inf, 0.0))
    allowed = atol + rtol * np.abs(np.where(finite, e, 0.0))
    if bound is not None:
        extra = np.broadcast_to(_as_f64(bound), e.shape)
        if (finite & ~(np.isfinite(extra) & (extra >= 0))).any():
            raise ValueError("assert_close: bound must hold finite errors >= 0 where the reference is finite (a "
                             "NaN or infinite bound accepts any result there)")
        allowed = allowed + np.where(finite, extra, 0.0)
    bad = err > allowed
    if bad.any():
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), err.shape))
        raise AssertionError(
            f"{prefix}{int(bad.sum())} of {bad.size} values outside the tolerance (dtype {_numpy_dtype(dtype)}, "
            f"reduction length {reduction_length}{_roundings_text(dtype, roundings)}: rtol {rtol:.3g}, "
            f"atol {atol:.3g}) at [{_where(bad)}]; "
            f"worst at {worst}: actual {float(a[worst])!r}, reference {float(e[worst])!r}, "
            f"|diff| {float(err[worst]):.3g}")


def _roundings_text(dtype: object, roundings: int | None) -> str:
    if not is_low_precision(_numpy_dtype(dtype)):
        return ""
    return f", {default_roundings(dtype) if roundings is None else roundings} roundings"
