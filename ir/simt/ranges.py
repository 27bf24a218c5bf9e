"""Static value ranges of integer registers, for the SIMT verifier's bounds check.

A `Range` ``[lo, hi]`` bounds a register over every thread, block and loop trip.
It is *exact* when both ends are reached by some thread (constants, thread and
block indices, loop counters with constant bounds, and monotone functions of one
such value with constants: ``+ c``, ``* c``, shifts, ``div c``, min/max with ``c``).
Only exact ranges may prove an access out of bounds; the others are kept so a
later use can still be bounded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..sizes import is_static
from ..semantics import BinaryOp
from .nodes import (
    Binary,
    BlockIdx,
    Cast,
    Const,
    For,
    IntBinary,
    IntOp,
    LaneId,
    Reg,
    SimtKernel,
    Stmt,
    ThreadIdx,
    WarpId,
)


@dataclass(frozen=True, slots=True)
class Range:
    lo: int
    hi: int
    exact: bool

    @property
    def is_const(self) -> bool:
        return self.exact and self.lo == self.hi


Ranges = dict[str, Range]


def _mono(r: Range, f: Callable[[int], int]) -> Range:
    """`f` (monotone) of `r`: ends map to ends."""
    a, b = f(r.lo), f(r.hi)
    return Range(min(a, b), max(a, b), r.exact)


def _trunc_div(a: int, c: int) -> int:
    q = abs(a) // abs(c)
    return q if (a >= 0) == (c > 0) else -q


def _binary(op: BinaryOp, a: Range, b: Range) -> Range | None:
    if a.is_const != b.is_const:  # one register against a constant: a monotone map of its range
        x, c = (b, a.lo) if a.is_const else (a, b.lo)
        sub = (lambda v: c - v) if a.is_const else (lambda v: v - c)
        one = {BinaryOp.ADD: lambda v: v + c, BinaryOp.SUB: sub, BinaryOp.MUL: lambda v: v * c,
               BinaryOp.MAX: lambda v: max(v, c), BinaryOp.MIN: lambda v: min(v, c)}.get(op)
        return _mono(x, one) if one is not None else None
    ends = {BinaryOp.ADD: (a.lo + b.lo, a.hi + b.hi), BinaryOp.SUB: (a.lo - b.hi, a.hi - b.lo),
            BinaryOp.MAX: (max(a.lo, b.lo), max(a.hi, b.hi)), BinaryOp.MIN: (min(a.lo, b.lo), min(a.hi, b.hi))}
    if op is BinaryOp.MUL:
        products = (a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi)
        ends[op] = (min(products), max(products))
    found = ends.get(op)
    return Range(found[0], found[1], a.is_const and b.is_const) if found else None


def _int_binary(op: IntOp, a: Range, b: Range) -> Range | None:
    if not b.is_const:
        return None
    c = b.lo
    if op is IntOp.SHL and 0 <= c < 63:
        return _mono(a, lambda v: v << c)
    if op is IntOp.SHR and 0 <= c < 63:
        return _mono(a, lambda v: v >> c)
    if op is IntOp.DIV and c != 0:
        return _mono(a, lambda v: _trunc_div(v, c))
    if op is IntOp.REM and c > 0 and a.lo >= 0:
        return a if a.hi < c else Range(0, c - 1, False)
    if op is IntOp.AND and c >= 0:
        if a.lo >= 0 and a.hi <= c and (c & (c + 1)) == 0:
            return a
        return Range(0, c if a.lo < 0 else min(c, a.hi), False)
    return None


def trip_range(s: For) -> Range | None:
    """The induction variable's range when the bounds are constants and the loop runs at least once."""
    if not (isinstance(s.start, int) and isinstance(s.stop, int)) or s.start >= s.stop:
        return None
    last = s.start + (s.stop - 1 - s.start) // s.step * s.step
    return Range(s.start, last, True)


def transfer(s: Stmt, ranges: Ranges, kernel: SimtKernel) -> None:
    """Record the range of the integer register `s` defines, when one is known."""
    out = getattr(s, "out", None)
    if not isinstance(out, Reg) or not out.dtype.is_int or out.type.is_vector:
        return
    found: Range | None = None
    if isinstance(s, Const) and not isinstance(s.value, bool | float):
        found = Range(int(s.value), int(s.value), True)
    elif isinstance(s, ThreadIdx):
        found = Range(0, kernel.threads - 1, True)
    elif isinstance(s, LaneId):
        found = Range(0, min(31, kernel.threads - 1), True)
    elif isinstance(s, WarpId):
        found = Range(0, kernel.warps - 1, True)
    elif isinstance(s, BlockIdx) and 0 <= s.axis < len(kernel.grid):
        g = kernel.grid[s.axis]       # a run-time dimension: below 2**31 (checked at launch)
        found = Range(0, (g if is_static(g) else 1 << 31) - 1, True)
    elif isinstance(s, Cast) and s.x.dtype.is_int and s.x.name in ranges:
        found = ranges[s.x.name]
    elif isinstance(s, Binary) and s.a.name in ranges and s.b.name in ranges:
        found = _binary(s.op, ranges[s.a.name], ranges[s.b.name])
    elif isinstance(s, IntBinary) and s.a.name in ranges and s.b.name in ranges:
        found = _int_binary(s.op, ranges[s.a.name], ranges[s.b.name])
    bits = 8 * out.dtype.itemsize - 1
    if found is not None and -(1 << bits) <= found.lo and found.hi < (1 << bits):  # else it may wrap
        ranges[out.name] = found
