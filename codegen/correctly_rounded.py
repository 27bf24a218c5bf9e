"""IEEE division and square root without a subroutine: correctly rounded results in straight-line code.

Why it exists: PTX's ``div.rn.f32`` and ``sqrt.rn.f32`` are not single instructions. ptxas expands each
into a fast path and a *subroutine* for operands near the ends of the range, and a kernel containing a
call gets its ``wgmma.mma_async`` instructions serialized (ptxas's C7509,
`ptx_check.SERIALIZED_BY_CALLS`): each waits for the one before, and the overlap the asynchronous tensor
cores exist for is lost. Attention's epilogue (``o / l``), the FP8 quantization's ``448 / absmax`` and a
norm's ``1 / sqrt(var + eps)`` are such operations, and all must stay exact (the body run on numpy is
the reference). So a kernel that issues wgmma divides with `divide` and takes roots with `sqrt`.

How `divide` works (for an f32 quotient of two f32 values; the scheme holds for any narrower format too):

1. ``a`` and ``b`` are widened to f64 (exactly) and ``r`` starts from the hardware's reciprocal estimate
   (`estimate`: ``rcp.approx.ftz.f64`` on NVPTX, which is one ``MUFU.RCP64H``, no call).
2. Two Newton steps ``r += r * (1 - b*r)`` (each an ``fma`` pair) square the estimate's relative error
   twice: an estimate good to 8 bits gives 2**-32, one good to 20 bits gives 2**-80 (then f64's own
   rounding, 2**-53, dominates).
3. ``q = a*r``, then one correction ``q += r * (a - b*q)``, the remainder formed by one ``fma``: the error
   of ``q`` becomes the product of ``r``'s and ``q``'s errors plus f64 rounding, so ``q`` is within about
   one f64 ulp (2**-52 relative) of ``a/b``.
4. ``q`` is rounded once to the narrow type (``cvt.rn``). That gives the correctly rounded quotient: the
   quotient of two p-bit numbers (p = 24 for f32, 11 for f16, 8 for bf16) is either exactly a rounding
   midpoint of the p-bit format (possible only where the result is subnormal, e.g. ``2**-149 / 2``) --
   then ``q`` is that midpoint exactly, f64 holds it, and the rounding breaks the tie to even as IEEE
   does -- or it lies at least about 2**-(2p+2) relative from every midpoint (2**-50 for f32), far
   more than ``q``'s error, so ``q`` rounds the way ``a/b`` does. The f64 range covers every narrow
   quotient (``|a/b|`` within ``2**±277`` for f32), so nothing overflows or goes subnormal on the way.
5. Where ``a`` or ``b`` is zero, infinite or NaN the result is ``a * (1/b)`` with ``1/b`` exact by
   selection (``±inf`` for ``±0``, ``±0`` for ``±inf``): IEEE's ``±inf`` for ``x/0``, NaN for ``0/0`` and
   ``inf/inf``, the signs of zeros, NaN in NaN out. (Newton's steps would give NaN for ``b = 0`` and a
   zero of the wrong sign for ``a = -0``.)

`sqrt` is the same scheme: ``y`` ~ ``1/sqrt(a)`` from ``rsqrt.approx.ftz.f64`` (one ``MUFU.RSQ64H``), two
Newton steps ``y += (y/2) * (1 - a*y*y)``, ``s = a*y`` and one correction ``s += (y/2) * (a - s*s)``, then one
rounding. The square root of a p-bit number is never a midpoint of the p-bit format and lies at least
about 2**-(2p+3) relative from every one (2**-51 for f32), and ``s`` is within about 0.5 f64 ulp
(2**-53). ``sqrt(+-0)`` is ``+-0``, ``sqrt(+inf)`` is ``+inf``, a negative or NaN argument gives NaN.

The cost is two conversions, one MUFU, seven f64 ``fma``/``mul``s and a few selects: on Hopper (the only
GPUs with wgmma) f64 runs at half the f32 rate, so this is about the cost of the fast path of ``div.rn``.
`tests/test_correctly_rounded.py` runs this same IR on the CPU, with estimates far worse than the GPU's,
against numpy bit for bit (every f32 for `sqrt`).
"""
from __future__ import annotations

import math
from typing import Callable

import llvmlite.ir as ir

from .llvm_utils import F64, call_intrinsic

Estimate = Callable[[object, ir.Value], ir.Value]
"""``(builder, x)``: an approximation of ``1/x`` (or of ``1/sqrt(x)``) for a finite, positive or nonzero
f64 ``x`` that is an f32 value widened, with any relative error up to 2**-8."""


def nvptx_reciprocal(b, x: ir.Value) -> ir.Value:
    """``rcp.approx.ftz.f64``: one ``MUFU.RCP64H`` on the GPU, no subroutine."""
    return call_intrinsic(b, "llvm.nvvm.rcp.approx.ftz.d", F64, [x])


