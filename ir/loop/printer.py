"""Deterministic, human-readable text for the Loop IR.

The printed form reads like pseudo-code::

    kernel softmax(x: f32[4,1000]) -> (out: f32[4,1000])
      # softmax.py:7  m = rf.max(x, axis=-1, keepdims=True)
      m: f32[4] = for i0<4: max over r0<1000 of x[i0,r0]

Loop axes are named ``i0, i1, ...`` (parallel) and ``r0, ...`` (reduced) by the
tracer; buffers carry the user's variable names where the source gives them.

A fused loop's state of f16, bf16 or e4m3 values is carried in f32 (`OnlineState.carried_dtype`) and stays
f32 where the statements after the loop compute with it, rounded where one is stored or decides
(`interpreter.held_results`). Its line says so and shows its update as computed, in f32
(`rewrite.in_work_precision`)::

    out_acc: f16[1] (carried in f32) = for i0<1: out_acc_prev[i0] * exp(...) + sum over j of exp(f32(x[0,j]) - ...)
"""
from __future__ import annotations

import math

from .expr import Axis, Binary, Cast, Const, Expr, IndexExpr, IndexValue, Length, Load, Select, Strided, Unary
from ..semantics import BinaryOp, UnaryOp
from .nodes import Compute, FusedLoop, OnlineState, Program, Reduce, Stmt, TopK, TopKState
from .rewrite import carried_in_f32, in_work_precision
from ..excerpt import LineIndex, note_line
from ..source import SourceLoc

_PREC = {     # Python's: `&` and `|` bind tighter than comparisons, which chain (`_expr` parenthesizes them)
    BinaryOp.LT: 1, BinaryOp.LE: 1, BinaryOp.GT: 1, BinaryOp.GE: 1, BinaryOp.EQ: 1, BinaryOp.NE: 1,
    BinaryOp.OR: 2,
    BinaryOp.AND: 3,
    BinaryOp.ADD: 4, BinaryOp.SUB: 4,
    BinaryOp.MUL: 5, BinaryOp.DIV: 5, BinaryOp.FLOORDIV: 5, BinaryOp.MOD: 5,
    BinaryOp.POW: 7,
}
_NEG_PREC = 6
_ATOM = 10


def format_const(value: float | int | bool) -> str:
    """A constant as a person writes it (``-inf``, ``0.125``, ``3``, ``True``)."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if math.isnan(value):
            return "nan"
        return repr(value)
    return str(value)


def format_index(indices: tuple[IndexExpr, ...], shape: tuple[int, ...] | None = None) -> str:
    """Indices as ``i0,2*i1 + 1``; with the buffer's `shape`, a strided index that may fall outside its
    dimension reads ``clip(i1 - 8)`` (it is clamped: `ir.loop.expr.Strided`)."""
    def one(i: IndexExpr, size: object) -> str:
        if isinstance(i, Strided) and shape is not None and i.may_clamp(size):
            return f"clip({i})"
        return str(i)
    return ",".join(one(i, size) for i, size in zip(indices, shape or (None,) * len(indices)))


def _expr(e: Expr) -> tuple[str, int]:
    """Text of `e` and its precedence (for parenthesizing)."""
    if isinstance(e, Const):
        text = format_const(e.value)
        return text, (_NEG_PREC if text.startswith("-") else _ATOM)
    if isinstance(e, IndexValue):
        return (e.axis.name if e.dtype.is_int else f"{e.dtype}({e.axis.name})"), _ATOM
    if isinstance(e, Length):     # (``f32(length(x.1 * x.2))``: x's axes 1 and 2's run-time lengths, as an f32)
        return f"{e.dtype}(length({' * '.join(str(n) for n in e.sizes)}))", _ATOM
    if isinstance(e, Load):
        return f"{e.buffer.name}[{format_index(e.indices, e.buffer.shape)}]", _ATOM
    if isinstance(e, Cast):
        return f"{e.dtype}({format_expr(e.x)})", _ATOM
    if isinstance(e, Select):
        return f"where({format_expr(e.cond)}, {format_expr(e.a)}, {format_expr(e.b)})", _ATOM
    if isinstance(e, Unary):
        if e.op is UnaryOp.NEG:
            inner, p = _expr(e.x)
            return "-" + (inner if p > _NEG_PREC else f"({inner})"), _NEG_PREC
        if e.op is UnaryOp.NOT:
            inner, p = _expr(e.x)
            return "~" + (inner if p > _NEG_PREC else f"({inner})"), _NEG_PREC
        return f"{e.op.value}({format_expr(e.x)})", _ATOM
    if isinstance(e, Binary):
        if not e.op.is_infix:
            return f"{e.op.value}({format_expr(e.a)}, {format_expr(e.b)})", _ATOM
        prec = _PREC[e.op]
        a, pa = _expr(e.a)
        b, pb = _expr(e.b)
        right_assoc = e.op is BinaryOp.POW
        chained = e.op.is_comparison      # (a < b == c is a chain in Python: a comparison operand is bracketed)
        if pa < prec or ((right_assoc or chained) and pa == prec):
            a = f"({a})"
        if pb < prec or (not right_assoc and pb == prec):
            b = f"({b})"
        return f"{a} {e.op.value} {b}", prec
    raise TypeError(f"not a Loop IR expression: {e!r}")


def format_expr(e: Expr) -> str:
    """One expression as text."""
    return _expr(e)[0]


def _loops(axes: tuple[Axis, ...]) -> str:
    return ", ".join(f"{a.name}<{a.extent}" for a in axes)


def format_state(st: OnlineState, axis: Axis, f32_buffers: frozenset[str] | None = None) -> str:
    """One online state's per-chunk update, e.g. ``l = l_prev * exp(m_prev - m) + sum over r0 of exp(...)``.

    A state the loop carries in f32 though its type is narrower reads ``l: f16[4] (carried in f32) = ...``,
    its expressions as the loop computes them, in f32. `f32_buffers`: the loop's buffers carried so
    (`rewrite.carried_in_f32`), read as they are; None: this state's own."""
    carried = f" (carried in {st.carried_dtype})" if st.carried_dtype != st.acc.dtype else ""
    if carried:
        st = in_work_precision(st, frozenset((st.acc.name, st.prev.name)) if f32_buffers is None else f32_buffers)
    head = f"{st.acc.name}: {st.acc.type}{carried} = " + (f"for {_loops(st.axes)}: " if st.axes else "")
    partial = f"{st.op.value} over {axis.name} of {format_expr(st.term)}"
    prev = f"{st.prev.name}[{format_index(st.axes)}]" if st.axes else st.prev.name
    if st.rescale is not None:
        text, prec = _expr(st.rescale)
        prev = f"{prev} * {text if prec >= _PREC[BinaryOp.MUL] else '(' + text + ')'}"
    if st.carry is not None:
        prev = f"({format_expr(st.carry)})"   # the shift to the new centre
    if st.op.value == "sum":
        return f"{head}{prev} + {partial}"
    return f"{head}{st.op.value}({prev}, {partial})"


