"""Index expressions as numbers and back: what an `IndexExpr` stands for, and the canonical index of an integer
expression of loop indices (a plain axis, a strided one, a fixed position or a `Computed` one).

Renaming axes (inlining a nest at its reader's indices, a view of a view) composes indices through these:
an index becomes its number, the axes in it are replaced, and the result is put back in canonical form.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from ..semantics import BINARY_FUNCS, BinaryOp
from ..types import DType, int64
from .expr import Axis, Binary, Cast, Computed, Const, Expr, IndexExpr, IndexValue, Load, Strided, strided, walk
from .nodes import Compute, Reduce, TopK
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
        if n.op is BinaryOp.ADD and _digits_rejoined(a, b):
            return b.a     # (e // c) * c + e % c == e: a dim split and merged back
        if n.op is BinaryOp.FLOORDIV and isinstance(b, Const) and b.value > 0 and isinstance(a, Binary) and \
                a.op is BinaryOp.FLOORDIV and isinstance(a.b, Const) and a.b.value > 0:
            # x // a // b is x // (a*b) (floored, positive divisors): one form, so digits can be rejoined
            return fold(Binary(BinaryOp.FLOORDIV, a.a, Const(int(a.b.value) * int(b.value), n.dtype), n.dtype)) or \
                Binary(BinaryOp.FLOORDIV, a.a, Const(int(a.b.value) * int(b.value), n.dtype), n.dtype)
        if n.op in (BinaryOp.FLOORDIV, BinaryOp.MOD) and isinstance(b, Const) and b.value > 0:
            return _digits(a, int(b.value), n.op is BinaryOp.MOD)
        return None
    return map_expr(e, fold)


def _bounds(e: Expr) -> tuple[int, int] | None:
    """The least and greatest value of an index expression over its axes' ranges (None: unknown)."""
    if isinstance(e, Const):
        return int(e.value), int(e.value)
    if isinstance(e, IndexValue):
        return (0, e.axis.extent - 1) if type(e.axis.extent) is int and e.axis.extent > 0 else None
    if not isinstance(e, Binary):
        return None
    a, b = _bounds(e.a), _bounds(e.b)
    if a is None or b is None:
        return None
    if e.op is BinaryOp.ADD:
        return a[0] + b[0], a[1] + b[1]
    if e.op is BinaryOp.SUB:
        return a[0] - b[1], a[1] - b[0]
    if e.op is BinaryOp.MUL:
        corners = [x * y for x in a for y in b]
        return min(corners), max(corners)
    if e.op is BinaryOp.FLOORDIV and b[0] == b[1] and b[0] > 0:
        return a[0] // b[0], a[1] // b[0]
    if e.op is BinaryOp.MOD and b[0] == b[1] and b[0] > 0:
        return (a[0], a[1]) if 0 <= a[0] and a[1] < b[0] else (0, b[0] - 1)
    return None


def _linear(e: Expr) -> tuple[dict[Expr, int], int]:
    """`e` as ``sum(coeff * atom) + const`` (an atom: anything but + - and * by a constant), digits rejoined:
    ``k*c * (x // (a*c)) + k * (x // a % c)`` is ``k * (x // a)`` (``x // 1`` being `x`), until none is left."""
    terms, const = _linear_terms(e)
    joined = True
    while joined:
        joined = False
        for low in list(terms):
            whole = _digit_of(low)
            if whole is None or low not in terms:
                continue
            x, a, c = whole
            k = terms[low]
            high = Binary(BinaryOp.FLOORDIV, x, Const(a * c, int64), int64)
            if terms.get(high) != k * c:
                continue
            del terms[low], terms[high]
            inner, extra = _linear(x if a == 1 else Binary(BinaryOp.FLOORDIV, x, Const(a, int64), int64))
            for atom, coeff in inner.items():
                terms[atom] = terms.get(atom, 0) + k * coeff
            const += k * extra
            terms = {atom: coeff for atom, coeff in terms.items() if coeff}
            joined = True
    return terms, const


def _digit_of(e: Expr) -> tuple[Expr, int, int] | None:
    """``(x, a, c)`` when `e` is ``x // a % c`` (``x % c``: ``a = 1``) with positive constants."""
    if not (isinstance(e, Binary) and e.op is BinaryOp.MOD and isinstance(e.b, Const) and e.b.value > 0):
        return None
    inner = e.a
    if isinstance(inner, Binary) and inner.op is BinaryOp.FLOORDIV and isinstance(inner.b, Const) and \
            inner.b.value > 0:
        return inner.a, int(inner.b.value), int(e.b.value)
    return inner, 1, int(e.b.value)