def nvptx_reciprocal_sqrt(b, x: ir.Value) -> ir.Value:
    """``rsqrt.approx.ftz.f64``: one ``MUFU.RSQ64H`` (the form without ``.ftz`` has a subroutine)."""
    return call_intrinsic(b, "llvm.nvvm.rsqrt.approx.ftz.d", F64, [x])


def _d(x: float) -> ir.Constant:
    return ir.Constant(F64, x)


def _fma(b, x, y, z):
    return call_intrinsic(b, "llvm.fma.f64", F64, [x, y, z])


def _abs(b, x):
    return call_intrinsic(b, "llvm.fabs.f64", F64, [x])


def _finite_nonzero(b, magnitude):
    """``0 < magnitude < inf`` (false for NaN)."""
    return b.and_(b.fcmp_ordered(">", magnitude, _d(0.0)), b.fcmp_ordered("<", magnitude, _d(math.inf)))


def _newton_quotient(b, a, d, estimate: Estimate):
    """``(q, r)``: ``q`` within about one f64 ulp of ``a/d`` and ``r`` ~ ``1/d`` (steps 1-3 of the module
    docstring), for a finite ``a`` and a divisor whose reciprocal is a normal f64."""
    r = estimate(b, d)
    for _ in range(2):                                               # Newton: r += r * (1 - d*r)
        r = _fma(b, r, _fma(b, b.fneg(d), r, _d(1.0)), r)
    q = b.fmul(a, r)
    return _fma(b, _fma(b, b.fneg(d), q, a), r, q), r                # q += r * (a - d*q)


def quotient_f64(b, a: ir.Value, d: ir.Value, estimate: Estimate) -> ir.Value:
    """``a / d`` for f64 scalars, within about one f64 ulp (not correctly rounded), for a finite ``a`` and
    ``1 <= |d| <= 2**1000`` (what `wide_math` divides by); straight-line code like `divide`."""
    return _newton_quotient(b, a, d, estimate)[0]


def divide(b, x: ir.Value, y: ir.Value, estimate: Estimate) -> ir.Value:
    """``x / y`` correctly rounded to the type of the scalars `x` and `y` (``float``; ``half`` would do as well),
    with IEEE's special values, in straight-line f64 code (the module docstring)."""
    narrow = x.type
    a, d = b.fpext(x, F64), b.fpext(y, F64)
    magnitude = _abs(b, d)
    divisor_regular = _finite_nonzero(b, magnitude)
    # The estimate reads only a finite nonzero divisor (1.0 stands in for the others; their lane is not used).
    q, r = _newton_quotient(b, a, b.select(divisor_regular, d, _d(1.0)), estimate)
    # Special operands: 1/d exactly by selection (NaN stays NaN), then one multiply gives IEEE's result
    # and the signs of zeros.
    d_sign = call_intrinsic(b, "llvm.copysign.f64", F64, [_d(1.0), d])
    inverse = b.select(divisor_regular, r, b.select(b.fcmp_ordered("==", magnitude, _d(0.0)),
                                                     b.fmul(d_sign, _d(math.inf)),
                                                     b.select(b.fcmp_ordered("==", magnitude, _d(math.inf)),
                                                              b.fmul(d_sign, _d(0.0)), d)))
    special = b.fmul(a, inverse)
    regular = b.and_(divisor_regular, _finite_nonzero(b, _abs(b, a)))
    return b.fptrunc(b.select(regular, q, special), narrow)


def sqrt(b, x: ir.Value, estimate: Estimate) -> ir.Value:
    """``sqrt(x)`` correctly rounded to the type of the scalar `x` (``float``; ``half`` would do as well), with
    IEEE's special values, in straight-line f64 code (the module docstring)."""
    a = b.fpext(x, F64)
    regular = b.and_(b.fcmp_ordered(">", a, _d(0.0)), b.fcmp_ordered("<", a, _d(math.inf)))
    y = estimate(b, b.select(regular, a, _d(1.0)))
    for _ in range(2):                                               # Newton: y += (y/2) * (1 - a*y*y)
        y = _fma(b, b.fmul(y, _d(0.5)), _fma(b, b.fneg(b.fmul(a, y)), y, _d(1.0)), y)
    s = b.fmul(a, y)
    s = _fma(b, b.fmul(y, _d(0.5)), _fma(b, b.fneg(s), s, a), s)      # s += (y/2) * (a - s*s)
    special = b.select(b.fcmp_ordered("<", a, _d(0.0)), _d(math.nan), a)   # +-0, +inf, NaN are their own roots
    return b.fptrunc(b.select(regular, s, special), x.type)


__all__ = ["Estimate", "divide", "nvptx_reciprocal", "nvptx_reciprocal_sqrt", "quotient_f64", "sqrt"]
