"""f32 transcendental functions for NVPTX, built from what the hardware has (``ex2``/``lg2`` approx).

`exp` takes a scalar or a vector (only its ``ex2.approx`` goes element by element); the
others take scalars.

LLVM's NVPTX backend has no ``llvm.exp``/``llvm.log``/``llvm.pow`` lowering (it
stops with "no libcall available"), so they are expanded here:

- ``exp``: Cody-Waite range reduction ``x = j ln2 + r`` (two-constant ``fma``),
  ``2**(r log2 e)`` by ``ex2.approx.ftz`` on ``[-0.5, 0.5]``, scaled by ``2**j`` built
  from exponent bits in two halves (so ``j`` from -150 to 128 stays exact): about
  2 ulp on the whole range, exact 0 below -104 and inf above 89, NaN kept;
- ``log2``: ``lg2.approx`` (absolute error about 2**-22 near 1; ``log`` is `codegen/wide_math.py`'s, in f64,
  as that error is up to 3.6% of ``log(1.00001)``);
- ``pow``: ``2**(b lg2 |a|)`` with the sign, zero, one and NaN cases numpy gives
  (relative error grows with ``|b lg2 a|``: a strength-reduced ``x*x`` is better).
"""
from __future__ import annotations

import math

from llvmlite import ir

from ..nvvm import F32, I1, I32, call_intrinsic, lanewise, like, splat
from ..llvm_dtypes import intrinsic_suffix

LOG2E = math.log2(math.e)
_LN2_HI = 0.693359375          # 9 significant bits: j * _LN2_HI is exact for |j| <= 2**15
_LN2_LO = -2.12194440e-4       # ln 2 - _LN2_HI


def _f(value: float) -> ir.Constant:
    return ir.Constant(F32, value)


def _clamp_keep_nan(b: ir.IRBuilder, x: ir.Value, lo: float, hi: float) -> ir.Value:
    # Ordered compares are false on NaN, so NaN passes through (minnum/maxnum would drop it).
    lo_c, hi_c = splat(x.type, lo), splat(x.type, hi)
    x = b.select(b.fcmp_ordered("<", x, lo_c), lo_c, x)
    return b.select(b.fcmp_ordered(">", x, hi_c), hi_c, x)


_MANTISSA_BIAS = float(2 ** 23 + 254)   # j + this, for whole j in [-150, 128], holds j + 254 in its low mantissa bits


def _pow2_halves(b: ir.IRBuilder, j: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``2**j1`` and ``2**j2`` with ``j1 = floor(j / 2)``, ``j2 = j - j1``, for a whole f32 (vector) ``j`` in
    [-150, 128] (both halves normal); NaN gives 0.0 (the caller's other factor carries the NaN).

    ``j + 2**23 + 254`` is exact and its low 23 bits are the integer ``t = j + 254``; then ``t >> 1`` and
    ``t - (t >> 1)`` are the halves plus the exponent bias 127, shifted into place. No float-to-int
    conversion, and no ``(x << 23) + C``: that form, once per exponential, made LLVM 22's straight-line
    strength reduction (run by the NVPTX code generator) pair every such add with every other one:
    88% of a softmax kernel's code generation."""
    ints = like(j.type, I32)
    t = b.and_(b.bitcast(b.fadd(j, splat(j.type, _MANTISSA_BIAS)), ints), splat(ints, (1 << 23) - 1))
    e1 = b.lshr(t, splat(ints, 1))
    e2 = b.sub(t, e1)
    return tuple(b.bitcast(b.shl(e, splat(ints, 23)), j.type) for e in (e1, e2))  # type: ignore[return-value]


def ex2_approx_ftz(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """``ex2.approx.ftz.f32`` of each element of `x` (the NVVM intrinsic has no vector form)."""
    return lanewise(b, x.type, lambda e: call_intrinsic(b, "llvm.nvvm.ex2.approx.ftz.f32", F32, [e]), x)


def exp2(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """``2**x`` (``ex2.approx.f32``, subnormal results kept)."""
    return call_intrinsic(b, "llvm.exp2.f32", F32, [x])


def exp_nonpositive(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """``e**x`` for x at most 0 (`UnaryOp.EXP_NONPOS`: a value minus its maximum, schedule/shifted_exp.py):
    ``ex2.approx.f32(x * log2 e)``, subnormal results kept; within ``2**-22 + |x| 2**-24`` relative."""
    return exp2(b, b.fmul(x, splat(x.type, LOG2E)))


def log2(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """``log2(x)`` (``lg2.approx.f32``): -inf at 0, NaN below, inf at inf."""
    return call_intrinsic(b, "llvm.nvvm.lg2.approx.f", F32, [x])


def exp(b: ir.IRBuilder, x: ir.Value, *, fast: bool = False) -> ir.Value:
    """``e**x`` of an f32 scalar or vector (see the module docstring); `fast`: one ``ex2.approx.ftz(x * log2 e)``."""
    t = x.type
    if fast:
        return ex2_approx_ftz(b, b.fmul(x, splat(t, LOG2E)))
    xc = _clamp_keep_nan(b, x, -104.0, 89.0)
    rint, fma = (f"llvm.{name}.{intrinsic_suffix(t)}" for name in ("rint", "fma"))
    j = call_intrinsic(b, rint, t, [b.fmul(xc, splat(t, LOG2E))])
    r = call_intrinsic(b, fma, t, [j, splat(t, -_LN2_HI), xc])
    r = call_intrinsic(b, fma, t, [j, splat(t, -_LN2_LO), r])
    p = ex2_approx_ftz(b, b.fmul(r, splat(t, LOG2E)))
    s1, s2 = _pow2_halves(b, j)
    return b.fmul(b.fmul(p, s1), s2)


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
