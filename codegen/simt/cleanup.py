"""`drop_unused`: remove SIMT statements whose registers nobody reads (repeated until none is left).

The lowering builds index arithmetic and constants on demand and folds some of
them away afterwards, so a few definitions end up unread; LLVM would delete them
too, but the printed SIMT IR (and the simulator) should not carry them. Only
side-effect-free statements go: stores, barriers, loops and ifs always stay.
"""
from __future__ import annotations

from dataclasses import replace

from ...ir.simt import (
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


def _used(stmts: tuple[Stmt, ...]) -> set[str]:
    names: set[str] = set()
    for s in walk_stmts(stmts):
        names |= {r.name for r in uses(s)}
        if isinstance(s, For):
            names |= {y.name for y in s.body.yields}
        elif isinstance(s, If):
            names |= {y.name for y in s.then.yields + s.orelse.yields}
    return names


def _drop(stmts: tuple[Stmt, ...], used: set[str]) -> tuple[Stmt, ...]:
    out = []
    for s in stmts:
        if isinstance(s, _PURE) and s.out.name not in used:
            continue
        if isinstance(s, For):
            s = replace(s, body=replace(s.body, stmts=_drop(s.body.stmts, used)))
        elif isinstance(s, If):
            s = replace(s, then=replace(s.then, stmts=_drop(s.then.stmts, used)),
                        orelse=replace(s.orelse, stmts=_drop(s.orelse.stmts, used)))
        out.append(s)
    return tuple(out)


def drop_unused(kernel: SimtKernel) -> SimtKernel:
    """`kernel` without unread side-effect-free statements."""
    body = kernel.body
    count = sum(1 for _ in walk_stmts(body))
    while True:
        body = _drop(body, _used(body))
        left = sum(1 for _ in walk_stmts(body))
        if left == count:
            return replace(kernel, body=body)
        count = left
