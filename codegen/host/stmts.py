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
  else ``for i, k: for j: out[i,j] += a[i,k] * b[k,j]``, both operands materialized row-major; the
  micro-kernel stores, instead of the dot, the one elementwise value computed from it (`epilogue.py`);
- for: carried values live in stack arrays; inits are copied in, each trip's yields
  (materialized first, so no yield reads a slot another already overwrote) are copied back.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ...ir import BinaryOp, DType, ReduceOp
from ...ir.errors import InternalError
from ...ir.tile import nodes as t
from ..llvm_dtypes import constant, memory_type, to_memory
from ..llvm_utils import I64, counted_loop, entry_alloca
from . import amx
from .emitter import KernelEmitter, Slot, StatementRule
from .epilogue import Epilogue, dot_epilogue
from .gemm import emit_register_blocked_dot
from .reduce_rows import emit_vector_row_reduction
from .transpose import emit_permute
from .plan import ELEMENTWISE
from .stream_prefetch import Trip, prefetch_next_trip, streamed_loads
from .rules import fenced_factor, intrinsic
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
            return b.fmul(acc, fenced_factor(em, x), flags=("reassoc",))
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
    streamed = streamed_loads(em, op.x)      # (rows of the next trip's tiles, asked for row by row)
    on_row = (lambda row: prefetch_next_trip(em, streamed, row)) if streamed else None
    if op.axis == len(op.x.shape) - 1:  # fold each row into a register (mem2reg turns the slot into a phi)
        acc = entry_alloca(b, identity.type, name=f"{op.out.name}.acc")
        with em.nest(op.out.shape, name=f"{op.out.name}.", on_row=on_row) as idx:
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
    with em.nest(op.x.shape, name=f"{op.out.name}.", on_row=on_row) as idx:
        o = idx[:op.axis] + idx[op.axis + 1:]
        em.write(out, o, combine(em, op.op, em.read(out, o), em.value(op.x, idx), d))


def _dot(em: KernelEmitter, op: t.Dot) -> None:
    b, d = em.b, op.out.dtype
    m, n = op.out.shape
    k = op.a.shape[1]
    if op.out.name in em.in_place:   # accumulates into its loop's carried slot (`_in_place_dots`)
        out, initialize = em.in_place[op.out.name]
        em.slots[op.out.name] = out
    else:
        out, initialize = em.new_slot(op.out), True
    epilogue = dot_epilogue(em, op)
    if op.acc is None and _dot_core(em, op, out, from_zero=True, epilogue=epilogue):
        _filled(em, epilogue)
        return      # (the accumulators start at 0 in registers: no pass writing zeros first)
    if initialize:
        with em.nest((m, n), name=f"{op.out.name}.init") as idx:
            em.write(out, idx, em.value(op.acc, idx) if op.acc is not None else constant(d, 0.0))
    if _dot_core(em, op, out, epilogue=epilogue):
        _filled(em, epilogue)
        return
    if epilogue is not None:            # (the loop nest stores the dot; its reader is computed as usual)
        del em.slots[epilogue.root.name]
    a_slot, b_slot = em.slots[op.a.name], em.slots[op.b.name]
    with em.loop(m, f"{op.out.name}.i") as i:
        with em.loop(k, f"{op.out.name}.k") as kk:
            aik = em.cast(em.read(a_slot, (i, kk)), op.a.dtype, d)
            with em.loop(n, f"{op.out.name}.j") as j:
                bkj = em.cast(em.read(b_slot, (kk, j)), op.b.dtype, d)
                cur = em.read(out, (i, j))
                em.write(out, (i, j), b.fadd(cur, b.fmul(aik, bkj, flags=("contract",)), flags=("contract",)))


def _dot_core(em: KernelEmitter, op: t.Dot, out: Slot, from_zero: bool = False,
              epilogue: Epilogue | None = None) -> bool:
    """The dot on AMX tiles where its values allow (`amx.py`; else, checked at run time, the micro-kernel), or
    on the micro-kernel (`gemm.py`); False where neither computes it (nothing emitted)."""
    if amx.readable(em, op, out):
        def fallback() -> None:
            if not emit_register_blocked_dot(em, op, out, from_zero=from_zero, epilogue=epilogue):
                raise InternalError(f"no FMA path for the AMX dot {op.out.name}", pass_name="codegen.host")
        amx.emit_amx_dot(em, op, out, from_zero, epilogue, fallback)
        return True
    return emit_register_blocked_dot(em, op, out, from_zero=from_zero, epilogue=epilogue)


