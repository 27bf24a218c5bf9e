"""Global and shared loads/stores as LLVM IR: GEP addressing, masks as branches, vectors aligned to their size.

A global index is widened to i64 before the GEP (never integer pointer
arithmetic). A vector access of n bytes is one ``ld``/``st .v{2,4}`` with
alignment n (the SIMT IR guarantees the index is a multiple of the length and
allocations are 16-byte aligned). A masked load branches around the access, so
a masked-off address is never dereferenced.
"""
from __future__ import annotations

from typing import Callable

from llvmlite import ir

from ...ir.simt import LoadGlobal, LoadShared, Reg, StoreGlobal, StoreShared
from .. import nvvm
from ..nvvm import I8
from .emitter import Emitter
from .types import const, mem_type


def _pointer(s: LoadGlobal | LoadShared | StoreGlobal | StoreShared, em: Emitter) -> tuple[ir.Value, ir.Type]:
    """The address of the first element and the element's memory type."""
    if isinstance(s, LoadGlobal | StoreGlobal):
        elem = mem_type(s.buffer.dtype)
        return nvvm.element_ptr(em.builder, em.buffers[s.buffer.name], elem, em[s.index]), elem
    elem = mem_type(s.alloc.dtype)
    return nvvm.shared_gep(em.builder, em.shared[s.alloc.name], elem, em[s.index]), elem


def _to_register(em: Emitter, value: ir.Value, reg: Reg) -> ir.Value:
    """Memory bytes of a bool register to i1 (other dtypes are stored as they are held)."""
    if not reg.dtype.is_bool:
        return value
    return em.builder.icmp_unsigned("!=", value, ir.Constant(value.type, None))


def _to_memory(em: Emitter, value: ir.Value, reg: Reg) -> ir.Value:
    if not reg.dtype.is_bool:
        return value
    return em.builder.zext(value, mem_type(reg.dtype, reg.length) if reg.length > 1 else I8)


def _load(s: LoadGlobal | LoadShared, em: Emitter) -> None:
    b = em.builder
    ptr, _ = _pointer(s, em)
    typ = mem_type(s.out.dtype, s.out.length)
    align = s.out.type.nbytes if s.out.length > 1 else s.out.dtype.itemsize
    if s.mask is None:
        value = b.load(ptr, typ=typ, align=align)
    else:
        other = _to_memory(em, const(s.other, s.out.type), s.out) if s.out.dtype.is_bool else const(s.other, s.out.type)
        value = nvvm.load_masked(b, ptr, typ, em[s.mask], other, align=align)
    em.set(s.out, _to_register(em, value, s.out))


def _store(s: StoreGlobal | StoreShared, em: Emitter) -> None:
    b = em.builder
    ptr, _ = _pointer(s, em)
    value = _to_memory(em, em[s.value], s.value)
    align = s.value.type.nbytes if s.value.length > 1 else s.value.dtype.itemsize
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
