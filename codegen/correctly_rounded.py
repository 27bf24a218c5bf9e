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
5. Where ``a`` or ``b`` is zero, infinite or NaN the result is ``q = a * (1/b)`` before the correction,
   with ``1/b`` exact by selection for a special ``b`` (``±inf`` for ``±0``, ``±0`` for ``±inf``): IEEE's
   ``±inf`` for ``x/0``, NaN for ``0/0`` and ``inf/inf``, the signs of zeros, NaN in NaN out. The
   correction is then NaN (``inf - inf``, ``0 * inf``) or a zero (whose sign it may flip), which it never is
   for two finite nonzero operands, so the result is ``q`` wherever the corrected value is NaN or zero.
   Everything but ``q``, its correction and that choice depends on ``b`` alone: computed once where many
   elements share a divisor (LLVM's CSE finds it: attention's ``o / l`` takes one reciprocal a row).

`sqrt` is the same scheme: ``y`` ~ ``1/sqrt(a)`` from ``rsqrt.approx.ftz.f64`` (one ``MUFU.RSQ64H``), two
Newton steps ``y += (y/2) * (1 - a*y*y)``, ``s = a*y`` and one correction ``s += (y/2) * (a - s*s)``, then one
rounding. The square root of a p-bit number is never a midpoint of the p-bit format and lies at least
about 2**-(2p+3) relative from every one (2**-51 for f32), and ``s`` is within about 0.5 f64 ulp
(2**-53). ``sqrt(+-0)`` is ``+-0``, ``sqrt(+inf)`` is ``+inf``, a negative or NaN argument gives NaN.

The cost of a division: per divisor one MUFU, four f64 ``fma``s and a few selects; per element two
conversions, a multiply, two ``fma``s, two compares and a select. On Hopper (the only GPUs with wgmma) f64
runs at half the f32 rate, so this is about what ``div.rn``'s fast path costs, without its subroutine.
`tests/test_correctly_rounded.py` runs this same IR on the CPU, with estimates far worse than the GPU's,
against numpy bit for bit (every f32 for `sqrt`).
"""
from __future__ import annotations

import math
from typing import Callable

import llvmlite.ir as ir

from .llvm_dtypes import intrinsic_suffix
from .llvm_utils import F64, call_intrinsic, like, splat
from .nvvm import lanewise

Estimate = Callable[[object, ir.Value], ir.Value]
"""``(builder, x)``: an approximation of ``1/x`` (or of ``1/sqrt(x)``) for a finite, positive or nonzero
f64 ``x`` (or each element of an f64 vector) that is an f32 value widened, with any relative error up to
2**-8."""


def nvptx_reciprocal(b, x: ir.Value) -> ir.Value:
    """``rcp.approx.ftz.f64`` of each element: one ``MUFU.RCP64H``, no subroutine."""
    return lanewise(b, x.type, lambda e: call_intrinsic(b, "llvm.nvvm.rcp.approx.ftz.d", F64, [e]), x)


def nvptx_reciprocal_sqrt(b, x: ir.Value) -> ir.Value:
    """``rsqrt.approx.ftz.f64`` of each element: one ``MUFU.RSQ64H`` (the form without ``.ftz`` has a
    subroutine)."""
    return lanewise(b, x.type, lambda e: call_intrinsic(b, "llvm.nvvm.rsqrt.approx.ftz.d", F64, [e]), x)


class _Wide:
    """f64 arithmetic on scalars or vectors of `t`'s shape: constants splatted, intrinsics suffixed."""

    def __init__(self, b, t: ir.Type) -> None:
        self.b, self.t = b, like(t, F64)

    def const(self, value: float) -> ir.Constant:
        return splat(self.t, value)

    def call(self, name: str, *args: ir.Value) -> ir.Value:
        return call_intrinsic(self.b, f"llvm.{name}.{intrinsic_suffix(self.t)}", self.t, list(args))

    def fma(self, x, y, z):
        return self.call("fma", x, y, z)

    def finite_nonzero(self, magnitude):
        """``0 < magnitude < inf`` (false for NaN)."""
        b = self.b
        return b.and_(b.fcmp_ordered(">", magnitude, self.const(0.0)),
                      b.fcmp_ordered("<", magnitude, self.const(math.inf)))