def _linear_terms(e: Expr) -> tuple[dict[Expr, int], int]:
    if isinstance(e, Const):
        return {}, int(e.value)
    if isinstance(e, Binary) and e.op in (BinaryOp.ADD, BinaryOp.SUB):
        (ta, ca), (tb, cb) = _linear(e.a), _linear(e.b)
        sign = 1 if e.op is BinaryOp.ADD else -1
        terms = dict(ta)
        for atom, c in tb.items():
            terms[atom] = terms.get(atom, 0) + sign * c
        return {a: c for a, c in terms.items() if c}, ca + sign * cb
    if isinstance(e, Binary) and e.op is BinaryOp.MUL and (isinstance(e.a, Const) or isinstance(e.b, Const)):
        scale, x = (int(e.a.value), e.b) if isinstance(e.a, Const) else (int(e.b.value), e.a)  # type: ignore
        terms, const = _linear(x)
        return {a: c * scale for a, c in terms.items() if c * scale}, const * scale
    return {e: 1}, 0


def _build(terms: dict[Expr, int], const: int) -> Expr:
    out: Expr | None = None
    for atom, c in terms.items():
        term = atom if c == 1 else Binary(BinaryOp.MUL, atom, Const(c, int64), int64)
        out = term if out is None else Binary(BinaryOp.ADD, out, term, int64)
    if out is None:
        return Const(const, int64)
    return Binary(BinaryOp.ADD, out, Const(const, int64), int64) if const else out


