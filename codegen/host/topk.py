"""Host code for the Tile IR `TopK` op: insertion into a sorted k-list held in registers.

For every position outside the ranked axis, the k-list starts as the `acc` list
(or k empty slots), then each candidate along the axis is compared with the
list's last (worst) entry; only a candidate that beats it enters, by one pass of
k comparisons and selects that shift the worse entries down (no branches inside,
so the k slots stay in registers: they are entry-block allocas that mem2reg
promotes). Blocks of `SCREEN` candidates are screened first: only a block holding
one not below the worst entry (unordered: NaN, or an empty worst slot) is inserted
candidate by candidate.

Where there are at least a vector's lanes of rows (`row_lanes`: along the last dim other than the ranked
one, e.g. MoE routing's tokens), each group of that many rows keeps its lists in the lanes of k value
vectors and k index vectors, and each candidate column, gathered across the rows, is screened by one
vector compare and shifted in by the same selects (`_rows_as_lanes`): a short row's insertions are
dependent steps, rows side by side are not. The rows left over go one at a time as above.

The order is exactly `redfuser.ir.topk`'s:

    class(v, i) = 0 if i < 0 (empty) else 1 if v is NaN else 2
    c beats e  <=>  class(c) > class(e)
                    or (class(c) == class(e) != 0 and (c.v > e.v or (c.v ~= e.v and c.i < e.i)))

where ``~=`` is "equal or unordered" (two NaNs tie and go by index; -0.0 ties
with 0.0 like numpy's sort). Indices are compared as i64. Empty slots are written
out as (NaN, -1) whatever value they carried.
"""
from __future__ import annotations

import math

import llvmlite.ir as ir

from ...ir.tile import nodes as t
from ...ir.types import float32, float64
from ..llvm_utils import I8, I32, I64, entry_alloca
from ..llvm_dtypes import register_type
from .blocking import vector_registers
from .emitter import KernelEmitter, Slot

SCREEN = 16
"""Candidates screened at once: a block whose every candidate is below the list's worst entry (the
common case once the list is full: top-2 of 64 random values inserts about 7 times) is passed over with
16 independent compares, instead of 16 dependent insertion steps (top-2 of 64 with the per-candidate
precheck: 4.6 -> 3.5 ns a candidate)."""


def _const(like: ir.Value, ty: ir.Type, value: object) -> ir.Constant:
    """`value` of type `ty`, splatted to `like`'s lanes where `like` is a vector."""
    if isinstance(like.type, ir.VectorType):
        return ir.Constant(ir.VectorType(ty, like.type.count), [value] * like.type.count)
    return ir.Constant(ty, value)


def _class(b: ir.IRBuilder, v: ir.Value, i: ir.Value) -> ir.Value:
    number = b.select(b.fcmp_unordered("uno", v, v), _const(v, I8, 1), _const(v, I8, 2))
    return b.select(b.icmp_signed("<", i, _const(i, I64, 0)), _const(v, I8, 0), number)


def beats(b: ir.IRBuilder, cv: ir.Value, ci: ir.Value, c_cls: ir.Value, ev: ir.Value, ei: ir.Value) -> ir.Value:
    """Whether candidate (cv, ci) of class `c_cls` comes before entry (ev, ei) in top-k order (an i1, or a
    vector of them lane by lane where the operands are vectors)."""
    e_cls = _class(b, ev, ei)
    higher = b.icmp_unsigned(">", c_cls, e_cls)
    same = b.and_(b.icmp_unsigned("==", c_cls, e_cls), b.icmp_unsigned("!=", c_cls, _const(c_cls, I8, 0)))
    tie = b.and_(b.fcmp_unordered("==", cv, ev), b.icmp_signed("<", ci, ei))
    return b.or_(higher, b.and_(same, b.or_(b.fcmp_ordered(">", cv, ev), tie)))


def _shift_in(b: ir.IRBuilder, lv: list, li: list, cv: ir.Value, ci: ir.Value, c_cls: ir.Value) -> None:
    """Insert the candidate into the sorted list held in `lv`/`li` (allocas of `cv`'s and `ci`'s types):
    slot j stays, takes the candidate, or takes its upper neighbour, by selects only (lane by lane for
    vectors); a candidate that beats no entry leaves the list as it was."""
    vs = [b.load(p, typ=cv.type) for p in lv]
    ix = [b.load(p, typ=ci.type) for p in li]
    wins = [beats(b, cv, ci, c_cls, vs[j], ix[j]) for j in range(len(lv))]
    for j in range(len(lv)):
        new_v, new_i = cv, ci
        if j:
            new_v, new_i = b.select(wins[j - 1], vs[j - 1], cv), b.select(wins[j - 1], ix[j - 1], ci)
        b.store(b.select(wins[j], new_v, vs[j]), lv[j])
        b.store(b.select(wins[j], new_i, ix[j]), li[j])


