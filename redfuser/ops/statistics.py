"""``mean``, ``var``, ``std``, ``any`` and ``all``, written with the reductions the IR has, as numpy computes them.

``any(x)`` is the max of ``x != 0`` over bools (logical or; ``!=`` is unordered, so NaN counts as true, as in
numpy) and ``all(x)`` their min; over an empty axis, where max and min have no identity, they are
``count(x != 0) > 0`` and ``count(x == 0) == 0`` (numpy's False and True).


numpy accumulates integers and bools in float64; its ``mean`` (not ``var``) also float16 in float32,
rounding the result back to f16; every other dtype in itself. A bf16 mean here accumulates as an f16 one
(numpy's one bf16 rounding per value is the documented bf16 sum divergence, docs/testing.md): its mean is
then the f32 mean rounded once, and so within half a bf16 step of the centre ``var`` uses (the f32 mean),
which a normalization ``(x - mean) / sqrt(var + eps)`` needs (of a constant row, 0). Then

- ``mean = sum(x) / n``, divided as numpy divides by a count: in float64 (an ``intp``), stored in the sum's
  dtype; a 16-bit sum is divided in f32 here (`_per_count`);
- ``var = sum((x - mean_k)**2) / max(n - ddof, 0)`` with ``mean_k`` the mean kept with its reduced axes
  (a second pass over x in numpy; the fusion engine makes the pair one pass, kept centred on the running
  mean, docs/fusion.md "Shift-stable sums");
- ``std = sqrt(var)``, the square root taken of var's result, in its dtype.

float8_e4m3fn values are refused (numpy adds them in e4m3, NaN past 448, where a kernel's running sums are
f32). So each traces to the existing reductions and elementwise ops, and every backend computes them. ``n`` is
the product of the reduced lengths: a constant, except where a shape class is traced (its symbolic axes'
lengths are probes, `redfuser.probes`), where it is a `Length` of those lengths, so a mean, var or std over
a symbolic axis keeps it symbolic (docs/shapes.md) and reads its length when the kernel runs.
"""
from __future__ import annotations

import builtins
import math
import warnings

import numpy as np

from ..ir import Binary, BinaryOp, Cast, Const, Expr, Length, UnsupportedError
from ..ir import types as T
from ..probes import ProbeLength
from ..source_info import user_loc
from ..tracer import Tracer
from .common import _check_operand, _traced, describe, result_dtype
from .elementwise import _elementwise, astype, divide, equal, greater, multiply, not_equal, sqrt, subtract
from .reductions import max as _max
from .reductions import min as _min
from .reductions import normalize_axes, sum as _sum


def _accumulation(x: Tracer, op: str) -> object:
    """The dtype numpy's ``_mean`` / ``_var`` accumulate `x` in (a numpy dtype, or None for x's own)."""
    d = x.ir_dtype
    if d.is_int or d.is_bool:
        return np.float64
    if d in (T.float16, T.bfloat16) and op == "mean":
        # (bf16 as f16: numpy adds bf16 in bf16, one rounding a value, which no kernel follows; its sum rounded
        # to bf16 before the division made a constant row's mean a bf16 step off its value, and a layer norm
        # centred there on a variance centred on the f32 mean gave -19.75 for numpy's 1 and the exact 0:
        # found by a helper, hunt_norms/02)
        return np.float32
    return None


def _prepared(op: str, x: Tracer, axis: object) -> tuple[tuple[int, ...], Tracer, tuple[int, ...]]:
    _check_operand(op, x)
    if x.ir_dtype == T.float8_e4m3fn:
        # numpy adds e4m3 values in e4m3 (NaN past 448); a kernel's running sums are f32, so the two part
        # on any row of large values, in a way no tolerance describes
        raise UnsupportedError(f"{op} of {describe(x)}: numpy accumulates e4m3 in e4m3 (NaN past 448) and a "
                               f"kernel in f32; take the {op} of x.astype(rf.float32)", op=op, loc=user_loc())
    dims = normalize_axes(op, x, axis)
    acc = _accumulation(x, op)
    wide = astype(x, acc) if acc is not None else x
    return dims, wide, tuple(x.shape[d] for d in dims)


def _finish(x: Tracer, value: Tracer) -> Tracer:
    """A 16-bit `x`'s mean, accumulated in f32, rounded back to its type (numpy's ``is_float16_result``)."""
    return astype(value, x.dtype) if x.ir_dtype in (T.float16, T.bfloat16) else value


