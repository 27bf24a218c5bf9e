"""A dot's elementwise epilogue, computed on the micro-kernel's accumulators while they are in registers.

Attention's scores are ``s = (q @ k^T) * scale``: the dot's tile ``D`` is read by one elementwise value ``E``
and by nothing else, and ``E`` is kept in memory (the row max and the exp read it). Emitted op by op, the
micro-kernel (`gemm.py`) stores ``D``, and a pass over the tile reads it back and stores ``E``: at 256 x 128
f32, 128 KiB each way through L2 every chunk, 5% of a CPU attention kernel. Here the micro-kernel computes
``E``'s vector from each accumulator vector and stores that instead; ``D`` is never stored.

Which ``E`` (`dot_epilogue`): a materialized value of ``D``'s shape, computed inline elementwise
(`stmts.pointwise_tree`) from ``D`` and from *row values*: constants, and broadcasts along the columns of a
scalar or of a per-row value (``[m, 1] -> [m, n]``) already computed where the dot runs (in a slot or a
register). ``D`` and the tree's inner values are read by the tree alone, ``E`` is defined in the dot's own
block, and the tree's ops are float ``+ - * /``, ``maximum``, ``minimum``, negation and ``abs``, whose rules
(`rules.py`) build the same instructions on vectors as on scalars: each element of ``E`` is the same IR
on the same operands, so bit for bit what the separate pass computed.

How it is evaluated (`Epilogue.apply`): the rules run unchanged at an index ``(row, col)`` whose memo entries
(`KernelEmitter.elem`) are seeded with the accumulator vector for ``D`` and with a splat of each row value's
element, so every ``em.value`` under ``E`` gives a vector and the rules emit vector instructions.
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from ...ir import BinaryOp, UnaryOp
from ...ir.tile import nodes as t
from ..llvm_utils import broadcast_lanes
from .emitter import KernelEmitter, Slot
from .plan import ELEMENTWISE, VIEWS

VECTOR_BINARY = frozenset({BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.DIV, BinaryOp.MAX, BinaryOp.MIN})
"""Binary ops whose host rule is one vector-generic instruction or intrinsic on floats."""

VECTOR_UNARY = frozenset({UnaryOp.NEG, UnaryOp.ABS})
"""Unary ops whose host rule is one vector-generic instruction or intrinsic on floats."""


@dataclass(frozen=True)
class Epilogue:
    """``E`` (`root`) computed from the dot's result (`dot_out`) in registers and stored in `slot`; `leaves`:
    the row values under it."""

    root: t.Value
    dot_out: t.Value
    leaves: tuple[t.Value, ...]
    slot: Slot

    def apply(self, em: KernelEmitter, row: ir.Value, col: ir.Value, acc: ir.Value) -> ir.Value:
        """``E``'s vector at ``(row, col .. col + lanes)`` from `acc`, ``D``'s accumulator vector there."""
        idx = (row, col)
        key = tuple(id(i) for i in idx)
        dot_slot = em.slots.pop(self.dot_out.name, None)   # (a slot is read before the memo: `elem`)
        try:
            with em.level():
                memo = em.memo()
                memo[(self.dot_out.name, key)] = (idx, acc)
                for leaf in self.leaves:        # the row's element, the same at every column
                    memo[(leaf.name, key)] = (idx, broadcast_lanes(em.b, em.value(leaf, idx), acc.type.count))
                return em.inline(self.root, idx)
        finally:
            if dot_slot is not None:
                em.slots[self.dot_out.name] = dot_slot


def _vector_op(op: t.Op) -> bool:
    if not op.out.dtype.is_float or not all(v.dtype.is_float for v in t.operands(op)):
        return False
    if isinstance(op, t.Binary):
        return op.op in VECTOR_BINARY
    return isinstance(op, t.Unary) and op.op in VECTOR_UNARY


def _row_source(em: KernelEmitter, v: t.Value) -> t.Value | None:
    """Where `v`'s elements come from when it is the same along its last axis and available here: `v` itself
    when a constant, else the value views broadcast along that axis (a scalar, or a length-1 last axis): a
    constant, or something already emitted. None otherwise."""
    op = em.plan.defs.get(v.name)
    if isinstance(op, t.Constant):
        return v
    if not isinstance(op, t.Broadcast) or (op.x.shape and op.x.shape[-1] != 1):
        return None
    src = op.x
    while isinstance(em.plan.defs.get(src.name), VIEWS):
        src = em.plan.defs[src.name].x
    if (isinstance(em.plan.defs.get(src.name), t.Constant) or src.name in em.slots
            or (src.shape == () and src.name in em.scalars)):
        return src
    return None


def dot_epilogue(em: KernelEmitter, op: t.Dot) -> Epilogue | None:
    """The epilogue of `op` (see the module docstring), its slot made; None where there is none."""
    from .stmts import pointwise_tree

    d = op.out
    readers = em.readers.get(d.name, [])
    if not readers or d.name in em.in_place:
        return None
    defs = em.plan.defs
    # from each reader of `d`, the elementwise ops above it up to a materialized value of its shape: one `E`
    roots = set()
    for reader in readers:
        if not isinstance(reader, ELEMENTWISE):
            return None
        while reader.out.name not in em.plan.materialized:
            above = em.readers.get(reader.out.name, [])
            if len(above) != 1 or not isinstance(above[0], ELEMENTWISE) or above[0].out.shape != d.shape:
                return None
            reader = above[0]
        roots.add(id(reader))
        root_op = reader
    if len(roots) != 1:
        return None
    root = root_op.out
    if root.shape != d.shape or em.block_of.get(id(root_op)) != em.block_of.get(id(op)):
        return None
    tree = pointwise_tree(em, defs, root)
    tree_ops = list({id(o): o for o in defs.values() if id(o) in tree}.values())
    if not all(_vector_op(o) for o in tree_ops):
        return None
    inner = {o.out.name for o in tree_ops if o.out is not root}
    if any(id(r) not in tree for name in inner | {d.name} for r in em.readers.get(name, [])):
        return None      # (a value under `E` read elsewhere would be recomputed there from a `D` never stored)
    leaves: dict[str, t.Value] = {}
    sources: list[t.Value] = []
    for o in tree_ops:
        for v in t.operands(o):
            if v.name == d.name or v.name in inner:
                continue
            src = _row_source(em, v)
            if src is None:
                return None
            leaves[v.name] = v
            sources.append(src)
    for src in sources:      # a scalar constant the block defines after the dot: its register is the constant
        if src.shape == () and src.name not in em.scalars:
            em.scalars[src.name] = em.inline(src, ())
    return Epilogue(root, d, tuple(leaves.values()), em.new_slot(root))
