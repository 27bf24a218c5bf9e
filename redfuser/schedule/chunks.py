"""`chunk_loop`: a walk of an axis in chunks, with the bounds mask only where a chunk can overhang.

An axis of static length either divides into chunks (no mask) or has a ragged last chunk, and the loop
masks every chunk, except with `ScheduleOptions.peel_ragged` (the CPU's default), where it is peeled as
below: a masked chunk of the CPU's fused loops costs its selects and stack copies on every chunk (layer
norm + GEMM over rows of 1000: 45 -> 31 ms; softmax 1000x1000 6.6 -> 1.6 ms). An axis of run-time length
(`redfuser.ir.sizes.Size`, a shape-polymorphic kernel: docs/shapes.md) would mask every chunk too, though
only the last one can overhang: a quarter of attention's time on the CPU. So its walk is *peeled*: one loop
over the whole chunks, ``[0, (n // chunk) * chunk)``, unmasked, then one over what is left, at most one
chunk, masked; the carried values pass from the first to the second. Both bounds are run-time extents.
"""
from __future__ import annotations

from typing import Callable

from ..ir import BinaryOp
from ..ir.sizes import SizeLike, divides, is_static
from ..ir.tile import nodes as t
from .builder import KernelBuilder
from .space import Dim

Step = Callable[[Dim, list[t.Value]], tuple[t.Value, ...] | list[t.Value]]
"""A chunk's work: the chunk's dim and the carried values -> the values to carry on."""


def chunk_loop(kb: KernelBuilder, key: str, order: int, n: SizeLike, stop: SizeLike | t.Value, size: int,
               inits: tuple[t.Value, ...], step: Step, hint: str, arg_hints: tuple[str, ...] | None = None,
               peel_ragged: bool = False) -> tuple[t.Value, ...]:
    """Walk ``[0, stop)`` of an axis of length `n` in chunks of `size` (a `Dim` keyed `key` at canonical
    position `order` each), carrying `inits` through `step`; the carried values after the walk. Peeled
    for a run-time `n` walked to its end, and with `peel_ragged` for a static `n` with a ragged last chunk
    (see the module docstring)."""
    ragged = peel_ragged and is_static(n) and n > size and not divides(size, n)
    if (is_static(n) and not ragged) or stop is not n:
        with kb.loop(0, stop, size, inits, hint=hint, arg_hints=arg_hints) as lp:
            lp.yield_(*step(Dim(key, order, size, n, lp.iv, not divides(size, n)), list(lp.args)))
        return lp.results
    whole = (n // size) * size
    with kb.loop(0, whole, size, inits, hint=hint, arg_hints=arg_hints) as lp:
        lp.yield_(*step(Dim(key, order, size, n, lp.iv, False), list(lp.args)))
    with kb.loop(0, n - whole, size, lp.results, hint=f"{hint}_tail", arg_hints=arg_hints) as tail:
        base = kb.binary(BinaryOp.ADD, kb.const(whole, kb.index_dtype), tail.iv, hint=f"{hint}_tail_base")
        tail.yield_(*step(Dim(key, order, size, n, base, True), list(tail.args)))
    return tail.results


__all__ = ["chunk_loop"]
