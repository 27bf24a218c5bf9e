"""float8_e4m3fn conversions with numpy's (ml_dtypes') semantics on every GPU generation.

ml_dtypes rounds to nearest even and gives NaN past the largest finite value
(|x| > 464, the midpoint between 448 and the NaN encoding) and for inf/NaN;
the hardware's ``cvt.rn.satfinite.e4m3x2.f32`` (sm_89+) clamps to +-448 instead,
so `to_e4m3` sends those inputs to NaN first. Without the instruction
(sm_80/86) `quantize` rounds to the e4m3 grid in f32 arithmetic — exact: the
grid spacing is a power of two found by comparisons, and ``(q + 1.5*2**23) -
1.5*2**23`` rounds ``q < 2**22`` to an integer, ties to even — for values that
are only read back as f32 (the quantize-dequantize of FP8 GEMMs).
"""
from __future__ import annotations

from ...ir.semantics import BinaryOp, UnaryOp
from ...ir.simt.nodes import Reg
from ...ir.types import float8_e4m3fn, float32
from .values import LoweringBuilder

NAN_ABOVE = 464.0      # ml_dtypes: |x| > 464 -> NaN (464 itself rounds to 448)
_RNE_SHIFT = 12582912.0  # 1.5 * 2**23


def _nan_past_range(b: LoweringBuilder, x: Reg, value: Reg | None = None) -> Reg:
    """`value` (default `x`) with NaN where |x| > 464 or x is NaN (inf included)."""
    n = x.length
    big = b.binary(BinaryOp.GT, b.unary(UnaryOp.ABS, x), b.const_of(NAN_ABOVE, float32, n))
    nan = b.binary(BinaryOp.NE, x, x)
    bad = b.binary(BinaryOp.OR, big, nan)
    return b.select(bad, b.const_of(float("nan"), float32, n), x if value is None else value)


def to_e4m3(b: LoweringBuilder, x: Reg) -> Reg:
    """f32 `x` as e4m3 registers, NaN beyond the range like ml_dtypes (needs sm_89+ in PTX)."""
    return b.cast(_nan_past_range(b, x), float8_e4m3fn)


def quantize(b: LoweringBuilder, x: Reg) -> Reg:
    """f32 `x` rounded to the nearest e4m3 value (ties to even), as f32; NaN beyond the range."""
    n = x.length
    a = b.unary(UnaryOp.ABS, x)
    ulp = b.const_of(2.0 ** -9, float32, n)
    for e in range(-5, 9):     # binade [2**e, 2**(e+1)) has spacing 2**(e-3); below 2**-6 it is 2**-9
        ulp = b.select(b.binary(BinaryOp.GE, a, b.const_of(2.0 ** e, float32, n)), b.const_of(2.0 ** (e - 3), float32, n),
                       ulp)
    q = b.binary(BinaryOp.DIV, a, ulp)
    shift = b.const_of(_RNE_SHIFT, float32, n)
    whole = b.binary(BinaryOp.SUB, b.binary(BinaryOp.ADD, q, shift), shift)
    y = b.binary(BinaryOp.MUL, whole, ulp)
    y = b.select(b.binary(BinaryOp.LT, x, b.const_of(0.0, float32, n)), b.unary(UnaryOp.NEG, y), y)
    return _nan_past_range(b, x, y)


__all__ = ["NAN_ABOVE", "quantize", "to_e4m3"]
