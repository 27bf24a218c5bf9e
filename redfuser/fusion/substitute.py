"""Substituting a nest's value for reads of its buffer (the heart of inlining)."""
from __future__ import annotations

from ..ir import Axis, Computed, Expr, IndexValue, Load, map_expr
from ..ir.loop.expr import IndexExpr
from ..ir.loop.index import as_index, index_value, rename_index


def rename_axes(e: Expr, mapping: dict[str, IndexExpr]) -> Expr:
    """`e` with loop axes replaced by name: by another axis, a fixed position, or a strided or computed index.

    Indices compose (`ir.loop.index`): ``x[2*i + 1]`` with ``i -> j + 4`` reads ``x[2*j + 9]``. (Clamping,
    which only keeps reads a select discards inside memory, is not composed: such a read stays discarded
    and in bounds.)"""
    if not mapping:
        return e

    def replace(a: Axis) -> IndexExpr | None:
        return mapping.get(a.name)

    def fix(n: Expr) -> Expr | None:
        if isinstance(n, Load):
            # (a computed position is a child: map_expr renamed inside it already; here it is only put back
            # in canonical form)
            indices = tuple(as_index(i.value, size) if isinstance(i, Computed) else rename_index(i, size, replace)
                            for i, size in zip(n.indices, n.buffer.shape))
            return None if indices == n.indices else Load(n.buffer, indices)
        if isinstance(n, IndexValue) and n.axis.name in mapping:
            return index_value(mapping[n.axis.name], n.dtype)
        return None

    return map_expr(e, fix)


def value_at(axes: tuple[Axis, ...], value: Expr, indices: tuple[IndexExpr, ...]) -> Expr:
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
