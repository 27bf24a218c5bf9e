"""Statements and programs of the Loop IR: one loop nest per op, unfused.

A `Compute` is an elementwise loop nest ``for axes: out[axes] = value``; a
`Reduce` is ``for axes: out[axes] = op over reduce_axes of value``. A `Program`
is a straight-line list of such nests over named buffers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from .expr import Axis, Buffer, Expr, ReduceOp
from .source import UNKNOWN, SourceLoc


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


Stmt = Union[Compute, Reduce]


@dataclass(frozen=True, slots=True)
class Program:
    """A kernel in Loop IR: inputs, outputs and the loop nests that compute them in order."""

    name: str
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    body: tuple[Stmt, ...]

    def producers(self) -> dict[str, Stmt]:
        """The statement writing each buffer, by buffer name."""
        return {s.out.name: s for s in self.body}


def _program_str(self: Program) -> str:
    from .printer import format_program

    return format_program(self)


Program.__str__ = _program_str  # type: ignore[method-assign]