def _filled(em: KernelEmitter, epilogue: Epilogue | None) -> None:
    """Record that the micro-kernel computed `epilogue`'s value into its slot (no pass of its own)."""
    if epilogue is not None:
        em.filled.add(epilogue.root.name)


def _copy(em: KernelEmitter, src: t.Value, slot: Slot) -> None:
    with em.nest(src.shape, name=f"{src.name}.cp") as idx:
        em.write(slot, idx, em.value(src, idx))


def pointwise_tree(em: KernelEmitter, defs: dict[str, t.Op], root: t.Value) -> set[int]:
    """The ops (by id) that compute `root`'s element at an index inline, elementwise from operands' elements at
    the same index: `root`'s defining op (in `defs`, a loop body's) and, through its operands, every
    elementwise op of `root`'s shape that is not materialized. Views end the tree (their source is read at
    other indices)."""
    tree: set[int] = set()
    todo = [root]
    while todo:
        v = todo.pop()
        o = defs.get(v.name)
        if not isinstance(o, ELEMENTWISE) or o.out.shape != root.shape or id(o) in tree \
                or (o.out.name in em.plan.materialized and o.out is not root):
            continue
        tree.add(id(o))
        todo.extend(t.operands(o))
    return tree


def _read_only_within(readers: dict[str, list[object]], defs: dict[str, t.Op], name: str, tree: set[int],
                      sink: object) -> bool:
    """Whether `name` and every value of `tree` are read only by ops of `tree` (and the tree's root by `sink`):
    then, when the root's elements are computed, nothing reads `name` afterwards, and each element of it is
    read only where the root's element at the same index is computed."""
    if any(id(r) not in tree for r in readers.get(name, ())):
        return False
    return all(id(r) in tree or r is sink for v, o in defs.items() if id(o) in tree for r in readers.get(v, ()))


def _in_place_dots(em: KernelEmitter, body: t.Region, slots: list[Slot]) -> dict[str, tuple[Slot, bool]]:
    """Dots of `body` that accumulate straight into a carried slot: ``c = dot(a, b) + acc`` yielded in `arg`'s
    place, where `acc` is `arg` or is computed elementwise from `arg` at the same index (`pointwise_tree`: a
    rescale ``arg * alpha``, ``where(d == 0, arg, arg + d * s)``) and nothing else reads `arg` or what is
    computed from it. The dot then writes its accumulator's initial value over `arg` (element by element, each
    read before it is written; not at all where `acc` is `arg`) and no copy follows the trip: a plain GEMM's
    128 x 128 accumulator was copied twice a chunk, and a fused GEMM's rescaled one once (the bool says
    whether the initial value must be written)."""
    readers = em.readers      # (kernel-wide: a value of `body` is read only in it)
    defs = {r.name: o for o in body.ops for r in t.results(o)}
    found: dict[str, tuple[Slot, bool]] = {}
    for o in body.ops:
        if not isinstance(o, t.Dot) or o.acc is None or readers.get(o.out.name) != [body]:
            continue
        for arg, y, slot in zip(body.args, body.yields, slots):
            if y.name != o.out.name or slot.panel is not None:
                continue
            if o.acc.name == arg.name and readers.get(arg.name) == [o]:
                found[o.out.name] = (slot, False)
            elif o.acc.shape == arg.shape:
                tree = pointwise_tree(em, defs, o.acc)
                if tree and _read_only_within(readers, defs, arg.name, tree, o):
                    found[o.out.name] = (slot, True)
    return found


def _for(em: KernelEmitter, op: t.For) -> None:
    body = op.body
    slots = [em.new_slot(a) for a in body.args]
    for init, slot in zip(op.inits, slots):
        _copy(em, init, slot)
    em.in_place.update(_in_place_dots(em, body, slots))
    start = ir.Constant(I64, op.start)
    if isinstance(op.stop, int):
        stop = ir.Constant(I64, op.stop)
    else:   # a bound computed before the loop (scalars are i64 or narrower here)
        stop = em.value(op.stop, ())
        stop = em.b.sext(stop, I64) if stop.type != I64 else stop
    with counted_loop(em.b, start, stop, op.step, name=f"for.{body.iv.name}") as iv:
        with em.level():
            em.scalars[body.iv.name] = iv
            em.trips.append(Trip.of(op))
            em.emit_block(body.ops)
            em.trips.pop()
            lazy = em.plan.in_place_yields
            for y, a, slot in sorted(zip(body.yields, body.args, slots), key=lambda e: e[0].name in lazy):
                if y.name != a.name and em.slots.get(y.name) is not slot:
                    _copy(em, y, slot)     # (an in-place yield last: computed from its own slot, `plan.py`)
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
