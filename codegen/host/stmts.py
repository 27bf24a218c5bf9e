"""Host code for the ops that run loops of their own: `STATEMENT_RULES`, one rule per op type, which
`module.py` hands to the emitter (materializing a tile is the emitter's own `materialize`).

- store: one loop nest; where the mask holds, the element goes to ``buffer[offset]``
  (LLVM turns the conditional store into a masked vector store);
- reduce over the last axis: a row of floats in memory as explicit vectors (`reduce_rows.py`); else per
  output element, an inner loop folds into a register (float sums carry ``reassoc`` so the loop
  vectorizes); over another axis: the
  output is initialized, then one pass over the input combines in place;
- topk: insertion into a k-list kept in registers (`topk.py`);
- permute: a view, inline, unless the plan materializes it (a dot operand): then a 2-D transpose
  is written in blocks transposed in registers (`transpose.py`);
- dot: ``out = acc``, then the register-blocked micro-kernel of `gemm.py` where it tiles the dot,
  else ``for i, k: for j: out[i,j] += a[i,k] * b[k,j]``, both operands materialized row-major;
- for: carried values live in stack arrays; inits are copied in, each trip's yields
  (materialized first, so no yield reads a slot another already overwrote) are copied back.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ...ir import BinaryOp, DType, ReduceOp
from ...ir.tile import nodes as t
from ..llvm_dtypes import constant, memory_type, to_memory
from ..llvm_utils import I64, counted_loop, entry_alloca
from .emitter import KernelEmitter, Slot, StatementRule
from .gemm import emit_register_blocked_dot
from .reduce_rows import emit_vector_row_reduction
from .transpose import emit_permute
from .rules import intrinsic
from .topk import emit_topk

ROW_VECTORIZE_MIN = 16
"""The shortest row a last-axis reduction vectorizes along (one AVX-512 vector of f32); shorter rows
are left to LLVM, which unrolls them and vectorizes across rows."""


def _store(em: KernelEmitter, op: t.Store) -> None:
    b = em.b
    mty = memory_type(op.buffer.dtype)
    with em.nest(op.value.shape, name=f"st.{op.buffer.name}.") as idx:
        ptr = b.gep(em.buffers[op.buffer.name], [em.wide(op.offsets, idx)], source_etype=mty)
        value = to_memory(b, em.value(op.value, idx), op.buffer.dtype)
        if op.mask is None:
            b.store(value, ptr)
        else:
            with b.if_then(em.value(op.mask, idx)):
                b.store(value, ptr)


def combine(em: KernelEmitter, op: ReduceOp, acc: ir.Value, x: ir.Value, dtype: DType) -> ir.Value:
    """``acc (+|max|min|*) x`` with numpy's NaN rules; float sums and products may be reassociated
    (vectorized)."""
    b = em.b
    if dtype.is_bool:    # numpy's + and maximum of bools are or, * and minimum are and
        return b.or_(acc, x) if op.combine in (BinaryOp.ADD, BinaryOp.MAX) else b.and_(acc, x)
    if dtype.is_float:
        if op is ReduceOp.SUM:
            return b.fadd(acc, x, flags=("reassoc",))
        if op is ReduceOp.PROD:
            return b.fmul(acc, x, flags=("reassoc",))
        return b.call(intrinsic(em, "maximum" if op is ReduceOp.MAX else "minimum", x.type, 2), [acc, x])
    if op is ReduceOp.SUM:
        return b.add(acc, x)
    if op is ReduceOp.PROD:
        return b.mul(acc, x)
    return b.call(intrinsic(em, "smax" if op is ReduceOp.MAX else "smin", x.type, 2), [acc, x])


def _reduce(em: KernelEmitter, op: t.Reduce) -> None:
    b, d = em.b, op.x.dtype
    out = em.new_slot(op.out)
    identity = constant(d, op.op.identity(d))
    n = op.x.shape[op.axis]
    if emit_vector_row_reduction(em, op, out):
        return
    if op.axis == len(op.x.shape) - 1:  # fold each row into a register (mem2reg turns the slot into a phi)
        acc = entry_alloca(b, identity.type, name=f"{op.out.name}.acc")
        with em.nest(op.out.shape, name=f"{op.out.name}.") as idx:
            b.store(identity, acc)
            # not unrolled: LLVM would unroll a row of a few vectors whole, then vectorize the loop over
            # rows with a gather per element (a quarter of a CPU attention kernel); kept, the row's own loop
            # vectorizes with contiguous loads and one horizontal combine per row
            with em.loop(n, f"{op.out.name}.r", unroll=n < ROW_VECTORIZE_MIN) as r:
                b.store(combine(em, op.op, b.load(acc, typ=identity.type), em.value(op.x, idx + (r,)), d), acc)
            em.write(out, idx, b.load(acc, typ=identity.type))
        return
    with em.nest(op.out.shape, name=f"{op.out.name}.z") as idx:
        em.write(out, idx, identity)
    with em.nest(op.x.shape, name=f"{op.out.name}.") as idx:
        o = idx[:op.axis] + idx[op.axis + 1:]
        em.write(out, o, combine(em, op.op, em.read(out, o), em.value(op.x, idx), d))


def _dot(em: KernelEmitter, op: t.Dot) -> None:
    b, d = em.b, op.out.dtype
    m, n = op.out.shape
    k = op.a.shape[1]
    if op.out.name in em.in_place:   # accumulates into its loop's carried slot (`_in_place_dots`)
        out = em.slots[op.out.name] = em.in_place[op.out.name]
    else:
        out = em.new_slot(op.out)
        with em.nest((m, n), name=f"{op.out.name}.init") as idx:
            em.write(out, idx, em.value(op.acc, idx) if op.acc is not None else constant(d, 0.0))
    if emit_register_blocked_dot(em, op, out):
        return
    a_slot, b_slot = em.slots[op.a.name], em.slots[op.b.name]
    with em.loop(m, f"{op.out.name}.i") as i:
        with em.loop(k, f"{op.out.name}.k") as kk:
            aik = em.cast(em.read(a_slot, (i, kk)), op.a.dtype, d)
            with em.loop(n, f"{op.out.name}.j") as j:
                bkj = em.cast(em.read(b_slot, (kk, j)), op.b.dtype, d)
                cur = em.read(out, (i, j))
                em.write(out, (i, j), b.fadd(cur, b.fmul(aik, bkj, flags=("contract",)), flags=("contract",)))


def _copy(em: KernelEmitter, src: t.Value, slot: Slot) -> None:
    with em.nest(src.shape, name=f"{src.name}.cp") as idx:
        em.write(slot, idx, em.value(src, idx))


def _in_place_dots(body: t.Region, slots: list[Slot]) -> dict[str, Slot]:
    """Dots of `body` that may accumulate straight into a carried slot: ``c = dot(a, b) + arg`` yielded in
    `arg`'s place, where nothing else in the body reads `arg` (no op, view or other yield). The dot then
    neither copies `arg` into a slot of its own first nor has its result copied back after the trip: a
    plain GEMM's 128 x 128 accumulator was copied twice a chunk."""
    readers: dict[str, int] = {}

    def count(region: t.Region) -> None:   # nested loops' bodies and yields read outer values too
        for o in region.ops:
            for v in t.operands(o):
                readers[v.name] = readers.get(v.name, 0) + 1
            if isinstance(o, t.For):
                count(o.body)
        for y in region.yields:
            readers[y.name] = readers.get(y.name, 0) + 1
    count(body)
    found: dict[str, Slot] = {}
    for o in body.ops:
        if not isinstance(o, t.Dot) or o.acc is None:
            continue
        for arg, y, slot in zip(body.args, body.yields, slots):
            if o.acc.name == arg.name and y.name == o.out.name and readers.get(arg.name) == 1 \
                    and readers.get(y.name) == 1 and slot.panel is None:
                found[o.out.name] = slot
    return found


