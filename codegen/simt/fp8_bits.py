"""f32 -> float8_e4m3fn bytes in software, for GPUs without ``cvt ... e4m3x2`` (sm_80/86).

The result is ml_dtypes' conversion bit for bit: round to nearest even, NaN
(``S.1111.111``) for NaN, inf and ``|x| > 464`` (the midpoint between 448 and
the NaN encoding), ``-0.0`` and negative values that round to zero keep their
sign. On the f32 bits ``u`` with magnitude ``a = u & 0x7fffffff``:

- normal results (``a >= 2**-6``): round ``a`` at bit 20 to nearest even
  (``a + 0x7ffff + bit20``; a carry moves into the exponent), then the e4m3 code
  is the rounded ``a >> 20`` rebiased from 127 to 7 (``- (120 << 3)``);
- subnormal results: ``|x| * 2**9`` (exact) rounded to an integer in f32 by
  ``(q + 1.5*2**23) - 1.5*2**23`` (round to nearest even for ``q < 2**22``); 8
  is the smallest normal's code, so rounding up across the boundary is right;
- then the sign bit ``(u >> 24) & 0x80``, and `Bitcast` takes the low byte.

About twenty SIMT statements per register chunk; the simulator runs exactly
these, so its results are the emitted code's (both checked against ml_dtypes
over every f16 and a large f32 sample in ``tests/test_f8_convert.py``).
"""
from __future__ import annotations

from ...ir.semantics import BinaryOp, UnaryOp
from ...ir.simt.nodes import IntOp, Reg
from ...ir.types import float8_e4m3fn, float32, int32
from .values import LoweringBuilder

NAN_ABOVE_BITS = 0x43E80000   # 464.0: above it (inf and NaN included) the result is NaN
MIN_NORMAL_BITS = 0x3C800000  # 2**-6, e4m3's smallest normal
_RNE_SHIFT = 12582912.0       # 1.5 * 2**23


def f32_to_e4m3_bits(b: LoweringBuilder, x: Reg) -> Reg:
    """The e4m3fn code of f32 `x` as an i32 in 0..255, elementwise (see the module docstring)."""
    n = x.length

    def c(value: int) -> Reg:
        return b.const_of(value, int32, n)

    u = b.bitcast(x, int32)
    a = b.int_op(IntOp.AND, u, c(0x7FFFFFFF))
    sign = b.int_op(IntOp.AND, b.int_op(IntOp.SHR, u, c(24)), c(0x80))
    odd = b.int_op(IntOp.AND, b.int_op(IntOp.SHR, a, c(20)), c(1))
    rounded = b.binary(BinaryOp.ADD, b.binary(BinaryOp.ADD, a, c(0x7FFFF)), odd)
    normal = b.binary(BinaryOp.SUB, b.int_op(IntOp.SHR, rounded, c(20)), c(120 << 3))
    scaled = b.binary(BinaryOp.MUL, b.unary(UnaryOp.ABS, x), b.const_of(512.0, float32, n))   # exact
    shift = b.const_of(_RNE_SHIFT, float32, n)
    whole = b.binary(BinaryOp.SUB, b.binary(BinaryOp.ADD, scaled, shift), shift)
    subnormal = b.cast(whole, int32)
    code = b.select(b.binary(BinaryOp.GE, a, c(MIN_NORMAL_BITS)), normal, subnormal)
    code = b.select(b.binary(BinaryOp.GT, a, c(NAN_ABOVE_BITS)), c(0x7F), code)
    return b.int_op(IntOp.OR, code, sign)


def f32_to_e4m3(b: LoweringBuilder, x: Reg) -> Reg:
    """f32 `x` as float8_e4m3fn registers, exactly like ml_dtypes, without the sm_89 instruction."""
    return b.bitcast(f32_to_e4m3_bits(b, x), float8_e4m3fn)


__all__ = ["MIN_NORMAL_BITS", "NAN_ABOVE_BITS", "f32_to_e4m3", "f32_to_e4m3_bits"]
