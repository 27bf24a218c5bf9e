"""Views (`Broadcast`, `ExpandDims`, `Permute`) move no data: a layout of the result is a layout of the source.

A view's result element ``(i_0, ...)`` is one source element, and the map from
result coordinates to source coordinates is linear (drop a size-1 dim, zero a
broadcast dim, reorder dims), so sending every basis of the result's layout
through it gives the layout in which the source's registers *are* the
result's registers (`source_layout`). Zero bases appear where the view repeats
elements; the lowering then reads the same source register twice.
"""
from __future__ import annotations

from ...ir.tile import nodes as t
from .layouts import Basis, Layout, mapped


def source_layout(op: t.Broadcast | t.ExpandDims | t.Permute, out: Layout) -> Layout:
    """The layout of ``op.x`` whose registers are those of ``op.out`` in layout `out`."""
    src = op.x.shape
    if isinstance(op, t.ExpandDims):
        def fn(b: Basis) -> Basis:
            return b[:op.axis] + b[op.axis + 1:]
    elif isinstance(op, t.Permute):
        perm = op.perm

        def fn(b: Basis) -> Basis:
            coord = [0] * len(perm)
            for n, p in enumerate(perm):
                coord[p] = b[n]
            return tuple(coord)
    else:
        def fn(b: Basis) -> Basis:
            if not src:
                return ()
            return tuple(c if s != 1 else 0 for c, s in zip(b, src))
    return mapped(out, src, fn)
