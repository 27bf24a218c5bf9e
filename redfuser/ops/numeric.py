"""Rounding, sign, classification and clipping: ``floor ceil trunc rint round sign isnan isinf isfinite clip``.

The four roundings are Loop IR ops of their own (`UnaryOp.FLOOR` ... `UnaryOp.RINT`: exact, one LLVM
intrinsic each on every backend). The others are written with the ops the IR already has, in one nest
each, so every backend and the fusion engine see only what they know:

- ``sign(x)``: ``where(x > 0, 1, where(x < 0, -1, where(x == 0, 0, x)))``: numpy's sign of ``-0.0`` is
  ``+0.0`` and of NaN is NaN (ml_dtypes' bf16 and e4m3 sign of ``-0.0`` is ``-0.0``: ``x`` itself there);
- ``isnan(x)``: ``x != x`` (the IR's ``!=`` is unordered, as numpy's); ``isinf(x)``: ``|x| == inf``;
  ``isfinite(x)``: ``|x| < inf`` (``x == x`` for float8_e4m3fn, which has no infinities); on integers and
  bools numpy's constant answers;
- ``clip(a, a_min, a_max)``: ``minimum(maximum(a, a_min), a_max)`` in the dtype numpy's ``clip`` gives,
  NaN in `a` or a bound propagating (numpy's clip); with ``a_min > a_max`` every element is ``a_max``.

Dtypes are numpy's (asked of numpy, as for every op): ``floor``/``ceil``/``trunc`` keep integers and bools
as they are, ``rint`` makes them float64 (bools float16), ``sign`` refuses bools.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..ir import Binary, BinaryOp, DType, Expr, Select, Unary, UnaryOp, UnsupportedError
from ..ir import types as T
from ..source_info import user_loc
from .common import _traced, cast, constant, describe, result_dtype
from .elementwise import BOOL_FORMS, _elementwise, e_dtype


def _rounding(op: UnaryOp, np_fn: Callable) -> Callable:
    def fn(x):
        if not _traced(x):
            return np_fn(x)
        # an integral result of an integer or bool operand is the operand (numpy's floor of an int32 is it)
        return _elementwise(op.value, np_fn, [x], lambda e, d: Unary(op, e[0], d) if d.is_float else e[0])

    fn.__name__ = fn.__qualname__ = op.value
    fn.__doc__ = f"Elementwise ``{op.value}`` (numpy's, dtype included); exact on every backend."
    return fn


floor = _rounding(UnaryOp.FLOOR, np.floor)
ceil = _rounding(UnaryOp.CEIL, np.ceil)
trunc = _rounding(UnaryOp.TRUNC, np.trunc)
rint = _rounding(UnaryOp.RINT, np.rint)
rint.__doc__ = "Elementwise round to the nearest integer, ties to even (numpy's ``rint``)."


def round(x, decimals: int = 0):  # noqa: A001 - numpy's name
    """numpy's ``round`` (``around``): ties to even; ``decimals`` other than 0 scales by ``10**decimals``
    first and divides after, as numpy does, for float32 and float64 values (see below), not 16-bit ones."""
    if not _traced(x):
        return np.round(x, decimals)
    if not isinstance(decimals, int) or isinstance(decimals, bool):
        raise UnsupportedError(f"decimals must be an int, got {decimals!r}", op="round", loc=user_loc())

    def numpy_round(v):
        return np.round(v, decimals)

    result_dtype("round", numpy_round, x)   # numpy's own refusals first (bools at decimals other than 0)
    d = e_dtype(x)
    if decimals < 0 and not d.is_float:
        raise UnsupportedError(f"decimals={decimals} of {describe(x)}: numpy rounds integers at a "
                               "negative decimal place through float64 and back; not in RedFuser's op subset",
                               op="round", loc=user_loc())
    if decimals == 0 or not d.is_float:   # numpy's round of integers at decimals >= 0 is the integers
        return _elementwise("round", numpy_round, [x], lambda e, d: Unary(UnaryOp.RINT, e[0], d) if d.is_float
                            else e[0])
    if d not in (T.float32, T.float64):
        # numpy rounds x * 10**decimals to the 16-bit type before rint; a kernel keeps it in f32 (16-bit types
        # are storage types, docs/cpu-backend.md), and a value near a tie would round the other way
        raise UnsupportedError(f"decimals={decimals} of {describe(x)}: only float32 and float64 "
                               "values are rounded at a decimal place exactly as numpy does (for "
                               f"{d.numpy_name} write rf.rint(x.astype(rf.float32) * 10.0**{decimals}) / "
                               f"10.0**{decimals})", op="round", loc=user_loc())
    scale = 10.0 ** abs(decimals)
    if decimals > 0:
        return rint(x * scale) / scale
    return rint(x / scale) * scale


def sign(x):
    """Elementwise sign: -1, 0 or 1 in `x`'s dtype; numpy's ``sign`` (``+0.0`` for ``-0.0``, NaN for NaN)."""
    if not _traced(x):
        return np.sign(x)

    def make(e: list[Expr], d: DType) -> Expr:
        v, zero = e[0], constant(0, d)
        # numpy's f16/f32/f64 sign of -0.0 is +0.0, ml_dtypes' bf16 and e4m3 one -0.0: ask the library
        keeps_zero = d.is_float and bool(np.signbit(np.sign(np.asarray(-0.0, d.numpy))))
        inner = Select(Binary(BinaryOp.EQ, v, zero, T.bool_), zero, v, d) if d.is_float and not keeps_zero else \
            (v if d.is_float else zero)
        negative = Select(Binary(BinaryOp.LT, v, zero, T.bool_), constant(-1, d), inner, d)
        return Select(Binary(BinaryOp.GT, v, zero, T.bool_), constant(1, d), negative, d)

    return _elementwise("sign", np.sign, [x], make)


def _holds_infinities(d: DType) -> bool:
    """Whether `d` has infinities (float8_e4m3fn has none: an inf becomes its NaN)."""
    with np.errstate(all="ignore"):
        return bool(np.isinf(np.asarray(np.inf, np.float32).astype(d.numpy)))


def _classify(name: str, np_fn: Callable, of_float: Callable[[Expr], Expr], of_other: bool,
              without_infinities: Callable[[Expr], Expr]) -> Callable:
    def fn(x):
        if not _traced(x):
            return np_fn(x)
        operand_dtype = e_dtype(x)

        def make(e: list[Expr], d: DType) -> Expr:
            if not operand_dtype.is_float:
                return constant(of_other, T.bool_)
            return of_float(e[0]) if _holds_infinities(operand_dtype) else without_infinities(e[0])

        return _elementwise(name, np_fn, [x], make, operand_dtype=lambda d: operand_dtype)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Elementwise ``{name}`` (numpy's; a bool array)."
    return fn


def _magnitude(v: Expr) -> Expr:
    return Unary(UnaryOp.ABS, v, v.dtype)


def _not_nan(v: Expr) -> Expr:
    return Binary(BinaryOp.EQ, v, v, T.bool_)


def _nan(v: Expr) -> Expr:
    return Binary(BinaryOp.NE, v, v, T.bool_)


isnan = _classify("isnan", np.isnan, _nan, False, _nan)
isinf = _classify("isinf", np.isinf,
                  lambda v: Binary(BinaryOp.EQ, _magnitude(v), constant(np.inf, v.dtype), T.bool_), False,
                  lambda v: constant(False, T.bool_))
isfinite = _classify("isfinite", np.isfinite,
                     lambda v: Binary(BinaryOp.LT, _magnitude(v), constant(np.inf, v.dtype), T.bool_), True,
                     _not_nan)


def _int_bounds_in_range(a: object, a_min: object, a_max: object) -> tuple[object, object]:
    """The bounds of ``clip`` of an integer array, a Python int past the result dtype's range on the side
    where it never clips dropped (numpy compares it exactly: ``clip(int32, -3, 2**40)`` never clips above;
    as a constant of the dtype it wrapped to 0 and clipped everything); past it on the other side numpy
    refuses, and `result_dtype` says so."""
    def python_int(b: object) -> bool:
        return isinstance(b, int) and not isinstance(b, bool)

    if not (python_int(a_min) or python_int(a_max)):
        return a_min, a_max
    d = result_dtype("clip", lambda x, *b: np.clip(x, a_min if a_min is None else b[0], a_max if a_max is None
                                                   else b[-1]), a, *(b for b in (a_min, a_max) if b is not None))
    if not d.is_int:
        return a_min, a_max
    info = np.iinfo(d.numpy)
    if python_int(a_min) and a_min < int(info.min):
        a_min = None
    if python_int(a_max) and a_max > int(info.max):
        a_max = None
    return a_min, a_max


def clip(a, a_min=None, a_max=None):
    """numpy's ``clip(a, a_min, a_max)``: ``minimum(maximum(a, a_min), a_max)``, either bound None (both, where
    the installed numpy takes that: ``a`` itself)."""
    if not _traced(a, a_min, a_max):
        return np.clip(a, a_min, a_max)
    if a_min is None and a_max is None:
        try:        # (numpy 2.1 and later take neither bound and copy; earlier ones raise)
            np.clip(np.zeros(1, np.float32), None, None)
        except ValueError as exc:
            raise UnsupportedError(f"clip needs a_min or a_max (numpy {np.__version__}: {exc})", op="clip",
                                   loc=user_loc()) from None
    a_min, a_max = _int_bounds_in_range(a, a_min, a_max)
    bounds = [b for b in (a_min, a_max) if b is not None]
    if not bounds:      # (no bound, or both past the dtype's range on the side that never clips)
        return _elementwise("clip", lambda x: np.clip(x, None, None), [a], lambda e, d: e[0])

    def make(e: list[Expr], d: DType) -> Expr:
        value, rest = cast(e[0], d), iter(e[1:])
        if a_min is not None:
            value = Binary(BOOL_FORMS[BinaryOp.MAX] if d.is_bool else BinaryOp.MAX, value, cast(next(rest), d), d)
        if a_max is not None:
            value = Binary(BOOL_FORMS[BinaryOp.MIN] if d.is_bool else BinaryOp.MIN, value, cast(next(rest), d), d)
        return value

    return _elementwise("clip", lambda x, *b: np.clip(x, a_min if a_min is None else b[0],
                                                      a_max if a_max is None else b[-1]), [a, *bounds], make)