def _per_count(total: Tracer, sizes: tuple[int, ...], ddof: int | float = 0) -> Tracer:
    """``total / max(n - ddof, 0)`` with ``n`` the product of `sizes`, as numpy divides a reduction by its
    count (a Python number, converted to the total's dtype): a 16-bit total is divided in f32 and the quotient
    stays f32, rounded where the caller stores it. As a constant of f16 the count rounded (to inf from 65520
    on: an f16 variance of 65536 elements was 0, a layer norm 31 times too large; bf16 counts past 256 lost
    their low bits). Where a size is a probe (a shape class is traced), the count is a `Length` of them,
    ``n - ddof`` taken in f64 as numpy's Python arithmetic takes it exactly."""
    if total.ir_dtype.storage_only:
        total = astype(total, np.float32)
    count = max(math.prod(sizes) - ddof, 0)
    if not builtins.any(isinstance(n, ProbeLength) for n in sizes):    # (this module defines `any`)
        return divide(total, count)

    def per_count(e: list[Expr], d: T.DType) -> Expr:
        n: Expr = Length(sizes, d if ddof == 0 else T.float64)
        if ddof != 0:      # (a symbol is at least 2 and a probe past 10^4, but ddof may be larger)
            less = Binary(BinaryOp.SUB, n, Const(float(ddof), T.float64), T.float64)
            n = Binary(BinaryOp.MAX, less, Const(0.0, T.float64), T.float64)
            n = n if d == T.float64 else Cast(n, d)
        return Binary(BinaryOp.DIV, e[0], n, d)

    return _elementwise("divide", np.divide, [total, count], per_count)


def mean(x, axis=None, keepdims=False):
    """numpy's ``mean`` (``axis``, ``keepdims``): ``sum / n`` accumulated as numpy does (module docstring)."""
    if not _traced(x):
        return np.mean(x, axis=axis, keepdims=keepdims)
    dims, wide, n = _prepared("mean", x, axis)
    result_dtype("mean", lambda v: np.mean(v, axis=dims), x)     # numpy's refusals, named
    total = _sum(wide, axis=dims, keepdims=keepdims)
    narrow = total.ir_dtype.storage_only
    value = _per_count(total, n)
    return astype(value, total.dtype) if narrow else _finish(x, value)


def var(x, axis=None, ddof=0, keepdims=False):
    """numpy's ``var`` (``axis``, ``ddof``, ``keepdims``): the mean of squared deviations from the mean,
    divided by ``max(n - ddof, 0)`` (module docstring)."""
    if not _traced(x):
        return np.var(x, axis=axis, ddof=ddof, keepdims=keepdims)
    return _var(x, axis, ddof, keepdims, "var")


def _var(x: Tracer, axis: object, ddof: object, keepdims: bool, op: str) -> Tracer:
    if isinstance(ddof, bool) or not isinstance(ddof, int | float | np.integer | np.floating):
        raise UnsupportedError(f"ddof must be a number, got {ddof!r}", op=op, loc=user_loc())
    if isinstance(ddof, np.generic):
        ddof = ddof.item()   # a Python number: numpy's var keeps x's dtype, and so must the divisor here
    dims, wide, n = _prepared(op, x, axis)
    with warnings.catch_warnings():      # numpy's "degrees of freedom <= 0" of the one-element probe
        warnings.simplefilter("ignore", RuntimeWarning)
        result_dtype(op, lambda v: np.var(v, axis=dims, ddof=ddof), x)
    # a 16-bit x's centre is the f32 mean of its values, summed in f32: numpy's is its 16-bit sum divided and
    # rounded to x's type; the sum rounded and the quotient not (as before) was neither, and an f16 constant
    # 100.3125 over 98 elements had a centre of 100.3265 and a std of 0.014 for numpy's (and the exact) 0
    summed = astype(wide, np.float32) if wide.ir_dtype.storage_only else wide
    centre = _per_count(_sum(summed, axis=dims, keepdims=True), n)
    deviation = subtract(wide, centre)     # (f32 for 16-bit values: the centre is the f32 quotient)
    value = _per_count(_sum(multiply(deviation, deviation), axis=dims, keepdims=keepdims), n, ddof)
    return astype(value, wide.dtype) if value.dtype != wide.dtype else value


def std(x, axis=None, ddof=0, keepdims=False):
    """numpy's ``std``: the square root of `var`'s result, in its dtype."""
    if not _traced(x):
        return np.std(x, axis=axis, ddof=ddof, keepdims=keepdims)
    return sqrt(_var(x, axis, ddof, keepdims, "std"))


def _logical(op: str, x, axis: object, keepdims: bool) -> Tracer:
    _check_operand(op, x)
    dims = normalize_axes(op, x, axis, ufunc=True)
    result_dtype(op, lambda v: getattr(np, op)(v, axis=dims), x)
    if builtins.any(x.shape[d] == 0 for d in dims):   # no identity for max/min: count instead (module docstring)
        if op == "any":
            return greater(_sum(not_equal(x, 0), axis=dims, keepdims=keepdims), 0)
        return equal(_sum(equal(x, 0), axis=dims, keepdims=keepdims), 0)
    truth = x if x.ir_dtype.is_bool else not_equal(x, 0)
    return (_max if op == "any" else _min)(truth, axis=dims, keepdims=keepdims)


def any(x, axis=None, keepdims=False):  # noqa: A001 - numpy's name
    """numpy's ``any``: whether some element along `axis` is nonzero (NaN is)."""
    if not _traced(x):
        return np.any(x, axis=axis, keepdims=keepdims)
    return _logical("any", x, axis, keepdims)


def all(x, axis=None, keepdims=False):  # noqa: A001 - numpy's name
    """numpy's ``all``: whether every element along `axis` is nonzero (NaN is)."""
    if not _traced(x):
        return np.all(x, axis=axis, keepdims=keepdims)
    return _logical("all", x, axis, keepdims)
