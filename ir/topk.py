"""Top-k semantics, once, in numpy: the reference of ``rf.topk`` and of the IR's top-k nodes.

``topk(x, k, axis)`` returns the k largest values along `axis` in descending
order with their indices (int64). Ties go to the lower index. NaN counts as
smaller than every number (as in numpy's sort, where NaN sorts last), so a NaN
is kept only when fewer than k numbers exist. Top-k is a reduction: its monoid
merges two sorted k-lists (`merge`), where a slot with index -1 is empty and
smaller than anything.
"""
from __future__ import annotations

import numpy as np


def _order(values: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Positions along the last axis sorted best first: class (number > NaN > empty), value desc, index asc.

    Floats rank by their float64 value (exact for every float dtype); integers by themselves, descending as
    ``~v`` (exact and without overflow: a float64 key would round int64 values near 2**63 into ties)."""
    cls = np.where(indices < 0, 0, np.where(np.isnan(values), 1, 2)) if values.dtype.kind == "f" or \
        values.dtype.kind == "V" else np.where(indices < 0, 0, 2)
    if values.dtype.kind in "iub":
        descending = ~np.where(cls == 2, values, np.zeros((), values.dtype)).astype(np.int64)
    else:
        descending = -np.where(cls == 2, values, np.zeros((), values.dtype)).astype(np.float64)
    return np.lexsort((indices, descending, -cls), axis=-1)


def topk(x: np.ndarray, k: int, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values of `x` along `axis` (descending, ties to the lower index) and their indices."""
    x = np.asarray(x)
    axis = axis % x.ndim
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ValueError(f"topk: k={k} is outside [0, {n}] for axis {axis} of shape {x.shape}")
    moved = np.moveaxis(x, axis, -1)
    idx = np.broadcast_to(np.arange(n, dtype=np.int64), moved.shape)
    order = _order(moved, idx)[..., :k]
    values = np.take_along_axis(moved, order, axis=-1)
    return np.moveaxis(values, -1, axis), np.moveaxis(order.astype(np.int64), -1, axis)


def merge(va: np.ndarray, ia: np.ndarray, vb: np.ndarray, ib: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The best k of two k-lists along the last axis (the top-k monoid)."""
    k = va.shape[-1]
    v = np.concatenate([va, vb], axis=-1)
    i = np.concatenate([ia, ib], axis=-1)
    order = _order(v, i)[..., :k]
    return np.take_along_axis(v, order, axis=-1), np.take_along_axis(i, order, axis=-1)


def empty(shape: tuple[int, ...], k: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The monoid's identity: k empty slots (index -1; the value NaN, or 0 in an integer or bool list)."""
    fill = np.nan if np.dtype(dtype).kind in "fcV" else 0
    return np.full(shape + (k,), fill, dtype=dtype), np.full(shape + (k,), -1, dtype=np.int64)
