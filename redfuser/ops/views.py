"""Views and index builders: `swapaxes`, `transpose`, indexing, and `arange`."""
from __future__ import annotations

import builtins
from typing import Sequence

import numpy as np

from ..ir import (
    Binary,
    BinaryOp,
    Compute,
    DTypeError,
    Expr,
    IndexValue,
    ShapeError,
    UnsupportedError,
)
from ..ir import types as T
from ..source_info import user_loc
from ..tracer import Fixed, Tracer, active_builder
from .common import (
    _traced,
    constant,
    describe,
)


def _dim(op: str, x: Tracer, d: object) -> int:
    if isinstance(d, bool) or not isinstance(d, int | np.integer):
        raise UnsupportedError(f"axis must be an int, got {d!r}", op=op, loc=user_loc())
    if not -x.ndim <= d < x.ndim:
        raise ShapeError(f"axis {d} is out of bounds for {describe(x)}", op=op, loc=user_loc())
    return int(d) % x.ndim


def _permute(x: Tracer, perm: Sequence[int]) -> Tracer:
    """The view whose dim ``n`` is `x`'s dim ``perm[n]``."""
    where_to = {old: new for new, old in enumerate(perm)}
    view = tuple(v if isinstance(v, Fixed) else where_to[v] for v in x.view)
    return x.with_view(view, tuple(x.shape[p] for p in perm))


def swapaxes(x, axis1: int, axis2: int):
    """``x`` with two axes exchanged (a view)."""
    if not _traced(x):
        return np.swapaxes(x, axis1, axis2)
    a, b = _dim("swapaxes", x, axis1), _dim("swapaxes", x, axis2)
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(x, perm)


def transpose(x, *axes):
    """``x`` with axes permuted (reversed when none are given), like ``numpy.transpose``."""
    if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], tuple | list)):
        axes = tuple(axes[0]) if axes[0] is not None else ()
    if not _traced(x):
        return np.transpose(x, axes or None)
    if not axes:
        return _permute(x, list(reversed(range(x.ndim))))
    perm = [_dim("transpose", x, a) for a in axes]
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"axes {tuple(axes)} are not a permutation of {describe(x)}'s dims", op="transpose",
                         loc=user_loc())
    return _permute(x, perm)


def getitem(x: Tracer, key: object) -> Tracer:
    """``x[key]`` for keys made of ``None``, ``...``, full slices ``:`` and integers (a view)."""
    items = key if isinstance(key, tuple) else (key,)
    if builtins.sum(1 for k in items if k is Ellipsis) > 1:
        raise ShapeError("an index can only have one ellipsis ('...')", op="getitem", loc=user_loc())
    consumed = builtins.sum(1 for k in items if k is not None and k is not Ellipsis)
    if consumed > x.ndim:
        raise ShapeError(f"too many indices for {describe(x)}", op="getitem", loc=user_loc())
    expanded: list[object] = []
    for k in items:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (x.ndim - consumed))
        else:
            expanded.append(k)
    if not builtins.any(k is Ellipsis for k in items):  # not `in`: that compares array keys with ==
        expanded.extend([slice(None)] * (x.ndim - consumed))
    new_of_old: dict[int, int | Fixed] = {}
    shape: list[int] = []
    dim = 0
    for k in expanded:
        if k is None:
            shape.append(1)
            continue
        size = x.shape[dim]
        if isinstance(k, slice):
            start, stop, step = k.indices(size)
            if (start, stop, step) != (0, size, 1):
                raise UnsupportedError(f"only full slices ':' are supported, got {k} on {describe(x)} dim {dim}",
                                       op="getitem", loc=user_loc())
            new_of_old[dim] = len(shape)
            shape.append(size)
        elif isinstance(k, int | np.integer) and not isinstance(k, bool):
            if not -size <= k < size:
                raise ShapeError(f"index {k} is out of bounds for dim {dim} of {describe(x)}", op="getitem",
                                 loc=user_loc())
            x.builder.need_length(size, int(k) + 1 if k >= 0 else -int(k))
            new_of_old[dim] = Fixed(int(k) % size)
        else:
            raise UnsupportedError(f"index {k!r} of type {type(k).__name__} is not supported (use None, ..., ':' "
                                   "or an int)", op="getitem", loc=user_loc())
        dim += 1
    view = tuple(v if isinstance(v, Fixed) else new_of_old[v] for v in x.view)
    # numpy: an index with an ellipsis returns an array (0-d included); integers alone down to 0-d, a scalar
    return x.with_view(view, tuple(shape), array0d=builtins.any(k is Ellipsis for k in items))




def arange(start, stop=None, step=1, dtype=None):
    """``numpy.arange`` with static bounds; inside a kernel it is a traced 1-d array."""
    builder = active_builder()
    if builder is None:
        return np.arange(start, stop, step, dtype=dtype) if stop is not None else np.arange(start, dtype=dtype)
    for v in (start, stop, step):
        if isinstance(v, Tracer):
            raise UnsupportedError("arange bounds must be static Python numbers (use x.shape)", op="arange",
                                   loc=user_loc())
    try:
        ref = np.arange(start, stop, step, dtype=dtype) if stop is not None else np.arange(start, dtype=dtype)
    except (TypeError, ValueError) as exc:   # numpy's own refusal (a bool range longer than 2, a bad dtype...)
        raise DTypeError(f"numpy refuses arange({start!r}, {stop!r}, {step!r}, dtype={dtype!r}): {exc}",
                         op="arange", loc=user_loc()) from None
    out_dtype = T.from_numpy(ref.dtype)
    if out_dtype is None:
        raise DTypeError(f"dtype {ref.dtype} is not supported", op="arange", loc=user_loc())
    lo, st = (0, 1) if stop is None else (start, step)
    axes = builder.axes(ref.shape)
    value: Expr = IndexValue(axes[0], out_dtype)
    if st != 1:
        value = Binary(BinaryOp.MUL, value, constant(st, out_dtype), out_dtype)
    if lo != 0:
        value = Binary(BinaryOp.ADD, constant(lo, out_dtype), value, out_dtype)
    loc = user_loc()
    return builder.emit("arange", out_dtype, ref.shape, lambda out: Compute(out, axes, value, loc=loc))


