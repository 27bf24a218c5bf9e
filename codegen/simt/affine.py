"""Which integer tiles are affine in their coordinates, and which masks are constant over vectors.

An integer tile is *affine* when its element at coordinates ``(c_0, ...)`` is
``base + sum_d stride_d * c_d`` with compile-time `strides` and a runtime
`base` (its element at the origin, known to be a multiple of `div`, a power of
two). Offsets the scheduler builds from aranges, program ids, loop counters,
constants and selects between such forms under one scalar condition are
affine; a load then computes each thread's address as the base
plus a bit field of the thread index plus a constant per register, and reads
``n`` elements at once where the stride along the fastest dim is 1, every
other step is a multiple of ``n`` and the base is (the alignment argument of
16-byte vector loads, ARCHITECTURE.md section 6). A form is also *non-negative*
when its base is known to be >= 0 and no stride is negative (aranges, program ids,
counters of loops that start at 0 or above and step up, sums and non-negative
multiples of those): top-k then knows its candidates' indices are real ones
(`topk.py`). Like the alignment facts, this takes the index arithmetic not to
overflow, which holds for the positions and offsets the scheduler builds.

`constancy` says how many consecutive elements along a dim a bool mask is
guaranteed to share (``idx < limit`` is constant over aligned groups of ``n``
when ``idx`` steps by 1 from a multiple of ``n`` and ``limit`` is a multiple of ``n``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...ir import BinaryOp
from ...ir.sizes import SizeLike, SizeOp
from ...ir.tile import nodes as t

MAX_DIV = 1 << 30


def size_pow2_factor(size: SizeLike) -> int:
    """A power of two dividing the run-time extent `size` for every value of its symbols (a symbol: 1)."""
    if not isinstance(size, SizeOp):
        return pow2_factor(size) if isinstance(size, int) else 1
    a, b = size_pow2_factor(size.a), size_pow2_factor(size.b)
    if size.op == "*":
        return min(a * b, MAX_DIV)
    if size.op in ("+", "-"):
        return min(a, b)
    return 1


def pow2_factor(c: int) -> int:
    """The largest power of two dividing `c` (`MAX_DIV` for 0)."""
    c = abs(int(c))
    return MAX_DIV if c == 0 else min(c & -c, MAX_DIV)


@dataclass(frozen=True, slots=True)
class Affine:
    """``base + sum strides[d] * c_d`` with ``base % div == 0``; `const` is the value when it is a known constant;
    `nonneg` when ``base >= 0`` and every stride is (so is every element)."""

    strides: tuple[int, ...]
    div: int
    const: int | None = None
    nonneg: bool = False


class AffineInfo:
    """Affine forms and mask constancy of one kernel's values (computed on demand, memoized)."""

    def __init__(self, defs: dict[str, t.Op]) -> None:
        self.defs = defs
        self._memo: dict[str, Affine | None] = {}

    def of(self, v: t.Value) -> Affine | None:
        """`v`'s affine form, or None when it is not affine (or not an integer tile)."""
        if v.name not in self._memo:
            self._memo[v.name] = self._compute(v) if v.dtype.is_int else None
        return self._memo[v.name]

    def _compute(self, v: t.Value) -> Affine | None:
        op = self.defs.get(v.name)
        rank = len(v.shape)
        if isinstance(op, t.Constant):
            return Affine((0,) * rank, pow2_factor(int(op.value)), int(op.value), int(op.value) >= 0)
        if isinstance(op, t.Arange):
            return Affine((1,), MAX_DIV, None, True)
        if isinstance(op, t.ProgramId):
            return Affine((), 1, None, True)
        if isinstance(op, t.Extent):      # a run-time extent: >= 0, a multiple of its factors' powers of two
            return Affine((), size_pow2_factor(op.size), None, True)
        if isinstance(op, t.For):
            if v == op.body.iv:
                return Affine((), pow2_factor(math.gcd(op.start, op.step)), None, op.start >= 0 and op.step > 0)
            return None
        if isinstance(op, t.Broadcast):
            x = self.of(op.x)
            if x is None:
                return None
            if not op.x.shape:
                return Affine((0,) * rank, x.div, x.const, x.nonneg)
            return Affine(tuple(s if n != 1 else 0 for s, n in zip(x.strides, op.x.shape)), x.div, x.const, x.nonneg)
        if isinstance(op, t.ExpandDims):
            x = self.of(op.x)
            return None if x is None else Affine(x.strides[:op.axis] + (0,) + x.strides[op.axis:], x.div, x.const,
                                                 x.nonneg)
        if isinstance(op, t.Permute):
            x = self.of(op.x)
            return None if x is None else Affine(tuple(x.strides[p] for p in op.perm), x.div, x.const, x.nonneg)
        if isinstance(op, t.Cast):
            if not op.x.dtype.is_int:
                return None
            x = self.of(op.x)
            narrowing = x is not None and op.out.dtype.itemsize < op.x.dtype.itemsize
            return replace(x, nonneg=False) if narrowing and x.nonneg else x
        if isinstance(op, t.Binary):
            return self._binary(op)
        if isinstance(op, t.Select) and not op.cond.shape:
            # One condition for every element: either base plus the same strides (the prefetched loop's
            # ``j_next = j + step < stop ? j + step : j``, schedule/prefetch.py).
            a, b = self.of(op.a), self.of(op.b)
            if a is None or b is None or a.strides != b.strides:
                return None
            const = a.const if a.const is not None and a.const == b.const else None
            return Affine(a.strides, min(a.div, b.div), const, a.nonneg and b.nonneg)
        return None

    def _binary(self, op: t.Binary) -> Affine | None:
        a, b = self.of(op.a), self.of(op.b)
        if a is None or b is None:
            return None
        both = None if a.const is None or b.const is None else (a.const, b.const)
        if op.op is BinaryOp.ADD:
            c = None if both is None else both[0] + both[1]
            return Affine(tuple(x + y for x, y in zip(a.strides, b.strides)), min(a.div, b.div), c,
                          a.nonneg and b.nonneg if c is None else c >= 0)
        if op.op is BinaryOp.SUB:
            c = None if both is None else both[0] - both[1]
            return Affine(tuple(x - y for x, y in zip(a.strides, b.strides)), min(a.div, b.div), c,
                          c is not None and c >= 0)
        if op.op is BinaryOp.MUL:
            if both is not None:
                c = both[0] * both[1]
                return Affine(a.strides, pow2_factor(c), c, c >= 0)
            if b.const is not None or a.const is not None:
                x, c = (a, b.const) if b.const is not None else (b, a.const)
                return Affine(tuple(s * c for s in x.strides), min(x.div * pow2_factor(c), MAX_DIV), None,
                              x.nonneg and c >= 0)
            if not any(a.strides) and not any(b.strides):
                return Affine(a.strides, min(a.div * b.div, MAX_DIV), None, a.nonneg and b.nonneg)
        return None

    # --- masks ---------------------------------------------------------------------------------

    def constancy(self, mask: t.Value, dim: int) -> int:
        """The largest power of two ``n`` with `mask` equal over aligned groups of ``n`` along `dim`."""
        full = mask.shape[dim]
        op = self.defs.get(mask.name)
        if isinstance(op, t.Constant):
            return full
        if isinstance(op, t.Broadcast):
            if not op.x.shape or op.x.shape[dim] == 1:
                return full
            return self.constancy(op.x, dim)
        if isinstance(op, t.ExpandDims):
            if dim == op.axis:
                return full
            return self.constancy(op.x, dim - (dim > op.axis))
        if isinstance(op, t.Permute):
            return self.constancy(op.x, op.perm[dim])
        if isinstance(op, t.Unary):
            return self.constancy(op.x, dim)
        if isinstance(op, t.Binary) and op.op in (BinaryOp.AND, BinaryOp.OR, BinaryOp.EQ, BinaryOp.NE) \
                and op.a.dtype.is_bool:
            return min(self.constancy(op.a, dim), self.constancy(op.b, dim))
        if isinstance(op, t.Binary) and op.op in (BinaryOp.LT, BinaryOp.GE, BinaryOp.GT, BinaryOp.LE):
            lo, hi = (op.a, op.b) if op.op in (BinaryOp.LT, BinaryOp.GE) else (op.b, op.a)
            return self._below(lo, hi, dim, full)
        return 1

    def _below(self, lo: t.Value, hi: t.Value, dim: int, full: int) -> int:
        """Constancy of ``lo < hi`` along `dim`."""
        a, b = self.of(lo), self.of(hi)
        if a is None or b is None:
            return 1
        d = [x - y for x, y in zip(a.strides, b.strides)]
        if d[dim] == 0:
            return full
        if d[dim] != 1:
            return 1
        n = min(a.div, b.div, full)
        for e, s in enumerate(d):
            if e != dim and lo.shape[e] > 1:
                n = min(n, pow2_factor(s))
        return max(1, n)
