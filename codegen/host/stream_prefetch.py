"""Software prefetch of the rows a chunk loop reads on its next trip.

A fused loop streams its operands a chunk per trip (decoding reads 64 KiB of ``k`` and of ``v`` per trip
of 128 keys). Where such a load's rows are read by a reduction, the row loop of that reduction asks for
the same row of the *next* trip's tile, one cache line at a time (``llvm.prefetch``, into L2), while it
reduces this trip's row. The hardware's streamer alone stops at every 4 KiB page and runs a few lines
ahead; a whole trip ahead, spread over the trip's rows, keeps more lines in flight. Measured on the
2-core Xeon (2 threads, interleaved with torch's SDPA in one process; see docs/cpu-backend.md): decoding
[1,8,1,128] against 8192 keys 1.57-1.67 -> 1.41-1.45 ms. A burst of the whole next tile at the top of
the trip was slower than none (1.97 ms): the requests queue behind each other.

Which loads: a `Load` of a 2-D tile, read by the reduction through elementwise ops of the same shape (not
materialized: those were loaded before), its offsets affine with the last dim contiguous (`AffineInfo`),
inside a `For` whose induction variable moves every offset by the same number of elements per trip
(`trip_delta`), at least a page (`PAGE_BYTES`). A prefetch cannot fault, so masked (ragged) loads and the last trip, which asks for lines
past the tile, need no guard; nothing is computed from a prefetched line.
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from ...ir import BinaryOp
from ...ir.tile import nodes as t
from ..llvm_dtypes import memory_type
from ..llvm_utils import I64, PTR, VOID, declare_intrinsic
from ..simt.affine import AffineInfo

LINE_BYTES = 64
"""Bytes of a cache line on the hosts this backend targets (x86-64, aarch64)."""

PAGE_BYTES = 4096
"""A load is streamed only where its next trip's rows are at least this far from this trip's: the hardware
streamer follows a row that goes on in the same 4 KiB page (a chunk of a long row, 256 bytes on, as in
`mean_abs_deviation`), and prefetching those lines too only adds instructions."""

L2_HINT = 2
"""``llvm.prefetch``'s locality for the next trip's lines: 2 is ``prefetcht1`` (into L2) on x86-64; the
trip's rows are read again within the trip, so they are not worth an L1 line a trip early."""


@dataclass(frozen=True)
class Trip:
    """The innermost `For` whose body is being emitted: its induction variable, step and the names its body
    defines (everything else is the same on every trip)."""

    iv: str
    step: int
    inside: frozenset[str]

    @staticmethod
    def of(op: t.For) -> "Trip":
        names = {r.name for o in t.walk_ops(op.body.ops) for r in t.results(o)}
        names.update(a.name for a in op.body.args)
        return Trip(op.body.iv.name, op.step, frozenset(names))


@dataclass(frozen=True)
class Streamed:
    """A load whose rows the next trip reads `delta` elements further on, each row `row_bytes` long."""

    load: t.Load
    delta: int
    row_bytes: int


def trip_delta(defs: dict[str, t.Op], v: t.Value, trip: Trip, affine: AffineInfo) -> int | None:
    """How many elements every element of the integer tile `v` moves from one trip of `trip` to the next;
    None where that is not one constant (a gather, a product of two counters, a loop-carried value)."""
    if v.name == trip.iv:
        return trip.step
    if v.name not in trip.inside:
        return 0
    op = defs.get(v.name)
    if isinstance(op, (t.Constant, t.Arange, t.ProgramId)):
        return 0
    if isinstance(op, (t.Broadcast, t.ExpandDims)):
        return trip_delta(defs, op.x, trip, affine)
    if isinstance(op, t.Binary) and op.op in (BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL):
        a, b = trip_delta(defs, op.a, trip, affine), trip_delta(defs, op.b, trip, affine)
        if a is None or b is None:
            return None
        if op.op is BinaryOp.ADD:
            return a + b
        if op.op is BinaryOp.SUB:
            return a - b
        if a == 0 and b == 0:
            return 0
        fa, fb = affine.of(op.a), affine.of(op.b)
        if b == 0 and fb is not None and fb.const is not None:
            return a * fb.const
        if a == 0 and fa is not None and fa.const is not None:
            return b * fa.const
    return None


_ELEMENTWISE = (t.Unary, t.Binary, t.Select, t.Cast)


def streamed_loads(em, x: t.Value) -> list[Streamed]:
    """The loads of `x`'s inline expression whose next-trip rows are worth prefetching (module docstring),
    for a reduction of the 2-D tile `x` emitted inside a `For` (none outside one)."""
    if not em.trips or len(x.shape) != 2:
        return []
    trip, defs = em.trips[-1], em.plan.defs
    affine = AffineInfo(defs)
    found: dict[str, Streamed] = {}
    pending, seen = [x], set()
    while pending:
        v = pending.pop()
        if v.name in seen or v.name in em.slots or v.shape != x.shape:
            continue
        seen.add(v.name)
        op = defs.get(v.name)
        if isinstance(op, _ELEMENTWISE):
            pending.extend(o for o in t.operands(op) if o.shape == x.shape)
        elif isinstance(op, t.Load) and v.name in trip.inside:
            form = affine.of(op.offsets)
            if form is None or len(form.strides) != 2 or form.strides[1] != 1:
                continue
            delta = trip_delta(defs, op.offsets, trip, affine)
            if delta and abs(delta) * op.buffer.dtype.itemsize >= PAGE_BYTES:
                found[v.name] = Streamed(op, delta, x.shape[1] * op.buffer.dtype.itemsize)
    return [found[name] for name in sorted(found)]


def prefetch_next_trip(em, streamed: list[Streamed], row: ir.Value) -> None:
    """Ask for row `row` of each streamed load's next-trip tile, line by line (emitted in the row loop)."""
    b = em.b
    fn = declare_intrinsic(b.module, "llvm.prefetch.p0", VOID, [PTR, ir.IntType(32), ir.IntType(32),
                                                                ir.IntType(32)])
    flags = [ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), L2_HINT), ir.Constant(ir.IntType(32), 1)]
    for s in streamed:
        offset = b.add(em.wide(s.load.offsets, (row, em.zero)), ir.Constant(I64, s.delta))
        first = b.gep(em.buffers[s.load.buffer.name], [offset], source_etype=memory_type(s.load.buffer.dtype))
        # every line from the row's first byte to its last (one more than row_bytes / 64 where the row does
        # not start on a line)
        for byte in [*range(0, s.row_bytes, LINE_BYTES), s.row_bytes - 1]:
            line = b.gep(first, [ir.Constant(I64, byte)], source_etype=ir.IntType(8)) if byte else first
            b.call(fn, [line] + flags)
