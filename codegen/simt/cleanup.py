"""`drop_unused`: remove SIMT statements whose registers nobody reads, and what only they read.

The lowering builds index arithmetic and constants on demand and folds some of
them away afterwards, so a few definitions end up unread; LLVM would delete them
too, but the printed SIMT IR (and the simulator) should not carry them. Only
side-effect-free statements go: stores, barriers, loops and ifs always stay.
"""
from __future__ import annotations

from dataclasses import replace

from ...ir.simt.nodes import (
    Binary,
    Bitcast,
    BlockIdx,
    Cast,
    Const,
    Extract,
    For,
    If,
    IntBinary,
    LaneId,
    LdMatrix,
    LoadGlobal,
    LoadShared,
    Mma,
    Pack,
    Select,
    Shuffle,
    SimtKernel,
    Stmt,
    ThreadIdx,
    Unary,
    WarpId,
    uses,
    walk_stmts,
)

_PURE = (Const, Unary, Binary, IntBinary, Select, Cast, Bitcast, Pack, Extract, ThreadIdx, LaneId, WarpId, BlockIdx,
         LoadGlobal, LoadShared, LdMatrix, Shuffle, Mma)


def _dead(stmts: tuple[Stmt, ...]) -> set[int]:
    """The ids of the side-effect-free statements whose results nobody reads, once the dead ones' own reads
    are gone too: one sweep, from the last statement back, over read counts (SSA: a statement's readers come
    after it, and loop-carried values pass through yields, which count as reads and always stay)."""
    reads: dict[str, int] = {}
    order = list(walk_stmts(stmts))
    for s in order:
        for r in uses(s):
            reads[r.name] = reads.get(r.name, 0) + 1
        if isinstance(s, For):
            regions = (s.body,)
        elif isinstance(s, If):
            regions = (s.then, s.orelse)
        else:
            continue
        for region in regions:
            for y in region.yields:
                reads[y.name] = reads.get(y.name, 0) + 1
    dead: set[int] = set()
    for s in reversed(order):
        if isinstance(s, _PURE) and not reads.get(s.out.name):
            dead.add(id(s))
            for r in uses(s):
                reads[r.name] -= 1
    return dead


def _drop(stmts: tuple[Stmt, ...], dead: set[int]) -> tuple[Stmt, ...]:
    out = []
    for s in stmts:
        if id(s) in dead:
            continue
        if isinstance(s, For):
            s = replace(s, body=replace(s.body, stmts=_drop(s.body.stmts, dead)))
        elif isinstance(s, If):
            s = replace(s, then=replace(s.then, stmts=_drop(s.then.stmts, dead)),
                        orelse=replace(s.orelse, stmts=_drop(s.orelse.stmts, dead)))
        out.append(s)
    return tuple(out)


def drop_unused(kernel: SimtKernel) -> SimtKernel:
    """`kernel` without unread side-effect-free statements (`kernel` itself when there are none)."""
    dead = _dead(kernel.body)
    return replace(kernel, body=_drop(kernel.body, dead)) if dead else kernel
