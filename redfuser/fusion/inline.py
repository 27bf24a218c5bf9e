"""Pass `inline_elementwise`: elementwise producers are recomputed where they are read.

Guarantees: the program computes the same values; no `Compute` that is not an
output remains unless its value is too large to duplicate (`MAX_INLINE_NODES`);
statements nothing reads (and that are not outputs) are removed.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Compute, Program, Reduce, TopK, walk, written
from ..ir.loop.rewrite import reads
from .substitute import inline_loads

MAX_INLINE_NODES = 256
"""A value larger than this is kept materialized rather than copied into every reader."""


def _size(e) -> int:
    return sum(1 for _ in walk(e))


def inline_elementwise(p: Program) -> Program:
    """Inline every small elementwise nest into its readers, then drop dead nests."""
    producers: dict[str, tuple] = {}
    body = []
    for s in p.body:
        if isinstance(s, Compute | Reduce | TopK):
            s = replace(s, value=inline_loads(s.value, producers))
            if isinstance(s, Compute) and _size(s.value) <= MAX_INLINE_NODES:
                producers[s.out.name] = (s.axes, s.value)
        body.append(s)
    return eliminate_dead(replace(p, body=tuple(body)))


def eliminate_dead(p: Program) -> Program:
    """`p` without statements whose buffers no output needs."""
    live = {b.name for b in p.outputs}
    kept = []
    for s in reversed(p.body):
        if any(b.name in live for b in written(s)):
            kept.append(s)
            live |= reads(s)
    return replace(p, body=tuple(reversed(kept)))
