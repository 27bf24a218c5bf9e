"""When the fuzzer's oracle can judge top-k indices of an inexact operand.

A top-k ranks values that the kernel computes otherwise than numpy (softmax
probabilities in routing). The kernel must return numpy's indices exactly
(issue 20: ties by lower index, NaN lowest) wherever the ranking is *robust*,
that is, wherever no correct computation of the operand can reorder it:

- two values are **separated** when they differ by more than the sum of their
  error bounds, so every correct kernel orders them as numpy does;
- two values are a **structural tie** when numpy's values are equal and so are
  their float64 shadows (the program evaluated in float64 without its narrowing
  casts): equal because their inputs are, not because a rounding collapsed two
  different values. A correct kernel computes equal inputs to equal keys and
  must break the tie by index as numpy does. Two NaNs (numpy's and the shadow's)
  are a structural tie too, which is how a ``+inf`` logit's all-NaN row is judged.

A row is judged when every selected value is robustly ordered against the next
one and the k-th against every value left out; otherwise the row's indices are
unsure (a rounding-level near-tie, or a tie made by a rounding that the kernel's
``exp`` need not make).
"""
from __future__ import annotations

import numpy as np


def _robust(a: float, ea: float, sa: float, b: float, eb: float, sb: float) -> bool:
    """Whether numpy's order of `a` before `b` holds for every correct kernel (see the module docstring)."""
    if np.isnan(a) or np.isnan(b):  # NaN ranks lowest; the shadow says whether it is NaN for every kernel
        return bool(np.isnan(b) and np.isnan(sb) and (np.isnan(a) == np.isnan(sa)))
    if a == b:
        return bool(sa == sb)
    if np.isinf(a) or np.isinf(b):  # an infinity keeps its class in every correct kernel (the judge checks it)
        return True
    return bool(a - b > ea + eb)


def robust_rows(values: np.ndarray, err: np.ndarray, shadow: np.ndarray | None, indices: np.ndarray) -> np.ndarray:
    """Per row of the last axis: True where numpy's top-k `indices` of `values` are robust.

    `err` bounds each value's error, `shadow` holds the float64 shadow (None: no structural ties known),
    `indices` numpy's selected positions (k of them). Returns a bool array of the rows' shape with a
    trailing axis of length 1.
    """
    v = np.asarray(values, np.float64)
    e = np.broadcast_to(np.asarray(err, np.float64), v.shape)
    s = np.full(v.shape, np.nan) if shadow is None else np.broadcast_to(np.asarray(shadow, np.float64), v.shape)
    idx = np.asarray(indices)
    rows = v.reshape(-1, v.shape[-1]) if v.ndim else v.reshape(1, 1)
    errs, shadows = e.reshape(rows.shape), s.reshape(rows.shape)
    chosen = idx.reshape(rows.shape[0], -1)
    out = np.zeros(rows.shape[0], bool)
    for r in range(rows.shape[0]):
        out[r] = _row_robust(rows[r], errs[r], shadows[r], chosen[r], shadow is not None)
    return out.reshape(v.shape[:-1] + (1,)) if v.ndim else out.reshape(())


def _row_robust(v: np.ndarray, e: np.ndarray, s: np.ndarray, chosen: np.ndarray, have_shadow: bool) -> bool:
    if not np.all(np.isfinite(e)):
        return False
    order = [int(i) for i in chosen]
    if not have_shadow:  # no structural ties known: every compared pair must be separated
        s = np.arange(len(v), dtype=np.float64) + 0.5  # distinct, so equal values never count as a tie
    for a, b in zip(order, order[1:]):
        if not _robust(v[a], e[a], s[a], v[b], e[b], s[b]):
            return False
    last = order[-1]
    left_out = np.setdiff1d(np.arange(len(v)), chosen)
    return all(_robust(v[last], e[last], s[last], v[j], e[j], s[j]) for j in left_out)
