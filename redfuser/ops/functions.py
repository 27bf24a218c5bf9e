"""Smooth math functions: ``tanh``, ``expm1``, ``log1p``, ``sin``, ``cos``, ``erf``, ``logaddexp``.

``tanh`` ... ``cos`` are numpy's ufuncs and Loop IR ops of their own (`UnaryOp.TANH` ...); compiled, their
f32 forms come from `codegen/wide_math.py` (evaluated in f64: at most 1 ulp on the whole f32 range, 16-bit
values through f32). ``erf`` is not in numpy: `rf.erf` gives ``math.erf`` of each element, computed in
float64 and returned in the float dtype numpy's ``sin`` would give (the input's float dtype; f16 for
bools, f64 for integers), which is ``scipy.special.erf``'s result for f32 and f64. ``logaddexp`` is written
with the ops above exactly as numpy computes it (``npy_logaddexp``), so the fusion engine sees its parts.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir import UnaryOp, semantics
from ..ir import types as T
from .common import _check_operand, _traced, result_dtype
from .elementwise import _unary, abs as _abs, astype, exp, maximum, where

tanh = _unary(UnaryOp.TANH, np.tanh)
expm1 = _unary(UnaryOp.EXPM1, np.expm1)
log1p = _unary(UnaryOp.LOG1P, np.log1p)
sin = _unary(UnaryOp.SIN, np.sin)
cos = _unary(UnaryOp.COS, np.cos)


def _erf_numpy(x):
    """``erf`` on numpy values: float64 ``math.erf``, in the float dtype numpy's ``sin`` gives for `x`."""
    scalar = not isinstance(x, np.ndarray)
    arr = np.asarray(x)
    out_dtype = np.sin(np.zeros(1, arr.dtype)).dtype
    out = semantics.erf(arr.astype(out_dtype))
    return out[()] if scalar else out


erf = _unary(UnaryOp.ERF, _erf_numpy)
erf.__doc__ = ("Elementwise error function (not a numpy ufunc): ``math.erf`` of each element, computed in "
               "float64 and returned in the float dtype numpy's ``sin`` gives (module docstring).")


def _as_work(x, work: T.DType):
    """`x` in the dtype `work`: a traced value cast; a Python or numpy scalar made a numpy scalar of `work` (a
    0-d array in its place would be an array captured by the body, which tracing refuses)."""
    return astype(x, work.numpy) if _traced(x) else np.asarray(x).astype(work.numpy)[()]


def logaddexp(a, b):
    """numpy's ``logaddexp(a, b)``: ``log(exp(a) + exp(b))`` without overflow, written as numpy computes it:
    ``a + log 2`` where ``a == b`` (so equal infinities stay), else ``max + log1p(exp(-|a - b|))``.
    16-bit operands are computed in f32 and rounded once, as numpy's half loop does."""
    if not _traced(a, b):
        return np.logaddexp(a, b)
    for x in (a, b):
        _check_operand("logaddexp", x)
    d = result_dtype("logaddexp", np.logaddexp, a, b)
    work = T.float32 if d.storage_only else d
    a, b = _as_work(a, work), _as_work(b, work)
    far = maximum(a, b) + log1p(exp(-_abs(a - b)))
    out = where(a == b, a + math.log(2.0), far)
    out.array0d = False   # a ufunc's 0-d result is a numpy scalar (`where`'s is an array: ``s += 1`` wrote through)
    return out if work == d else astype(out, d.numpy)