def format_topk_state(st: TopKState, axis: Axis) -> str:
    """A running top-k's per-chunk update: ``v, i = top k of (v_prev * rescale, top k over j of term)``."""
    head = f"{st.acc.name}, {st.indices.name}: {st.acc.type}, {st.indices.type} = "
    head += f"for {_loops(st.axes)}: " if st.axes else ""
    prev = st.prev.name if st.rescale is None else f"{st.prev.name} * {format_expr(st.rescale)}"
    return f"{head}top {st.k} of ({prev}, top {st.k} over {axis.name} of {format_expr(st.term)})"


def format_fused_loop(s: FusedLoop, indent: str = "") -> str:
    """A fused loop: its header, per-chunk producers (``local``) and state updates, one per line."""
    lines: list[str] = []
    _emit_fused_loop(s, indent, lines, None)
    return "\n".join(lines)


def _emit_fused_loop(s: FusedLoop, indent: str, lines: list[str], index: LineIndex | None) -> None:
    """Append a fused loop's lines, noting in `index` where it, each local and each state starts."""
    note_line(index, s, len(lines))
    names = ", ".join(b.name for b in s.outs)
    lines.append(f"{indent}{names} = fused loop over {s.axis.name}<{s.axis.extent}, chunk by chunk:")
    for local in s.locals:
        note_line(index, local, len(lines))
        lines.append(f"{indent}  local {format_stmt(local)}")
    f32_buffers = carried_in_f32(s)
    for st in s.states:
        note_line(index, st, len(lines))
        lines.append(f"{indent}  " + (format_topk_state(st, s.axis) if isinstance(st, TopKState)
                                      else format_state(st, s.axis, f32_buffers)))


def format_stmt(s: Stmt) -> str:
    """One loop nest on one line: ``name: type = for axes: value``."""
    if isinstance(s, FusedLoop):
        return format_fused_loop(s)
    if isinstance(s, TopK):
        loops = f"for {_loops(s.axes)}: " if s.axes else ""
        return (f"{s.values.name}, {s.indices.name}: {s.values.type}, {s.indices.type} = {loops}top {s.k} over "
                f"{s.reduce_axis.name}<{s.reduce_axis.extent} of {format_expr(s.value)}")
    head = f"{s.out.name}: {s.out.type} = "
    loops = f"for {_loops(s.axes)}: " if s.axes else ""
    if isinstance(s, Compute):
        return f"{head}{loops}{format_expr(s.value)}"
    if isinstance(s, Reduce):
        return f"{head}{loops}{s.op.value} over {_loops(s.reduce_axes)} of {format_expr(s.value)}"
    raise TypeError(f"not a Loop IR statement: {s!r}")


def format_loc(loc: SourceLoc) -> str:
    return f"# {loc.short()}  {loc.text.strip()}" if loc.line else ""


def program_lines(p: Program, index: LineIndex | None = None) -> list[str]:
    """`format_program`'s lines; with `index`, where each statement starts (for `excerpt.excerpt_at`)."""
    params = ", ".join(f"{b.name}: {b.type}" for b in p.inputs)
    outs = ", ".join(f"{b.name}: {b.type}" for b in p.outputs)
    lines = [f"kernel {p.name}({params}) -> ({outs})"]
    last_loc = None
    for s in p.body:
        loc = getattr(s, "loc", None)
        if loc is not None and loc.line and loc != last_loc:
            lines.append("  " + format_loc(loc))
            last_loc = loc
        if isinstance(s, FusedLoop):
            _emit_fused_loop(s, "  ", lines, index)
        else:
            note_line(index, s, len(lines))
            lines.append("  " + format_stmt(s))
    return lines


def format_program(p: Program) -> str:
    """The whole program, with a ``# file:line  source`` comment where the source line changes."""
    return "\n".join(program_lines(p))