def _reciprocal(w: _Wide, d, estimate: Estimate):
    """``1/d`` to about 2**-53 relative (steps 1-2 of the module docstring), for a divisor whose reciprocal is
    a normal f64."""
    b, one = w.b, w.const(1.0)
    r = estimate(b, d)
    for _ in range(2):                                               # Newton: r += r * (1 - d*r)
        r = w.fma(r, w.fma(b.fneg(d), r, one), r)
    return r


def quotient_f64(b, a: ir.Value, d: ir.Value, estimate: Estimate) -> ir.Value:
    """``a / d`` for f64 values, within about one f64 ulp (not correctly rounded), for a finite ``a`` and
    ``1 <= |d| <= 2**1000`` (what `wide_math` divides by); straight-line code like `divide`."""
    w = _Wide(b, a.type)
    r = _reciprocal(w, d, estimate)
    q = b.fmul(a, r)
    return w.fma(w.fma(b.fneg(d), q, a), r, q)                       # q += r * (a - d*q)


def divide(b, x: ir.Value, y: ir.Value, estimate: Estimate) -> ir.Value:
    """``x / y`` correctly rounded to the type of `x` and `y` (``float`` or a vector of it; ``half`` would do
    as well), with IEEE's special values, in straight-line f64 code (the module docstring)."""
    w = _Wide(b, x.type)
    a, d = b.fpext(x, w.t), b.fpext(y, w.t)
    magnitude = w.call("fabs", d)
    divisor_regular = w.finite_nonzero(magnitude)
    # The estimate reads only a finite nonzero divisor (1.0 stands in for the others). For the others 1/d is
    # exact by selection: +-inf for +-0, +-0 for +-inf, NaN for NaN. All of this depends on the divisor alone
    # (once a row where rows share one), the rest is per element.
    r = _reciprocal(w, b.select(divisor_regular, d, w.const(1.0)), estimate)
    d_sign = w.call("copysign", w.const(1.0), d)
    r = b.select(divisor_regular, r, b.select(b.fcmp_ordered("==", magnitude, w.const(0.0)),
                                              b.fmul(d_sign, w.const(math.inf)),
                                              b.select(b.fcmp_ordered("==", magnitude, w.const(math.inf)),
                                                       b.fmul(d_sign, w.const(0.0)), d)))
    q = b.fmul(a, r)                                                 # IEEE's result where an operand is special
    corrected = w.fma(w.fma(b.fneg(d), q, a), r, q)                  # q += r * (a - d*q)
    # The correction is NaN where an operand is infinite or zero (inf - inf, 0 * inf) and can flip the sign of a
    # zero quotient; of two finite nonzero operands it is never 0 or NaN (f64 holds every f32 quotient).
    keep_q = b.or_(b.fcmp_unordered("uno", corrected, corrected), b.fcmp_ordered("==", corrected, w.const(0.0)))
    return b.fptrunc(b.select(keep_q, q, corrected), x.type)


def sqrt(b, x: ir.Value, estimate: Estimate) -> ir.Value:
    """``sqrt(x)`` correctly rounded to the type of `x` (``float`` or a vector of it; ``half`` would do as
    well), with IEEE's special values, in straight-line f64 code (the module docstring)."""
    w = _Wide(b, x.type)
    a = b.fpext(x, w.t)
    regular = b.and_(b.fcmp_ordered(">", a, w.const(0.0)), b.fcmp_ordered("<", a, w.const(math.inf)))
    y = estimate(b, b.select(regular, a, w.const(1.0)))
    half, one = w.const(0.5), w.const(1.0)
    for _ in range(2):                                               # Newton: y += (y/2) * (1 - a*y*y)
        y = w.fma(b.fmul(y, half), w.fma(b.fneg(b.fmul(a, y)), y, one), y)
    s = b.fmul(a, y)
    s = w.fma(b.fmul(y, half), w.fma(b.fneg(s), s, a), s)            # s += (y/2) * (a - s*s)
    special = b.select(b.fcmp_ordered("<", a, w.const(0.0)), w.const(math.nan), a)   # +-0, +inf, NaN: themselves
    return b.fptrunc(b.select(regular, s, special), x.type)


__all__ = ["Estimate", "divide", "nvptx_reciprocal", "nvptx_reciprocal_sqrt", "quotient_f64", "sqrt"]
