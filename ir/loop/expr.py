"""Scalar expressions of the Loop IR: what one element of a loop nest computes.

Every node is a frozen, slotted dataclass with a `dtype`; equality and hashing
are structural. Index expressions are loop axes (`Axis`) or fixed integers.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Union

from ..types import BufferType, DType


@dataclass(frozen=True, slots=True)
class Axis:
    """A loop variable ranging over ``0 <= name < extent``."""

    name: str
    extent: int

    def __str__(self) -> str:
        return self.name


IndexExpr = Union[Axis, int]
"""How one dimension of a buffer is indexed: by a loop axis or a fixed position."""


@dataclass(frozen=True, slots=True)
class Buffer:
    """A named array of the program: an input, an output or a temporary."""

    name: str
    type: BufferType

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    def __str__(self) -> str:
        return self.name


class UnaryOp(enum.Enum):
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    EXP2 = "exp2"
    EXP2_FTZ = "exp2_ftz"   # 2**x with results below f32's smallest normal (2**-126) flushed to +0: not in the
    #                         op namespace; the scheduler's exp of an f16 or e4m3 result (schedule/exprs.py)
    LOG = "log"
    LOG2 = "log2"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    NOT = "not"


TRANSCENDENTAL = frozenset({UnaryOp.EXP, UnaryOp.EXP2, UnaryOp.EXP2_FTZ, UnaryOp.LOG, UnaryOp.LOG2})
"""The unary ops a GPU computes in f32 only (from ``ex2``/``lg2``)."""

F32_TINY = 2.0 ** -126
"""f32's smallest normal number: `UnaryOp.EXP2_FTZ` flushes results below it to 0."""


class BinaryOp(enum.Enum):
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    POW = "**"
    MAX = "maximum"
    MIN = "minimum"
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="
    AND = "&"
    OR = "|"

    @property
    def is_comparison(self) -> bool:
        return self in _COMPARISONS

    @property
    def is_infix(self) -> bool:
        return self not in (BinaryOp.MAX, BinaryOp.MIN)


_COMPARISONS = frozenset({BinaryOp.LT, BinaryOp.LE, BinaryOp.GT, BinaryOp.GE, BinaryOp.EQ, BinaryOp.NE})


class ReduceOp(enum.Enum):
    """A commutative monoid a reduction combines with."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"

    def identity(self, dtype: DType) -> float | int | bool:
        """The monoid's neutral element in `dtype` (what an empty reduction gives)."""
        if self is ReduceOp.SUM:
            return False if dtype.is_bool else 0
        if dtype.is_float:
            return -math.inf if self is ReduceOp.MAX else math.inf
        if dtype.is_bool:
            return self is ReduceOp.MIN
        import numpy as np

        info = np.iinfo(dtype.numpy)
        return int(info.min) if self is ReduceOp.MAX else int(info.max)


@dataclass(frozen=True, slots=True)
class Const:
    """A scalar constant."""

    value: float | int | bool
    dtype: DType


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

