"""Race and uninitialized-read detection for one array (shared or global), element by element.

Every element remembers the thread that last wrote it and the barrier *epoch*
of that write, and the thread(s) that read it in the current epoch. The epoch
advances at every barrier and at every new block, so two accesses conflict when:

- read after write: a thread reads a value another thread wrote in the same
  epoch (a barrier is missing between them), or a block reads a global value
  another block wrote in this launch (blocks are not ordered);
- write after read: a thread overwrites a value another thread read in the same epoch;
- write after write: two threads (or blocks) write *different* values to one
  element in the same epoch (the same value twice, as replicated layouts do, is benign).

Thread ids are launch-wide (``block * threads + tid``).
"""
from __future__ import annotations

from typing import Callable, NoReturn

import numpy as np


Fail = Callable[[str, str], NoReturn]  # (kind, message) -> raises SimulationError
_SEVERAL = -2   # reader marker: more than one thread read the element this epoch


class Tracker:
    """Access history of one array of `size` elements (see the module docstring)."""

    def __init__(self, name: str, space: str, size: int, threads: int, describe: Callable[[int], str], *,
                 check_uninitialized: bool, check_races: bool = True) -> None:
        self.name, self.space, self.threads, self.describe = name, space, threads, describe
        self.check_uninitialized, self.check_races = check_uninitialized, check_races
        self.writer = np.full(size, -1, np.int64)
        self.write_epoch = np.full(size, -1, np.int64)
        self.reader = np.full(size, -1, np.int64)
        self.read_epoch = np.full(size, -1, np.int64)

    def _where(self, e: int) -> str:
        return f"{self.space} {self.name}[{int(e)}]"

    def read(self, elems: np.ndarray, gids: np.ndarray, epoch: int, fail: Fail) -> None:
        """Check and record reads of `elems` by launch-wide threads `gids` (same length); raises on a conflict."""
        if not elems.size:
            return
        w, we = self.writer[elems], self.write_epoch[elems]
        if self.check_uninitialized:
            bad = np.flatnonzero(w < 0)
            if bad.size:
                k = bad[0]
                fail("uninitialized", f"{self.describe(gids[k])} reads {self._where(elems[k])}, which no thread "
                             "has written (shared memory starts poisoned with NaN)")
        if not self.check_races:
            return
        block = gids // self.threads
        other_block = (w >= 0) & (w // self.threads != block)
        same_interval = (we == epoch) & (w >= 0) & (w != gids)
        bad = np.flatnonzero(other_block | same_interval)
        if bad.size:
            k = bad[0]
            why = ("no barrier orders them" if not other_block[k]
                   else "blocks are not ordered within a launch")
            fail("race", f"{self.describe(gids[k])} reads {self._where(elems[k])}, which "
                         f"{self.describe(w[k])} wrote in the same barrier interval ({why})")
        uniq, first, counts = np.unique(elems, return_index=True, return_counts=True)
        new = np.where(counts == 1, gids[first], _SEVERAL)
        old, fresh = self.reader[uniq], self.read_epoch[uniq] != epoch
        self.reader[uniq] = np.where(fresh | (old == new), new, _SEVERAL)
        self.read_epoch[uniq] = epoch

    def record_async_write(self, elems: np.ndarray, gid: int) -> None:
        """Elements an asynchronous copy (TMA) wrote for thread `gid`: initialized from now on, and in no
        barrier interval (an mbarrier, not a barrier, orders them: `codegen/simulator/tma.py` checks that)."""
        self.writer[elems] = gid
        self.write_epoch[elems] = -1

    def write(self, elems: np.ndarray, gids: np.ndarray, old: np.ndarray, new: np.ndarray, epoch: int,
              fail: Fail) -> None:
        """Check and record writes of bit patterns `new` over `old` to `elems` by `gids`; raises on a conflict."""
        if not elems.size:
            return
        if self.check_races:
            r, re_ = self.reader[elems], self.read_epoch[elems]
            bad = np.flatnonzero((re_ == epoch) & (r != -1) & (r != gids))
            if bad.size:
                k = bad[0]
                readers = "other threads" if r[k] == _SEVERAL else self.describe(r[k])
                fail("race", f"{self.describe(gids[k])} writes {self._where(elems[k])}, which {readers} "
                             "read in the same barrier interval (a barrier is missing before the write)")
            w, we = self.writer[elems], self.write_epoch[elems]
            other_block = (w >= 0) & (w // self.threads != gids // self.threads)
            clash = (w >= 0) & (w != gids) & (old != new) & ((we == epoch) | other_block)
            bad = np.flatnonzero(clash)
            if bad.size:
                k = bad[0]
                fail("race", f"{self.describe(gids[k])} and {self.describe(w[k])} write different values to "
                             f"{self._where(elems[k])} with no barrier between them")
            self._same_statement(elems, gids, new, fail)
        self.writer[elems] = gids
        self.write_epoch[elems] = epoch

    def _same_statement(self, elems: np.ndarray, gids: np.ndarray, new: np.ndarray, fail: Fail) -> None:
        order = np.argsort(elems, kind="stable")
        e, g, v = elems[order], gids[order], new[order]
        dup = np.flatnonzero((e[1:] == e[:-1]) & (v[1:] != v[:-1]))
        if dup.size:
            k = dup[0]
            fail("race", f"{self.describe(g[k])} and {self.describe(g[k + 1])} write different values to "
                         f"{self._where(e[k])} in one store")

