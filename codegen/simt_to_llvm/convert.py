"""`Cast` as LLVM conversions, with the semantics the simulator emulates.

`convert` takes a scalar or (except for e4m3, converted element by element) a whole vector.

- f8 e4m3 -> f32 is decoded from the bits with integer ops (any sm); f32 -> e4m3
  is ``cvt.rn.satfinite.e4m3x2.f32`` (sm_89+, saturating); other sources go
  through f32. bf16 travels as i16 bits: ``cvt.rn.bf16.f32`` one way, a shift back.
- float -> int is ``llvm.fptosi.sat`` (truncate, saturate, NaN -> 0: PTX's ``cvt.rzi``);
  to bool is ``!= 0`` (NaN is true); bool -> number is 0/1.
"""
from __future__ import annotations

from llvmlite import ir

from ...ir.types import DType, float32
from ..nvvm import F32, I8, I32, call_intrinsic, like, splat
from ..nvvm_mma import bf16_bits_to_f32, f32_to_bf16_bits, f32x2_to_e4m3x2
from .types import overload, scalar_type

_E4M3_NAN = 0x7F


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
    """Round to nearest even, saturating to +-448 (NaN stays NaN); the byte, as an i8."""
    return b.trunc(f32x2_to_e4m3x2(b, x, ir.Constant(F32, 0.0)), I8)


def _to_f32(b: ir.IRBuilder, x: ir.Value, src: DType) -> ir.Value:
    if src.name == "f8e4m3":
        return e4m3_to_f32(b, x)
    if src.name == "bf16":
        return bf16_bits_to_f32(b, x)
    return convert(b, x, src, float32)


def convert(b: ir.IRBuilder, x: ir.Value, src: DType, dst: DType) -> ir.Value:
    """One element `x` of dtype `src` converted to `dst` (both register representations)."""
    if src == dst:
        return x
    if src.name in ("f8e4m3", "bf16") or (dst.name in ("f8e4m3", "bf16") and src != float32 and not src.is_bool):
        wide = _to_f32(b, x, src)
        return wide if dst == float32 else convert(b, wide, float32, dst)
    if dst.name == "f8e4m3":
        return f32_to_e4m3(b, x if src == float32 else convert(b, x, src, float32))
    if dst.name == "bf16":
        return f32_to_bf16_bits(b, x if src == float32 else convert(b, x, src, float32))
    target = like(x.type, scalar_type(dst))
    if dst.is_bool:
        if src.is_float:
            return b.fcmp_unordered("!=", x, splat(x.type, 0.0))
        return b.icmp_unsigned("!=", x, splat(x.type, 0))
    if src.is_bool:
        return b.uitofp(x, target) if dst.is_float else b.zext(x, target)
    if src.is_int and dst.is_int:
        return b.sext(x, target) if dst.itemsize > src.itemsize else b.trunc(x, target)
    if src.is_int:
        return b.sitofp(x, target)
    if dst.is_int:
        name = f"llvm.fptosi.sat.{overload(target)}.{overload(x.type)}"   # from f16, f32 or f64
        return call_intrinsic(b, name, target, [x])
    return b.fpext(x, target) if dst.itemsize > src.itemsize else b.fptrunc(x, target)


__all__ = ["convert", "e4m3_to_f32", "f32_to_e4m3"]
