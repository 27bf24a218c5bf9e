"""f32 transcendental functions for NVPTX, built from what the hardware has (``ex2``/``lg2`` approx).

LLVM's NVPTX backend has no ``llvm.exp``/``llvm.log``/``llvm.pow`` lowering (it
stops with "no libcall available"), so they are expanded here:

- ``exp``: Cody-Waite range reduction ``x = j ln2 + r`` (two-constant ``fma``),
  ``2**(r log2 e)`` by ``ex2.approx.ftz`` on ``[-0.5, 0.5]``, scaled by ``2**j`` built
  from exponent bits in two halves (so ``j`` from -150 to 128 stays exact): about
  2 ulp on the whole range, exact 0 below -104 and inf above 89, NaN kept;
- ``log``/``log2``: ``lg2.approx`` (absolute error about 2**-22 near 1);
- ``pow``: ``2**(b lg2 |a|)`` with the sign, zero, one and NaN cases numpy gives
  (relative error grows with ``|b lg2 a|``: a strength-reduced ``x*x`` is better).
"""
from __future__ import annotations

import math

from llvmlite import ir

from ..nvvm import F32, I1, I32, call_intrinsic

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
_LN2_HI = 0.693359375          # 9 significant bits: j * _LN2_HI is exact for |j| <= 2**15
_LN2_LO = -2.12194440e-4       # ln 2 - _LN2_HI


def _f(value: float) -> ir.Constant:
    return ir.Constant(F32, value)


def _clamp_keep_nan(b: ir.IRBuilder, x: ir.Value, lo: float, hi: float) -> ir.Value:
    # Ordered compares are false on NaN, so NaN passes through (minnum/maxnum would drop it).
    x = b.select(b.fcmp_ordered("<", x, _f(lo)), _f(lo), x)
    return b.select(b.fcmp_ordered(">", x, _f(hi)), _f(hi), x)


def _pow2(b: ir.IRBuilder, j: ir.Value) -> ir.Value:
    """``2**j`` for an i32 ``j`` in [-126, 127], from the exponent bits."""
    return b.bitcast(b.shl(b.add(j, ir.Constant(I32, 127)), ir.Constant(I32, 23)), F32)


def ex2_approx_ftz(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return call_intrinsic(b, "llvm.nvvm.ex2.approx.ftz.f32", F32, [x])


def exp2(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """``2**x`` (``ex2.approx.f32``, subnormal results kept)."""
    return call_intrinsic(b, "llvm.exp2.f32", F32, [x])


def log2(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """``log2(x)`` (``lg2.approx.f32``): -inf at 0, NaN below, inf at inf."""
    return call_intrinsic(b, "llvm.nvvm.lg2.approx.f", F32, [x])


def log(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.fmul(log2(b, x), _f(LN2))


def exp(b: ir.IRBuilder, x: ir.Value, *, fast: bool = False) -> ir.Value:
    """``e**x`` in f32 (see the module docstring); `fast`: one ``ex2.approx.ftz(x * log2 e)``."""
    if fast:
        return ex2_approx_ftz(b, b.fmul(x, _f(LOG2E)))
    xc = _clamp_keep_nan(b, x, -104.0, 89.0)
    j = call_intrinsic(b, "llvm.rint.f32", F32, [b.fmul(xc, _f(LOG2E))])
    r = call_intrinsic(b, "llvm.fma.f32", F32, [j, _f(-_LN2_HI), xc])
    r = call_intrinsic(b, "llvm.fma.f32", F32, [j, _f(-_LN2_LO), r])
    p = ex2_approx_ftz(b, b.fmul(r, _f(LOG2E)))
    ji = call_intrinsic(b, "llvm.fptosi.sat.i32.f32", I32, [j])   # NaN -> 0; r carries the NaN
    j1 = b.ashr(ji, ir.Constant(I32, 1))
    j2 = b.sub(ji, j1)
    return b.fmul(b.fmul(p, _pow2(b, j1)), _pow2(b, j2))


def pow_(b: ir.IRBuilder, a: ir.Value, e: ir.Value) -> ir.Value:
    """``a ** e`` in f32 with numpy's special cases (see the module docstring)."""
    fabs = call_intrinsic(b, "llvm.fabs.f32", F32, [a])
    r = exp2(b, b.fmul(e, log2(b, fabs)))
    whole = b.fcmp_ordered("==", call_intrinsic(b, "llvm.rint.f32", F32, [e]), e)
    half = b.fmul(e, _f(0.5))
    odd = b.and_(whole, b.fcmp_ordered("!=", call_intrinsic(b, "llvm.rint.f32", F32, [half]), half))
    negative = b.fcmp_ordered("<", a, _f(0.0))
    r = b.select(b.and_(negative, odd), b.fneg(r), r)
    r = b.select(b.and_(negative, b.xor(whole, ir.Constant(I1, 1))), _f(math.nan), r)
    one = b.or_(b.fcmp_ordered("==", e, _f(0.0)), b.fcmp_ordered("==", a, _f(1.0)))
    return b.select(one, _f(1.0), r)
