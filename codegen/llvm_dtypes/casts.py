"""`cast`: one IR dtype's register converted to another's, exactly as numpy's ``astype``, on any target.

The ladder, in order (each step's result goes on down the ladder as a new `cast`):

1. wide source to a storage-only type (f64, i32, i64 -> f16, bf16, e4m3), where the target narrows wide
   sources here (`TargetCaps.narrows_wide_sources`): through f64 (exact from i32) and f32 rounded to odd,
   so the one rounding to the narrow type is numpy's one;
2. from a bit-pattern type (bf16, e4m3): decoded to f32 (exact), then f32 to the destination;
3. to a bit-pattern type: the source to f32, then encoded by the target's instruction or by integer code
   (`codegen.llvm_dtypes.bits`), rounding to nearest even (e4m3 saturates to NaN, as ml_dtypes does);
4. to bool: ``!= 0`` (a NaN is true); from bool: 0 or 1;
5. int to int: sign-extend or truncate (wraps, as numpy);
6. int to float: ``sitofp`` (one rounding);
7. float to int: ``llvm.fptosi.sat``: truncate, saturate, NaN -> 0 (numpy's value is undefined there;
   this is what PTX's ``cvt.rzi`` gives); from f16 through f32 where the target lacks the instruction;
8. float to float: ``fpext`` or ``fptrunc``.

`x` may be a scalar or an LLVM vector of registers for every step but the e4m3 ones (the GPU emitter
converts e4m3 element by element).
"""
from __future__ import annotations

from llvmlite import ir

from ...ir.types import DType, bfloat16, float16, float32, float64
from ..llvm_utils import F32, F64, I8, call_intrinsic, like, splat
from ..nvvm_mma import f32_to_bf16_bits, f32x2_to_e4m3x2
from . import bits
from .target import TargetCaps
from .types import holds_bits, intrinsic_suffix, register_type


def cast(b: ir.IRBuilder, x: ir.Value, src: DType, dst: DType, target: TargetCaps) -> ir.Value:
    """`x` (registers of `src`) converted to `dst` like numpy's ``astype`` (see the module docstring)."""
    if src == dst:
        return x
    if target.narrows_wide_sources and dst.storage_only and (src == float64 or src.is_int):
        wide = x if src == float64 else b.sitofp(x, like(x.type, F64))
        return cast(b, bits.f64_to_f32_odd(b, wide), float32, dst, target)
    if holds_bits(src):
        wide = bits.bf16_to_f32(b, x) if src == bfloat16 else bits.e4m3_to_f32(b, x)
        return cast(b, wide, float32, dst, target)
    if holds_bits(dst):
        return _encode(b, cast(b, x, src, float32, target), dst, target)
    out = like(x.type, register_type(dst))
    if dst.is_bool:
        if src.is_float:
            return b.fcmp_unordered("!=", x, splat(x.type, 0.0))
        return b.icmp_unsigned("!=", x, splat(x.type, 0))
    if src.is_bool:
        return b.uitofp(x, out) if dst.is_float else b.zext(x, out)
    if src.is_int and dst.is_int:
        return b.sext(x, out) if dst.itemsize > src.itemsize else b.trunc(x, out)
    if src.is_int:
        return b.sitofp(x, out)
    if dst.is_int:
        if src == float16 and not target.half_to_int_instruction:
            x = cast(b, x, src, float32, target)
        name = f"llvm.fptosi.sat.{intrinsic_suffix(out)}.{intrinsic_suffix(x.type)}"
        return call_intrinsic(b, name, out, [x])
    return b.fpext(x, out) if dst.itemsize > src.itemsize else b.fptrunc(x, out)


def _encode(b: ir.IRBuilder, x: ir.Value, dst: DType, target: TargetCaps) -> ir.Value:
    """f32 `x` as the bits of bf16 or e4m3, by the target's instruction where it has one."""
    if dst == bfloat16:
        return f32_to_bf16_bits(b, x) if target.f32_to_bf16_instruction else bits.f32_to_bf16(b, x)
    if target.f32_to_e4m3_instruction:   # the two-element cvt, the second element unused
        return b.trunc(f32x2_to_e4m3x2(b, x, ir.Constant(F32, 0.0)), I8)
    return bits.f32_to_e4m3(b, x)


__all__ = ["cast"]