def _for(em: KernelEmitter, op: t.For) -> None:
    body = op.body
    slots = [em.new_slot(a) for a in body.args]
    for init, slot in zip(op.inits, slots):
        _copy(em, init, slot)
    em.in_place.update(_in_place_dots(body, slots))
    start = ir.Constant(I64, op.start)
    if isinstance(op.stop, int):
        stop = ir.Constant(I64, op.stop)
    else:   # a bound computed before the loop (scalars are i64 or narrower here)
        stop = em.value(op.stop, ())
        stop = em.b.sext(stop, I64) if stop.type != I64 else stop
    with counted_loop(em.b, start, stop, op.step, name=f"for.{body.iv.name}") as iv:
        with em.level():
            em.scalars[body.iv.name] = iv
            em.emit_block(body.ops)
            for y, a, slot in zip(body.yields, body.args, slots):
                if y.name != a.name and em.slots.get(y.name) is not slot:
                    _copy(em, y, slot)
    for r, slot in zip(op.results, slots):
        em.slots[r.name] = slot


STATEMENT_RULES: dict[type, StatementRule] = {
    t.Store: _store,
    t.For: _for,
    t.Reduce: _reduce,
    t.Dot: _dot,
    t.TopK: emit_topk,
    t.Permute: emit_permute,
}
