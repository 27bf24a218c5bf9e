"""Tile IR program -> one LLVM module for the host, one function per kernel.

`build_host_module` returns the module and, per kernel in launch order, the
function's name, the buffers its pointer arguments stand for, and how many
program instances to run. Every module is verified by LLVM before it is returned.
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.binding as llvm
import llvmlite.ir as ir

from ...ir.sizes import Size, SizeLike
from ...ir.tile import nodes as t
from ..llvm_dtypes.bits import f64_to_f32_odd
from ..llvm_utils import F16, F64, initialize_native, parse_and_verify
from .amx import amx_dot_operands
from .emitter import KernelEmitter
from .rules import RULES
from .stmts import STATEMENT_RULES


@dataclass(frozen=True)
class KernelABI:
    """How to call one compiled kernel: ``fn(*buffer pointers, sizes, begin, end)`` over ``0 <= pid <
    programs``; ``sizes`` points to the values of `sizes` (run-time extents, evaluated per call; none for a
    kernel of static shapes, which gets a null pointer)."""

    name: str
    symbol: str
    params: tuple[str, ...]
    programs: SizeLike
    sizes: tuple[Size, ...] = ()


def _symbol(program: str, kernel: str) -> str:
    clean = "".join(c if c.isalnum() or c == "_" else "_" for c in kernel)
    return f"rf_{clean}"


def build_host_module(p: t.TileProgram) -> tuple[ir.Module, tuple[KernelABI, ...]]:
    """The host LLVM module of `p` (verified) and its kernels' calling conventions."""
    initialize_native()
    module = ir.Module(name=p.name)
    module.triple = llvm.get_process_triple()
    abis = []
    for k in p.kernels:
        k = amx_dot_operands(k)   # (bf16 dots on AMX tiles, where the host has them: amx.py)
        symbol = _symbol(p.name, k.name)
        emitter = KernelEmitter(module, k, symbol, RULES, STATEMENT_RULES)
        emitter.build()
        abis.append(KernelABI(k.name, symbol, tuple(b.name for b in k.params), k.num_programs, emitter.size_params))
    _define_truncdfhf2(module)
    parse_and_verify(module, pass_name="codegen.host")
    return module, tuple(abis)


def _define_truncdfhf2(module: ir.Module) -> None:
    """``__truncdfhf2`` (f64 -> f16, rounded once), defined in the module itself.

    x86's code generator turns an f64 -> f32 rounding followed by an f32 -> f16 one into this library call
    (seen on the scalar remainder of f16 ``tanh``, evaluated in f64 by `codegen/wide_math.py`), and the JIT
    process has no such symbol: the call would jump to address 0. Defined here, through f32 rounded to odd
    (`llvm_dtypes.bits.f64_to_f32_odd`, which the code generator cannot merge), the call is to this."""
    fn = ir.Function(module, ir.FunctionType(F16, [F64]), name="__truncdfhf2")
    fn.visibility = "hidden"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    b.ret(b.fptrunc(f64_to_f32_odd(b, fn.args[0]), F16))
