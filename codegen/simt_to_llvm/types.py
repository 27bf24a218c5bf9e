"""SIMT register and memory types as LLVM types, and constants of them.

Registers: f32 ``float``, f64 ``double``, f16 ``half``, bf16 ``i16`` (its bit
pattern; LLVM's ``bfloat`` appears only inside conversions), f8 e4m3 ``i8``,
i32/i64, bool ``i1``; an n-vector is ``<n x T>``. In memory bool is ``i8``.
"""
from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir

from ...ir.errors import InternalError
from ...ir.simt.nodes import RegType, Scalar
from ...ir.types import DType
from ..nvvm import F16, F32, F64, I1, I8, I16, I32, I64, splat

_SCALAR: dict[str, ir.Type] = {
    "f32": F32, "f64": F64, "f16": F16, "bf16": I16, "f8e4m3": I8, "i32": I32, "i64": I64, "bool": I1,
}


def scalar_type(dtype: DType) -> ir.Type:
    """The LLVM type of one register element of `dtype`."""
    try:
        return _SCALAR[dtype.name]
    except KeyError:
        raise InternalError(f"no LLVM type for {dtype}", pass_name="simt_to_llvm") from None


@functools.lru_cache(maxsize=256)
def reg_type(t: RegType) -> ir.Type:
    """The LLVM type of a register of type `t`."""
    elem = scalar_type(t.dtype)
    return elem if t.length == 1 else ir.VectorType(elem, t.length)


def overload(t: ir.Type) -> str:
    """An overloaded intrinsic's type suffix: ``f32``, ``v16f32``, ``i32``."""
    elem = t.element if isinstance(t, ir.VectorType) else t
    name = {F32: "f32", F64: "f64", F16: "f16"}.get(elem, str(elem))
    return f"v{t.count}{name}" if isinstance(t, ir.VectorType) else name


@functools.lru_cache(maxsize=256)
def mem_type(dtype: DType, length: int = 1) -> ir.Type:
    """The LLVM type of `length` elements of `dtype` in memory (bool is a byte)."""
    elem = I8 if dtype.is_bool else scalar_type(dtype)
    return elem if length == 1 else ir.VectorType(elem, length)


def scalar_const(value: Scalar, dtype: DType) -> ir.Constant:
    """`value` as an LLVM constant of `dtype`'s register element type (rounded to the dtype first)."""
    if dtype.is_bool:
        return ir.Constant(I1, int(bool(value)))
    if dtype.is_int:
        return ir.Constant(scalar_type(dtype), int(value))
    if dtype.name in ("bf16", "f8e4m3"):
        bits = np.asarray(value, dtype=dtype.numpy).view(np.uint16 if dtype.name == "bf16" else np.uint8)
        return ir.Constant(scalar_type(dtype), int(bits))
    rounded = float(np.asarray(value).astype(dtype.numpy))  # LLVM wants a value the type represents exactly
    return ir.Constant(scalar_type(dtype), rounded)


def const(value: Scalar, t: RegType) -> ir.Constant:
    """`value` in every element of a register of type `t`."""
    c = scalar_const(value, t.dtype)
    return c if t.length == 1 else splat(reg_type(t), c)


__all__ = ["scalar_type", "reg_type", "overload", "mem_type", "scalar_const", "const"]
