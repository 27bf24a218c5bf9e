"""Recomputing a loop-local reduction where a later statement reads it at gathered positions.

A reduction that a fused loop reads only along the loop's axis, one chunk at a time, is computed per chunk
inside the loop and never stored (`rewrite._pull_locals`: a linear cross-entropy's ``logits = h @ w``
feeding the log-sum-exp over the vocabulary). A statement after the loop that reads it at a few positions
(the label's logit, ``logits[i, labels[i] % V]``) would keep it whole in memory. Here each such read
becomes a reduction of its own at the read's positions, ``sum over r of h[i, r] * w[r, labels[i] % V]``,
placed in front of the reader: one row of work per element read instead of the whole array in memory.

Only where it is cheap: the readers are elementwise statements that read, in all, no more elements than
one per row of the reduction's result (the result's size without the loop's dim). The values are the same
reduction in another summation order: within the tolerance any sum has (docs/testing.md).
"""
from __future__ import annotations

import math
from dataclasses import replace

from ..ir import Axis, Buffer, Compute, Expr, Load, Program, Reduce, map_expr, reads_axis, walk, written
from ..ir.loop.rewrite import reads
from .substitute import value_at


def read_along(indices: tuple, axis: Axis) -> int:
    """The dim a load reads along `axis` at the axis itself, or -1 (none, or a shifted or strided position:
    such a read needs other chunks' values than the chunk's own)."""
    along = [k for k, i in enumerate(indices) if reads_axis(i, axis.name)]
    return along[0] if len(along) == 1 and isinstance(indices[along[0]], Axis) else -1


def recompute_gathered_reads(p: Program, fused_ids: set[int], loop_exprs: list[Expr], epilogue: list[Compute],
                             axis: Axis) -> Program:
    """`p` with the gathered reads of each reduction the fused loop over `axis` reads along it (in
    `loop_exprs`) recomputed (see the module docstring), so that the loop can keep the reduction local."""
    outputs = {o.name for o in p.outputs}
    taken = {b.name for b in p.inputs} | {b.name for s in p.body for b in written(s)}
    body = list(p.body)
    for s in p.body:
        if not isinstance(s, Reduce) or s.out.name in outputs or id(s) in fused_ids:
            continue
        dims = {read_along(n.indices, axis) for e in loop_exprs for n in walk(e)
                if isinstance(n, Load) and n.buffer.name == s.out.name}
        if len(dims) != 1 or -1 in dims or any(s.out.name in reads(e) for e in epilogue):
            continue
        d = dims.pop()
        readers = [r for r in body if r is not s and id(r) not in fused_ids and s.out.name in reads(r)]
        if not readers or not all(isinstance(r, Compute) for r in readers):
            continue
        sites = [(r, n) for r in readers for n in dict.fromkeys(walk(r.value))
                 if isinstance(n, Load) and n.buffer.name == s.out.name]
        per_row = math.prod(a.extent for k, a in enumerate(s.axes) if k != d)
        if sum(math.prod(a.extent for a in r.axes) for r, _ in sites) > per_row:
            continue
        if {a.name for a in s.reduce_axes} & {a.name for r in readers for a in r.axes}:
            continue
        for r in readers:
            at: dict[Load, Load] = {}
            new: list[Reduce] = []
            for reader, n in sites:
                if reader is not r:
                    continue
                name = f"{s.out.name}_at"
                k = 1
                while name in taken:
                    name, k = f"{s.out.name}_at{k}", k + 1
                taken.add(name)
                buf = Buffer(name, replace(s.out.type, shape=tuple(a.extent for a in r.axes)))
                new.append(Reduce(buf, r.axes, s.reduce_axes, s.op, value_at(s.axes, s.value, n.indices), loc=s.loc))
                at[n] = Load(buf, r.axes)
            k = body.index(r)
            body[k:k + 1] = new + [replace(r, value=map_expr(r.value, lambda n: at.get(n)))]
    return replace(p, body=tuple(body))


__all__ = ["read_along", "recompute_gathered_reads"]
