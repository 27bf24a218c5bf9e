"""IR dtypes on the host: LLVM register and memory types, loads/stores, and numpy-exact casts.

| dtype  | in registers        | in memory | note                                        |
|--------|---------------------|-----------|---------------------------------------------|
| bool   | i1                  | i8        |                                             |
| f16    | half                | half      | converted with fpext/fptrunc (F16C) to f32  |
| bf16   | i16 (the raw bits)  | i16       | to f32: shift; from f32: round to even      |
| f8e4m3 | i8 (the raw bits)   | i8        | e4m3fn: no inf, NaN = S.1111.111, max 448   |

Arithmetic never happens in f16/bf16/f8 (the scheduler computes in f32), so
those types only meet loads, stores and casts here. f64 and integers reach them
through f32 rounded to odd (`_f64_to_f32_odd`): one rounding, as numpy's.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ...ir import DType
from ...ir.types import float32 as _F32
from ..llvm_utils import F16, F32, F64, I1, I8, I16, I32, I64, declare_intrinsic

_REGISTER = {"bool": I1, "i32": I32, "i64": I64, "f32": F32, "f64": F64, "f16": F16, "bf16": I16, "f8e4m3": I8}
_MEMORY = {**_REGISTER, "bool": I8}
_FLOAT_LLVM = {"f16": F16, "f32": F32, "f64": F64}


def reg_type(d: DType) -> ir.Type:
    """The LLVM type a value of `d` has in a register."""
    return _REGISTER[d.name]


def mem_type(d: DType) -> ir.Type:
    """The LLVM type of one element of `d` in memory."""
    return _MEMORY[d.name]


def from_memory(b: ir.IRBuilder, v: ir.Value, d: DType) -> ir.Value:
    return b.icmp_unsigned("!=", v, ir.Constant(I8, 0)) if d.is_bool else v


def to_memory(b: ir.IRBuilder, v: ir.Value, d: DType) -> ir.Value:
    return b.zext(v, I8) if d.is_bool else v


def constant(d: DType, value: float | int | bool) -> ir.Constant:
    """`value` as an LLVM constant of `d`'s register type (bf16/f8: their bit patterns)."""
    if d.name in ("bf16", "f8e4m3"):
        import numpy as np

        bits = np.asarray(value, dtype=d.numpy).view(np.uint16 if d.name == "bf16" else np.uint8)
        return ir.Constant(reg_type(d), int(bits))
    if d.is_bool:
        return ir.Constant(I1, int(bool(value)))
    if d.is_int:
        return ir.Constant(reg_type(d), int(value))
    return ir.Constant(reg_type(d), float(value))


