"""Statements and programs of the Loop IR: one loop nest per op, unfused.

A `Compute` is an elementwise loop nest ``for axes: out[axes] = value``; a
`Reduce` is ``for axes: out[axes] = op over reduce_axes of value``. A `Program`
is a straight-line list of such nests over named buffers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from .expr import Axis, Expr
from ..buffer import Buffer
from ..semantics import ReduceOp
from ..source import UNKNOWN, SourceLoc
from ..types import DType, float32


@dataclass(frozen=True, slots=True)
class Compute:
    """``for axes: out[axes] = value`` (one axis per dimension of `out`)."""

    out: Buffer
    axes: tuple[Axis, ...]
    value: Expr
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class Reduce:
    """``for axes: out[axes] = op over reduce_axes of value``.

    `value` may read `axes` and `reduce_axes`; the result starts from the
    monoid's identity, so an empty reduction gives it.
    """

    out: Buffer
    axes: tuple[Axis, ...]
    reduce_axes: tuple[Axis, ...]
    op: ReduceOp
    value: Expr
    loc: SourceLoc = field(default=UNKNOWN, compare=False)


@dataclass(frozen=True, slots=True)
class TopK:
    """``for axes: values, indices = top k over reduce_axis of value`` (order: see `redfuser.ir.topk`).

    `values` and `indices` (i64) have one dim per axis of `axes`; ``axes[rank]``, of
    extent k, is the rank (0 = largest). `value` reads the other axes and `reduce_axis`.
    """

    values: Buffer
    indices: Buffer
    axes: tuple[Axis, ...]
    rank: int
    reduce_axis: Axis
    value: Expr
    loc: SourceLoc = field(default=UNKNOWN, compare=False)

    @property
    def k(self) -> int:
        return self.axes[self.rank].extent

    @property
    def parallel(self) -> tuple[Axis, ...]:
        """The axes other than the rank."""
        return self.axes[: self.rank] + self.axes[self.rank + 1:]


@dataclass(frozen=True, slots=True)
class OnlineState:
    """One loop-carried partial result of a fused cascade (ARCHITECTURE.md section 4).

    Per chunk of the loop axis, in cascade order::

        partial = op over the chunk of term       # term reads earlier states' updated values
        scaled  = prev                      where prev == identity(op) or rescale is None
                = prev * rescale            elsewhere
        acc     = scaled + partial (SUM)   or   op(scaled, partial) (MAX/MIN)

    `prev` names `acc`'s value before the chunk; `rescale` reads `prev`-buffers and
    current values of earlier states, e.g. ``exp(m_prev - m)``; it is > 0 or NaN,
    so it distributes over max and min too. `acc` starts at the monoid's identity,
    which no rescale changes (``-inf * 0`` must stay ``-inf``, not become NaN).

    The fusion engine reads a running max ``m`` inside exponentials as
    ``where(m == -inf, 0, m)`` (explicitly, in `term` and on the current side of
    `rescale`), so a chunk seen while ``m`` is still -inf contributes the exact
    ``exp(-inf - 0) = 0`` rather than ``exp(-inf + inf) = NaN``; a row that stays
    -inf to the end gets the reference's NaN in the epilogue.

    `carry`, when set (only for SUM and PROD states, and then `rescale` is None), replaces
    the ``scaled`` line: ``scaled = carry``, always, identity included. It reads the
    `prev`-buffers of this and earlier states and earlier states' current values:
    a shift-stable accumulator ``sum (x - c)^k`` moves to a new centre by the
    binomial law over its family's lower powers (`redfuser/fusion/centred.py`); a
    running product is rescaled by the sum's rescale raised to the count of elements
    already multiplied in (`redfuser/fusion/product_law.py`).
    """

    acc: Buffer
    prev: Buffer
    axes: tuple[Axis, ...]
    op: ReduceOp
    term: Expr
    rescale: Expr | None = None
    carry: Expr | None = None

    @property
    def carried_dtype(self) -> DType:
        """The type the loop carries `acc` (and `prev`) in and computes the update in: f32 where `acc` is a
        storage-only type (f16, bf16, e4m3) -- each chunk's running value rounded to 16 bits would overflow or
        lose what the whole sum keeps, and numpy accumulates a 16-bit sum or matmul in f32 too; every backend
        carries it so. After the loop a sum, max or min is read in f32 by the arithmetic that follows, rounded
        where it is stored or where a decision reads it (`interpreter.held_results`).
        Otherwise `acc`'s own type."""
        return float32 if self.acc.dtype.storage_only else self.acc.dtype


@dataclass(frozen=True, slots=True)
class TopKState:
    """A running top-k of a fused cascade (the top-k monoid of `redfuser.ir.topk`).

    Per chunk: the chunk's top k of `term` (indices along the loop axis) merges
    with the previous list, whose values (not empty slots) are first multiplied
    by `rescale` — positive, so the order is kept. `acc` holds the values with the
    rank at position `rank` among `axes`; `indices` the positions (i64).
    """

    acc: Buffer
    indices: Buffer
    prev: Buffer
    axes: tuple[Axis, ...]
    rank: int
    term: Expr
    rescale: Expr | None = None

    @property
    def k(self) -> int:
        return self.acc.shape[self.rank]


@dataclass(frozen=True, slots=True)
class FusedLoop:
    """One pass over `axis` that computes several reductions at once (a fused cascade).

    `locals` are producers computed per chunk inside the loop (for example the
    ``q @ k.T`` scores of the current keys): nests whose axes include `axis`, whose
    buffers live only inside the loop. `states` are updated in order per chunk.
    After the loop each state's `acc` holds that reduction's final value.
    """

    axis: Axis
    locals: tuple["Compute | Reduce", ...]
    states: tuple["OnlineState | TopKState", ...]
    loc: SourceLoc = field(default=UNKNOWN, compare=False)

    @property
    def outs(self) -> tuple[Buffer, ...]:
        out: list[Buffer] = []
        for s in self.states:
            out += [s.acc, s.indices] if isinstance(s, TopKState) else [s.acc]
        return tuple(out)


Stmt = Union[Compute, Reduce, TopK, FusedLoop]


def written(s: "Stmt") -> tuple[Buffer, ...]:
    """The buffers a statement defines (visible after it)."""
    if isinstance(s, FusedLoop):
        return s.outs
    if isinstance(s, TopK):
        return (s.values, s.indices)
    return (s.out,)


@dataclass(frozen=True, slots=True)
class Program:
    """A kernel in Loop IR: inputs, outputs and the loop nests that compute them in order."""

    name: str
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    body: tuple[Stmt, ...]

    def producers(self) -> dict[str, Stmt]:
        """The statement writing each buffer, by buffer name."""
        return {b.name: s for s in self.body for b in written(s)}


def _program_str(self: Program) -> str:
    from .printer import format_program

    return format_program(self)


Program.__str__ = _program_str  # type: ignore[method-assign]
