"""Layout conversion: the same tile in another layout (ARCHITECTURE.md section 6).

When every register the target layout wants is already in the same thread —
some register of the source holds that element in every thread — conversion is
a renaming (`register_map`; e.g. an mma accumulator re-read as an A operand, or
a broadcast). Otherwise the tile goes through shared memory: a barrier (the
scratch array may still be read by an earlier conversion), each element stored
once (replica threads stay quiet), a barrier, then every thread loads what the
target layout gives it. Stores and loads are vectors where a thread's registers
are consecutive in the tile (up to 16 bytes), and a 16-bit tile whose target
layout is ``ldmatrix``'s -- the mma A and B fragments, transposed or not -- is read
with ``ldmatrix`` (`ldmatrix_plan`): one instruction gives a lane 8 elements that
would otherwise be four 2-element loads, or eight single ones for a B operand
whose pairs run down the columns of a row-major tile (``P @ V``'s V). An 8-bit
tile whose target reads words from a column-major scratch and bytes from a
row-major one (an e4m3 mma's B operand) goes through shared memory transposed.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ...ir.semantics import BinaryOp
from ...ir.simt.nodes import IntOp
from ...ir.types import int32
from .layouts import Layout, flat, flat_run, mapped, without_duplicate_regs
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


def vector_width(layout: Layout, itemsize: int, limit: int, pitch: int | None = None) -> int:
    """Registers per shared-memory access: the thread's contiguous run, at most 16 bytes and `limit`; with a
    row `pitch` (2-D, elements) also within a row and no wider than a row start's alignment."""
    n = max(1, min(flat_run(layout), 16 // max(1, itemsize), limit))
    if pitch is not None:
        n = min(n, layout.shape[1], math.gcd(pitch * itemsize, 16) // itemsize or 1)
    return max(1, n)


def _at(coord, shape: tuple[int, ...], pitch: int | None) -> int:
    """The scratch offset of `coord`: row-major, or rows `pitch` elements apart (a padded 2-D scratch)."""
    return flat(coord, shape) if pitch is None else coord[0] * pitch + coord[1]


def store_shared(lw, regs: Regs, alloc, offset: int = 0, pitch: int | None = None) -> None:
    """Every element of `regs` into `alloc` at `offset` plus its flat index (rows `pitch` apart if given; one
    writer per element)."""
    b, layout = lw.b, regs.layout
    n = vector_width(layout, regs.dtype.itemsize, regs.chunk_len, pitch)
    if offset % n:
        n = 1
    mask = writer_mask(lw, layout)
    base = b.thread_field(lw.tid, [_at(x, layout.shape, pitch) for x in layout.thread_bases])
    for r in range(0, layout.num_regs, n):
        at = offset + _at(layout.reg_coord(r), layout.shape, pitch)
        index = b.arith(BinaryOp.ADD, base, b.const_of(at, int32))
        b.store_shared(alloc, index, pieces(b, regs, r, n), mask=mask)


@dataclass(frozen=True)
class LdMatrixPlan:
    """How ``ldmatrix`` reads a tile: `trans`, the scratch offsets of a matrix's 8 rows (bits of the row
    number), and of its matrices (bits of the matrix number, from register bit 1 up)."""

    trans: bool
    rows: tuple[int, int, int]
    matrices: tuple[int, ...]


@functools.lru_cache(maxsize=256)
def ldmatrix_plan(layout: Layout, itemsize: int, pitch: int | None = None) -> LdMatrixPlan | None:
    """The plan when `layout` (no zero register bases) is ``ldmatrix``'s over a scratch whose rows are `pitch`
    elements apart (row-major when None), else None.

    ``ldmatrix`` gives lane ``4 r + w`` elements ``2 w, 2 w + 1`` of row ``r`` of each 8x8 matrix (of its
    transpose with ``.trans``), a row being 8 consecutive 16-bit elements at a 16-byte aligned address.
    So: register bit 0 and lane bits 0, 1 step through a row (flat +1, +2, +4) and lane bits 2-4 pick the
    row, or (transposed) lane bits 2-4 step through the row and register bit 0, lane bits 0, 1 pick it;
    the other register bits pick the matrix. Every row start must be a multiple of 8 elements.
    """
    if itemsize != 2 or layout.num_regs < 2:
        return None
    f = [_at(x, layout.shape, pitch) for x in layout.regs]
    lanes = [_at(x, layout.shape, pitch) for x in layout.lanes]
    warps = [_at(x, layout.shape, pitch) for x in layout.warps]
    if (f[0], lanes[0], lanes[1]) == (1, 2, 4):
        trans, rows = False, (lanes[2], lanes[3], lanes[4])
    elif tuple(lanes[2:]) == (1, 2, 4):
        trans, rows = True, (f[0], lanes[0], lanes[1])
    else:
        return None
    if any(x % 8 for x in (*rows, *f[1:], *warps)):
        return None
    return LdMatrixPlan(trans, rows, tuple(f[1:]))   # type: ignore[arg-type]


def _load_ldmatrix(lw, alloc, lean: Layout, plan: LdMatrixPlan, pitch: int | None) -> list:
    """`lean`'s registers in order, ``2 count`` per ``ldmatrix.x<count>``: lane ``8 m + r`` of a call gives
    row ``r`` of its ``m``-th matrix."""
    b = lw.b
    matrices = lean.num_regs // 2
    count = min(4, matrices)
    per_call = count.bit_length() - 1                 # matrix-number bits one call covers (lane bits 3, 4)
    lane_coefs = list(plan.rows) + [plan.matrices[i] if i < per_call else 0 for i in range(2)]
    base = b.thread_field(lw.tid, lane_coefs + [_at(x, lean.shape, pitch) for x in lean.warps])
    parts = []
    for first in range(0, matrices, count):
        origin = sum(m for i, m in enumerate(plan.matrices) if first >> i & 1)
        index = b.arith(BinaryOp.ADD, base, b.const_of(origin, int32))
        parts.append(b.ldmatrix(alloc, index, count, trans=plan.trans))
    return parts


def load_shared(lw, alloc, layout: Layout, dtype, pitch: int | None = None) -> Regs:
    """A tile in `layout` read from `alloc` (flat, row-major; rows `pitch` apart if given)."""
    b = lw.b
    lean, index = without_duplicate_regs(layout)
    plan = ldmatrix_plan(lean, dtype.itemsize, pitch)
    if plan is not None:
        regs = from_registers(b, lean, dtype, _load_ldmatrix(lw, alloc, lean, plan, pitch))
        return regs if lean == layout else gather(b, regs, index, layout)
    n = vector_width(lean, dtype.itemsize, min(lean.num_regs, 16), pitch)
    base = b.thread_field(lw.tid, [_at(x, lean.shape, pitch) for x in lean.thread_bases])
    parts = []
    for r in range(0, lean.num_regs, n):
        at = _at(lean.reg_coord(r), lean.shape, pitch)
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
    if _reads_wider_transposed(target, regs.dtype.itemsize):
        row = target.shape[0]               # a row of the transposed tile: one column of the target's
        moved = _through_shared(lw, Regs(transposed(regs.layout), regs.dtype, regs.chunks), transposed(target),
                                pitch=row + BYTE_ROW_PAD)
        return Regs(target, regs.dtype, moved.chunks)
    return _through_shared(lw, regs, target, ldmatrix_pitch(target, regs.dtype.itemsize))


def ldmatrix_pitch(target: Layout, itemsize: int) -> int | None:
    """The row pitch (elements) of a scratch that `target` reads with ``ldmatrix``; None (row-major) otherwise.

    An 8x8 matrix read is one shared-memory wavefront when its 8 rows, 16 bytes each, fall in distinct
    16-byte slots of the 128 bytes the 32 banks span (distinct modulo 128): when the rows are an odd number
    of 16-byte units apart. Rows 128 bytes apart (or a multiple) all share one slot, 8 wavefronts a
    matrix; 64 bytes apart, 4 to a slot, 4 wavefronts. So rows that are an even number of 16-byte units
    long get 16 bytes of padding (attention's K and V tiles;
    `test_ldmatrix_reads_of_a_padded_scratch_are_one_wavefront_a_matrix` counts it)."""
    if len(target.shape) != 2 or (target.shape[1] * itemsize) % 16:
        return None
    lean, _ = without_duplicate_regs(target)
    units = target.shape[1] * itemsize // 16
    pitch = target.shape[1] + (16 // itemsize if units % 2 == 0 else 0)
    if pitch == target.shape[1] or ldmatrix_plan(lean, itemsize, pitch) is None:
        return None
    return pitch


BYTE_ROW_PAD = 4
"""Bytes added to each row of a transposed 8-bit scratch. Shared memory has 32 banks of 4 bytes: the 8
rows an e4m3 B-fragment read touches, 64 bytes apart, fall 4 to a bank; 68 bytes apart, 2 (the test
`test_a_transposed_byte_scratch_is_padded...` counts it). Over the FP8 GEMM benchmark kernel's 8-bit
conversions that is 672 shared-memory wavefronts a block instead of 1 184 unpadded, counted the same
way (row-major, before the transposition: 2 240; pads of 8 to 32 bytes: 672-928, so 4 is as good as
any and the least memory)."""


def transposed(layout: Layout) -> Layout:
    """`layout` seen as a layout of the transposed 2-D tile: the same registers, coordinates swapped."""
    return mapped(layout, layout.shape[::-1], lambda basis: basis[::-1])


def _reads_wider_transposed(target: Layout, itemsize: int) -> bool:
    """Whether an 8-bit 2-D tile is better kept column-major in shared memory for `target`: its threads' runs
    then reach a 32-bit word where row-major they are single bytes (an FP8 mma's B fragment, four consecutive
    k of one column, from a row-major ``[k, n]`` tile). The stores get narrower instead, but every warp
    that shares the operand reads it, and one ``ld.shared.b32`` replaces four byte loads and their packing."""
    if itemsize != 1 or len(target.shape) != 2:
        return False
    lean, _ = without_duplicate_regs(target)
    return flat_run(lean) * itemsize < 4 <= flat_run(transposed(lean)) * itemsize


def _through_shared(lw, regs: Regs, target: Layout, pitch: int | None = None) -> Regs:
    b = lw.b
    size = int(np.prod(target.shape, dtype=np.int64)) if pitch is None else target.shape[0] * pitch
    alloc = lw.arena(regs.dtype, size, alternate=True)
    b.barrier()
    store_shared(lw, regs, alloc, pitch=pitch)
    b.barrier()
    return load_shared(lw, alloc, target, regs.dtype, pitch)
