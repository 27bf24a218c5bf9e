"""``argmax`` and ``argmin``: numpy's first index of the extremum along one axis, written with ``topk``.

``topk(x, 1)`` already gives the first index of the largest value (ties to the lower index), but ranks NaN
below every number, where numpy's argmax and argmin both return the first NaN. So

- ``argmax(x) = where(any(isnan(x)), first index of isnan(x), topk(x, 1) index)``;
- ``argmin`` the same with ``topk`` of the order reversed: ``-x`` for floats (``-0.0`` and ``0.0`` tie as
  numpy's comparisons do), ``-1 - x`` for integers (no overflow at INT_MIN, unlike ``-x``), ``~x`` for bools.

Every piece is a reduction the fusion engine knows (a running top-1 joins a cascade as top-k does), so
``argmax(softmax(x))`` is one pass. The index dtype is numpy's (int64). `axis` must be an int (or None for
1-d `x`); ``keepdims`` keeps the axis with length 1.
"""
from __future__ import annotations

import numpy as np

from ..ir import ShapeError, UnsupportedError
from ..source_info import user_loc
from ..tracer import Tracer
from .common import _check_operand, _traced, describe, result_dtype
from .elementwise import astype, logical_not, subtract, where
from .numeric import isnan
from .reductions import max as _max
from .reductions import axis_of_a_0d_array, normalize_axes, topk


def _first_index(key: Tracer, d: int, keepdims: bool) -> Tracer:
    """The index of `key`'s first largest element along dim `d`, keeping that dim or not."""
    index = topk(key, 1, axis=d)[1]
    return index if keepdims else index[(slice(None),) * d + (0,)]


def _arg(op: str, x, axis: object, keepdims: bool) -> Tracer:
    _check_operand(op, x)
    if (axis is None and x.ndim != 1) or axis_of_a_0d_array(x, axis):   # numpy's flat index: of the flattened array
        # (numpy takes axis 0 or -1 of a 0-d array as its one element, index 0)
        from .views import reshape
        flat = _arg(op, reshape(x, (-1,)), 0, False)
        return reshape(flat, (1,) * x.ndim) if keepdims else flat
    if isinstance(axis, tuple | list):
        raise UnsupportedError(f"axis must be an int or None, got {axis!r} ({op} takes one axis, as numpy's)",
                               op=op, loc=user_loc())
    (d,) = normalize_axes(op, x, 0 if axis is None else axis)
    result_dtype(op, lambda v: getattr(np, op)(v, axis=d), x)   # numpy's refusals, named
    if x.shape[d] == 0:
        raise ShapeError(f"attempt to get {op} of an empty sequence: axis {d} of {describe(x)} has length 0 "
                         "(as numpy refuses it)", op=op, loc=user_loc())
    dtype = x.ir_dtype
    if op == "argmax":
        key = x if not dtype.is_bool else astype(x, np.int32)
    elif dtype.is_float:
        key = -x
    elif dtype.is_bool:
        key = astype(logical_not(x), np.int32)
    else:
        key = subtract(-1, x)
    best = _first_index(key, d, keepdims)
    if not dtype.is_float:
        return best
    nan = isnan(x)
    out = where(_max(nan, axis=d, keepdims=keepdims), _first_index(astype(nan, np.int32), d, keepdims), best)
    out.array0d = False   # numpy's argmax of one row is a scalar (`where`'s 0-d result is an array: ``s += 1``
    return out            # on it would write through every name bound to it)


def argmax(x, axis=None, keepdims=False):
    """numpy's ``argmax``: the first index of the largest value along `axis` (of the first NaN, if any)."""
    if not _traced(x):
        return np.argmax(x, axis=axis, keepdims=keepdims)
    return _arg("argmax", x, axis, keepdims)


def argmin(x, axis=None, keepdims=False):
    """numpy's ``argmin``: the first index of the smallest value along `axis` (of the first NaN, if any)."""
    if not _traced(x):
        return np.argmin(x, axis=axis, keepdims=keepdims)
    return _arg("argmin", x, axis, keepdims)
