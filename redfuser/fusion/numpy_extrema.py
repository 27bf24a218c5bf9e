"""Pass `compute_extrema_as_numpy`: a 16-bit max or min, and the values that meet it, computed as numpy does.

A fused loop computes f16/bf16 values in f32 and rounds once where it stores (`OnlineState.carried_dtype`);
numpy rounds after every operation. Where a max ``m`` of values ``y`` the program computes (``x * 0.75``,
``tanh(x) * 30``, ``a - b``, ``x - mean(x)``, an f16 ``q @ k.T``) meets ``y`` again, the two roundings part:

- a decision after the loop compared numpy's ``y`` with the once-rounded max: ``y == max(y)`` marked no
  element in 20-30% of rows;
- a max read from memory by a later kernel is rounded, and ``exp(y - m)`` computed with the f32 ``y`` is
  ``exp`` of half an ulp of ``y`` at the max: a bf16 softmax of ``x * 0.75`` at 3e38 was NaN, an f16 softmax's
  sum beside a reduction over the other axis 0.94 for a row whose max term alone is 1, and a second pass's
  ``sum(exp(y - max(y)))`` of ``y = x - mean(x)`` 0.95-1.29 for numpy's 1 (found by helpers);
- and which max a kernel read depended on how the schedule split the program into kernels, so one softmax
  gave other probabilities beside a one-hot than alone.

This pass makes both sides numpy's, whatever the schedule. Each place ``y`` meets its max is a sum with the
max (or a constant multiple of it) on one side and, on the other, terms that equal ``∓y`` (checked numerically
in float64 at random points of magnitudes 0.1 to 1e4, casts to narrower types rounding: `numeric_check.agree`; fusion writes ``2x + 3x`` as ``5x``, ``my - (a - b)`` as ``b + my - a``, and an
epilogue reads ``x[i0, i1]`` where the loop read ``x[i0, j]``); those terms become numpy's ``y``
(`ir.loop.rewrite.numpy_values`: rounded after every operation), so ``y - max(y)`` is exactly 0 at the max.
A running max or min of a computed ``y`` then runs over numpy's ``y`` too, so its value is numpy's max, in
f32 or stored. A max finished after its loop by a monotone law (``max(x * 0.3 - mu)`` is ``max(x) * 0.3 -
mu``, rounded as written) is numpy's max already, rounding being monotone; its meetings are made numpy's.
Where some meeting of a running max cannot be matched so, that max is left as it was (f32, rounded once,
with ``y`` in f32 everywhere), which is consistent within its kernel. The reductions still accumulate in f32.

Guarantees: values unchanged in exact arithmetic; the rounding points added are numpy's own; only 16-bit
maxima and minima without a rescale or carry, and the terms that meet them, are touched.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from ..ir import Binary, BinaryOp, Cast, Compute, Const, Expr, FusedLoop, Load, OnlineState, Program, ReduceOp
from ..ir import IndexValue, Select, Stmt, Unary, UnaryOp, loads, walk
from ..ir.loop.rewrite import map_expr, numpy_values
from .algebra import FLOAT_RANK
from .numeric_check import agree


def compute_extrema_as_numpy(p: Program) -> Program:
    """`p` with its fused loops' 16-bit maxima and minima, and the values that meet them, computed as numpy
    computes them (see the module docstring)."""
    body = list(p.body)
    for i, s in enumerate(body):
        if not isinstance(s, FusedLoop):
            continue
        held = frozenset(l.out.name for l in s.locals if l.out.dtype.storage_only)
        running = {st.acc.name: st.term for st in s.states if _running_extremum(st)}
        computed = {n: [t] for n, t in running.items() if _is_computed(t, held)}
        while True:      # (a running max with an unmatched meeting is left as it was, and the rest tried again)
            # (a max finished from one left in f32 is not numpy's: only those over numpy's values finish one)
            numpys = {n: t for n, t in running.items() if n in computed or not _is_computed(t, held)}
            finished = _finished_by_monotone_laws(body[i + 1:], numpys)
            rewritten, unmatched = _meetings_numpys(body, i, {**computed, **finished}, held)
            if not unmatched & set(computed):
                break
            computed = {n: t for n, t in computed.items() if n not in unmatched}
        body = rewritten
        loop = body[i]
        body[i] = replace(loop, states=tuple(replace(st, term=numpy_values(st.term, held))
                                             if st.acc.name in computed else st for st in loop.states))
    return replace(p, body=tuple(body))


def _running_extremum(st) -> bool:
    """A 16-bit running max or min without a rescale or carry."""
    return (isinstance(st, OnlineState) and st.op in (ReduceOp.MAX, ReduceOp.MIN) and st.acc.dtype.storage_only
            and st.rescale is None and st.carry is None)


def _is_computed(e: Expr, held: frozenset[str]) -> bool:
    """Whether `e` is a value the kernel computes (an operation, or a load of a 16-bit local it holds in f32, an
    f16 ``q @ k.T``), which numpy holds rounded to its type."""
    return isinstance(e, Unary | Binary | Select) or (isinstance(e, Load) and e.buffer.name in held)


def _finished_by_monotone_laws(later: list[Stmt], running: dict[str, Expr]) -> dict[str, list[Expr]]:
    """The 16-bit maxima and minima a statement after the loop finishes from a running one by a law increasing
    in one of its reads of it (``m = f16(f16(acc * 0.3) - mu)``: added to, multiplied or divided by a positive
    constant, rounded), each with the terms ``y`` it is the max of: ``f`` with the running term in place of
    that read, one for each read it increases with (``acc * 0.7 + acc`` finishes ``max(x * 0.7 + max(x))``,
    which is also ``max(max(x) * 0.7 + x)``: the meeting matches either)."""
    out: dict[str, list[Expr]] = {}
    for s in later:
        if not (isinstance(s, Compute) and s.out.dtype.storage_only):
            continue
        found = []
        for read in (n for n in loads(s.value) if n.buffer.name in running):
            var = f"{read.buffer.name}\0read"      # (a stand-in name for this one read)
            marked = _renamed(s.value, read, var)
            if _increasing_in(marked, var):
                found.append(map_expr(marked, lambda n, var=var, acc=read.buffer.name: running[acc]
                                      if isinstance(n, Load) and n.buffer.name == var else None))
        if found:
            out[s.out.name] = found
    return out


def _renamed(e: Expr, read: Load, name: str) -> Expr:
    """`e` with the load `read` (that node) reading a buffer named `name` instead."""
    def swap(n: Expr) -> Expr:
        return Load(replace(n.buffer, name=name), n.indices) if n is read else _map_children(n, swap)
    return swap(e)


def _increasing_in(e: Expr, name: str) -> bool:
    """Whether `e` is an increasing function of its one read of `name` (through casts, ``+``, ``-`` on its
    left, and products and quotients by positive constants)."""
    if isinstance(e, Load):
        return e.buffer.name == name
    reads = lambda v: any(n.buffer.name == name for n in loads(v))  # noqa: E731
    if isinstance(e, Cast):
        return _increasing_in(e.x, name)
    if isinstance(e, Binary) and e.op in (BinaryOp.ADD, BinaryOp.SUB):
        if reads(e.a) and not reads(e.b):
            return _increasing_in(e.a, name)
        return e.op is BinaryOp.ADD and reads(e.b) and not reads(e.a) and _increasing_in(e.b, name)
    if isinstance(e, Binary) and e.op in (BinaryOp.MUL, BinaryOp.DIV):
        const, other = (e.b, e.a) if isinstance(e.b, Const) else (e.a, e.b) if e.op is BinaryOp.MUL else (None, None)
        return (isinstance(const, Const) and not isinstance(const.value, bool) and float(const.value) > 0
                and _increasing_in(other, name))
    return False


def _meetings_numpys(body: list[Stmt], i: int, terms: dict[str, list[Expr]],
                     held: frozenset[str]) -> tuple[list[Stmt], set[str]]:
    """`body` with each meeting of an extremum of `terms` (name -> the ``y`` it is the max of, or several
    forms of it) in the loop ``body[i]``'s other states and every later statement made numpy's (module
    docstring), and the extrema some meeting of which did not match."""
    unmatched: set[str] = set()
    if not terms:
        return body, unmatched

    def fix(e: Expr) -> Expr:
        return _numpys_where_met(e, terms, held, unmatched)

    def stmt(s: Stmt) -> Stmt:
        if isinstance(s, FusedLoop):
            return replace(s, locals=tuple(stmt(l) for l in s.locals), states=tuple(_map_state(st, fix)
                                                                                   for st in s.states))
        return replace(s, value=fix(s.value))

    loop = body[i]
    assert isinstance(loop, FusedLoop)
    out = list(body)
    out[i] = replace(loop, states=tuple(st if st.acc.name in terms else _map_state(st, fix) for st in loop.states))
    out[i + 1:] = [stmt(s) for s in body[i + 1:]]
    return out, unmatched


def _map_state(st, fn: Callable[[Expr], Expr]):
    st = replace(st, term=fn(st.term), rescale=None if st.rescale is None else fn(st.rescale))
    if isinstance(st, OnlineState) and st.carry is not None:
        st = replace(st, carry=fn(st.carry))
    return st


def _numpys_where_met(e: Expr, terms: dict[str, list[Expr]], held: frozenset[str], unmatched: set[str]) -> Expr:
    """`e` with each sum in which a max of `terms` meets terms reading its ``y``'s buffers rewritten as
    ``numpy(y) - m`` (or ``m - numpy(y)``, times the max's constant) where those terms equal ``∓y``; the maxima
    whose meeting does not are added to `unmatched`."""
    def reads_of(v: Expr) -> set[str]:
        return {n.buffer.name for n in loads(v)}

    def go(n: Expr) -> Expr:
        if n.dtype.storage_only and isinstance(n, Binary) and n.op in (BinaryOp.ADD, BinaryOp.SUB):
            parts = _signed_parts(n)
            tried: list[str] = []
            # (each part reading one max is a candidate: ``x*0.7 - mu - m`` meets m, whose y is ``x*0.7 - mu``)
            for k, (sign, m_part) in enumerate(parts):
                met = reads_of(m_part) & set(terms)
                rest = [p for j, p in enumerate(parts) if j != k]
                if len(met) != 1 or not rest:
                    continue
                (name,) = met
                rest_reads = set().union(*(reads_of(a) for _, a in rest))
                ys = [y for y in terms[name] if rest_reads & (reads_of(y) - set(terms))]
                if not ys:
                    continue      # (no term of y beside it: a rescale's m_prev - m, an lse's m + log(l))
                for y in ys:
                    # (the terms reading y's buffers are y; the others stay: ``x - m - log(l)``)
                    own = reads_of(y) - set(terms)
                    with_y = [p for p in rest if reads_of(p[1]) & own]
                    others = [p for p in rest if not reads_of(p[1]) & own]
                    made = _as_numpys(with_y, sign, m_part, y, n.dtype, held)
                    if made is not None:
                        return _chain([(1, made)] + [(s, go(a)) for s, a in others], n.dtype) if others else made
                tried.append(name)
            if tried:
                unmatched.update(tried)
                return n
        return _map_children(n, go)
    return go(e)


def _as_numpys(rest: list[tuple[int, Expr]], sign: int, m_part: Expr, y: Expr, dtype,
               held: frozenset[str]) -> Expr | None:
    """``sign * m_part + sum(rest)`` as ``sign * (m_part - numpy(y'))`` with ``y'`` the term `y` read at the
    positions `rest` reads, where ``sum(rest)`` is ``-sign * c * y'`` (``m_part = c * m``); None where not."""
    c, m_core = _constant_multiple(m_part)
    placed = _at_positions(y, [a for _, a in rest])
    if placed is None:
        return None
    rest_expr = _chain(rest, dtype)
    # (a cast to another 16-bit or narrower type rounds: ``x.astype(e4m3) * 0.7`` is not ``x * 0.7``)
    rounds = lambda cast: cast.dtype.is_float and cast.dtype != dtype and FLOAT_RANK[cast.dtype] <= FLOAT_RANK[dtype]  # noqa: E731
    if not agree(rest_expr, Binary(BinaryOp.MUL, Const(-sign * c, dtype), placed, dtype), rounds):
        return None
    y_numpy = numpy_values(placed, held)
    y_part = y_numpy if c == 1.0 else Binary(BinaryOp.MUL, Const(c, dtype), y_numpy, dtype)
    if sign > 0:       # m - y
        return Binary(BinaryOp.SUB, m_part, y_part, dtype)
    return Binary(BinaryOp.SUB, y_part, m_part, dtype)     # y - m


def _at_positions(y: Expr, parts: list[Expr]) -> Expr | None:
    """`y` with each load of a buffer read at the one position `parts` read it at; None where a buffer of `y`
    is read at two positions in `y` or in `parts`."""
    def positions(v: Expr) -> dict[str, set]:
        found: dict[str, set] = {}
        for n in loads(v):
            found.setdefault(n.buffer.name, set()).add(n.indices)
        return found

    theirs: dict[str, set] = {}
    for p in parts:
        for name, at in positions(p).items():
            theirs.setdefault(name, set()).update(at)
    ours = positions(y)
    if any(len(at) > 1 for at in ours.values()) or any(len(theirs.get(name, ())) != 1 for name in ours):
        return None       # (a buffer of y the meeting does not read would keep the loop's positions)
    if any(isinstance(n, IndexValue) for n in walk(y)):
        return None       # (an arange's position in y: the loop's axis, out of scope after it; fuzz seed 108)
    to = {name: next(iter(theirs[name])) for name in ours if name in theirs}
    return map_expr(y, lambda n: Load(n.buffer, to[n.buffer.name])
                    if isinstance(n, Load) and n.buffer.name in to else None)


def _map_children(n: Expr, fn: Callable[[Expr], Expr]) -> Expr:
    """`n` with `fn` applied to its direct operands (a load kept as it is)."""
    if isinstance(n, Unary | Cast):
        x = fn(n.x)
        return n if x is n.x else replace(n, x=x)
    if isinstance(n, Binary):
        a, b = fn(n.a), fn(n.b)
        return n if (a is n.a and b is n.b) else replace(n, a=a, b=b)
    if isinstance(n, Select):
        c, a, b = fn(n.cond), fn(n.a), fn(n.b)
        return n if (c is n.cond and a is n.a and b is n.b) else replace(n, cond=c, a=a, b=b)
    return n


def _signed_parts(e: Expr, sign: int = 1) -> list[tuple[int, Expr]]:
    """The operands of the sum `e` (through ``+``, ``-`` and negation, in its own type) with their signs."""
    if isinstance(e, Binary) and e.op in (BinaryOp.ADD, BinaryOp.SUB) and e.a.dtype == e.b.dtype == e.dtype:
        return _signed_parts(e.a, sign) + _signed_parts(e.b, sign if e.op is BinaryOp.ADD else -sign)
    if isinstance(e, Unary) and e.op is UnaryOp.NEG and e.x.dtype == e.dtype:
        return _signed_parts(e.x, -sign)
    return [(sign, e)]


def _chain(parts: list[tuple[int, Expr]], dtype) -> Expr:
    """The sum of signed `parts`, the first positive one first."""
    first = next((k for k, (s, _) in enumerate(parts) if s > 0), None)
    out: Expr = parts[first][1] if first is not None else Unary(UnaryOp.NEG, parts[0][1], dtype)
    first = 0 if first is None else first
    for k, (s, a) in enumerate(parts):
        if k != first:
            out = Binary(BinaryOp.ADD if s > 0 else BinaryOp.SUB, out, a, dtype)
    return out


def _constant_multiple(e: Expr) -> tuple[float, Expr]:
    """``(c, core)`` with ``e = c * core`` for a finite positive constant ``c`` (1 and `e` otherwise)."""
    if isinstance(e, Binary) and e.op is BinaryOp.MUL:
        for const, core in ((e.a, e.b), (e.b, e.a)):
            if (isinstance(const, Const) and not isinstance(const.value, bool) and np.isfinite(const.value)
                    and float(const.value) > 0):
                return float(const.value), core
    return 1.0, e


__all__ = ["compute_extrema_as_numpy"]
