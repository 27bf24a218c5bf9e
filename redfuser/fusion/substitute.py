"""Substituting a nest's value for reads of its buffer (the heart of inlining)."""
from __future__ import annotations

from ..ir import Axis, Const, Expr, IndexValue, Load, map_expr


def rename_axes(e: Expr, mapping: dict[str, Axis | int]) -> Expr:
    """`e` with loop axes replaced by name: by another axis, or by a fixed position."""
    if not mapping:
        return e

    def fix(n: Expr) -> Expr | None:
        if isinstance(n, Load):
            if any(isinstance(i, Axis) and i.name in mapping for i in n.indices):
                return Load(n.buffer, tuple(mapping.get(i.name, i) if isinstance(i, Axis) else i for i in n.indices))
            return None
        if isinstance(n, IndexValue) and n.axis.name in mapping:
            new = mapping[n.axis.name]
            return IndexValue(new, n.dtype) if isinstance(new, Axis) else Const(new, n.dtype)
        return None

    return map_expr(e, fix)


def value_at(axes: tuple[Axis, ...], value: Expr, indices: tuple[Axis | int, ...]) -> Expr:
    """The value a nest ``for axes: out[axes] = value`` stores at ``out[indices]``."""
    return rename_axes(value, {a.name: i for a, i in zip(axes, indices)})


def inline_loads(e: Expr, producers: dict[str, tuple[tuple[Axis, ...], Expr]]) -> Expr:
    """Replace every read of a buffer in `producers` (name -> (axes, value)) by the value it reads."""

    def fix(n: Expr) -> Expr | None:
        if isinstance(n, Load) and n.buffer.name in producers:
            axes, value = producers[n.buffer.name]
            return value_at(axes, value, n.indices)
        return None

    return map_expr(e, fix)
