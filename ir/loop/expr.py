"""Scalar expressions of the Loop IR: what one element of a loop nest computes.

Every node is a frozen, slotted dataclass with a `dtype`; equality and hashing
are structural. Index expressions are loop axes (`Axis`) or fixed integers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..buffer import Buffer
from ..semantics import BinaryOp, UnaryOp
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


IndexExpr = Union[Axis, int]
"""How one dimension of a buffer is indexed: by a loop axis or a fixed position."""


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


Expr = Union[Const, IndexValue, Load, Unary, Binary, Select, Cast]


def children(e: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of `e`, in order."""
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


def loads(e: Expr) -> list[Load]:
    """All loads in `e`, in pre-order."""
    return [n for n in walk(e) if isinstance(n, Load)]

