"""`For`: a SIMT loop carrying every chunk of every loop-carried tile, in the layout the plan gave it.

Inits are converted into the carried layout in front of the loop and yields at
the end of the body, so online states (``m``, ``l``, ``acc``) stay in registers,
in one layout, across all chunks. The trip count is static and the same in
every thread, so barriers inside the body stay convergent.
"""
from __future__ import annotations

from ...ir.tile import nodes as t
from ...ir.simt.nodes import RegType
from .context import Lowering, LoopFrame, effect_rule
from .values import Regs


@effect_rule(t.For)
def _for(lw: Lowering, op: t.For) -> None:
    body = op.body
    layouts = [lw.planned(a) for a in body.args]
    inits = [lw.get(v, layout) for v, layout in zip(op.inits, layouts)]
    counts = [len(r.chunks) for r in inits]
    names = [a.name if n == 1 else f"{a.name}_{i}" for a, n in zip(body.args, counts) for i in range(n)]

    trips = max(0, -(-(op.stop - op.start) // op.step)) if isinstance(op.stop, int) else None
    stop = op.stop if isinstance(op.stop, int) else lw.get(op.stop, lw.scalar).chunks[0]

    def run(iv, *carried):
        lw.loops.append(LoopFrame(iv, op.start, stop, op.step, trips, lw.b.depth, body.iv.name))
        try:
            return body_of(iv, *carried)
        finally:
            lw.loops.pop()

    def body_of(iv, *carried):
        with lw.region():
            lw.bind(body.iv, Regs(lw.scalar, body.iv.dtype, (iv,)))
            at = 0
            for arg, layout, n in zip(body.args, layouts, counts):
                lw.bind(arg, Regs(layout, arg.dtype, tuple(carried[at:at + n])))
                at += n
            lw.emit_ops(body.ops)
            yields = [lw.get(y, layout) for y, layout in zip(body.yields, layouts)]
        return [c for r in yields for c in r.chunks]

    results = lw.b.for_(op.start, stop, op.step, [c for r in inits for c in r.chunks], run,
                        iv_type=RegType(body.iv.dtype), names=names, iv_name=body.iv.name)
    at = 0
    for r, layout, n in zip(op.results, layouts, counts):
        lw.bind(r, Regs(layout, r.dtype, tuple(results[at:at + n])))
        at += n