# -- bf16 and f8 <-> f32, as bit manipulation (vectorizable) --------------------------------------
def _bf16_to_f32(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    return b.bitcast(b.shl(b.zext(v, I32), ir.Constant(I32, 16)), F32)


def _f32_to_bf16(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    bits = b.bitcast(x, I32)
    lsb = b.and_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
    rounded = b.lshr(b.add(bits, b.add(lsb, ir.Constant(I32, 0x7FFF))), ir.Constant(I32, 16))
    quiet = b.or_(b.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 0x40))
    isnan = b.fcmp_unordered("uno", x, x)
    return b.trunc(b.select(isnan, quiet, rounded), I16)


def _f8_to_f32(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    w = b.zext(v, I32)
    sign = b.shl(b.and_(w, ir.Constant(I32, 0x80)), ir.Constant(I32, 24))
    exp = b.and_(b.lshr(w, ir.Constant(I32, 3)), ir.Constant(I32, 0xF))
    man = b.and_(w, ir.Constant(I32, 7))
    normal = b.or_(b.shl(b.add(exp, ir.Constant(I32, 120)), ir.Constant(I32, 23)), b.shl(man, ir.Constant(I32, 20)))
    sub = b.bitcast(b.fmul(b.uitofp(man, F32), ir.Constant(F32, 2.0 ** -9)), I32)
    mag = b.select(b.icmp_unsigned("==", exp, ir.Constant(I32, 0)), sub, normal)
    mag = b.select(b.icmp_unsigned("==", b.and_(w, ir.Constant(I32, 0x7F)), ir.Constant(I32, 0x7F)),
                   ir.Constant(I32, 0x7FC00000), mag)
    return b.bitcast(b.or_(mag, sign), F32)


def _f32_to_f8(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    m = b.module
    bits = b.bitcast(x, I32)
    sign = b.and_(b.lshr(bits, ir.Constant(I32, 24)), ir.Constant(I32, 0x80))
    a_bits = b.and_(bits, ir.Constant(I32, 0x7FFFFFFF))
    a = b.bitcast(a_bits, F32)
    rint = declare_intrinsic(m, "llvm.rint.f32", F32, [F32])
    sub = b.fptoui(b.call(rint, [b.fmul(a, ir.Constant(F32, 512.0))]), I32)  # subnormals: multiples of 2**-9
    lsb = b.and_(b.lshr(a_bits, ir.Constant(I32, 20)), ir.Constant(I32, 1))
    rounded = b.lshr(b.add(a_bits, b.add(lsb, ir.Constant(I32, 0x7FFFF))), ir.Constant(I32, 20))
    normal = b.sub(rounded, ir.Constant(I32, 120 << 3))
    small = b.fcmp_ordered("<", a, ir.Constant(F32, 2.0 ** -6))
    code = b.select(small, sub, normal)
    bad = b.or_(b.fcmp_unordered("uno", x, x), b.icmp_unsigned(">", code, ir.Constant(I32, 0x7E)))
    code = b.select(bad, ir.Constant(I32, 0x7F), code)
    return b.trunc(b.or_(code, sign), I8)


def _to_f32(b: ir.IRBuilder, v: ir.Value, d: DType) -> ir.Value:
    if d.name == "bf16":
        return _bf16_to_f32(b, v)
    if d.name == "f8e4m3":
        return _f8_to_f32(b, v)
    return cast(b, v, d, _F32)


def _from_f32(b: ir.IRBuilder, x: ir.Value, d: DType) -> ir.Value:
    if d.name == "bf16":
        return _f32_to_bf16(b, x)
    if d.name == "f8e4m3":
        return _f32_to_f8(b, x)
    return cast(b, x, _F32, d)


def _float_bits(d: DType) -> int:
    return {"f16": 16, "f32": 32, "f64": 64}[d.name]


def _f64_to_f32_odd(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """`v` rounded to f32 *to odd* (toward zero, the last bit set when inexact). Rounding that again to a type of
    at most 22 significant bits (f16, bf16, e4m3) rounds `v` once, as numpy does; f64 -> f32 -> narrow by
    nearest would round twice (1 + 2**-8 + 2**-30 -> bf16 is 1.0078125, not 1.0)."""
    t = b.fptrunc(v, F32)
    back = b.fpext(t, F64)
    fabs = declare_intrinsic(b.module, "llvm.fabs.f64", F64, [F64])
    away = b.fcmp_ordered(">", b.call(fabs, [back]), b.call(fabs, [v]))   # rounded up in magnitude: one step back
    bits = b.bitcast(t, I32)
    bits = b.select(away, b.sub(bits, ir.Constant(I32, 1)), bits)
    inexact = b.fcmp_ordered("!=", back, v)                                 # NaN: false, kept as it is
    return b.bitcast(b.select(inexact, b.or_(bits, ir.Constant(I32, 1)), bits), F32)


def cast(b: ir.IRBuilder, v: ir.Value, src: DType, dst: DType) -> ir.Value:
    """`v` (a register of `src`) converted like numpy's ``astype`` (float->int saturates; NaN -> 0)."""
    if src == dst:
        return v
    if dst.name in ("f16", "bf16", "f8e4m3") and src.name in ("f64", "i32", "i64"):
        # one rounding, as numpy's: through f64 (exact from i32) and f32 rounded to odd. (f64 -> half by
        # fptrunc is also a call of __truncdfhf2, which the JIT cannot resolve.)
        wide = v if src.name == "f64" else b.sitofp(v, F64)
        return cast(b, _f64_to_f32_odd(b, wide), _F32, dst)
    if src.name in ("bf16", "f8e4m3"):
        return cast(b, _to_f32(b, v, src), _F32, dst)
    if dst.name in ("bf16", "f8e4m3"):
        return _from_f32(b, cast(b, v, src, _F32), dst)
    if dst.is_bool:
        if src.is_float:
            return b.fcmp_unordered("!=", v, ir.Constant(reg_type(src), 0.0))
        return b.icmp_unsigned("!=", v, ir.Constant(reg_type(src), 0))
    if src.is_bool:
        return b.uitofp(v, reg_type(dst)) if dst.is_float else b.zext(v, reg_type(dst))
    if src.is_float and dst.is_float:
        bigger = _float_bits(dst) > _float_bits(src)
        return b.fpext(v, reg_type(dst)) if bigger else b.fptrunc(v, reg_type(dst))
    if src.is_float:  # -> int
        if src.name == "f16":
            v, src = b.fpext(v, F32), _F32
        rt, st = reg_type(dst), reg_type(src)
        fn = declare_intrinsic(b.module, f"llvm.fptosi.sat.i{rt.width}.{'f32' if st == F32 else 'f64'}", rt, [st])
        return b.call(fn, [v])
    if dst.is_float:  # int -> float
        return b.sitofp(v, reg_type(dst))
    sw, dw = reg_type(src).width, reg_type(dst).width
    return b.sext(v, reg_type(dst)) if dw > sw else (b.trunc(v, reg_type(dst)) if dw < sw else v)

