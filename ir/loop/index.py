"""Index expressions as numbers and back: what an `IndexExpr` stands for, and the canonical index of an integer
expression of loop indices (a plain axis, a strided one, a fixed position or a `Computed` one).

Renaming axes (inlining a nest at its reader's indices, a view of a view) composes indices through these:
an index becomes its number, the axes in it are replaced, and the result is put back in canonical form.
"""
from __future__ import annotations

from typing import Callable

from ..semantics import BINARY_FUNCS, BinaryOp
from ..types import DType, int64
from .expr import Axis, Binary, Cast, Computed, Const, Expr, IndexExpr, IndexValue, Strided, strided
from .rewrite import map_expr

def index_value(i: IndexExpr, dtype: DType = int64) -> Expr:
    """The number index `i` stands for, as a value of `dtype` (``start + step * axis`` for a strided one;
    computed in int64 and cast for a float or bool `dtype`: exact, as an arange's value is its position cast)."""
    if isinstance(i, int):
        return Const(i, dtype)
    if isinstance(i, Axis):
        return IndexValue(i, dtype)
    if isinstance(i, Computed):
        value = i.value
    else:
        value = IndexValue(i.axis, int64)
        if i.step != 1:
            value = Binary(BinaryOp.MUL, Const(i.step, int64), value, int64)
        if i.start:
            value = Binary(BinaryOp.ADD, value, Const(i.start, int64), int64)
    if dtype == int64:
        return value
    if dtype.is_int:    # an int32 arange: the same arithmetic in its own type (positions fit)
        return map_expr(value, lambda n: Const(n.value, dtype) if isinstance(n, Const) else
                        IndexValue(n.axis, dtype) if isinstance(n, IndexValue) else
                        Binary(n.op, n.a, n.b, dtype) if isinstance(n, Binary) else None)
    return Cast(value, dtype)


def _fold(e: Expr) -> Expr:
    """`e` with constant sub-expressions folded and ``+ 0``, ``* 1``, ``* 0`` removed."""
    def fold(n: Expr) -> Expr | None:
        if not isinstance(n, Binary):
            return None
        a, b = n.a, n.b
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(int(BINARY_FUNCS[n.op](a.value, b.value)), n.dtype)
        if n.op is BinaryOp.ADD and isinstance(b, Const) and b.value == 0 or \
                n.op is BinaryOp.MUL and isinstance(b, Const) and b.value == 1:
            return a
        if n.op is BinaryOp.ADD and isinstance(a, Const) and a.value == 0 or \
                n.op is BinaryOp.MUL and isinstance(a, Const) and a.value == 1:
            return b
        if n.op is BinaryOp.MUL and (isinstance(a, Const) and a.value == 0 or isinstance(b, Const) and b.value == 0):
            return Const(0, n.dtype)
        return None
    return map_expr(e, fold)


def _affine(e: Expr) -> tuple[Axis | None, int, int] | None:
    """``(axis, start, step)`` when `e` is ``start + step * axis`` of at most one axis, else None."""
    if isinstance(e, Const):
        return None, int(e.value), 0
    if isinstance(e, IndexValue):
        return e.axis, 0, 1
    if isinstance(e, Binary) and e.op in (BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL):
        a, b = _affine(e.a), _affine(e.b)
        if a is None or b is None:
            return None
        if e.op is BinaryOp.MUL:
            if a[0] is not None and b[0] is not None:
                return None
            (axis, s, t), c = (a, b[1]) if b[0] is None else (b, a[1])
            return axis, s * c, t * c
        if a[0] is not None and b[0] is not None and a[0] != b[0]:
            return None
        sign = 1 if e.op is BinaryOp.ADD else -1
        return a[0] or b[0], a[1] + sign * b[1], a[2] + sign * b[2]
    return None


def as_index(value: Expr, size: object) -> IndexExpr:
    """The canonical index of a dimension of `size` read at the int64 `value`: a position, the axis itself
    (when it runs over the whole dim in order), a strided axis, or a computed position."""
    value = _fold(value)
    form = _affine(value)
    if form is not None:
        axis, start, step = form
        if axis is None or step == 0:
            return clamped(start, size)
        return strided(axis, start, step, size)
    return Computed(value)


def clamped(position: int, size: object) -> int:
    """A fixed position clamped into a dim of `size` (as strided and computed reads are: a read a select
    discards, of a piece of a concatenation, stays inside memory); unchanged for a run-time size."""
    return min(max(position, 0), size - 1) if isinstance(size, int) and size > 0 else position


def rename_index(i: IndexExpr, size: object, replace: Callable[[Axis], IndexExpr | None]) -> IndexExpr:
    """`i` (indexing a dim of `size`) with each axis `a` replaced by ``replace(a)`` (None: kept)."""
    if isinstance(i, int):
        return i
    if isinstance(i, Axis):
        new = replace(i)
        return i if new is None else new
    if isinstance(i, Strided):
        new = replace(i.axis)
        if new is None:
            return i
        if not isinstance(new, Computed):
            from .expr import shift_index
            moved = shift_index(new, i.start, i.step, size)
            return clamped(moved, size) if isinstance(moved, int) else moved

    def sub(n: Expr) -> Expr | None:
        if isinstance(n, IndexValue):
            new = replace(n.axis)
            return None if new is None else index_value(new, n.dtype)
        return None
    before = index_value(i)
    after = map_expr(before, sub)
    return i if after is before else as_index(after, size)


def is_index_expression(e: Expr) -> bool:
    """Whether `e` is what a `Computed` index may hold: an int64 value (of loop indices, constants and, for a
    gather, integer data)."""
    return e.dtype == int64
