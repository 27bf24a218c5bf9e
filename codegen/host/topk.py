"""Host code for the Tile IR `TopK` op: insertion into a sorted k-list held in registers.

For every position outside the ranked axis, the k-list starts as the `acc` list
(or k empty slots), then each candidate along the axis is compared with the
list's last (worst) entry; only a candidate that beats it enters, by one pass of
k comparisons and selects that shift the worse entries down (no branches inside,
so the k slots stay in registers: they are entry-block allocas that mem2reg
promotes). Blocks of `SCREEN` candidates are screened first: only a block holding
one not below the worst entry (unordered: NaN, or an empty worst slot) is inserted
candidate by candidate. The order is exactly `redfuser.ir.topk`'s:

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
from ..llvm_utils import I1, I8, I64, entry_alloca
from ..llvm_dtypes import register_type
from .emitter import KernelEmitter

SCREEN = 16
"""Candidates screened at once: a block whose every candidate is below the list's worst entry (the
common case once the list is full: top-2 of 64 random values inserts about 7 times) is passed over with
16 independent compares, instead of 16 dependent insertion steps (top-2 of 64 with the per-candidate
precheck: 4.6 -> 3.5 ns a candidate)."""


def _class(b: ir.IRBuilder, v: ir.Value, i: ir.Value) -> ir.Value:
    number = b.select(b.fcmp_unordered("uno", v, v), ir.Constant(I8, 1), ir.Constant(I8, 2))
    return b.select(b.icmp_signed("<", i, ir.Constant(I64, 0)), ir.Constant(I8, 0), number)


def beats(b: ir.IRBuilder, cv: ir.Value, ci: ir.Value, c_cls: ir.Value, ev: ir.Value, ei: ir.Value) -> ir.Value:
    """Whether candidate (cv, ci) of class `c_cls` comes before entry (ev, ei) in top-k order (an i1)."""
    e_cls = _class(b, ev, ei)
    higher = b.icmp_unsigned(">", c_cls, e_cls)
    same = b.and_(b.icmp_unsigned("==", c_cls, e_cls), b.icmp_unsigned("!=", c_cls, ir.Constant(I8, 0)))
    tie = b.and_(b.fcmp_unordered("==", cv, ev), b.icmp_signed("<", ci, ei))
    return b.or_(higher, b.and_(same, b.or_(b.fcmp_ordered(">", cv, ev), tie)))


def emit_topk(em: KernelEmitter, op: t.TopK) -> None:
    """Fill the stack arrays of `op.out` and `op.out_indices` (see the module docstring)."""
    b = em.b
    k, n, axis = op.k, op.x.shape[op.axis], op.axis
    vty = register_type(op.x.dtype)
    out_v, out_i = em.new_slot(op.out), em.new_slot(op.out_indices)
    lv = [entry_alloca(b, vty, name=f"{op.out.name}.v{j}") for j in range(k)]
    li = [entry_alloca(b, I64, name=f"{op.out.name}.i{j}") for j in range(k)]
    nan, none = ir.Constant(vty, math.nan), ir.Constant(I64, -1)
    outer = op.x.shape[:axis] + op.x.shape[axis + 1:]
    with em.nest(outer, name=f"{op.out.name}.o") as o:
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
                    enter(cv, ci, c_cls)

        def enter(cv: ir.Value, ci: ir.Value, c_cls: ir.Value) -> None:
            vs = [b.load(p, typ=vty) for p in lv]
            ix = [b.load(p, typ=I64) for p in li]
            wins = [beats(b, cv, ci, c_cls, vs[j], ix[j]) for j in range(k - 1)] + [ir.Constant(I1, 1)]
            for j in range(k):  # slot j stays, takes the candidate, or takes its upper neighbour
                new_v, new_i = cv, ci
                if j:
                    new_v, new_i = b.select(wins[j - 1], vs[j - 1], cv), b.select(wins[j - 1], ix[j - 1], ci)
                b.store(b.select(wins[j], new_v, vs[j]), lv[j])
                b.store(b.select(wins[j], new_i, ix[j]), li[j])

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
        ity = register_type(op.out_indices.dtype)
        for j in range(k):
            pos = at(ir.Constant(I64, j))
            v, i = b.load(lv[j], typ=vty), b.load(li[j], typ=I64)
            empty = b.icmp_signed("<", i, ir.Constant(I64, 0))
            em.write(out_v, pos, b.select(empty, nan, v))
            i = b.select(empty, none, i)
            em.write(out_i, pos, b.trunc(i, ity) if ity != I64 else i)
