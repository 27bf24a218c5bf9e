"""`Reduce`: per-thread partials, then ``shfl.sync.bfly`` across lanes, then shared memory across warps.

In the input's layout, each bit that steps along the reduced axis is either a
register bit (folded inside the thread: a tree over register halves), a lane bit
(a butterfly shuffle with that lane mask: afterwards every lane of the group
holds the combined value) or a warp bit (partials go through shared memory:
each warp group writes its partial, a barrier, every thread reads all partials
of its outputs and folds them in a fixed order). The result's layout is the
input's with the axis sliced away (`layouts.sliced`); the reduced thread bits
become replicas. Lanes that only *replicate* data are never combined (a sum
would double count). Shuffles move f32/i32; other dtypes cross lanes through
shared memory too. max/min propagate NaN like numpy.
"""
from __future__ import annotations

from ...ir import BinaryOp, ReduceOp
from ...ir.tile import nodes as t
from ...ir.errors import BackendError, InternalError
from ...ir.simt.nodes import IntOp, Reg, ShuffleKind
from ...ir.types import float32, int32
from .context import Lowering, value_rule
from .layouts import Layout, flat
from .values import Regs, chunk_len, from_registers, gather

_SHUFFLED = frozenset({float32, int32})


def combiner(lw: Lowering, op: ReduceOp, dtype):
    """The binary SIMT op folding two partials of `op` (bool max/min are or/and)."""
    if dtype.is_bool:
        if op in (ReduceOp.SUM, ReduceOp.PROD):
            raise BackendError(f"a {op.value} of bools must be cast to an integer first")
        which = BinaryOp.OR if op is ReduceOp.MAX else BinaryOp.AND
    else:
        which = op.combine
    return lambda a, b: lw.b.binary(which, a, b)


def _fold_registers(lw: Lowering, regs: Regs, axis: int, combine) -> tuple[list[Reg], int]:
    """Fold the register bits along `axis`: (chunks, registers left), kept registers in their order."""
    src = regs.layout
    kept = [i for i, x in enumerate(src.regs) if not x[axis]]
    folded = [i for i, x in enumerate(src.regs) if x[axis]]
    if not folded:
        return list(regs.chunks), src.num_regs
    order = kept + folded
    sources = [sum(1 << order[k] for k in range(len(order)) if j >> k & 1) for j in range(src.num_regs)]
    chunks = list(gather(lw.b, regs, sources, src).chunks)
    n = src.num_regs
    for _ in folded:
        half = n // 2
        if n > 16:
            m = len(chunks) // 2
            chunks = [combine(a, c) for a, c in zip(chunks[:m], chunks[m:])]
        else:
            (only,) = chunks
            chunks = [combine(lw.b.piece(only, 0, half), lw.b.piece(only, half, half))]
        n = half
    return chunks, n


def _butterfly(lw: Lowering, chunks: list[Reg], bit: int, combine) -> list[Reg]:
    b = lw.b
    out = []
    for chunk in chunks:
        moved = [b.shuffle(ShuffleKind.BFLY, b.piece(chunk, e), 1 << bit) for e in range(chunk.length)]
        out.append(combine(chunk, moved[0] if len(moved) == 1 else b.pack(moved)))
    return out


def _exchange(lw: Lowering, regs: Regs, bits: list[int], quiet: int, combine) -> Regs:
    """Fold across the thread bits `bits` through shared memory; threads with a `quiet` bit set do not write."""
    b, layout = lw.b, regs.layout
    numel = max(1, layout.numel)
    groups = 1 << len(bits)
    alloc = lw.arena(regs.dtype, groups * numel)
    group = b.thread_field(lw.tid, [(1 << bits.index(i)) * numel if i in bits else 0
                                      for i in range(len(layout.thread_bases))])
    where = b.thread_field(lw.tid, [flat(x, layout.shape) for x in layout.thread_bases])
    mine = b.arith(BinaryOp.ADD, group, where)
    quiet_bits = b.int_op(IntOp.AND, lw.tid, b.const_of(quiet, int32)) if quiet else None
    writer = b.binary(BinaryOp.EQ, quiet_bits, b.const_of(0, int32)) if quiet_bits is not None else None
    b.barrier()
    scalars = [b.piece(c, e) for c in regs.chunks for e in range(c.length)]
    for r, value in enumerate(scalars):
        at = flat(layout.reg_coord(r), layout.shape)
        b.store_shared(alloc, b.arith(BinaryOp.ADD, mine, b.const_of(at, int32)), value, mask=writer)
    b.barrier()
    out = []
    for r in range(layout.num_regs):
        at = flat(layout.reg_coord(r), layout.shape)
        acc = None
        for g in range(groups):
            index = b.arith(BinaryOp.ADD, where, b.const_of(at + g * numel, int32))
            part = b.load_shared(alloc, index, other=False if regs.dtype.is_bool else 0)
            acc = part if acc is None else combine(acc, part)
        out.append(acc)
    return from_registers(b, layout, regs.dtype, out)


@value_rule(t.Reduce)
def _reduce(lw: Lowering, op: t.Reduce, layout: Layout) -> Regs:
    src = lw.plan.reduce_in[op.out.name]
    axis, dtype = op.axis, op.x.dtype
    for x in src.bases:
        if x[axis] and sum(1 for c in x if c) != 1:
            raise InternalError(f"reduce over a layout mixing dims in one basis: {src.describe()}",
                                pass_name="lower_to_simt")
    combine = combiner(lw, op.op, dtype)
    chunks, n = _fold_registers(lw, lw.get(op.x, src), axis, combine)
    if n != layout.num_regs or (chunks and chunks[0].length != chunk_len(n)):
        raise InternalError(f"reduce left {n} registers for a layout of {layout.num_regs}", pass_name="lower_to_simt")
    thread = src.thread_bases
    across = [i for i, x in enumerate(thread) if x[axis]]
    quiet = sum(1 << i for i, x in enumerate(thread) if not any(x))
    lanes = [i for i in across if i < 5] if dtype in _SHUFFLED else []
    for bit in lanes:
        chunks = _butterfly(lw, chunks, bit, combine)
    quiet |= sum(1 << i for i in lanes)
    rest = [i for i in across if i not in lanes]
    regs = Regs(layout, dtype, tuple(chunks))
    return _exchange(lw, regs, rest, quiet, combine) if rest else regs

