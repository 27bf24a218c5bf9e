"""Conversions of the bit-pattern dtypes (bf16, float8 e4m3fn) and of f64 to f32, as integer operations.

Straight-line code of integer and select instructions, so a host loop of them vectorizes; each is exact
or rounds once to nearest even, like numpy (ml_dtypes) does:

- `bf16_to_f32`, `e4m3_to_f32`: exact decodes (scalars or vectors; e4m3's NaN code S.1111.111 gives NaN);
- `f32_to_bf16`: round to nearest even, NaN kept quiet;
- `f32_to_e4m3`: round to nearest even, saturating: above 448 (and NaN) gives the NaN code, as
  ``astype(float8_e4m3fn)`` does;
- `f64_to_f32_odd`: f64 rounded to f32 *to odd*, so that one more rounding to a type of at most 22
  significant bits (f16, bf16, e4m3) rounds the f64 once.

Targets with conversion instructions use those instead (`codegen.llvm_dtypes.casts`).
"""
from __future__ import annotations

from llvmlite import ir

from ..llvm_utils import F32, F64, I8, I16, I32, call_intrinsic, like, splat

_E4M3_NAN = 0x7F


def bf16_to_f32(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """The f32 value of bf16 bit patterns (scalar or vector; exact: shifted into the high half)."""
    wide = b.zext(bits, like(bits.type, I32))
    return b.bitcast(b.shl(wide, splat(wide.type, 16)), like(bits.type, F32))


def f32_to_bf16(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """bf16 bits of `x` rounded to nearest even (a NaN stays a quiet NaN), as an i16."""
    bits = b.bitcast(x, I32)
    lsb = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
    rounded = b.lshr(b.add(bits, b.add(lsb, ir.Constant(I32, 0x7FFF))), ir.Constant(I32, 16))
    quiet = b.or_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 0x40))
    isnan = b.fcmp_unordered("uno", x, x)
    return b.trunc(b.select(isnan, quiet, rounded), I16)


def e4m3_to_f32(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """The exact f32 value of an e4m3fn byte: sign, 4 exponent bits (bias 7), 3 mantissa bits; S.1111.111 is NaN."""
    x = b.zext(bits, I32)
    sign = b.shl(b.and_(x, ir.Constant(I32, 0x80)), ir.Constant(I32, 24))
    mag = b.and_(x, ir.Constant(I32, 0x7F))
    exponent = b.lshr(mag, ir.Constant(I32, 3))
    # Normal: rebias the exponent (7 -> 127) and widen the mantissa (3 -> 23 bits).
    normal = b.bitcast(b.shl(b.add(mag, ir.Constant(I32, 120 << 3)), ir.Constant(I32, 20)), F32)
    # Subnormal (exponent 0): mantissa * 2**-9.
    subnormal = b.fmul(b.uitofp(mag, F32), ir.Constant(F32, 2.0 ** -9))
    value = b.select(b.icmp_unsigned("==", exponent, ir.Constant(I32, 0)), subnormal, normal)
    value = b.select(b.icmp_unsigned("==", mag, ir.Constant(I32, _E4M3_NAN)), ir.Constant(F32, float("nan")), value)
    return b.bitcast(b.or_(b.bitcast(value, I32), sign), F32)


def f32_to_e4m3(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The e4m3fn byte of `x` rounded to nearest even (beyond 448 and NaN: the NaN code), as an i8."""
    bits = b.bitcast(x, I32)
    sign = b.and_(b.lshr(bits, ir.Constant(I32, 24)), ir.Constant(I32, 0x80))
    a_bits = b.and_(bits, ir.Constant(I32, 0x7FFFFFFF))
    a = b.bitcast(a_bits, F32)
    scaled = b.fmul(a, ir.Constant(F32, 512.0))
    sub = b.fptoui(call_intrinsic(b, "llvm.rint.f32", F32, [scaled]), I32)  # subnormals: multiples of 2**-9
    lsb = b.and_(b.lshr(a_bits, ir.Constant(I32, 20)), ir.Constant(I32, 1))
    rounded = b.lshr(b.add(a_bits, b.add(lsb, ir.Constant(I32, 0x7FFFF))), ir.Constant(I32, 20))
    normal = b.sub(rounded, ir.Constant(I32, 120 << 3))
    small = b.fcmp_ordered("<", a, ir.Constant(F32, 2.0 ** -6))
    code = b.select(small, sub, normal)
    bad = b.or_(b.fcmp_unordered("uno", x, x), b.icmp_unsigned(">", code, ir.Constant(I32, _E4M3_NAN - 1)))
    code = b.select(bad, ir.Constant(I32, _E4M3_NAN), code)
    return b.trunc(b.or_(code, sign), I8)


def f64_to_f32_odd(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """`v` rounded to f32 *to odd* (toward zero, the last bit set when inexact). Rounding that again to a type of
    at most 22 significant bits (f16, bf16, e4m3) rounds `v` once, as numpy does; f64 -> f32 -> narrow by
    nearest would round twice (1 + 2**-8 + 2**-30 -> bf16 is 1.0078125, not 1.0)."""
    t = b.fptrunc(v, F32)
    back = b.fpext(t, F64)
    fabs_back = call_intrinsic(b, "llvm.fabs.f64", F64, [back])
    away = b.fcmp_ordered(">", fabs_back, call_intrinsic(b, "llvm.fabs.f64", F64, [v]))  # rounded up: one step back
    bits = b.bitcast(t, I32)
    bits = b.select(away, b.sub(bits, ir.Constant(I32, 1)), bits)
    inexact = b.fcmp_ordered("!=", back, v)                                 # NaN: false, kept as it is
    return b.bitcast(b.select(inexact, b.or_(bits, ir.Constant(I32, 1)), bits), F32)


__all__ = ["bf16_to_f32", "f32_to_bf16", "e4m3_to_f32", "f32_to_e4m3", "f64_to_f32_odd"]