def _divisors_above_one(c: int) -> list[int]:
    """The divisors of `c` greater than 1, largest first (found up to its square root)."""
    small = [d for d in range(1, math.isqrt(c) + 1) if c % d == 0]
    return sorted({d for s in small for d in (s, c // s)} - {1}, reverse=True)


def _digits(e: Expr, c: int, remainder: bool) -> Expr | None:
    """``e // c`` (or ``e % c``) without the division where `e` is ``g * Q + R`` with ``0 <= R < g`` for a
    divisor `g` of `c`: then ``e // c == Q // (c / g)`` and ``e % c == (Q % (c / g)) * g + R``. A reshape's
    positions composed with another's collapse so: ``(64*i1 + 8*i2 + i3) // 64`` is ``i1``."""
    terms, const = _linear(e)
    whole = {a: k // c for a, k in terms.items() if k % c == 0}
    if whole or const // c:     # (c*Q + R) // c == Q + R // c and (c*Q + R) % c == R % c, for any integers
        rest = {a: k for a, k in terms.items() if k % c}
        low = _build(rest, const % c)
        part = Binary(BinaryOp.MOD if remainder else BinaryOp.FLOORDIV, low, Const(c, int64), int64)
        part = _digits(low, c, remainder) or part
        if remainder:
            return part
        if isinstance(part, Const):
            return _build(whole, const // c + int(part.value))
        return _build({**whole, part: whole.get(part, 0) + 1}, const // c)
    for g in _divisors_above_one(c):
        quotient = {a: k // g for a, k in terms.items() if k % g == 0}
        rest = {a: k for a, k in terms.items() if k % g}
        r = [_bounds(_build(rest, const % g))] if rest or const % g else [(0, 0)]
        if r[0] is None or not (0 <= r[0][0] and r[0][1] < g):
            continue
        if any(_bounds(a) is None or _bounds(a)[0] < 0 for a in quotient):   # type: ignore[index]
            continue
        q = _build(quotient, const // g)
        if not remainder:
            return q if g == c else Binary(BinaryOp.FLOORDIV, q, Const(c // g, int64), int64)
        low = _build(rest, const % g)
        if g == c:
            return low
        high = Binary(BinaryOp.MUL, Binary(BinaryOp.MOD, q, Const(c // g, int64), int64), Const(g, int64), int64)
        return Binary(BinaryOp.ADD, high, low, int64)
    return None


def _digits_rejoined(a: Expr, b: Expr) -> bool:
    """Whether ``a + b`` is ``(e // c) * c + e % c`` for one `e` and one constant ``c > 0``."""
    if not (isinstance(b, Binary) and b.op is BinaryOp.MOD and isinstance(b.b, Const) and b.b.value > 0):
        return False
    if not (isinstance(a, Binary) and a.op is BinaryOp.MUL):
        return False
    quotient, scale = (a.a, a.b) if isinstance(a.b, Const) else (a.b, a.a)
    return isinstance(scale, Const) and scale.value == b.b.value and isinstance(quotient, Binary) and \
        quotient.op is BinaryOp.FLOORDIV and quotient.a == b.a and quotient.b == b.b


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
    return Computed(_build(*_linear(value)))     # (constants gathered into one, digits rejoined)


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


def rename_loop_indices(s: Compute | Reduce | TopK, names: dict[str, str]) -> Compute | Reduce | TopK:
    """`s` with its loop indices renamed by `names` (old name -> new name; a nest's indices are its own, so
    nothing outside `s` changes). A new name must not be one of `s`'s indices already."""
    if not names:
        return s

    def axis(a: Axis) -> Axis:
        return Axis(names[a.name], a.extent) if a.name in names else a

    def fix(n: Expr) -> Expr | None:
        if isinstance(n, Load):
            indices = tuple(rename_index(i, size, lambda a: axis(a) if a.name in names else None)
                            for i, size in zip(n.indices, n.buffer.shape))
            return None if indices == n.indices else Load(n.buffer, indices)
        if isinstance(n, IndexValue) and n.axis.name in names:
            return IndexValue(axis(n.axis), n.dtype)
        return None

    s = dataclasses.replace(s, axes=tuple(axis(a) for a in s.axes), value=map_expr(s.value, fix))
    if isinstance(s, Reduce):
        return dataclasses.replace(s, reduce_axes=tuple(axis(a) for a in s.reduce_axes))
    return dataclasses.replace(s, reduce_axis=axis(s.reduce_axis)) if isinstance(s, TopK) else s


def is_index_expression(e: Expr) -> bool:
    """Whether `e` is what a `Computed` index may hold: an int64 value (of loop indices, constants and, for a
    gather, integer data)."""
    return e.dtype == int64


def in_index_type(value: Expr, dtype: DType) -> Expr:
    """A computed position's int64 `value` computed in `dtype` (a kernel's index type, i32 on GPUs) where every
    step of it provably fits (its loop indices and constants bound it: a reshape's positions), so the same
    floored divisions and remainders run in 32 bits; `value` itself where one may not (a gather's data)."""
    if dtype == int64 or not dtype.is_int:
        return value
    limit = int(np.iinfo(dtype.numpy).max) // 2     # headroom: a tile's masked lanes run past the extents
    for n in walk(value):
        if not isinstance(n, Const | IndexValue | Binary):
            return value
        bounds = _bounds(n)
        if bounds is None or bounds[0] < -limit or bounds[1] > limit:
            return value
    return map_expr(value, lambda n: Const(n.value, dtype) if isinstance(n, Const) else
                    IndexValue(n.axis, dtype) if isinstance(n, IndexValue) else
                    Binary(n.op, n.a, n.b, dtype) if isinstance(n, Binary) else None)


def flat_offset(indices: tuple[IndexExpr, ...], shape: tuple[object, ...],
                strides: tuple[object, ...]) -> Expr | None:
    """The element offset ``sum(position_d * stride_d)`` of a load whose positions are computed (a reshape's):
    one linear expression, its digits rejoined across dims, so group norm's ``x[i0, i1*4 + r0 // 64,
    r0 // 8 % 8, r0 % 8]`` of a dense buffer is the affine ``65536*i0 + 256*i1 + r0``. None where a position
    reads data (a gather) or may fall outside its dim (it would need its clamp), or a length or stride is
    known only at run time."""
    total: Expr = Const(0, int64)
    for i, size, stride in zip(indices, shape, strides):
        if type(size) is not int or type(stride) is not int:
            return None
        if isinstance(i, Computed | Strided):
            value = index_value(i)
            if any(not isinstance(n, Const | IndexValue | Binary) for n in walk(value)):
                return None
            bounds = _bounds(value)
            if bounds is None or bounds[0] < 0 or bounds[1] >= size:
                return None
        else:
            value = index_value(i)
        if stride:
            total = Binary(BinaryOp.ADD, total, Binary(BinaryOp.MUL, value, Const(stride, int64), int64), int64)
    return _build(*_linear(_fold(total)))