"""float8_e4m3fn conversions with numpy's (ml_dtypes') semantics on every GPU generation.

ml_dtypes rounds to nearest even and gives NaN past the largest finite value
(|x| > 464, the midpoint between 448 and the NaN encoding) and for inf/NaN,
the NaN keeping `x`'s sign (``S.1111.111``); the hardware's
``cvt.rn.satfinite.e4m3x2.f32`` (sm_89+) clamps to +-448 instead, so `to_e4m3`
puts the NaN code in for those inputs after the conversion, with the sign bit
of the f32 input (an inf or NaN input's sign is not the conversion's to keep).
Without the instruction (sm_80/86) `quantize` rounds to the e4m3 grid in f32
arithmetic — exact: the grid spacing is a power of two found by comparisons,
and ``(q + 1.5*2**23) - 1.5*2**23`` rounds ``q < 2**22`` to an integer, ties to
even — for values that are only read back as f32 (the quantize-dequantize of
FP8 GEMMs); it too takes the sign from `x`'s bits, so -0.0, negative values
that round to zero and negative NaNs keep it.
"""
from __future__ import annotations

from ...ir.semantics import BinaryOp, UnaryOp
from ...ir.simt.nodes import IntOp, Reg
from ...ir.types import float8_e4m3fn, float32, int32
from .values import LoweringBuilder

NAN_ABOVE = 464.0      # ml_dtypes: |x| > 464 -> NaN (464 itself rounds to 448)
_RNE_SHIFT = 12582912.0  # 1.5 * 2**23
_E4M3_NAN = 0x7F         # S.1111.111 without its sign
_F32_NAN = 0x7FC00000    # the quiet NaN without its sign


def _past_range(b: LoweringBuilder, x: Reg) -> Reg:
    """True where ml_dtypes gives NaN: |x| > 464 or x is NaN (inf included)."""
    big = b.binary(BinaryOp.GT, b.unary(UnaryOp.ABS, x), b.const_of(NAN_ABOVE, float32, x.length))
    return b.binary(BinaryOp.OR, big, b.binary(BinaryOp.NE, x, x))


def _with_sign_of(b: LoweringBuilder, x: Reg, bits: Reg, sign_at: int) -> Reg:
    """i32 `bits` with f32 `x`'s sign bit ORed in at bit `sign_at` (31 for f32, 7 for e4m3).

    Comparisons cannot see the sign of -0.0 or of a NaN; the bits can."""
    def c(value: int) -> Reg:
        return b.const_of(value, int32, x.length)

    moved = b.int_op(IntOp.SHR, b.bitcast(x, int32), c(31 - sign_at)) if sign_at < 31 else b.bitcast(x, int32)
    return b.int_op(IntOp.OR, bits, b.int_op(IntOp.AND, moved, c(-(1 << 31) if sign_at == 31 else 1 << sign_at)))


def to_e4m3(b: LoweringBuilder, x: Reg) -> Reg:
    """f32 `x` as e4m3 registers, signed NaN beyond the range like ml_dtypes (needs sm_89+ in PTX)."""
    code = b.bitcast(b.cast(x, float8_e4m3fn), int32)   # finite inputs: the right byte, sign included
    code = b.select(_past_range(b, x), b.const_of(_E4M3_NAN, int32, x.length), code)
    return b.bitcast(_with_sign_of(b, x, code, 7), float8_e4m3fn)


def quantize(b: LoweringBuilder, x: Reg) -> Reg:
    """f32 `x` rounded to the nearest e4m3 value (ties to even), as f32; NaN beyond the range, `x`'s sign kept."""
    n = x.length
    a = b.unary(UnaryOp.ABS, x)
    ulp = b.const_of(2.0 ** -9, float32, n)
    for e in range(-5, 9):     # binade [2**e, 2**(e+1)) has spacing 2**(e-3); below 2**-6 it is 2**-9
        ulp = b.select(b.binary(BinaryOp.GE, a, b.const_of(2.0 ** e, float32, n)), b.const_of(2.0 ** (e - 3), float32, n),
                       ulp)
    q = b.binary(BinaryOp.DIV, a, ulp)
    shift = b.const_of(_RNE_SHIFT, float32, n)
    whole = b.binary(BinaryOp.SUB, b.binary(BinaryOp.ADD, q, shift), shift)
    magnitude = b.bitcast(b.binary(BinaryOp.MUL, whole, ulp), int32)
    magnitude = b.select(_past_range(b, x), b.const_of(_F32_NAN, int32, n), magnitude)
    return b.bitcast(_with_sign_of(b, x, magnitude, 31), float32)


__all__ = ["NAN_ABOVE", "quantize", "to_e4m3"]
