"""Layout conversion: the same tile in another layout (ARCHITECTURE.md section 6).

When every register the target layout wants is already in the same thread —
some register of the source holds that element in every thread — conversion is
a renaming (`register_map`; e.g. an mma accumulator re-read as an A operand, or
a broadcast). Otherwise the tile goes through shared memory: a barrier (the
scratch array may still be read by an earlier conversion), each element stored
once (replica threads stay quiet), a barrier, then every thread loads what the
target layout gives it. Stores and loads are vectors where a thread's registers
are consecutive in the tile (up to 16 bytes).
"""
from __future__ import annotations

import functools

import numpy as np

from ...ir.expr import BinaryOp
from ...ir.simt import IntOp
from ...ir.types import int32
from .layouts import Layout, flat, flat_run, without_duplicate_regs
from .values import Regs, from_registers, gather, pieces


@functools.lru_cache(maxsize=1024)
def register_map(src: Layout, dst: Layout) -> tuple[int, ...] | None:
    """For each register of `dst`, a register of `src` holding the same element in every thread; None if none."""
    a, b = src.table(), dst.table()
    index: dict[bytes, int] = {}
    for r in range(a.shape[1]):
        index.setdefault(a[:, r].tobytes(), r)
    out = []
    for j in range(b.shape[1]):
        r = index.get(b[:, j].tobytes())
        if r is None:
            return None
        out.append(r)
    return tuple(out)


def writer_mask(lw, layout: Layout):
    """A bool register true on the threads that own `layout`'s elements (not replicas); None when all do."""
    b = lw.b
    mask = layout.replica_mask()
    if not mask:
        return None
    bits = b.int_op(IntOp.AND, lw.tid, b.const_of(mask, int32))
    return b.binary(BinaryOp.EQ, bits, b.const_of(0, int32))


def vector_width(layout: Layout, itemsize: int, limit: int) -> int:
    """Registers per shared-memory access: the thread's contiguous run, at most 16 bytes and `limit`."""
    return max(1, min(flat_run(layout), 16 // max(1, itemsize), limit))


def store_shared(lw, regs: Regs, alloc, offset: int = 0) -> None:
    """Every element of `regs` into `alloc` at `offset` plus its flat index (one writer per element)."""
    b, layout = lw.b, regs.layout
    n = vector_width(layout, regs.dtype.itemsize, regs.chunk_len)
    if offset % n:
        n = 1
    mask = writer_mask(lw, layout)
    base = b.thread_field(lw.tid, [flat(x, layout.shape) for x in layout.thread_bases])
    for r in range(0, layout.num_regs, n):
        at = offset + flat(layout.reg_coord(r), layout.shape)
        index = b.arith(BinaryOp.ADD, base, b.const_of(at, int32))
        b.store_shared(alloc, index, pieces(b, regs, r, n), mask=mask)


def load_shared(lw, alloc, layout: Layout, dtype) -> Regs:
    """A tile in `layout` read from `alloc` (flat, row-major)."""
    b = lw.b
    lean, index = without_duplicate_regs(layout)
    n = vector_width(lean, dtype.itemsize, min(lean.num_regs, 16))
    base = b.thread_field(lw.tid, [flat(x, lean.shape) for x in lean.thread_bases])
    parts = []
    for r in range(0, lean.num_regs, n):
        at = flat(lean.reg_coord(r), lean.shape)
        idx = b.arith(BinaryOp.ADD, base, b.const_of(at, int32))
        parts.append(b.load_shared(alloc, idx, length=n, other=False if dtype.is_bool else 0))
    regs = from_registers(b, lean, dtype, parts)
    return regs if lean == layout else gather(b, regs, index, layout)


def convert(lw, regs: Regs, target: Layout) -> Regs:
    """`regs` in layout `target` (same shape): renamed registers when possible, else through shared memory."""
    if regs.layout == target:
        return regs
    sources = register_map(regs.layout, target)
    if sources is not None:
        return gather(lw.b, regs, sources, target)
    b = lw.b
    alloc = lw.arena(regs.dtype, int(np.prod(target.shape, dtype=np.int64)))
    b.barrier()
    store_shared(lw, regs, alloc)
    b.barrier()
    return load_shared(lw, alloc, target, regs.dtype)
