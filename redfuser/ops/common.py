"""Shared helpers of the op namespace: describing operands, asking numpy for result dtypes, building loads."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..ir import (
    Axis,
    Cast,
    Const,
    DType,
    DTypeError,
    Expr,
    Length,
    ShapeError,
    UnsupportedError,
)
from ..ir import types as T
from ..probes import ProbeLength
from ..source_info import user_loc
from ..tracer import Tracer

inf = math.inf
Scalar = bool | int | float | np.generic


def describe(x: object) -> str:
    """An operand as an error message shows it: ``f32[2,3]`` or ``python float``."""
    if isinstance(x, Tracer):
        return f"{x.ir_dtype}[{','.join(map(str, x.shape))}]"
    if isinstance(x, np.ndarray):
        d = T.from_numpy(x.dtype)
        return f"numpy array {d or x.dtype}[{','.join(map(str, x.shape))}]"
    if isinstance(x, ProbeLength):
        return "python int (a length)"
    return f"python {type(x).__name__}" if not isinstance(x, np.generic) else f"numpy {x.dtype} scalar"


def static_scalar(x: object) -> object:
    """A 0-d numpy array as the numpy scalar it holds (what ``rf.where(True, 1.0, 2.0)`` or ``rf.astype(2.5,
    rf.float16)`` of static values return in a kernel): numpy's promotion treats the two alike (NEP 50), so
    it is a static value of its dtype like ``np.float16(2.5)``. Anything else unchanged."""
    return x[()] if type(x) is np.ndarray and x.ndim == 0 else x


def _check_operand(op: str, x: object) -> None:
    if isinstance(x, Tracer) or isinstance(x, bool | int | float | np.generic):
        return
    if isinstance(x, np.ndarray):
        raise UnsupportedError(
            f"a {describe(x)} mixed with traced values: a kernel reads arrays only through its arguments, so pass "
            "it as a kernel argument (a captured array, or one the body made from static values such as "
            "rf.stack([1.0, 2.0]))",
            op=op, loc=user_loc())
    raise UnsupportedError(f"operand of type {type(x).__name__} is not an array or a scalar", op=op, loc=user_loc())


def is_numpy_scalar(x: object) -> bool:
    """Whether `x` is, in the numpy reference, a numpy scalar rather than an array. numpy returns scalars
    from ufuncs of 0-d operands, reductions to 0-d and full integer indexing; 0-d ndarrays are a 0-d kernel
    argument and what ``where``, ``x[..., ...]`` and ``astype``/``transpose`` of a 0-d array return
    (`Tracer.array0d`). The two differ where numpy's operators take shortcuts for arrays only (``x ** 2``
    of a bool array is int8, of a bool scalar int64)."""
    if isinstance(x, np.generic):
        return True
    return isinstance(x, Tracer) and x.ndim == 0 and not x.array0d


def probe(x: object, value: object = 1) -> object:
    """What numpy sees in place of `x`: a one-element array (or numpy scalar, `is_numpy_scalar`) holding
    `value` for a traced value, `x` itself otherwise (a traced length as the plain int it is: numpy takes a
    subclass of int for a strong int64 operand, not a Python int, and ``f32 / x.shape[-1]`` would be f64)."""
    if isinstance(x, ProbeLength):
        return int(x)
    if not isinstance(x, Tracer):
        return x
    if is_numpy_scalar(x):
        return x.dtype.type(value)
    return np.full((1,) * x.ndim, value, dtype=x.dtype)


def _probe_value(x: object) -> object:
    return probe(x)


def result_dtype(op: str, fn: Callable, *args: object, **kwargs: object) -> DType:
    """The dtype numpy gives for `fn(*args)`, as an IR dtype (raises `DTypeError`)."""
    try:
        with np.errstate(all="ignore"):
            out = fn(*(_probe_value(a) for a in args), **kwargs)
    except Exception as exc:  # numpy's own refusal: no common dtype, no loop for this dtype
        raise DTypeError(
            f"not defined for {', '.join(describe(a) for a in args)} ({exc})", op=op, loc=user_loc()) from None
    dtype = T.from_numpy(np.asarray(out).dtype)
    if dtype is None:
        raise DTypeError(f"gives dtype {np.asarray(out).dtype}, which RedFuser does not support "
                         f"(operands {', '.join(describe(a) for a in args)})", op=op, loc=user_loc())
    return dtype


def broadcast_shapes(op: str, *xs: object) -> tuple[int, ...]:
    shapes = [x.shape for x in xs if isinstance(x, Tracer)]
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"shapes do not broadcast: {' and '.join(describe(x) for x in xs if isinstance(x, Tracer))}",
                         op=op, loc=user_loc()) from None


def cast(e: Expr, dtype: DType) -> Expr:
    """`e` converted to `dtype` (no node when it already has it)."""
    if e.dtype == dtype:
        return e
    if isinstance(e, Const):
        return constant(e.value, dtype)
    return Cast(e, dtype)


def constant(value: Scalar, dtype: DType) -> Const:
    """`value` as a constant of `dtype`. An int outside an integer dtype's range wraps as numpy converts it
    (through a C long: ``where(c, int32_array, 2**40)`` holds 0 there); past int64 numpy refuses, and so
    does this (`DTypeError`). Every backend then computes with the same value: the compiled ones truncated
    it, the interpreter raised numpy's bare `OverflowError`."""
    v = value.item() if isinstance(value, np.generic) else value
    if dtype.is_bool:
        return Const(bool(v), dtype)
    if dtype.is_int:
        v = int(v)
        info = np.iinfo(dtype.numpy)
        if not int(info.min) <= v <= int(info.max):
            if not -2 ** 63 <= v < 2 ** 63:
                raise DTypeError(f"the Python int {v} does not fit {dtype} (numpy: too large to convert to C long)",
                                 op="constant", loc=user_loc())
            v = int(np.array(v, np.int64).astype(dtype.numpy))
        return Const(v, dtype)
    return Const(float(v), dtype)


def operand(x: object, axes: tuple[Axis, ...], dtype: DType) -> Expr:
    """`x` as an expression inside a nest over `axes` (right-aligned broadcasting), cast to `dtype`."""
    if isinstance(x, Tracer):
        lead = len(axes) - x.ndim
        return cast(x.expr_for(axes[lead:]), dtype)
    if isinstance(x, ProbeLength) and x.is_one_symbol and not dtype.is_bool:
        # ``s / x.shape[-1]``: a symbolic length handed to an op as it is (the user's code computed nothing
        # with it) is its run-time value, so the axis stays symbolic (docs/shapes.md); a 16-bit operand
        # gets it rounded to its type when the kernel runs, as numpy converts the Python int
        wide = T.float32 if dtype.storage_only else dtype
        return Length((x,), wide) if wide == dtype else Cast(Length((x,), wide), dtype)
    return constant(x, dtype)


def _builder(op: str, *xs: object):
    tracers = [x for x in xs if isinstance(x, Tracer)]
    builder = tracers[0].builder
    if any(t.builder is not builder for t in tracers):
        raise UnsupportedError("a traced value from another kernel's trace was used", op=op, loc=user_loc())
    return builder


def _traced(*xs: object) -> bool:
    """Whether an op's operands include a traced array; where none does the op is numpy's, on the values, so
    a length among them (``rf.minimum(x.shape[-1], 64)``) is read as a number: noted, and its axis kept static
    (both probes give 64, and the class had 64 compiled in for every length)."""
    if any(isinstance(x, Tracer) for x in xs):
        return True
    for x in xs:
        if isinstance(x, ProbeLength):
            x.note_read()
    return False


