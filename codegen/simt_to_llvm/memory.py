"""Global and shared loads/stores as LLVM IR: GEP addressing, masks as branches, vectors aligned to their size.

A global index is widened to i64 before the GEP (never integer pointer
arithmetic). A vector access of n bytes is one ``ld``/``st .v{2,4}`` with
alignment n (the SIMT IR guarantees the index is a multiple of the length and
allocations are 16-byte aligned). A shared access states the larger alignment
its index is known to have in the 16-byte aligned allocation (its low zero bits,
`known_zero_bits`): LLVM's load/store vectorizer then joins neighbouring scalar
accesses (a cross-warp reduction's reads of each warp's partials) into one
``ld.shared.v4``, without the middle-end pass that would infer it. A masked
load branches around the access, so a masked-off address is never dereferenced.
"""
from __future__ import annotations

from typing import Callable

from llvmlite import ir

from ...ir.semantics import BinaryOp
from ...ir.simt.nodes import (
    Binary, Cast, Const, IntBinary, IntOp, LoadGlobal, LoadShared, Reg, StoreGlobal, StoreShared,
)
from .. import nvvm
from ..llvm_dtypes import from_memory, to_memory
from .emitter import Emitter
from .types import const, mem_type


def _pointer(s: LoadGlobal | LoadShared | StoreGlobal | StoreShared, em: Emitter) -> tuple[ir.Value, ir.Type]:
    """The address of the first element and the element's memory type."""
    if isinstance(s, LoadGlobal | StoreGlobal):
        elem = mem_type(s.buffer.dtype)
        return nvvm.element_ptr(em.builder, em.buffers[s.buffer.name], elem, em[s.index]), elem
    elem = mem_type(s.alloc.dtype)
    return nvvm.shared_gep(em.builder, em.shared[s.alloc.name], elem, em[s.index]), elem


SHARED_ALIGNMENT = 16   # bytes: every shared allocation's alignment (`nvvm.declare_shared`)


def _alignment(s: LoadGlobal | LoadShared | StoreGlobal | StoreShared, em: Emitter, reg: Reg) -> int:
    """The access's alignment in bytes: its size (a vector) or its element's, or more for a shared access
    whose byte offset has more known low zero bits (up to the allocation's alignment)."""
    align = reg.type.nbytes if reg.length > 1 else reg.dtype.itemsize
    if isinstance(s, LoadShared | StoreShared):
        zeros = known_zero_bits(s.index, em) + s.alloc.dtype.itemsize.bit_length() - 1   # of the byte offset
        align = max(align, min(1 << min(zeros, 16), SHARED_ALIGNMENT))
    return align


def known_zero_bits(reg: Reg, em: Emitter, depth: int = 6) -> int:
    """How many low bits of the integer register `reg` are zero in every thread, from its definition:
    constants, ``<<`` by a constant, products, sums, ``&``/``|`` and integer casts (0 when unknown)."""
    key = ("known_zero_bits", reg.name)
    found = em.memo.get(key)
    if found is not None:
        return found  # type: ignore[return-value]
    s = em.defs.get(reg.name)
    zeros = 0
    if depth and reg.length == 1 and not reg.dtype.is_float:
        if isinstance(s, Const):
            value = int(s.value)
            zeros = 64 if value == 0 else (value & -value).bit_length() - 1
        elif isinstance(s, Cast) and not s.x.dtype.is_float:
            zeros = known_zero_bits(s.x, em, depth - 1)
        elif isinstance(s, Binary | IntBinary):
            a, b = known_zero_bits(s.a, em, depth - 1), known_zero_bits(s.b, em, depth - 1)
            if s.op in (BinaryOp.ADD, BinaryOp.SUB, IntOp.OR):
                zeros = min(a, b)
            elif s.op is BinaryOp.MUL:
                zeros = a + b
            elif s.op is IntOp.AND:
                zeros = max(a, b)
            elif s.op is IntOp.SHL and isinstance(em.defs.get(s.b.name), Const):
                zeros = a + int(em.defs[s.b.name].value)  # type: ignore[union-attr]
    em.memo[key] = zeros = min(zeros, 64)
    return zeros


def _load(s: LoadGlobal | LoadShared, em: Emitter) -> None:
    b = em.builder
    ptr, _ = _pointer(s, em)
    typ = mem_type(s.out.dtype, s.out.length)
    align = _alignment(s, em, s.out)
    if s.mask is None:
        value = b.load(ptr, typ=typ, align=align)
    else:
        other = to_memory(b, const(s.other, s.out.type), s.out.dtype)
        value = nvvm.load_masked(b, ptr, typ, em[s.mask], other, align=align)
    em.set(s.out, from_memory(b, value, s.out.dtype))


def _store(s: StoreGlobal | StoreShared, em: Emitter) -> None:
    b = em.builder
    ptr, _ = _pointer(s, em)
    value = to_memory(b, em[s.value], s.value.dtype)
    align = _alignment(s, em, s.value)
    if s.mask is None:
        b.store(value, ptr, align=align)
    else:
        nvvm.store_masked(b, value, ptr, em[s.mask], align=align)


RULES: dict[type, Callable[..., None]] = {
    LoadGlobal: _load,
    LoadShared: _load,
    StoreGlobal: _store,
    StoreShared: _store,
}
