"""Global and shared loads/stores: bounds, alignment, masks, and the race trackers.

Only active threads whose mask holds touch memory; the others get `other`. An
index outside the array, or a vector access not aligned to its length, raises
`SimulationError` naming the array, the index, the thread and the statement.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...ir.simt.nodes import LoadGlobal, LoadShared, Stmt, StoreGlobal, StoreShared
from .state import Block
from .tma import check_landed
from .tracker import Tracker


def _bits(values: np.ndarray) -> np.ndarray:
    """Values as unsigned bit patterns (so NaN == NaN and -0 != 0 when comparing writes)."""
    return values.view(f"u{values.dtype.itemsize}")


def _where(s: Stmt, block: Block) -> tuple[np.ndarray, str, str, Tracker | None]:
    """The flat array `s` touches, its printed name, its space and its tracker."""
    if isinstance(s, LoadGlobal | StoreGlobal):
        name = s.buffer.name
        return block.launch.globals[name], name, "global", block.launch.trackers.get(name)
    name = s.alloc.name
    return block.shared[name], name, "shared", block.shared_trackers.get(name)


def _elements(s: LoadGlobal | LoadShared | StoreGlobal | StoreShared, block: Block, size: int, name: str,
              space: str, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(threads that access, their element offsets ``[n, length]``), after bounds and alignment checks."""
    on = block.active if s.mask is None else block.active & block[s.mask]
    threads = np.flatnonzero(on)
    first = block[s.index][threads].astype(np.int64)
    bad = np.flatnonzero((first < 0) | (first + length > size))
    verb = "load" if isinstance(s, LoadGlobal | LoadShared) else "store"
    if bad.size:
        k = bad[0]
        span = f"[{first[k]}]" if length == 1 else f"[{first[k]}:{first[k] + length}]"
        block.fail("out_of_bounds", f"{verb} of {space} {name}{span} by {block.thread_name(threads[k])}: "
                   f"{name} has {size} elements", s)
    if length > 1:
        bad = np.flatnonzero(first % length)
        if bad.size:
            k = bad[0]
            block.fail("misaligned", f"{length}-element vector {verb} of {space} {name}[{first[k]}] by "
                       f"{block.thread_name(threads[k])}: the index must be a multiple of {length}", s)
    return threads, first[:, None] + np.arange(length)


def fail_at(block: Block, s: Stmt) -> Callable[[str, str], None]:
    """The tracker's failure callback for statement `s` of `block`."""
    return lambda kind, message: block.fail(kind, message, s)


def load(s: LoadGlobal | LoadShared, block: Block) -> None:
    array, name, space, tracker = _where(s, block)
    length = s.out.length
    threads, elems = _elements(s, block, array.size, name, space, length)
    if space == "shared" and block.tma.copies:
        check_landed(block, name, elems, s)
    if tracker is not None:
        tracker.read(elems.ravel(), np.repeat(block.gid[threads], length), block.launch.epoch, fail_at(block, s))
    shape = (block.threads,) if length == 1 else (block.threads, length)
    out = np.full(shape, s.other).astype(s.out.dtype.numpy)
    out[threads] = array[elems] if length > 1 else array[elems[:, 0]]
    block.set(s.out, out)


def store(s: StoreGlobal | StoreShared, block: Block) -> None:
    array, name, space, tracker = _where(s, block)
    length = s.value.length
    threads, elems = _elements(s, block, array.size, name, space, length)
    values = block[s.value][threads].reshape(len(threads), length)
    if tracker is not None:
        flat = elems.ravel()
        tracker.write(flat, np.repeat(block.gid[threads], length), _bits(array[flat]), _bits(values.ravel()),
                      block.launch.epoch, fail_at(block, s))
    array[elems] = values


RULES: dict[type, Callable[..., None]] = {
    LoadGlobal: load,
    LoadShared: load,
    StoreGlobal: store,
    StoreShared: store,
}
