"""Small, generic helpers for building LLVM IR with `llvmlite.ir` (host and NVPTX alike).

- `counted_loop`: ``for iv in range(start, stop, step)`` as a context manager, in
  the canonical form LLVM's loop passes expect (header with a phi, latch, exit);
- `entry_alloca`: stack slots in the entry block, so mem2reg/SROA promote them;
- `named_block`: a fresh basic block with a readable name;
- `declare_intrinsic` / `call_intrinsic`: an intrinsic declared (once) with an explicit signature;
- `splat` / `like`: a constant or type in every element of a vector (or the scalar itself), so one
  piece of emission serves scalar and vector registers;
- `parse_and_verify`: the textual module parsed and verified by LLVM (every
  module we emit goes through it; a failure is an `InternalError` with LLVM's
  message and the offending IR around it).

Opaque pointers only: addresses are formed with ``getelementptr`` (never
integer arithmetic on pointers).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator

import llvmlite.binding as llvm
import llvmlite.ir as ir

from ..ir.errors import InternalError
from .llvm_text import TextModule

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


class _LoopID(ir.values.MDValue):
    """A loop's ``llvm.loop`` metadata: ``distinct !{!self, properties...}`` (LLVM wants the first operand to
    refer to the node itself, which `llvmlite.ir.Module.add_metadata` cannot make)."""

    def descr(self, buf):
        ops = ", ".join([self.get_reference()] + [op.get_reference() for op in self.operands])
        buf += (f"distinct !{{ {ops} }}", "\n")


def no_unroll_loop_id(module: ir.Module) -> ir.values.MDValue:
    """A new ``llvm.loop`` node saying "do not unroll": LLVM may still vectorize the loop."""
    prop = module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")])
    return _LoopID(module, [prop], name=str(len(module.metadata)))


@contextmanager
def counted_loop(builder: ir.IRBuilder, start: ir.Value, stop: ir.Value, step: int = 1,
                 name: str = "loop", unroll: bool = True) -> Iterator[ir.Value]:
    """``for iv in range(start, stop, step)`` (step > 0); the body is emitted inside the ``with``.

    After the ``with`` the builder sits in the exit block. `iv` has `start`'s type. ``unroll=False`` marks the
    loop for LLVM not to unroll (an `llvmlite.ir` builder only).
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
    latch = builder.branch(header)
    if not unroll:
        latch.set_metadata("llvm.loop", no_unroll_loop_id(builder.module))
    builder.position_at_end(exit_)


def new_function(module, fnty: ir.FunctionType, name: str):
    """A function of `module`, an `llvmlite.ir.Module` or a `TextModule`."""
    return module.add_function(fnty, name) if isinstance(module, TextModule) else ir.Function(module, fnty, name)


def declare_intrinsic(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """The intrinsic `name` (e.g. ``llvm.maximum.f32``) with an explicit signature, declared in `module` (an
    `llvmlite.ir.Module` or a `TextModule`) on first use; a second use with another signature is an error."""
    fnty = ir.FunctionType(ret, args)
    existing = module.globals.get(name)
    if existing is None:
        return new_function(module, fnty, name)
    if existing.function_type != fnty:
        raise InternalError(f"{name} declared as {existing.function_type}, wanted {fnty}", pass_name="llvm")
    return existing  # type: ignore[return-value]


def call_intrinsic(builder: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
    """Call intrinsic `name` (declared on first use) with `args`."""
    return builder.call(declare_intrinsic(builder.module, name, ret, [a.type for a in args]), args)


class _Splat(ir.Constant):
    """A vector constant with one value in every element, printed the short way: ``splat (float 1.0)``."""

    def _get_reference(self) -> str:
        elem = self.constant[0]
        return f"splat ({elem.type} {elem.get_reference()})"


def splat(t: ir.Type, value: object) -> ir.Constant:
    """`value` as a constant of type `t`, in every element when `t` is a vector (`value` may be a scalar
    `ir.Constant` of the element type). Made once per (type, value): llvmlite caches a constant's
    text, and kernels use the same few constants hundreds of times."""
    key = (str(t), type(value).__name__, str(value) if isinstance(value, ir.Constant) else repr(value))
    found = _SPLATS.get(key)
    if found is None:
        if isinstance(t, ir.VectorType):
            elem = value if isinstance(value, ir.Constant) else ir.Constant(t.element, value)
            found = _Splat(t, [elem] * t.count)
        else:
            found = value if isinstance(value, ir.Constant) else ir.Constant(t, value)
        _SPLATS[key] = found
    return found


_SPLATS: dict[tuple[str, str, str], ir.Constant] = {}


def broadcast_lanes(builder: ir.IRBuilder, x: ir.Value, lanes: int) -> ir.Value:
    """A vector of `lanes` copies of the scalar register `x` (insert into lane 0, shuffle lane 0 everywhere;
    `splat` makes the constant kind)."""
    vec = ir.VectorType(x.type, lanes)
    one = builder.insert_element(ir.Constant(vec, ir.Undefined), x, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined), ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))


def like(t: ir.Type, scalar: ir.Type) -> ir.Type:
    """`scalar`, as a vector with as many elements as `t` when `t` is a vector."""
    return ir.VectorType(scalar, t.count) if isinstance(t, ir.VectorType) else scalar


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


def _llvm_lock() -> Any:
    """llvmlite's one lock around every LLVM call (``llvmlite.binding.ffi.lib``'s), or None where this
    llvmlite keeps it elsewhere."""
    from llvmlite.binding import ffi

    lock = getattr(getattr(getattr(ffi, "lib", None), "_lock", None), "_lock", None)
    return lock if hasattr(lock, "acquire") and hasattr(lock, "release") else None


_LLVM_LOCK = _llvm_lock()
"""Held across ``os.fork()``: a fork while another thread was inside LLVM (compiling) left the child's copy
held by a thread the child does not have, and its first kernel call waited for it forever. Taken before
the fork (so no other thread is inside LLVM then) and released on both sides after it."""

if hasattr(os, "register_at_fork") and _LLVM_LOCK is not None:
    os.register_at_fork(before=_LLVM_LOCK.acquire, after_in_parent=_LLVM_LOCK.release,
                        after_in_child=_LLVM_LOCK.release)
