"""Structured control flow and barriers, lock-step with an active mask.

`If` runs each branch with the threads that take it (a branch no thread takes
is skipped); `For` iterates while any active thread's counter is below its
bound, narrowing the mask as threads finish. A `Barrier` must be reached by
every thread of the block; it advances the epoch the race trackers compare.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...ir.simt.nodes import Barrier, For, If, Reg
from .state import Block


def _barrier(s: Barrier, block: Block) -> None:
    if not block.active.all():
        idle = int(np.flatnonzero(~block.active)[0])
        block.fail("divergent_barrier", f"barrier reached under divergent control flow: {block.thread_name(idle)} "
                   "does not reach it (every thread of the block must)", s)
    block.launch.epoch += 1


def _bound(v: Reg | int, block: Block, dtype: np.dtype) -> np.ndarray:
    return block[v].astype(dtype) if isinstance(v, Reg) else np.full(block.threads, v, dtype=dtype)


def _merge(take: np.ndarray, new: np.ndarray, old: np.ndarray) -> np.ndarray:
    return np.where(take[:, None] if new.ndim == 2 else take, new, old)


def _for(s: For, block: Block) -> None:
    body = s.body
    dtype = body.iv.dtype.numpy
    iv, stop = _bound(s.start, block, dtype), _bound(s.stop, block, dtype)
    carried = [block[r] for r in s.inits]
    outer = block.active
    try:
        while True:
            running = outer & (iv < stop)
            if not running.any():
                break
            block.active = running
            block.set(body.iv, iv)
            for arg, value in zip(body.args, carried):
                block.set(arg, value)
            block.run(body.stmts)
            carried = [_merge(running, block[y], c) for y, c in zip(body.yields, carried)]
            iv = np.where(running, iv + s.step, iv).astype(dtype)
    finally:
        block.active = outer
    for r, value in zip(s.results, carried):
        block.set(r, value)


def _if(s: If, block: Block) -> None:
    cond = block[s.cond]
    outer = block.active
    sides = []
    try:
        for side, take in ((s.then, outer & cond), (s.orelse, outer & ~cond)):
            if take.any():
                block.active = take
                block.run(side.stmts)
                sides.append([block[y] for y in side.yields])
            else:   # nobody runs it: its yields are never selected
                sides.append([np.zeros((block.threads,) + ((r.length,) if r.length > 1 else ()), r.dtype.numpy)
                              for r in s.results])
    finally:
        block.active = outer
    for r, a, b in zip(s.results, sides[0], sides[1]):
        block.set(r, _merge(cond, a, b))


RULES: dict[type, Callable[..., None]] = {
    Barrier: _barrier,
    For: _for,
    If: _if,
}
