"""SIMT register types as LLVM types, and constants of them (the dtypes' own types: `codegen.llvm_dtypes`).

A register of n elements is ``<n x T>`` of its dtype's register type ``T``; in memory, n elements are
``<n x M>`` of its memory type ``M`` (a bool is a byte).
"""
from __future__ import annotations

import functools

from llvmlite import ir

from ...ir.simt.nodes import RegType, Scalar
from ...ir.types import DType
from ..llvm_dtypes import constant, memory_type, register_type
from ..nvvm import splat


@functools.lru_cache(maxsize=256)
def reg_type(t: RegType) -> ir.Type:
    """The LLVM type of a register of type `t`."""
    elem = register_type(t.dtype)
    return elem if t.length == 1 else ir.VectorType(elem, t.length)


@functools.lru_cache(maxsize=256)
def mem_type(dtype: DType, length: int = 1) -> ir.Type:
    """The LLVM type of `length` elements of `dtype` in memory (bool is a byte)."""
    elem = memory_type(dtype)
    return elem if length == 1 else ir.VectorType(elem, length)


def const(value: Scalar, t: RegType) -> ir.Constant:
    """`value` in every element of a register of type `t` (rounded to its dtype first)."""
    c = constant(t.dtype, value)
    return c if t.length == 1 else splat(reg_type(t), c)


__all__ = ["reg_type", "mem_type", "const"]
