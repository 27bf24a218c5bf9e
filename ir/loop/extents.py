"""`substitute_extents`: a Loop IR program with some axis lengths replaced, the rest unchanged.

A shape-polymorphic kernel is traced once with *probe* lengths on its symbolic axes (large primes no
program computes by accident, `redfuser.shapes`); this pass then swaps each probe for what stands in its
place: a `Size` symbol for the scheduler of a polymorphic kernel, another probe (to check that nothing
in the program depends on the probe's value: the two programs must then be equal), or a call's real
lengths (the ``interpret`` backend runs the Loop IR itself). Only extents change: every `Axis`'s
`extent`, every dense `BufferType`'s shape entry and every `Length`'s size found in `mapping` (a mean's
count of a symbolic axis); constants, indices and strides never do, which is what makes the equality check
meaningful.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Mapping, TypeVar

from ..sizes import SizeLike
from ..types import BufferType, DType
from .expr import Axis, Length

_LEAVES = (str, int, float, bool, type(None), enum.Enum, DType)
T = TypeVar("T")


def substitute_extents(program: T, mapping: Mapping[int, SizeLike]) -> T:
    """`program` (or any tree of frozen dataclasses, tuples and dicts holding Loop IR, such as a fusion report's
    cascade groups) with each axis extent and buffer shape entry that is a key of `mapping` replaced by
    its value (see the module docstring). Shared sub-terms stay shared."""
    memo: dict[int, object] = {}

    def sub(x: object) -> object:
        if isinstance(x, _LEAVES):
            return x
        found = memo.get(id(x))
        if found is not None:
            return found
        if isinstance(x, Axis):
            made: object = Axis(x.name, mapping.get(x.extent, x.extent)) if _is_key(x.extent, mapping) else x
        elif isinstance(x, Length):
            sizes = tuple(mapping.get(n, n) if _is_key(n, mapping) else n for n in x.sizes)
            made = x if all(a is b for a, b in zip(sizes, x.sizes)) else Length(sizes, x.dtype)
        elif isinstance(x, BufferType):
            shape = tuple(mapping.get(n, n) if _is_key(n, mapping) else n for n in x.shape)
            made = x if all(a is b for a, b in zip(shape, x.shape)) else BufferType(x.dtype, shape, x.strides)
        elif isinstance(x, tuple):
            items = tuple(sub(i) for i in x)
            made = x if all(a is b for a, b in zip(items, x)) else items
        elif isinstance(x, dict):     # (a cascade group's decompositions by member)
            values = {k: sub(v) for k, v in x.items()}
            made = x if all(values[k] is v for k, v in x.items()) else values
        elif dataclasses.is_dataclass(x):
            changes = {f.name: sub(getattr(x, f.name)) for f in dataclasses.fields(x)}
            same = all(changes[f.name] is getattr(x, f.name) for f in dataclasses.fields(x))
            made = x if same else dataclasses.replace(x, **changes)
        else:
            made = x
        memo[id(x)] = made
        return made

    return sub(program)  # type: ignore[return-value]


def _is_key(extent: object, mapping: Mapping[int, SizeLike]) -> bool:
    return isinstance(extent, int) and not isinstance(extent, bool) and extent in mapping


__all__ = ["substitute_extents"]
