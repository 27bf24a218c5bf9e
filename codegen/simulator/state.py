"""The simulator's state: one `Launch` (global memory, the barrier epoch) and one `Block` at a time.

Registers are numpy arrays with one row per thread of the block: shape ``(T,)``
for a scalar register, ``(T, n)`` for an n-vector. `Block.active` is the mask of
threads executing the current statement (structured control flow narrows it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NoReturn

import numpy as np

from ...ir.errors import SimulationError
from ...ir.simt.nodes import Reg, SimtKernel, Stmt
from ...ir.simt.printer import format_stmt
from .tracker import Tracker


@dataclass(frozen=True, slots=True)
class SimOptions:
    """What the simulator checks besides bounds and divergence.

    `check_races`: flag shared/global accesses that conflict within one barrier
    interval (and global accesses that conflict across blocks);
    `check_uninitialized`: flag reads of shared memory no thread has written.
    """

    check_races: bool = True
    check_uninitialized: bool = True


class Launch:
    """One kernel launch: its global buffers (flat arrays), their trackers and the barrier epoch."""

    def __init__(self, kernel: SimtKernel, globals_: dict[str, np.ndarray], options: SimOptions) -> None:
        self.kernel, self.globals, self.options = kernel, globals_, options
        self.epoch = 0
        self.trackers = {name: Tracker(name, "global", arr.size, kernel.threads, self.describe, check_uninitialized=False)
                         for name, arr in globals_.items()} if options.check_races else {}

    def block_coords(self, linear: int) -> tuple[int, ...]:
        """The grid position of the block with linear id `linear` (x fastest, as CUDA numbers them)."""
        coords = []
        for g in self.kernel.grid:
            coords.append(linear % g)
            linear //= g
        return tuple(coords)

    def describe(self, gid: int) -> str:
        """``thread 37 (warp 1, lane 5) of block (0,)`` for the launch-wide thread id `gid`."""
        t = self.kernel.threads
        block, tid = divmod(int(gid), t)
        coords = self.block_coords(block)
        return f"thread {tid} (warp {tid // 32}, lane {tid % 32}) of block {coords}"


class Block:
    """One thread block being simulated: registers, the active mask and its shared memory."""

    def __init__(self, launch: Launch, linear: int, rules: dict[type, Callable[[Stmt, "Block"], None]]) -> None:
        kernel = launch.kernel
        self.launch, self.kernel, self.linear, self.rules = launch, kernel, linear, rules
        self.coords = launch.block_coords(linear)
        self.threads = kernel.threads
        self.tid = np.arange(self.threads, dtype=np.int32)
        self.gid = self.tid.astype(np.int64) + linear * self.threads
        self.active = np.ones(self.threads, dtype=bool)
        self.env: dict[str, np.ndarray] = {}
        self.shared: dict[str, np.ndarray] = {}
        self.shared_trackers: dict[str, Tracker] = {}
        check = launch.options.check_races or launch.options.check_uninitialized
        for alloc in kernel.shared:
            # Poison: NaN for floats, the most negative value for integers, so stale reads show.
            dtype = alloc.dtype.numpy
            poison = np.nan if alloc.dtype.is_float else (np.iinfo(dtype).min if alloc.dtype.is_int else True)
            self.shared[alloc.name] = np.full(alloc.size, poison).astype(dtype)
            if check:
                self.shared_trackers[alloc.name] = Tracker(
                    alloc.name, "shared", alloc.size, self.threads, launch.describe,
                    check_uninitialized=launch.options.check_uninitialized, check_races=launch.options.check_races)
        launch.epoch += 1  # a new block starts a new interval: its accesses never meet the last block's

    def __getitem__(self, reg: Reg) -> np.ndarray:
        return self.env[reg.name]

    def set(self, reg: Reg, value: np.ndarray) -> None:
        shape = (self.threads,) if reg.length == 1 else (self.threads, reg.length)
        self.env[reg.name] = np.broadcast_to(np.asarray(value), shape).astype(reg.dtype.numpy, copy=False)

    def thread_name(self, tid: int) -> str:
        return self.launch.describe(self.linear * self.threads + int(tid))

    def fail(self, kind: str, message: str, stmt: Stmt | None) -> NoReturn:
        text = format_stmt(stmt)[0] if stmt is not None else ""
        raise SimulationError(kind, message, kernel=self.kernel.name, stmt=text)

    def run(self, stmts: tuple[Stmt, ...]) -> None:
        """Run statements lock-step over the active threads (a rule per statement type)."""
        for s in stmts:
            self.rules[type(s)](s, self)
