"""Joining arrays: `concatenate` and `stack`.

A concatenation is one elementwise nest: along the joined axis, a chain of selects on the position picks
the piece, and each piece is read at the position shifted back by where it starts (a strided index,
clamped into the piece where the select discards it: `ir.loop.expr.Strided`). Nothing is copied when the
nest is inlined into its readers, as the fusion engine does with every elementwise nest.
"""
from __future__ import annotations

import builtins
from typing import Sequence

import numpy as np

from ..ir import Binary, BinaryOp, Compute, Const, Expr, IndexValue, Select, ShapeError, UnsupportedError, strided
from ..ir import types as T
from ..probes import ProbeLength
from ..source_info import user_loc
from ..tracer import TraceBuilder, Tracer
from .common import _builder, _check_operand, _traced, cast, constant, describe, result_dtype


def _pieces(op: str, arrays: object) -> list[object]:
    if isinstance(arrays, Tracer) or not isinstance(arrays, Sequence) or isinstance(arrays, str):
        raise UnsupportedError(f"{op} takes a tuple or list of arrays, got {describe(arrays)}", op=op,
                               loc=user_loc())
    if not arrays:
        raise ShapeError("need at least one array to concatenate", op=op, loc=user_loc())
    return list(arrays)


def _axis(op: str, axis: object, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
        raise UnsupportedError(f"axis must be an int, got {axis!r}", op=op, loc=user_loc())
    if not -ndim <= axis < ndim:
        raise ShapeError(f"axis {axis} is out of bounds for arrays of dimension {ndim}", op=op, loc=user_loc())
    return int(axis) % ndim


def concatenate(arrays, axis=0, dtype=None):
    """``numpy.concatenate``: the arrays joined along an existing `axis` (their other dims must match);
    the result's dtype is numpy's (``result_type`` of the pieces, or `dtype` under ``same_kind`` casting)."""
    pieces = _pieces("concatenate", arrays)
    if not _traced(*pieces):
        return np.concatenate(pieces, axis=axis, dtype=dtype)
    for x in pieces:
        _check_operand("concatenate", x)
        if not isinstance(x, Tracer) or x.ndim == 0:
            raise ShapeError(f"zero-dimensional arrays cannot be concatenated ({describe(x)})", op="concatenate",
                             loc=user_loc())
    if axis is None:
        raise UnsupportedError("axis=None flattens the arrays first; RedFuser joins along an existing axis",
                               op="concatenate", loc=user_loc())
    tracers: list[Tracer] = pieces  # type: ignore[assignment]
    ndim = tracers[0].ndim
    if any(x.ndim != ndim for x in tracers):
        raise ShapeError("all the input arrays must have the same number of dimensions, got "
                         + ", ".join(describe(x) for x in tracers), op="concatenate", loc=user_loc())
    ax = _axis("concatenate", axis, ndim)
    for x in tracers:
        if any(a != b for d, (a, b) in enumerate(zip(x.shape, tracers[0].shape)) if d != ax):
            raise ShapeError(f"all the input array dimensions except for the concatenation axis {ax} must match "
                             f"exactly: {', '.join(describe(t) for t in tracers)}", op="concatenate", loc=user_loc())
    out_dtype = result_dtype("concatenate", lambda *a: np.concatenate(a, axis=ax, dtype=dtype), *tracers)
    starts = [0]
    for x in tracers:
        if isinstance(x.shape[ax], ProbeLength):
            x.shape[ax].note_read()   # where the pieces meet is compiled in: the kernel specializes on it
        starts.append(starts[-1] + x.shape[ax])
    shape = tracers[0].shape[:ax] + (starts[-1],) + tracers[0].shape[ax + 1:]
    builder = _builder("concatenate", *tracers)
    axes = builder.axes(shape)
    position_dtype = T.int32 if starts[-1] < 2**31 else T.int64
    position = IndexValue(axes[ax], position_dtype)

    def piece(k: int) -> Expr:
        at = axes[:ax] + (strided(axes[ax], -starts[k], 1, tracers[k].shape[ax]),) + axes[ax + 1:]
        return cast(tracers[k].expr_for(at), out_dtype)

    present = [k for k, x in enumerate(tracers) if x.shape[ax] > 0] or [0]
    value = piece(present[-1])
    for k in reversed(present[:-1]):
        below = Binary(BinaryOp.LT, position, Const(starts[k + 1], position_dtype), T.bool_)
        value = Select(below, piece(k), value, out_dtype)
    loc = user_loc()
    return builder.emit("concatenate", out_dtype, shape, lambda out: Compute(out, axes, value, loc=loc))


def stack(arrays, axis=0, dtype=None):
    """``numpy.stack``: arrays of one shape joined along a new `axis`."""
    pieces = _pieces("stack", arrays)
    if not _traced(*pieces):
        return np.stack(pieces, axis=axis, dtype=dtype)
    for x in pieces:
        _check_operand("stack", x)
    shapes = {tuple(x.shape) if isinstance(x, Tracer) else () for x in pieces}
    if len(shapes) != 1:
        raise ShapeError(f"all input arrays must have the same shape, got {', '.join(describe(x) for x in pieces)}",
                         op="stack", loc=user_loc())
    ndim = len(shapes.pop()) + 1
    ax = _axis("stack", axis, ndim)
    builder = _builder("stack", *pieces)
    expanded = []
    for x in pieces:
        if not isinstance(x, Tracer):   # a scalar among traced values: numpy makes it a 0-d array
            x = _scalar_array(builder, x)
        expanded.append(x[(builtins.slice(None),) * ax + (None,)])
    return concatenate(expanded, axis=ax, dtype=dtype)


def _scalar_array(builder: TraceBuilder, x: object) -> Tracer:
    """A Python or numpy scalar as the 0-d array numpy's `stack` makes of it."""
    value = np.asarray(x)
    d = T.from_numpy(value.dtype)
    if d is None:
        raise UnsupportedError(f"cannot stack {describe(x)}", op="stack", loc=user_loc())
    loc = user_loc()
    out = builder.emit("stack", d, (), lambda out: Compute(out, (), constant(value.item(), d), loc=loc))
    out.array0d = True
    return out
