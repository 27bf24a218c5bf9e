"""Generic, structure-preserving rewrites of Loop IR expressions and statements."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from .expr import Binary, Cast, Computed, Const, Expr, Load, Select, Unary
from ..buffer import Buffer
from ..types import float32
from .nodes import Compute, FusedLoop, OnlineState, Program, Reduce, Stmt, TopK, TopKState


def map_expr(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild `e` bottom-up; `fn(node)` returns a replacement or None to keep the node (a load's computed
    positions are its children: rebuilt first)."""
    if isinstance(e, Load) and any(isinstance(i, Computed) for i in e.indices):
        indices = tuple(Computed(map_expr(i.value, fn)) if isinstance(i, Computed) else i for i in e.indices)
        e = e if indices == e.indices else Load(e.buffer, indices)
    elif isinstance(e, Unary | Cast):
        x = map_expr(e.x, fn)
        e = e if x is e.x else replace(e, x=x)
    elif isinstance(e, Binary):
        a, b = map_expr(e.a, fn), map_expr(e.b, fn)
        e = e if (a is e.a and b is e.b) else replace(e, a=a, b=b)
    elif isinstance(e, Select):
        c, a, b = map_expr(e.cond, fn), map_expr(e.a, fn), map_expr(e.b, fn)
        e = e if (c is e.cond and a is e.a and b is e.b) else replace(e, cond=c, a=a, b=b)
    out = fn(e)
    return e if out is None else out


def widened(e: Expr, f32_buffers: frozenset[str] = frozenset()) -> Expr:
    """`e` computed in f32 wherever it computes in a storage-only type (f16, bf16, e4m3): such loads are cast
    to f32 and such arithmetic, selects and constants become f32; casts are kept (they are rounding points
    the program asked for). This is how the compiled kernels evaluate a fused loop's terms (the schedule
    widens every operand), and how the interpreter evaluates the terms it made itself. Loads of
    `f32_buffers` (a fused loop's states carried in f32, whose declared type is narrower) are left as they
    are: their values are f32 already, and a cast would read as a rounding to the declared type first."""
    def widen(n: Expr) -> Expr | None:
        if not n.dtype.storage_only:
            return None
        if isinstance(n, Load):
            return None if n.buffer.name in f32_buffers else Cast(n, float32)
        if isinstance(n, Const):
            # the constant's value in its own type first: numpy rounds a weak Python scalar to f16 before
            # it multiplies (``x * 0.3`` of f16 is ``x * 0.30005``), and so do the compiled kernels
            return Const(float(np.asarray(n.value, n.dtype.numpy)), float32)
        if isinstance(n, Unary | Binary | Select):
            return replace(n, dtype=float32)
        return None
    return map_expr(e, widen)


def carried_in_f32(s: FusedLoop) -> frozenset[str]:
    """The names of `s`'s state buffers (`acc` and `prev`) that the loop carries in f32 while their declared
    type is narrower (`OnlineState.carried_dtype`)."""
    return frozenset(name for st in s.states if isinstance(st, OnlineState) and st.carried_dtype != st.acc.dtype
                     for name in (st.acc.name, st.prev.name))


def in_work_precision(st: OnlineState, f32_buffers: frozenset[str] = frozenset()) -> OnlineState:
    """`st` with its term, rescale and carry `widened` where the loop carries it in f32
    (`OnlineState.carried_dtype`): terms that fusion made and numpy never computes, such as exp(2*x - 2*m)
    for a squared softmax, would overflow 16 bits where x - m does not. `f32_buffers`: as for `widened`."""
    if st.carried_dtype == st.acc.dtype:
        return st
    def w(e: Expr | None) -> Expr | None:
        return None if e is None else widened(e, f32_buffers)
    return replace(st, term=widened(st.term, f32_buffers), rescale=w(st.rescale), carry=w(st.carry))


def rounded(e: Expr) -> Expr:
    """`e` rounded to its storage-only type (f16, bf16, e4m3) after every operation computing in one, as the
    reference (numpy, in that type) rounds it: an explicit cast after each such arithmetic or select, which
    the compiled kernels, computing in f32 (`widened`), keep as a rounding point. For the few expressions
    that must see what the reference sees (where a narrow value underflows to 0 or overflows), not for a
    loop's terms."""
    def round_(n: Expr) -> Expr | None:
        if n.dtype.storage_only and isinstance(n, Unary | Binary | Select):
            return Cast(n, n.dtype)
        return None
    return map_expr(e, round_)


def state_exprs(st: OnlineState | TopKState) -> list[Expr]:
    """The expressions a state computes per chunk: its term, and its rescale and (an `OnlineState`'s) carry
    where it has them (the ones `map_state_exprs` maps)."""
    return [e for e in (st.term, st.rescale, getattr(st, "carry", None)) if e is not None]


def map_state_exprs(st: OnlineState | TopKState, fn: Callable[[Expr], Expr | None]) -> OnlineState | TopKState:
    """`st` with `map_expr(., fn)` applied to each of its expressions: term, rescale and (an `OnlineState`'s)
    carry."""
    st = replace(st, term=map_expr(st.term, fn), rescale=None if st.rescale is None else map_expr(st.rescale, fn))
    if isinstance(st, OnlineState) and st.carry is not None:
        st = replace(st, carry=map_expr(st.carry, fn))
    return st


def rename_buffers(p: Program, names: dict[str, str], program_name: str | None = None) -> Program:
    """`p` with buffers renamed by `names` (old name -> new name); others keep theirs."""
    new: dict[str, Buffer] = {}

    def buf(b: Buffer) -> Buffer:
        if b.name not in new:
            new[b.name] = Buffer(names.get(b.name, b.name), b.type)
        return new[b.name]

    def fix(e: Expr) -> Expr | None:
        return Load(buf(e.buffer), e.indices) if isinstance(e, Load) else None

    def state(st: OnlineState | TopKState) -> OnlineState | TopKState:
        st = map_state_exprs(replace(st, acc=buf(st.acc), prev=buf(st.prev)), fix)
        return replace(st, indices=buf(st.indices)) if isinstance(st, TopKState) else st

    def stmt(s: Stmt) -> Stmt:
        if isinstance(s, FusedLoop):
            return replace(s, locals=tuple(stmt(l) for l in s.locals), states=tuple(state(st) for st in s.states))
        if isinstance(s, TopK):
            return replace(s, values=buf(s.values), indices=buf(s.indices), value=map_expr(s.value, fix))
        return replace(s, out=buf(s.out), value=map_expr(s.value, fix))

    return Program(
        name=program_name or p.name,
        inputs=tuple(buf(b) for b in p.inputs),
        outputs=tuple(buf(b) for b in p.outputs),
        body=tuple(stmt(s) for s in p.body),
    )


__all__ = ["carried_in_f32", "in_work_precision", "map_expr", "map_state_exprs", "rename_buffers", "state_exprs",
           "Compute", "Reduce"]
