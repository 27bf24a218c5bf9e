"""Small, generic helpers for building LLVM IR with `llvmlite.ir` (host and NVPTX alike).

- `counted_loop`: ``for iv in range(start, stop, step)`` as a context manager, in
  the canonical form LLVM's loop passes expect (header with a phi, latch, exit);
- `entry_alloca`: stack slots in the entry block, so mem2reg/SROA promote them;
- `named_block`: a fresh basic block with a readable name;
- `declare_intrinsic`: an intrinsic declared with an explicit signature;
- `parse_and_verify`: the textual module parsed and verified by LLVM (every
  module we emit goes through it; a failure is an `InternalError` with LLVM's
  message and the offending IR around it).

Opaque pointers only: addresses are formed with ``getelementptr`` (never
integer arithmetic on pointers).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import llvmlite.binding as llvm
import llvmlite.ir as ir

from ..ir.errors import InternalError

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F16 = ir.HalfType()
F32 = ir.FloatType()
F64 = ir.DoubleType()
PTR = ir.PointerType()
VOID = ir.VoidType()


def const_int(ty: ir.IntType, value: int) -> ir.Constant:
    return ir.Constant(ty, value)


def named_block(builder: ir.IRBuilder, name: str) -> ir.Block:
    """A new basic block appended to the current function."""
    return builder.function.append_basic_block(name)


def entry_alloca(builder: ir.IRBuilder, ty: ir.Type, name: str = "", count: int | None = None,
                 align: int | None = None) -> ir.AllocaInstr:
    """A stack slot created at the top of the entry block (whatever block the builder is in)."""
    entry = builder.function.entry_basic_block
    with builder.goto_block(entry):
        if entry.instructions:
            builder.position_before(entry.instructions[0])
        slot = builder.alloca(ty, size=None if count is None else const_int(I64, count), name=name)
        if align is not None:
            slot.align = align
    slot.type = PTR  # llvmlite types allocas as typed pointers; ours are opaque (addressed by GEP)
    return slot


@contextmanager
def counted_loop(builder: ir.IRBuilder, start: ir.Value, stop: ir.Value, step: int = 1,
                 name: str = "loop") -> Iterator[ir.Value]:
    """``for iv in range(start, stop, step)`` (step > 0); the body is emitted inside the ``with``.

    After the ``with`` the builder sits in the exit block. `iv` has `start`'s type.
    """
    pre = builder.block
    header = named_block(builder, f"{name}.header")
    body = named_block(builder, f"{name}.body")
    exit_ = named_block(builder, f"{name}.exit")
    builder.branch(header)
    builder.position_at_end(header)
    iv = builder.phi(start.type, name=f"{name}.iv")
    iv.add_incoming(start, pre)
    builder.cbranch(builder.icmp_signed("<", iv, stop), body, exit_)
    builder.position_at_end(body)
    yield iv
    nxt = builder.add(iv, ir.Constant(start.type, step), name=f"{name}.next", flags=("nsw",))
    iv.add_incoming(nxt, builder.block)
    builder.branch(header)
    builder.position_at_end(exit_)


def declare_intrinsic(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """The intrinsic `name` (e.g. ``llvm.maximum.f32``) with an explicit signature."""
    existing = module.globals.get(name)
    if existing is not None:
        return existing  # type: ignore[return-value]
    return ir.Function(module, ir.FunctionType(ret, args), name=name)


_INITIALIZED = False


def initialize_native() -> None:
    """Initialize LLVM's native target once per process."""
    global _INITIALIZED
    if not _INITIALIZED:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        _INITIALIZED = True


def parse_and_verify(module: ir.Module | str, pass_name: str = "llvm") -> llvm.ModuleRef:
    """The module parsed by LLVM and verified; a broken module raises `InternalError`."""
    text = str(module)
    try:
        ref = llvm.parse_assembly(text)
        ref.verify()
    except RuntimeError as err:
        lines = text.splitlines()
        shown = "\n".join(lines[:200]) + ("\n..." if len(lines) > 200 else "")
        raise InternalError(f"LLVM rejected the module: {err}", pass_name=pass_name, context=shown) from None
    return ref
