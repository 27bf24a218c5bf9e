"""IR dtypes as LLVM types: registers, memory, constants, and the bool byte of memory.

| dtype  | in registers        | in memory | note                                           |
|--------|---------------------|-----------|------------------------------------------------|
| bool   | i1                  | i8        | loaded as ``!= 0``, stored zero-extended        |
| f16    | half                | half      |                                                |
| bf16   | i16 (the raw bits)  | i16       | LLVM's ``bfloat`` appears only in conversions  |
| f8e4m3 | i8 (the raw bits)   | i8        | e4m3fn: no inf, NaN = S.1111.111, max 448      |

f32, f64, i32, i64 are ``float``, ``double``, ``i32``, ``i64``. Every function here takes scalars and,
where an LLVM vector of the register type is given, vectors alike (the GPU's registers are vectors).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ...ir.errors import InternalError
from ...ir.types import DType, bfloat16, bool_, float8_e4m3fn, float16, float32, float64, int32, int64
from ..llvm_utils import F16, F32, F64, I1, I8, I16, I32, I64, like

# Keyed by the dtype's name: these are looked up for every constant and register, and a `DType`'s hash is
# a Python-level call (six times a string's).
_REGISTER: dict[str, ir.Type] = {d.name: t for d, t in {
    float32: F32, float64: F64, float16: F16, bfloat16: I16, float8_e4m3fn: I8, int32: I32, int64: I64, bool_: I1,
}.items()}


def register_type(dtype: DType) -> ir.Type:
    """The LLVM type of one register element of `dtype`."""
    try:
        return _REGISTER[dtype.name]
    except KeyError:
        raise InternalError(f"no LLVM type for {dtype}", pass_name="llvm") from None


def memory_type(dtype: DType) -> ir.Type:
    """The LLVM type of one element of `dtype` in memory (a bool is a byte)."""
    return I8 if dtype.is_bool else register_type(dtype)


def from_memory(b: ir.IRBuilder, value: ir.Value, dtype: DType) -> ir.Value:
    """A value loaded from memory as the register it is (bool bytes become ``!= 0``; the rest as they are)."""
    if not dtype.is_bool:
        return value
    return b.icmp_unsigned("!=", value, ir.Constant(value.type, None))


def to_memory(b: ir.IRBuilder, value: ir.Value, dtype: DType) -> ir.Value:
    """A register as the memory it is stored to (bools zero-extended to bytes; the rest as they are)."""
    return b.zext(value, like(value.type, I8)) if dtype.is_bool else value


def constant(dtype: DType, value: float | int | bool) -> ir.Constant:
    """`value` as a constant of `dtype`'s register type: rounded to `dtype` first, as numpy's ``astype``
    does (LLVM wants a value the type represents exactly; a bf16/e4m3 constant is its bit pattern)."""
    if dtype.is_bool:
        return ir.Constant(I1, int(bool(value)))
    if dtype.is_int:
        return ir.Constant(register_type(dtype), int(value))
    if holds_bits(dtype):
        bits = np.asarray(value, dtype=dtype.numpy).view(_BIT_PATTERNS[dtype.name])
        return ir.Constant(register_type(dtype), int(bits))
    return ir.Constant(register_type(dtype), float(np.asarray(value).astype(dtype.numpy)))


_BIT_PATTERNS = {bfloat16.name: np.uint16, float8_e4m3fn.name: np.uint8}   # register types LLVM has no float type for


def holds_bits(dtype: DType) -> bool:
    """Whether `dtype`'s registers hold its bit pattern as an integer (bf16, e4m3): LLVM does no arithmetic
    on them, and every conversion goes through f32 (`codegen.llvm_dtypes.bits`)."""
    return dtype.name in _BIT_PATTERNS


def intrinsic_suffix(t: ir.Type) -> str:
    """An overloaded intrinsic's type suffix: ``f32``, ``v16f32``, ``i32``."""
    elem = t.element if isinstance(t, ir.VectorType) else t
    name = _FLOAT_NAMES.get(elem, str(elem))
    return f"v{t.count}{name}" if isinstance(t, ir.VectorType) else name


_FLOAT_NAMES = {F32: "f32", F64: "f64", F16: "f16"}

__all__ = ["register_type", "memory_type", "from_memory", "to_memory", "constant", "holds_bits",
           "intrinsic_suffix"]
