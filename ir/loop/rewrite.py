"""Generic, structure-preserving rewrites of Loop IR expressions and statements."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from .expr import Binary, Cast, Computed, Const, Expr, Load, Select, Unary
from .expr import walk as walk_expr
from ..buffer import Buffer
from ..semantics import ROUNDING, BinaryOp, ReduceOp, UnaryOp
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
    def keep_rounding(n: Expr) -> Expr | None:
        # a cast out of a storage-only type of a value computed in it rounds that value first, as numpy does and
        # as the compiled kernels do (`decided` reads a cast's operand): widened, the cast alone would be f32 to
        # f32, and the interpreter's fused term of ``(xb * 0.3).astype(f32)`` (bf16 xb) lost the rounding
        if (isinstance(n, Cast) and n.x.dtype.storage_only and n.x.dtype != n.dtype
                and isinstance(n.x, Unary | Binary | Select)):
            return replace(n, x=Cast(n.x, n.x.dtype))
        return None

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
    return map_expr(map_expr(e, keep_rounding), widen)


def decided(e: Expr, unrounded: frozenset[str] | set[str], extrema: frozenset[str] | set[str]) -> Expr:
    """`e`, the operand of a decision (a comparison, a rounding to an integral value or a cast), as the reference
    rounds it where it computes in a storage-only type (f16, bf16, e4m3): a decision jumps where its operand
    crosses a threshold, so the f32 value the kernels otherwise keep can land on the other side. `rounded`
    after every operation; a finished result held in f32 (`unrounded`: a fused loop's 16-bit sum, max or min, an
    epilogue value) read as its buffer holds it where it is the operand itself; and a max or min (`extrema`)
    rounded wherever the operand reads it, so that ``floor(y - max(y))`` is numpy's ``floor(f16(y) - f16(m))``
    (a max of rounded values is the rounded max). Inside an operand a sum keeps its f32 value, as every step's
    arithmetic does (the two sides of a softmax's one-hot ``p == max(p)`` divide by the same ``l``)."""
    if not e.dtype.storage_only:
        return e
    if isinstance(e, Load) and e.buffer.name in unrounded:
        return Cast(e, e.dtype)
    if extrema:
        e = map_expr(e, lambda n: Cast(n, n.dtype) if isinstance(n, Load) and n.buffer.name in extrema else None)
    return rounded(e)


def compared_branch(e: Select, branch: Expr, extrema: frozenset[str] | set[str] = frozenset()) -> bool:
    """Whether `branch` of `e` is a value its condition compares (through ``&``, ``|`` and ``~``), which a
    kernel computing in f32 returns as the comparison saw it (`decided`): bf16 ``sign(y - max(y))`` takes its
    ±0 branch where the rounded ``y`` is the max, and returned the f32 difference there (-0.047 for numpy's
    0). A fused loop's finished max or min (`extrema`) is not: the loop's terms used its f32 value."""
    if not branch.dtype.storage_only or (isinstance(branch, Load) and branch.buffer.name in extrema):
        return False
    return branch in _compared_operands(e.cond)


def _compared_operands(cond: Expr) -> tuple[Expr, ...]:
    """The storage-only operands of the comparisons `cond` is made of (through ``&``, ``|`` and ``~``)."""
    if isinstance(cond, Binary) and cond.op.is_comparison:
        return tuple(v for v in (cond.a, cond.b) if v.dtype.storage_only)
    if isinstance(cond, Binary) and cond.op in (BinaryOp.AND, BinaryOp.OR):
        return _compared_operands(cond.a) + _compared_operands(cond.b)
    if isinstance(cond, Unary) and cond.op is UnaryOp.NOT:
        return _compared_operands(cond.x)
    return ()


def ranked_key(e: Expr, results: frozenset[str] | set[str], extrema: frozenset[str] | set[str]) -> Expr:
    """`e`, the values a top-k (argmax, argmin) ranks, rounded where numpy rounds them so that it ties where
    numpy's do (a ranking decides): f16 ``exp(12 - x)`` of ``[2.002, 2.0]`` ties in numpy, whose ``12 - x``
    rounds both to 10, and the f32 chain rounded once ranked the second first (found by a helper). Where `e`
    reads results of earlier statements (`results`: a softmax's ``e / l`` after its loop), only the steps
    from them on are rounded (each max or min of `extrema` read rounded, as `decided` reads it): the values
    below them are the ones the loop summed, and rounding a computed ``x = logits * 1.5`` by half a bf16 ulp
    of ``x`` where the sum ``l`` used the f32 ``x`` put probabilities at 1.56; rounding ``x - m`` moves an
    exponential by a part of it that is small where the probability is not."""
    if not e.dtype.storage_only:
        return e

    def reads_result(n: Expr) -> bool:
        return any(isinstance(v, Load) and v.buffer.name in results for v in walk_expr(n))

    if not reads_result(e):
        return rounded(e)

    def round_(n: Expr) -> Expr | None:
        if isinstance(n, Load) and n.buffer.name in extrema:
            return Cast(n, n.dtype)
        if n.dtype.storage_only and isinstance(n, Unary | Binary | Select) and reads_result(n):
            return Cast(n, n.dtype)
        return None
    return map_expr(e, round_)


def numpy_values(term: Expr, computed: frozenset[str] = frozenset()) -> Expr:
    """`term` as numpy computes it in its storage-only type: `rounded` after every operation, and each load of a
    buffer the kernel holds in f32 though its type is narrower (`computed`: a fused loop's locals) rounded."""
    def load(n: Expr) -> Expr | None:
        if isinstance(n, Load) and n.buffer.name in computed and n.dtype.storage_only:
            return Cast(n, n.dtype)
        return None
    return rounded(map_expr(term, load) if computed else term)


def read_as_held(e: Expr, held: frozenset[str], extrema: frozenset[str] = frozenset(),
                 ranked: bool = False) -> Expr:
    """`e` evaluated as the compiled kernels evaluate a statement reading `held` results (16-bit sums, maxima
    and minima a fused loop finished in f32, which a kernel keeps in f32 after its loop; `extrema` the maxima
    and minima among them): in f32 (`widened`), each held result read as it is where arithmetic reads it, and
    each decision's operand as `decided` says; `ranked`: `e` is a top-k's values, which are a decision's operand
    as a whole, as `schedule.topk.ranked_values` ranks them."""
    out = decisions_decided(e, held, extrema)
    return widened(ranked_key(out, held, extrema) if ranked else out, held)


def decisions_decided(e: Expr, held: frozenset[str] | set[str] = frozenset(),
                      extrema: frozenset[str] | set[str] = frozenset()) -> Expr:
    """`e` with each decision's operand (`map_decision_operands`), and each one nested in it, as `decided`
    rounds it: what the compiled kernels compute where they compute the rest in f32."""
    def decide(v: Expr) -> Expr:
        return decided(map_decision_operands(v, decide, extrema), held, extrema)

    return map_decision_operands(e, decide, extrema)


def map_decision_operands(e: Expr, decide: Callable[[Expr], Expr], extrema: frozenset[str] | set[str],
                          but_infinities: bool = False) -> Expr:
    """`e` with `decide(operand)` in place of each decision's operand as written: a comparison's, a rounding's
    to an integral value, a cast's, a select's branch its condition compares (`compared_branch`, `extrema` the
    running maxima and minima, which are not); the rest kept. Top-down, so that a select's branches are
    matched with its condition as written; `decide` recurses into its operand itself where it needs to. With
    `but_infinities`, a comparison with an infinity (the NaN guard ``m == -inf``, alike for every rounding of
    ``m``) is no decision."""
    def infinite(v: Expr) -> bool:
        return isinstance(v, Const) and isinstance(v.value, float) and not np.isfinite(v.value)

    def go(n: Expr) -> Expr:
        if isinstance(n, Binary) and n.op.is_comparison and not (but_infinities and (infinite(n.a) or infinite(n.b))):
            return replace(n, a=decide(n.a), b=decide(n.b))
        if (isinstance(n, Unary) and n.op in ROUNDING) or (isinstance(n, Cast) and n.x.dtype != n.dtype):
            return replace(n, x=decide(n.x))
        if isinstance(n, Unary | Cast):
            return replace(n, x=go(n.x))
        if isinstance(n, Binary):
            return replace(n, a=go(n.a), b=go(n.b))
        if isinstance(n, Select):
            a, b = (decide(v) if compared_branch(n, v, extrema) else go(v) for v in (n.a, n.b))
            return replace(n, cond=go(n.cond), a=a, b=b)
        return n
    return go(e)


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


def reads(s: Stmt) -> set[str]:
    """Names of the buffers a statement reads (a fused loop's own locals and states too)."""
    if isinstance(s, FusedLoop):
        exprs = [l.value for l in s.locals] + [e for st in s.states for e in state_exprs(st)]
    else:
        exprs = [s.value]
    return {n.buffer.name for e in exprs for n in walk_expr(e) if isinstance(n, Load)}


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


__all__ = ["carried_in_f32", "decisions_decided", "in_work_precision", "map_expr", "map_state_exprs", "rename_buffers", "state_exprs",
           "Compute", "Reduce"]
