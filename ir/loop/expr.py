"""Scalar expressions of the Loop IR: what one element of a loop nest computes.

Every node is a frozen, slotted dataclass with a `dtype`; equality and hashing
are structural. Index expressions are loop axes (`Axis`), fixed integers, or
an axis scaled and shifted (`Strided`: the index map of a slice with a start or
a step, and of a piece of a concatenation).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

from ..buffer import Buffer
from ..semantics import BinaryOp, UnaryOp
from ..sizes import SizeLike
from ..types import DType, scalar_key


@dataclass(frozen=True, slots=True)
class Axis:
    """A loop variable ranging over ``0 <= name < extent``."""

    name: str
    extent: int

    def __post_init__(self) -> None:
        if type(self.extent) is not int and isinstance(self.extent, int):
            object.__setattr__(self, "extent", int(self.extent))   # a traced probe length (redfuser.probes)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Strided:
    """Position ``start + step * axis`` along one buffer dimension (``x[start::step]`` read at `axis`).

    A position outside the dimension reads the nearest element instead (the index is clamped). The
    tracer makes such reads only for the pieces of ``concatenate``, whose select discards every value
    read so: clamping keeps those reads inside the buffer's memory; every value a program keeps is read
    at ``start + step * axis`` exactly. `step` is never 0 (that is a fixed position). ``(0, 1)`` is a
    prefix of the dimension (a plain `Axis` index always runs over the whole dimension).
    """

    axis: Axis
    start: int
    step: int

    def at(self, k: int, size: int) -> int:
        """The position read when the axis is at `k`, in a dimension of `size` (clamped)."""
        return min(max(self.start + self.step * k, 0), size - 1)

    def may_clamp(self, size: object) -> bool:
        """Whether some position of the axis falls outside a dimension of `size` (a run-time size: yes)."""
        if not isinstance(size, int) or not isinstance(self.axis.extent, int):
            return True
        last = self.start + self.step * (self.axis.extent - 1)
        return self.axis.extent > 0 and not (0 <= min(self.start, last) and max(self.start, last) < size)

    def __str__(self) -> str:
        scaled = self.axis.name if self.step == 1 else f"-{self.axis.name}" if self.step == -1 else \
            f"{self.step}*{self.axis.name}"
        if self.start == 0:
            return scaled   # (0, 1): a prefix of the dimension, which the buffer's shape shows
        return f"{scaled} {'+' if self.start > 0 else '-'} {abs(self.start)}"


@dataclass(frozen=True, slots=True)
class Computed:
    """A position computed from loop indices and data: an int64 expression, clamped into the dimension as a
    `Strided` one is (a reshape's and a gather's positions are always inside it; a piece of a concatenation
    read through a reshape is clamped where it is discarded). A reshape reads through these (a dim split in
    two at ``16*g + c``, two dims merged into one at ``n // 16`` and ``n % 16``), and so does a gather
    (``take_along_axis``: ``x[i, idx[i, k] % n]``, whose loads of ``idx`` are the load's children)."""

    value: "Expr"

    def __str__(self) -> str:
        from .printer import format_expr

        return format_expr(self.value)


IndexExpr = Union[Axis, int, Strided, Computed]
"""How one dimension of a buffer is indexed: by a loop axis, a fixed position, an axis scaled and shifted, or
a position computed from several axes."""


def strided(axis: Axis, start: int, step: int, size: object = None) -> IndexExpr:
    """The index ``start + step * axis`` of a dimension of `size`: the axis itself when that is the whole
    dimension in order (a `size` is needed to know it), else a `Strided` one."""
    if step == 0:
        raise ValueError("a step of 0 is a fixed position, not a strided index")
    if (start, step) == (0, 1) and size is not None and axis.extent == size:
        return axis
    return Strided(axis, int(start), int(step))


def index_axes(i: IndexExpr) -> tuple[Axis, ...]:
    """The loop axes an index varies with (none for a fixed position), in order of first use."""
    if isinstance(i, Axis):
        return (i,)
    if isinstance(i, Strided):
        return (i.axis,)
    if isinstance(i, Computed):
        return tuple(dict.fromkeys(n.axis for n in walk(i.value) if isinstance(n, IndexValue)))
    return ()


def reads_axis(i: IndexExpr, name: str) -> bool:
    """Whether index `i` varies with the loop axis called `name`."""
    return any(a.name == name for a in index_axes(i))


def shift_index(i: IndexExpr, start: int, step: int, size: object = None) -> IndexExpr:
    """``start + step * i``: the index `i` seen through a slice ``[start::step]`` of a dimension of `size`."""
    if isinstance(i, int):
        return start + step * i
    if isinstance(i, Axis):
        return strided(i, start, step, size)
    if isinstance(i, Computed):
        from ..types import int64
        scaled = i.value if step == 1 else Binary(BinaryOp.MUL, Const(step, int64), i.value, int64)
        return Computed(Binary(BinaryOp.ADD, scaled, Const(start, int64), int64) if start else scaled)
    return strided(i.axis, start + step * i.start, step * i.step, size)


@dataclass(frozen=True, slots=True)
class Const:
    """A scalar constant. Two are equal when their dtypes are and their values are the same number of the same
    Python type bit for bit: ``-0.0`` is not ``0.0`` (``x / -0.0`` is -inf), ``1`` is not ``True`` and a NaN
    equals itself, so what shares equal expressions (CSE, the schedule's lowering memo) never merges
    constants that compute differently."""

    value: float | int | bool
    dtype: DType

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Const) and self.dtype == other.dtype and \
            scalar_key(self.value) == scalar_key(other.value)

    def __hash__(self) -> int:
        return hash((scalar_key(self.value), self.dtype))


@dataclass(frozen=True, slots=True)
class IndexValue:
    """The value of a loop axis as a number (what ``arange`` produces)."""

    axis: Axis
    dtype: DType


@dataclass(frozen=True, slots=True)
class Length:
    """The number of elements of some axes, as a number of `dtype`: what numpy's ``mean`` and ``var`` divide
    by. `sizes` are the lengths multiplied: integers, or a shape-polymorphic kernel's run-time lengths
    (`redfuser.ir.sizes.Size`) once its probes are replaced (`ir.loop.extents`), so a mean over a symbolic
    axis does not make the kernel specialize on its length. A constant length is a `Const` (the tracer makes
    this node only for a probe length: a mean's count, `redfuser.ops.statistics`, and a length the body
    hands to an op as it is, ``s / x.shape[-1]``, `redfuser.ops.common.operand`)."""

    sizes: tuple[SizeLike, ...]
    dtype: DType

    def __post_init__(self) -> None:
        # a traced probe length (redfuser.probes) is an int subclass that notes reads: keep the plain int
        object.__setattr__(self, "sizes", tuple(int(n) if isinstance(n, int) else n for n in self.sizes))

    @property
    def count(self) -> SizeLike:
        """The product of `sizes`: an int, or a `Size` where one of them is."""
        return math.prod(self.sizes)


@dataclass(frozen=True, slots=True)
class Load:
    """Read ``buffer[indices]``; one index per buffer dimension."""

    buffer: Buffer
    indices: tuple[IndexExpr, ...]

    @property
    def dtype(self) -> DType:
        return self.buffer.dtype


@dataclass(frozen=True, slots=True)
class Unary:
    op: UnaryOp
    x: "Expr"
    dtype: DType


@dataclass(frozen=True, slots=True)
class Binary:
    op: BinaryOp
    a: "Expr"
    b: "Expr"
    dtype: DType


@dataclass(frozen=True, slots=True)
class Select:
    """``where(cond, a, b)``."""

    cond: "Expr"
    a: "Expr"
    b: "Expr"
    dtype: DType


@dataclass(frozen=True, slots=True)
class Cast:
    x: "Expr"
    dtype: DType


Expr = Union[Const, IndexValue, Length, Load, Unary, Binary, Select, Cast]


def children(e: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of `e`, in order (a load's are its computed positions: a gather reads the
    index buffers in them, so every walk sees those reads)."""
    if isinstance(e, Load):
        return tuple(i.value for i in e.indices if isinstance(i, Computed))
    if isinstance(e, Unary | Cast):
        return (e.x,)
    if isinstance(e, Binary):
        return (e.a, e.b)
    if isinstance(e, Select):
        return (e.cond, e.a, e.b)
    return ()


def walk(e: Expr):
    """Every node of `e`, parents before children (pre-order)."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def contraction(term: Expr, axis: str) -> bool:
    """Whether `term` is a product of two factors that both vary along `axis` (``p[i, j] * v[j, d]``: a GEMM's
    accumulator, whose chunks a dot takes itself; ``x[i, j] * w[j]`` counts too)."""
    def varies(e: Expr) -> bool:
        return any((isinstance(n, Load) and any(reads_axis(i, axis) for i in n.indices))
                   or (isinstance(n, IndexValue) and n.axis.name == axis) for n in walk(e))

    return isinstance(term, Binary) and term.op is BinaryOp.MUL and varies(term.a) and varies(term.b)


def loads(e: Expr) -> list[Load]:
    """All loads in `e`, in pre-order."""
    return [n for n in walk(e) if isinstance(n, Load)]