def emit_topk(em: KernelEmitter, op: t.TopK) -> None:
    """Fill the stack arrays of `op.out` and `op.out_indices` (see the module docstring)."""
    b = em.b
    vty = register_type(op.x.dtype)
    out_v, out_i = em.new_slot(op.out), em.new_slot(op.out_indices)
    lv = [entry_alloca(b, vty, name=f"{op.out.name}.v{j}") for j in range(op.k)]
    li = [entry_alloca(b, I64, name=f"{op.out.name}.i{j}") for j in range(op.k)]
    outer = op.x.shape[:op.axis] + op.x.shape[op.axis + 1:]
    lanes = row_lanes(op)
    if lanes:   # groups of `lanes` rows along the last outer dim as vectors, the rest row by row
        groups, rest = divmod(outer[-1], lanes)
        with em.nest(outer[:-1], name=f"{op.out.name}.o") as pre:
            with em.loop(groups, f"{op.out.name}.g") as g:
                _rows_as_lanes(em, op, pre, b.mul(g, ir.Constant(I64, lanes)), lanes, out_v, out_i)
            if rest:
                with em.loop(rest, f"{op.out.name}.r") as r:
                    _one_row(em, op, pre + (b.add(r, ir.Constant(I64, groups * lanes)),), lv, li, out_v, out_i)
        return
    with em.nest(outer, name=f"{op.out.name}.o") as o:
        _one_row(em, op, o, lv, li, out_v, out_i)


def _one_row(em: KernelEmitter, op: t.TopK, o: tuple[ir.Value, ...], lv: list, li: list, out_v: Slot,
             out_i: Slot) -> None:
    """The top-k of the candidates at outer position `o`, by screened insertion (the module docstring)."""
    b = em.b
    k, n, axis = op.k, op.x.shape[op.axis], op.axis
    vty = register_type(op.x.dtype)
    nan, none = ir.Constant(vty, math.nan), ir.Constant(I64, -1)

    def at(j: ir.Value) -> tuple[ir.Value, ...]:
        return o[:axis] + (j,) + o[axis:]

    for j in range(k):
        if op.acc is not None:
            pos = at(ir.Constant(I64, j))
            b.store(em.value(op.acc, pos), lv[j])
            b.store(em.wide(op.acc_indices, pos), li[j])
        else:
            b.store(nan, lv[j])
            b.store(none, li[j])

    def threshold() -> ir.Value:
        """The worst entry's value, NaN where it is empty: a candidate below it (ordered) cannot enter."""
        worst_i = b.load(li[-1], typ=I64)
        return b.select(b.icmp_signed("<", worst_i, ir.Constant(I64, 0)), nan, b.load(lv[-1], typ=vty))

    def insert(c: ir.Value) -> None:
        cv = em.value(op.x, at(c))
        with b.if_then(b.fcmp_unordered(">=", cv, threshold())), em.level():   # (values made here stay here)
            ci = em.wide(op.indices, at(c))
            c_cls = _class(b, cv, ci)
            worst = beats(b, cv, ci, c_cls, b.load(lv[-1], typ=vty), b.load(li[-1], typ=I64))
            with b.if_then(worst):
                _shift_in(b, lv, li, cv, ci, c_cls)

    blocks, tail = divmod(n, SCREEN) if n >= 2 * SCREEN else (0, n)
    if blocks:
        with em.loop(blocks, f"{op.out.name}.blk") as blk:
            base = b.mul(blk, ir.Constant(I64, SCREEN))
            # the screen: no candidate of the block is >= the worst entry (NaN: an empty one), so none beats it
            bar = threshold()
            hit = None
            for j in range(SCREEN):
                ge = b.fcmp_unordered(">=", em.value(op.x, at(b.add(base, ir.Constant(I64, j)))), bar)
                hit = ge if hit is None else b.or_(hit, ge)
            with b.if_then(hit):
                with em.loop(SCREEN, f"{op.out.name}.c") as j:
                    insert(b.add(base, j))
    if tail:
        with em.loop(tail, f"{op.out.name}.t") as j:
            insert(b.add(ir.Constant(I64, blocks * SCREEN), j) if blocks else j)
    for j in range(k):
        _write_entry(em, op, out_v, out_i, at(ir.Constant(I64, j)), b.load(lv[j], typ=vty), b.load(li[j], typ=I64))


