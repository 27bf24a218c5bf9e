"""TMA copies and mbarriers in the simulator: the asynchronous pipeline's protocol, checked.

`TmaLoad` copies a box of a global tensor into shared memory (0 outside the tensor, rows swizzled as a
``wgmma`` descriptor of the same mode reads them) and completes its bytes as transactions on an mbarrier.
A phase of an mbarrier completes when all its expected arrivals are in and its transaction count is back
to 0 (`MbarrierArrive` adds to the count what it expects, a copy takes off what it wrote); a wait on
parity ``p`` returns once the phase of that parity has completed. The simulator runs a block's threads
lock-step and performs a copy at once, so a wait that finds its phase incomplete can never return: no
other thread is left to arrive and no copy is still on its way. Each failure is a `SimulationError`:

- ``mbarrier_uninitialized``: an arrive, wait or copy on a barrier no `MbarrierInit` set up;
- ``mbarrier_expect_tx``: a copy completing bytes in a phase that had no ``expect_tx``, or more bytes than
  were expected (a copy issued by every thread instead of one, a box larger than the count);
- ``mbarrier_arrivals``: more arrivals in a phase than the barrier expects;
- ``mbarrier_deadlock``: a wait for a phase that can never complete (arrivals or bytes missing, or the
  wrong parity);
- ``tma_not_landed``: shared memory read (a load, an ``ldmatrix``, a ``wgmma``'s tile) from a copy that no
  wait has yet seen complete;
- ``buffer_reuse``: a copy into elements a ``wgmma`` still in flight reads (its stage was not released);
- ``tma_index``: threads naming different barriers of an allocation in one arrive or wait (a ring's stage
  is the same in every thread).

A copy's elements count as written for the race tracker's uninitialized check, but in no barrier interval:
the mbarrier, not ``bar.sync``, orders them, and that is what is checked here.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...ir.simt.nodes import MbarrierArrive, MbarrierInit, MbarrierWait, Reg, Stmt, TmaLoad
from ...ir.simt.wgmma_fragments import Swizzle, swizzle
from ...ir.simt.nodes import shared_offsets
from .state import Block, Mbarrier


def uniform_index(s: Stmt, block: Block, index: int | Reg, what: str) -> int:
    """`index` (a constant, or a register every active thread must hold the same value of: a ring's stage)."""
    if isinstance(index, int):
        return index
    values = block[index][block.active]
    if not values.size:
        return 0
    if (values != values[0]).any():
        block.fail("tma_index", f"threads name different {what}s ({index}: {sorted(set(values.tolist()))[:4]})", s)
    return int(values[0])


def _barrier(s: Stmt, block: Block, alloc, index: int) -> Mbarrier:
    found = block.tma.barriers.get((alloc.name, index))
    if found is None:
        block.fail("mbarrier_uninitialized", f"mbarrier {alloc.name}[{index}] is used before mbarrier.init", s)
    return found


def _complete(bar: Mbarrier, s: Stmt, block: Block, alloc, index: int) -> None:
    if bar.arrived > bar.expected:
        block.fail("mbarrier_arrivals", f"mbarrier {alloc.name}[{index}] expects {bar.expected} arrivals a phase, "
                   f"{bar.arrived} arrived", s)
    if bar.arrived == bar.expected and bar.tx == 0:
        bar.completed += 1
        bar.arrived, bar.expect_seen = 0, False


def _init(s: MbarrierInit, block: Block) -> None:
    block.tma.barriers[(s.alloc.name, s.index)] = Mbarrier(s.count)


def _arrive(s: MbarrierArrive, block: Block) -> None:
    index = uniform_index(s, block, s.index, "mbarrier")
    bar = _barrier(s, block, s.alloc, index)
    n = int(block.active.sum())
    bar.tx += s.tx_bytes * n
    bar.arrived += n
    bar.expect_seen = bar.expect_seen or s.tx_bytes > 0
    _complete(bar, s, block, s.alloc, index)


def _wait(s: MbarrierWait, block: Block) -> None:
    index = uniform_index(s, block, s.index, "mbarrier")
    bar = _barrier(s, block, s.alloc, index)
    parity = block[s.parity][block.active] if isinstance(s.parity, Reg) else np.array([s.parity])
    if parity.size and (parity != parity[0]).any():
        block.fail("mbarrier_deadlock", f"threads wait on mbarrier {s.alloc.name}[{index}] for different "
                   "parities", s)
    if parity.size and int(parity[0]) & 1 == bar.completed & 1:
        block.fail("mbarrier_deadlock", f"the wait on mbarrier {s.alloc.name}[{index}] for parity "
                   f"{int(parity[0]) & 1} can never return: its current phase has {bar.arrived} of {bar.expected} "
                   f"arrivals and {bar.tx} transaction bytes outstanding", s)
    bar.observed = bar.completed


def box_elements(s: TmaLoad, block: Block, coords: list[int], dst_index: int) -> tuple[np.ndarray, np.ndarray]:
    """(the global element of each box element, or -1 outside the tensor; the shared element it lands on, the
    box starting at element `dst_index` of `s.dst`)."""
    shape, box = block.kernel.buffer(s.src.name).shape, s.box      # (the launch's lengths)
    idx = np.indices(box).reshape(len(box), -1)                 # box coordinates, row-major
    pos = idx + np.array(coords)[:, None]
    inside = np.all((pos >= 0) & (pos < np.array(shape)[:, None]), axis=0)
    strides = np.cumprod((1,) + tuple(reversed(shape[1:])))[::-1]
    src = np.where(inside, (pos * np.array(strides)[:, None]).sum(axis=0), -1)
    item = s.dst.dtype.itemsize
    base = shared_offsets(block.kernel.shared)[s.dst.name]
    byte = base + (dst_index + np.arange(idx.shape[1])) * item
    mode = Swizzle(s.swizzle)
    if mode is not Swizzle.NONE:
        byte = swizzle(byte, mode)
    return src, (byte - base) // item


def _tma(s: TmaLoad, block: Block) -> None:
    barrier_index = uniform_index(s, block, s.barrier_index, "mbarrier")
    bar = _barrier(s, block, s.barrier, barrier_index)
    key = (s.barrier.name, barrier_index)
    mode = Swizzle(s.swizzle)
    row_bytes = s.box[-1] * s.dst.dtype.itemsize
    if mode is not Swizzle.NONE and row_bytes != mode.row_bytes:
        block.fail("tma_box", f"a {mode.name} swizzle wants box rows of {mode.row_bytes} bytes, not {row_bytes}", s)
    data = block.launch.globals[s.src.name]
    tracker = block.shared_trackers.get(s.dst.name)
    for t in np.flatnonzero(block.active):
        coords = [int(block[c][t]) for c in s.coords]
        dst_index = s.dst_index if isinstance(s.dst_index, int) else int(block[s.dst_index][t])
        src, dst = box_elements(s, block, coords, dst_index)
        if not ((dst >= 0) & (dst < s.dst.size)).all():
            block.fail("tma_box", f"the box lands outside {s.dst.name} (swizzle with a misaligned destination)", s)
        for out, reads in block.wgmma.reads.items():
            for name, elems in reads:
                if name == s.dst.name and np.intersect1d(elems.ravel(), dst).size:
                    block.fail("buffer_reuse", f"the copy overwrites {s.dst.name} elements that wgmma result %{out}, "
                               "still in flight, reads (wait for it before reusing the stage)", s)
        if not bar.expect_seen:
            block.fail("mbarrier_expect_tx", f"the copy completes {dst.size * s.dst.dtype.itemsize} bytes on mbarrier "
                       f"{key[0]}[{key[1]}] in a phase that had no arrive.expect_tx", s)
        bar.tx -= dst.size * s.dst.dtype.itemsize
        if bar.tx < 0:
            block.fail("mbarrier_expect_tx", f"the copies complete {-bar.tx} more bytes on mbarrier {key[0]}[{key[1]}] "
                       "than its phase expects", s)
        block.shared[s.dst.name][dst] = np.where(src >= 0, data[np.maximum(src, 0)], 0).astype(s.dst.dtype.numpy)
        if tracker is not None:
            tracker.record_async_write(dst, int(block.gid[t]))
        block.tma.copies.append((s.dst.name, dst, key, bar.completed))
        _complete(bar, s, block, s.barrier, s.barrier_index)


def check_landed(block: Block, name: str, elems: np.ndarray, s: Stmt) -> None:
    """Fail where `elems` of shared `name` come from a copy no wait has seen complete."""
    tma = block.tma
    if not tma.copies:
        return
    keep = []
    for alloc, dst, key, phase in tma.copies:
        if tma.barriers[key].observed > phase:
            continue          # landed and seen: forget it
        keep.append((alloc, dst, key, phase))
        if alloc == name and np.intersect1d(dst, np.asarray(elems).ravel()).size:
            block.fail("tma_not_landed", f"{name} is read where a TMA copy lands that no wait on mbarrier "
                       f"{key[0]}[{key[1]}] has seen complete", s)
    tma.copies = keep


RULES: dict[type, Callable[..., None]] = {
    MbarrierInit: _init,
    MbarrierArrive: _arrive,
    MbarrierWait: _wait,
    TmaLoad: _tma,
}

__all__ = ["box_elements", "check_landed", "RULES"]
