"""Key blocks a fused loop may skip: the bound behind the ``skip_masked=True`` kernel option.

Causal attention masks its scores with ``where(j <= i, s, -inf)``: for a tile of
query rows ``i``, every key block past the diagonal holds only ``-inf`` scores,
so it changes no state -- the max stays, ``exp(-inf - m)`` adds zeros, and the
rescale of an unchanged max is exactly 1. `live_bound` finds such a mask and
proves the claim for each state on random points (`check_dead_terms`); the
scheduler then stops the loop after the last block any row of the tile can see
(``fused.fused_kernel``), halving causal attention's work.

With ``skip_masked=True`` this is exact for finite values only. Not for infinities under the mask: the
reference computes ``0 * v`` for every masked key, which is NaN where ``v`` is inf or NaN, and a skipped
block never reads ``v``. So the exact form, the cpu backend's default (``skip_masked=None``), skips a
block only where it has checked that the loads that could break it (`LiveBound.unsafe`: ``v``, not ``k``,
whose scores the mask replaces) are finite there: before the loop, a scan of the dead blocks' unsafe
loads (``0 * v`` summed, NaN if any is not finite) moves the stop past the last block holding one
(`fused.exact_live_stop`). Reading ``v``'s dead rows costs a small fraction of the dots skipped.

The masks recognized: a `Select` with ``-inf`` on one side whose condition
compares the fused axis ``j`` with a row axis ``i`` (each optionally plus a
constant), such that the live side is ``j - i <= K``. Every state must be an
online state whose terms all hold such a mask with one row axis and one ``K``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir import Axis, Binary, BinaryOp, Const, Expr, FusedLoop, IndexValue, Load, OnlineState, Select
from ..ir.loop.expr import walk
from ..ir.sizes import SizeLike, is_static
from ..ir.types import float64
from ..fusion.numeric_check import evaluate64
from .unify import AxisClasses

_POINTS = 64


@dataclass(frozen=True, slots=True)
class LiveBound:
    """Chunks with ``j > i + offset`` for every row ``i`` of a program change no state *while the loads in
    `unsafe` are finite there*; `row_key` is the class key of ``i``. `unsafe` lists ``(state number, load)``:
    the loads of the states' terms an infinity or NaN of which makes a dead term differ from its identity
    (``0 * v`` in ``P @ V``: NaN where ``v`` is inf); loads under the mask (``k`` in ``where(j <= i, q.k,
    -inf)``) are not among them."""

    row_key: str
    offset: int
    unsafe: tuple[tuple[int, Load], ...] = ()


OFFSET_MAX = 1 << 30
"""The largest mask offset ``K`` (``j <= i + K``) a loop stops early for. The stop, the row plus ``K``, is
computed in the kernel's index type (i32 where the extents fit): ``K = 2**31 - 1``, a "no limit" sentinel,
wrapped, and every row came out NaN on `cpu` (``2**32`` wrapped to 0: plain causal attention, 0.8 off; an i32
constant the GPU verifier refused; found by a helper). A mask that far out hides nothing of an axis shorter
than it, so the loop simply runs to the end: exact, as not skipping always is."""


def live_bound(fl: FusedLoop, classes: AxisClasses, fused_key: str) -> LiveBound | None:
    """The bound of `fl`'s masks (see the module docstring), or None when some state is not masked so."""
    if not fl.states or not all(isinstance(st, OnlineState) for st in fl.states):
        return None
    found: set[tuple[str, int]] = set()
    rows: dict[str, Axis] = {}
    n_locals = len(fl.locals)
    for j, st in enumerate(fl.states):
        stmt = n_locals + j
        masks = [m for m in (_mask(s, stmt, classes, fused_key) for s in walk(st.term) if isinstance(s, Select))
                 if m is not None]
        if not masks:
            return None
        for axis, offset in masks:
            key = classes.of(stmt, axis)
            rows[key] = axis
            found.add((key, offset))
    if len(found) != 1:
        return None
    ((row_key, offset),) = found
    if abs(offset) >= OFFSET_MAX:
        return None
    if not all(check_dead_terms(st, fl.axis, rows[row_key], offset) for st in fl.states):
        return None
    # an earlier state read in a dead chunk holds the value it had after the live ones: not scanned (a NaN
    # there came from the live chunks, whose results it has already made NaN)
    states = {b.name for st in fl.states for b in (st.acc, st.prev)}
    unsafe = tuple((j, leaf) for j, st in enumerate(fl.states) for leaf in _float_loads(st.term)
                   if leaf.buffer.name not in states and not all(check_dead_terms(st, fl.axis, rows[row_key], offset, special={leaf: v})
                              for v in (math.inf, -math.inf, math.nan)))
    return LiveBound(row_key, offset, unsafe)


