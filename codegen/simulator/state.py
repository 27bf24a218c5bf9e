"""The simulator's state: one `Launch` (global memory, the barrier epoch) and one `Block` at a time.

Registers are numpy arrays with one row per thread of the block: shape ``(T,)``
for a scalar register, ``(T, n)`` for an n-vector. `Block.active` is the mask of
threads executing the current statement (structured control flow narrows it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NoReturn

import numpy as np

from ...ir.errors import SimulationError
from ...ir.simt.nodes import Reg, SimtKernel, Stmt, StoreShared, Wgmma, uses, walk_stmts
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
        # Register writes and shared stores are recorded for wgmma's fence checks only where there is a wgmma
        # (every statement of every other kernel would pay for it).
        self.has_wgmma = any(isinstance(s, Wgmma) for s in walk_stmts(kernel.body))

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


@dataclass
class WgmmaState:
    """What one block's wgmma ops have left in flight (the simulator runs a block's warpgroups lock-step)."""

    uncommitted: list[str] = field(default_factory=list)      # results issued since the last commit
    groups: list[list[str]] = field(default_factory=list)     # committed, not yet waited for (oldest first)
    in_flight: set[str] = field(default_factory=set)          # every result not yet waited for
    taken: set[str] = field(default_factory=set)              # C registers a wgmma took (now D's)
    produced: set[str] = field(default_factory=set)           # results of wgmmas (chained C needs no fence)
    unfenced: set[str] = field(default_factory=set)           # registers written since the last wgmma.fence
    fenced: bool = False                                      # a wgmma.fence came before (the first wgmma needs one)
    proxy_dirty: set[str] = field(default_factory=set)        # shared allocations stored to since the proxy fence
    reads: dict[str, list[tuple[str, np.ndarray]]] = field(default_factory=dict)   # in-flight result -> tiles read

    def check_reads(self, s: Stmt, block: "Block") -> None:
        """Fail where `s` reads a result still in flight or a C register a wgmma took."""
        chained = s.c.name if isinstance(s, Wgmma) and s.c is not None else None
        for r in uses(s):
            if r.name in self.taken:
                block.fail("wgmma_in_flight", f"{r} was the accumulator C of a wgmma, whose D now occupies its "
                           "registers: read the wgmma's result instead", s)
            if r.name in self.in_flight and r.name != chained:
                block.fail("wgmma_in_flight", f"{r} is the result of a wgmma still in flight: a wgmma.commit_group "
                           "and a wgmma.wait_group that covers it must come before it is read", s)


@dataclass
class Mbarrier:
    """One mbarrier: the arrivals it expects a phase, those in, its transaction count, how many phases have
    completed (the phase bit is its parity), how many of them a wait has seen, and whether the current
    phase has had an ``expect_tx``."""

    expected: int
    arrived: int = 0
    tx: int = 0
    completed: int = 0
    observed: int = 0
    expect_seen: bool = False


@dataclass
class TmaState:
    """A block's mbarriers (by (allocation, index)) and the TMA copies not yet seen complete by a wait."""

    barriers: dict[tuple[str, int], Mbarrier] = field(default_factory=dict)
    copies: list[tuple[str, np.ndarray, tuple[str, int], int]] = field(default_factory=list)  # alloc, elems, key, phase


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
        self.wgmma = WgmmaState()
        self.tma = TmaState()
        self.has_wgmma = launch.has_wgmma

    def __getitem__(self, reg: Reg) -> np.ndarray:
        return self.env[reg.name]

    def set(self, reg: Reg, value: np.ndarray) -> None:
        shape = (self.threads,) if reg.length == 1 else (self.threads, reg.length)
        self.env[reg.name] = np.broadcast_to(np.asarray(value), shape).astype(reg.dtype.numpy, copy=False)
        if self.has_wgmma:
            # a (re)definition, e.g. in a loop's next iteration, is a new value in new registers: no wgmma has
            # taken it as its C and it is no wgmma's result (a wgmma marks its own result after this)
            self.wgmma.unfenced.add(reg.name)
            self.wgmma.taken.discard(reg.name)
            self.wgmma.produced.discard(reg.name)

    def thread_name(self, tid: int) -> str:
        return self.launch.describe(self.linear * self.threads + int(tid))

    def fail(self, kind: str, message: str, stmt: Stmt | None) -> NoReturn:
        text = format_stmt(stmt)[0] if stmt is not None else ""
        raise SimulationError(kind, message, kernel=self.kernel.name, stmt=text)

    def run(self, stmts: tuple[Stmt, ...]) -> None:
        """Run statements lock-step over the active threads (a rule per statement type)."""
        if not self.has_wgmma:
            for s in stmts:
                self.rules[type(s)](s, self)
            return
        wgmma = self.wgmma
        for s in stmts:
            if wgmma.in_flight or wgmma.taken:
                wgmma.check_reads(s, self)
            if isinstance(s, StoreShared):
                wgmma.proxy_dirty.add(s.alloc.name)
            self.rules[type(s)](s, self)