def _write_entry(em: KernelEmitter, op: t.TopK, out_v: Slot, out_i: Slot, pos: tuple[ir.Value, ...],
                 v: ir.Value, i: ir.Value) -> None:
    """Store one finished list entry (value `v`, i64 index `i`) at `pos`: an empty slot as (NaN, -1)."""
    b = em.b
    empty = b.icmp_signed("<", i, ir.Constant(I64, 0))
    em.write(out_v, pos, b.select(empty, ir.Constant(register_type(op.x.dtype), math.nan), v))
    i = b.select(empty, ir.Constant(I64, -1), i)
    ity = register_type(op.out_indices.dtype)
    em.write(out_i, pos, b.trunc(i, ity) if ity != I64 else i)


def row_lanes(op: t.TopK) -> int:
    """Rows (along the last dim other than the ranked one) whose top-k lists are kept in the lanes of one
    vector each, or 0 (row by row): float candidates with at least that many rows."""
    if op.x.dtype not in (float32, float64) or len(op.x.shape) < 2:
        return 0
    lanes = vector_registers()[0] // op.x.dtype.itemsize
    outer = op.x.shape[:op.axis] + op.x.shape[op.axis + 1:]
    return lanes if outer[-1] >= lanes else 0


def _rows_as_lanes(em: KernelEmitter, op: t.TopK, pre: tuple[ir.Value, ...], row0: ir.Value, lanes: int,
                   out_v: Slot, out_i: Slot) -> None:
    """The top-k of rows ``row0 .. row0 + lanes`` (last outer dim) at once: lane ``l`` of each list vector is
    row ``row0 + l``'s entry. Each candidate column is gathered across the rows and shifted in by the same
    selects as a single row's (`_shift_in`), after one vector compare against the worst entries lets a
    column that no row takes pass (no branch per row: rows vectorize where the candidates are short)."""
    b = em.b
    k, n, axis = op.k, op.x.shape[op.axis], op.axis
    vvec, ivec = ir.VectorType(register_type(op.x.dtype), lanes), ir.VectorType(I64, lanes)
    lv = [entry_alloca(b, vvec, name=f"{op.out.name}.lv{j}") for j in range(k)]
    li = [entry_alloca(b, ivec, name=f"{op.out.name}.li{j}") for j in range(k)]
    rows = [row0 if l == 0 else b.add(row0, ir.Constant(I64, l), flags=("nsw", "nuw")) for l in range(lanes)]

    def at(l: int, j: ir.Value) -> tuple[ir.Value, ...]:
        o = pre + (rows[l],)
        return o[:axis] + (j,) + o[axis:]

    def gather(read, j: ir.Value, ty: ir.Type) -> ir.Value:
        vec: ir.Value = ir.Constant(ty, ir.Undefined)
        for l in range(lanes):
            vec = b.insert_element(vec, read(at(l, j)), ir.Constant(I32, l))
        return vec

    nan_v, none_v = ir.Constant(vvec, [math.nan] * lanes), ir.Constant(ivec, [-1] * lanes)
    for j in range(k):
        if op.acc is not None:
            pos = ir.Constant(I64, j)
            b.store(gather(lambda p: em.value(op.acc, p), pos, vvec), lv[j])
            b.store(gather(lambda p: em.wide(op.acc_indices, p), pos, ivec), li[j])
        else:
            b.store(nan_v, lv[j])
            b.store(none_v, li[j])
    with em.loop(n, f"{op.out.name}.c") as c:
        cv = gather(lambda p: em.value(op.x, p), c, vvec)
        worst_i = b.load(li[-1], typ=ivec)
        bar = b.select(b.icmp_signed("<", worst_i, _const(worst_i, I64, 0)), nan_v, b.load(lv[-1], typ=vvec))
        hit = b.bitcast(b.fcmp_unordered(">=", cv, bar), ir.IntType(lanes))
        with b.if_then(b.icmp_unsigned("!=", hit, ir.Constant(ir.IntType(lanes), 0))), em.level():
            ci = gather(lambda p: em.wide(op.indices, p), c, ivec)
            _shift_in(b, lv, li, cv, ci, _class(b, cv, ci))
    for j in range(k):
        vs, ix = b.load(lv[j], typ=vvec), b.load(li[j], typ=ivec)
        for l in range(lanes):
            lane = ir.Constant(I32, l)
            _write_entry(em, op, out_v, out_i, at(l, ir.Constant(I64, j)), b.extract_element(vs, lane),
                         b.extract_element(ix, lane))