def _float_loads(e: Expr) -> list[Load]:
    """The distinct float loads of `e`, in a deterministic order."""
    return sorted({n for n in walk(e) if isinstance(n, Load) and n.dtype.is_float}, key=repr)


def _mask(s: Select, stmt: int, classes: AxisClasses, fused_key: str) -> tuple[Axis, int] | None:
    """(row axis, K) when `s` is ``where(live, x, -inf)`` (or ``where(dead, -inf, x)``) with live ``j - i <= K``."""
    minus_inf = [isinstance(side, Const) and side.value == -math.inf for side in (s.a, s.b)]
    if minus_inf == [False, True]:
        negate = False
    elif minus_inf == [True, False]:
        negate = True
    else:
        return None
    cond = s.cond
    if not (isinstance(cond, Binary) and cond.op in _FLIP):
        return None
    left, right = _affine(cond.a), _affine(cond.b)
    if left is None or right is None:
        return None
    op = cond.op
    (la, lo), (ra, ro) = left, right
    if la is not None and classes.of(stmt, la) == fused_key and ra is not None and classes.of(stmt, ra) != fused_key:
        i_axis, diff = ra, ro - lo                        # j + lo op i + ro  <=>  j op i + (ro - lo)
    elif ra is not None and classes.of(stmt, ra) == fused_key and la is not None and classes.of(stmt, la) != fused_key:
        i_axis, diff, op = la, lo - ro, _FLIP[op]         # i + lo op j + ro  <=>  j flip(op) i + (lo - ro)
    else:
        return None
    if negate:   # the live side is the condition's complement
        op = _NEGATE[op]
    if op is BinaryOp.LE:
        return i_axis, diff
    if op is BinaryOp.LT:
        return i_axis, diff - 1
    return None      # a lower bound on j (a sliding window's start) ends no loop early


_FLIP = {BinaryOp.LE: BinaryOp.GE, BinaryOp.LT: BinaryOp.GT, BinaryOp.GE: BinaryOp.LE, BinaryOp.GT: BinaryOp.LT}
_NEGATE = {BinaryOp.LE: BinaryOp.GT, BinaryOp.LT: BinaryOp.GE, BinaryOp.GE: BinaryOp.LT, BinaryOp.GT: BinaryOp.LE}


def _affine(e: Expr) -> tuple[Axis | None, int] | None:
    """``(axis, c)`` for ``axis + c`` (``axis - c``, ``c + axis``, a constant alone: axis None), else None."""
    if isinstance(e, IndexValue):
        return e.axis, 0
    if isinstance(e, Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return None, e.value
    if isinstance(e, Binary) and e.op in (BinaryOp.ADD, BinaryOp.SUB):
        a, b = _affine(e.a), _affine(e.b)
        if a is None or b is None:
            return None
        if e.op is BinaryOp.ADD and (a[0] is None or b[0] is None):
            return (a[0] or b[0]), a[1] + b[1]
        if e.op is BinaryOp.SUB and b[0] is None:
            return a[0], a[1] - b[1]
    return None


def _points_range(extent: SizeLike) -> int:
    """How far random indices of an axis of `extent` reach (a run-time extent: as far as a long axis)."""
    return max(1, extent) if is_static(extent) else 1 << 16


def check_dead_terms(st: OnlineState, fused: Axis, row: Axis, offset: int, seed: int = 0,
                     special: dict[Load, float] | None = None) -> bool:
    """Whether `st`'s term is its reduction's identity wherever ``j > i + offset``, on random points in
    float64 (loads uniform in [-3, 3], so finite, except those in `special`, which hold the value given
    there; other indices random in their range)."""
    identity = st.op.identity(float64)
    rng = np.random.default_rng(seed)
    values: dict[Expr, np.ndarray] = {}
    i = rng.integers(0, _points_range(row.extent), _POINTS).astype(np.float64)
    for leaf in {n for n in walk(st.term) if isinstance(n, Load | IndexValue)}:
        if isinstance(leaf, IndexValue):
            if leaf.axis == row:
                values[leaf] = i
            elif leaf.axis == fused:
                values[leaf] = i + offset + 1 + rng.integers(0, 64, _POINTS)
            else:
                values[leaf] = rng.integers(0, _points_range(leaf.axis.extent), _POINTS).astype(np.float64)
        elif leaf.dtype.is_bool:
            values[leaf] = rng.random(_POINTS) < 0.5
        else:
            values[leaf] = rng.uniform(-3.0, 3.0, _POINTS)
        if special and leaf in special:
            values[leaf] = np.full(_POINTS, special[leaf])
    with np.errstate(all="ignore"):
        got = np.broadcast_to(evaluate64(st.term, values), (_POINTS,))
    return bool(np.all(got == identity))


__all__ = ["LiveBound", "live_bound", "check_dead_terms"]
