"""Gathers: ``take_along_axis``.

``take_along_axis(a, idx, axis)`` reads `a` along `axis` at positions that are data: one elementwise nest
whose load of `a` has a computed position, ``idx[...] % n`` (numpy's negative indices count from the end;
the floored remainder is exactly that for every index numpy accepts, ``-n <= idx < n``). numpy raises
`IndexError` for an index outside that range; a kernel cannot raise from inside, so there it reads the
index modulo `n` (a documented divergence: README, "Op subset").
"""
from __future__ import annotations

import numpy as np

from ..ir import (Binary, BinaryOp, Cast, Compute, Computed, Const, DTypeError, Expr, Length, ShapeError,
                  UnsupportedError)
from ..ir import types as T
from ..probes import ProbeLength
from ..source_info import user_loc
from ..tracer import Tracer
from .common import _builder, _check_operand, _traced, constant, describe


def take_along_axis(arr, indices, axis=-1):
    """``numpy.take_along_axis``: `arr` read along `axis` at `indices` (same ndim; the other dims broadcast);
    ``axis=None`` reads the flattened `arr` at 1-d `indices`."""
    if not _traced(arr, indices):
        return np.take_along_axis(arr, indices, axis=axis)
    for x in (arr, indices):
        _check_operand("take_along_axis", x)
        if not isinstance(x, Tracer):
            raise ShapeError(f"take_along_axis needs arrays, got {describe(x)}", op="take_along_axis",
                             loc=user_loc())
    if not indices.ir_dtype.is_int:
        raise DTypeError(f"`indices` must be an integer array, got {describe(indices)}", op="take_along_axis",
                         loc=user_loc())
    if axis is None:
        if indices.ndim != 1:
            raise ShapeError(f"with axis=None, `indices` must be 1-d, got {describe(indices)}", op="take_along_axis",
                             loc=user_loc())
        arr, axis = arr.reshape(-1), 0
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
        raise UnsupportedError(f"axis must be an int or None, got {axis!r}", op="take_along_axis", loc=user_loc())
    if arr.ndim != indices.ndim:
        raise ShapeError(f"`indices` and `arr` must have the same number of dimensions: {describe(indices)} and "
                         f"{describe(arr)}", op="take_along_axis", loc=user_loc())
    if not -arr.ndim <= axis < arr.ndim:
        raise ShapeError(f"axis {axis} is out of bounds for {describe(arr)}", op="take_along_axis", loc=user_loc())
    ax = int(axis) % arr.ndim
    others = [d for d in range(arr.ndim) if d != ax]
    try:
        broadcast = np.broadcast_shapes(tuple(arr.shape[d] for d in others), tuple(indices.shape[d] for d in others))
    except ValueError:
        raise ShapeError(f"shapes do not broadcast outside axis {ax}: {describe(arr)} and {describe(indices)}",
                         op="take_along_axis", loc=user_loc()) from None
    shape = list(broadcast)
    shape.insert(ax, indices.shape[ax])
    n = arr.shape[ax]
    symbolic = isinstance(n, ProbeLength) and n.is_one_symbol
    if isinstance(n, ProbeLength) and not symbolic:
        n.note_read()       # the wrap-around compiles in the length: the kernel specializes on it
    if n == 0 and int(np.prod(shape)) > 0:
        raise ShapeError(f"index out of bounds: {describe(arr)} has no elements along axis {ax}",
                         op="take_along_axis", loc=user_loc())
    builder = _builder("take_along_axis", arr, indices)
    axes = builder.axes(tuple(shape))
    loc = user_loc()
    if int(np.prod(shape)) == 0:
        # no element: the result reads nothing (a read of `arr` at a wrapped index, hoisted out of the empty loop
        # and clamped to an empty axis's -1, loaded x[-1] on simulate, and the interpreter raised IndexError)
        return builder.emit("take_along_axis", arr.ir_dtype, tuple(shape),
                            lambda out: Compute(out, axes, constant(0, arr.ir_dtype), loc=loc))
    position = Cast(indices.expr_for(axes), T.int64) if indices.ir_dtype != T.int64 else indices.expr_for(axes)
    # numpy's negative indices wrap around the length; a symbolic one is read when the kernel runs (so a
    # cross-entropy's vocabulary stays symbolic), which must then be at least 1, as it is here
    if symbolic:
        builder.need_length(int(n), 1)
    count: Expr = Length((n,), T.int64) if symbolic else Const(max(int(n), 1), T.int64)
    wrapped = Binary(BinaryOp.MOD, position, count, T.int64)
    at = axes[:ax] + (Computed(wrapped),) + axes[ax + 1:]
    value = arr.expr_for(at)
    return builder.emit("take_along_axis", arr.ir_dtype, tuple(shape), lambda out: Compute(out, axes, value, loc=loc))
