"""Distributed layouts: which thread holds which element of a tile, in which register.

A `Layout` is *linear* over the bits of (register, lane, warp): each register
bit, each of the 5 lane bits and each warp bit has a *basis* (a coordinate
vector of the tile), and the element thread ``t`` holds in register ``r`` is the
sum of the bases of the bits set in ``r``, ``t % 32`` and ``t // 32``. A zero
basis means replication (those threads, or those registers, hold the same
element). Every layout here is *disjoint*: along each dimension the nonzero
components of the bases are distinct powers of two, so sums never carry and
the coordinate of a register is a sum of bit fields of the thread index plus a
constant per register — which is how the lowering computes indices.

Tile dimensions are powers of two (GPU schedules round them up), so these cover
every tile. The kinds built here (ARCHITECTURE.md section 6):

- `blocked`: ``vec`` consecutive elements of the fastest dimension per thread,
  lanes next along the dimensions in `order`, warps along the slowest; the rest
  repeats in registers (elementwise work, loads, stores, reductions);
- `mma_acc`, `mma_a`, `mma_b`: the accumulator and operand fragments of
  ``mma.sync.m16n8k16`` / ``m16n8k32`` (`redfuser.ir.simt.fragments`),
  warps tiled ``wm x wn`` over the output, repeated over tiles in registers;
- `sliced` (a reduction's result), `mapped` (a view's source, see `views.py`),
  `origin` (every thread holds element 0) and `scalar`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ...ir.errors import InternalError
from ...ir.types import row_major_strides

LANE_BITS = 5
Basis = tuple[int, ...]


def log2(n: int) -> int:
    """log2 of a power of two (`InternalError` otherwise)."""
    if n < 1 or n & (n - 1):
        raise InternalError(f"{n} is not a power of two", pass_name="lower_to_simt")
    return n.bit_length() - 1


@dataclass(frozen=True, slots=True)
class Layout:
    """A linear layout of a tile of `shape` over ``32 * 2**len(warps)`` threads (see the module docstring)."""

    shape: tuple[int, ...]
    regs: tuple[Basis, ...]
    lanes: tuple[Basis, ...]
    warps: tuple[Basis, ...]
    kind: str = field(default="blocked", compare=False)   # for printing only: equal bases, equal layouts

    def __post_init__(self) -> None:
        if len(self.lanes) != LANE_BITS:
            raise InternalError(f"layout with {len(self.lanes)} lane bits", pass_name="lower_to_simt")
        rank = len(self.shape)
        for d in range(rank):
            seen = [b[d] for b in self.bases if b[d]]
            if len(set(seen)) != len(seen) or any(c < 0 or c & (c - 1) or c >= self.shape[d] for c in seen):
                raise InternalError(f"layout {self.kind} of {self.shape} is not disjoint along dim {d}: {seen}",
                                    pass_name="lower_to_simt")

    @property
    def bases(self) -> tuple[Basis, ...]:
        return self.regs + self.lanes + self.warps

    @property
    def num_regs(self) -> int:
        return 1 << len(self.regs)

    @property
    def num_warps(self) -> int:
        return 1 << len(self.warps)

    @property
    def threads(self) -> int:
        return 32 << len(self.warps)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def thread_bases(self) -> tuple[Basis, ...]:
        """Bases of the thread-index bits: 5 lane bits, then the warp bits (bit i of ``tid``)."""
        return self.lanes + self.warps

    def replica_mask(self) -> int:
        """Bits of ``tid`` whose basis is zero: threads with one of them set repeat another thread's elements."""
        return sum(1 << i for i, b in enumerate(self.thread_bases) if not any(b))

    def reg_coord(self, r: int) -> Basis:
        """The coordinate register `r` contributes (its thread's part added gives the element)."""
        out = [0] * len(self.shape)
        for i, b in enumerate(self.regs):
            if r >> i & 1:
                out = [x + y for x, y in zip(out, b)]
        return tuple(out)

    def table(self) -> np.ndarray:
        """``[threads, num_regs]`` flat (row-major) element index of each thread's registers."""
        return _table(self)

    def describe(self) -> str:
        """Short text for printing: kind, shape and the bit counts."""
        return (f"{self.kind}{list(self.shape)} regs={self.num_regs} "
                f"replicas={bin(self.replica_mask()).count('1')} bits")


def flat(basis: Basis, shape: tuple[int, ...]) -> int:
    """The flat (row-major) offset of coordinate `basis` in `shape`."""
    return sum(c * s for c, s in zip(basis, row_major_strides(shape)))


@functools.lru_cache(maxsize=512)
def _table(layout: Layout) -> np.ndarray:
    reg = np.array([flat(layout.reg_coord(r), layout.shape) for r in range(layout.num_regs)], dtype=np.int64)
    tid = np.arange(layout.threads)
    thread = np.zeros(layout.threads, dtype=np.int64)
    for i, b in enumerate(layout.thread_bases):
        thread += ((tid >> i) & 1) * flat(b, layout.shape)
    return thread[:, None] + reg[None, :]


def _unit(rank: int, dim: int, value: int) -> Basis:
    return tuple(value if d == dim else 0 for d in range(rank))


def _zero(rank: int) -> Basis:
    return (0,) * rank


def scalar(warps: int) -> Layout:
    """Shape ``()``: one register, every thread holds the value."""
    return Layout((), (), ((),) * LANE_BITS, ((),) * log2(warps), "scalar")


def origin(shape: tuple[int, ...], warps: int) -> Layout:
    """Every thread's one register holds element ``(0, ..., 0)`` (for the base of an affine index)."""
    z = _zero(len(shape))
    return Layout(tuple(shape), (), (z,) * LANE_BITS, (z,) * log2(warps), "origin")


def blocked(shape: tuple[int, ...], warps: int, order: tuple[int, ...] | None = None, vec: int = 1) -> Layout:
    """`vec` consecutive elements of dim ``order[0]`` per thread, lanes along `order`, warps from its far end."""
    rank = len(shape)
    if rank == 0:
        return scalar(warps)
    order = tuple(order) if order is not None else tuple(reversed(range(rank)))
    left = [log2(s) for s in shape]
    used = [0] * rank
    regs: list[Basis] = []

    def take(dim: int) -> Basis:
        b = _unit(rank, dim, 1 << used[dim])
        used[dim] += 1
        left[dim] -= 1
        return b

    fast = order[0]
    for _ in range(min(log2(max(vec, 1)), left[fast])):
        regs.append(take(fast))
    lanes: list[Basis] = []
    for d in order:
        while left[d] and len(lanes) < LANE_BITS:
            lanes.append(take(d))
    lanes += [_zero(rank)] * (LANE_BITS - len(lanes))
    warp_list: list[Basis] = []
    for d in reversed(order):
        while left[d] and len(warp_list) < log2(warps):
            warp_list.append(take(d))
    warp_list += [_zero(rank)] * (log2(warps) - len(warp_list))
    for d in order:
        while left[d]:
            regs.append(take(d))
    return Layout(tuple(shape), tuple(regs), tuple(lanes), tuple(warp_list), "blocked")


def default_vec(shape: tuple[int, ...], warps: int, itemsize: int) -> int:
    """16 bytes per thread, no more than the tile gives each thread."""
    numel = 1
    for s in shape:
        numel *= s
    vec = max(1, min(16 // max(itemsize, 1), numel // (32 * warps)))
    return 1 << (vec.bit_length() - 1)


# --- tensor-core layouts ------------------------------------------------------------------------

def mma_warps(m: int, n: int, warps: int) -> tuple[int, int]:
    """How `warps` tile an ``m x n`` mma output: ``(wm, wn)`` warps along rows and columns (extra warps replicate)."""
    wm = min(warps, max(1, m // 16))
    wn = min(warps // wm, max(1, n // 8))
    return wm, wn


def _warp_bases(rank_bases: list[Basis], warps: int) -> tuple[Basis, ...]:
    zero = (0, 0)
    return tuple(rank_bases + [zero] * (log2(warps) - len(rank_bases)))


def mma_acc(m: int, n: int, warps: int) -> Layout:
    """The ``16 x 8`` f32 accumulator fragments (`fragment_c`), ``wm x wn`` warps, tiles repeated in registers.

    Register ``4 * (mi * NT + ni) + c`` is element ``c`` of tile ``(mi, ni)``.
    """
    wm, wn = mma_warps(m, n, warps)
    regs = [(0, 1), (8, 0)]
    regs += [(0, 8 * wn << i) for i in range(log2(n // (8 * wn)))]
    regs += [(16 * wm << i, 0) for i in range(log2(m // (16 * wm)))]
    lanes = ((0, 2), (0, 4), (1, 0), (2, 0), (4, 0))
    warp = [(16 << i, 0) for i in range(log2(wm))] + [(0, 8 << i) for i in range(log2(wn))]
    return Layout((m, n), tuple(regs), lanes, _warp_bases(warp, warps), "mma_acc")


def mma_a(m: int, k: int, n: int, warps: int, k_inst: int) -> Layout:
    """A fragments (`fragment_a`, ``16 x k_inst``): register ``A_len * (mi * KT + ki) + e`` is element ``e``."""
    wm, wn = mma_warps(m, n, warps)
    per_reg = k_inst // 8
    regs = [(0, 1 << j) for j in range(log2(per_reg))] + [(8, 0), (0, k_inst // 2)]
    regs += [(0, k_inst << i) for i in range(log2(k // k_inst))]
    regs += [(16 * wm << i, 0) for i in range(log2(m // (16 * wm)))]
    lanes = ((0, per_reg), (0, 2 * per_reg), (1, 0), (2, 0), (4, 0))
    warp = [(16 << i, 0) for i in range(log2(wm))] + [(0, 0)] * log2(wn)
    return Layout((m, k), tuple(regs), lanes, _warp_bases(warp, warps), "mma_a")


def mma_b(k: int, n: int, m: int, warps: int, k_inst: int) -> Layout:
    """B fragments (`fragment_b`, ``k_inst x 8``): register ``B_len * (ni * KT + ki) + e`` is element ``e``."""
    wm, wn = mma_warps(m, n, warps)
    per_reg = k_inst // 8
    regs = [(1 << j, 0) for j in range(log2(per_reg))] + [(k_inst // 2, 0)]
    regs += [(k_inst << i, 0) for i in range(log2(k // k_inst))]
    regs += [(0, 8 * wn << i) for i in range(log2(n // (8 * wn)))]
    lanes = ((per_reg, 0), (2 * per_reg, 0), (0, 1), (0, 2), (0, 4))
    warp = [(0, 0)] * log2(wm) + [(0, 8 << i) for i in range(log2(wn))]
    return Layout((k, n), tuple(regs), lanes, _warp_bases(warp, warps), "mma_b")


# --- derived layouts ----------------------------------------------------------------------------

def sliced(layout: Layout, axis: int) -> Layout:
    """The layout of a reduction over `axis`: that dim dropped, its register bits gone, its thread bits replicas."""
    def drop(b: Basis) -> Basis:
        return b[:axis] + b[axis + 1:]

    regs = tuple(drop(b) for b in layout.regs if not b[axis])
    return Layout(drop(layout.shape), regs, tuple(drop(b) for b in layout.lanes),
                  tuple(drop(b) for b in layout.warps), "sliced")


def mapped(layout: Layout, shape: tuple[int, ...], fn) -> Layout:
    """`layout` with every basis sent through `fn` (a linear map of coordinates) onto a tile of `shape`."""
    return Layout(tuple(shape), tuple(fn(b) for b in layout.regs), tuple(fn(b) for b in layout.lanes),
                  tuple(fn(b) for b in layout.warps), layout.kind if layout.kind.endswith("*") else layout.kind + "*")


def without_duplicate_regs(layout: Layout) -> tuple[Layout, list[int]]:
    """`layout` with zero register bases dropped, and for each of its registers the register of the result."""
    keep = [i for i, b in enumerate(layout.regs) if any(b)]
    lean = Layout(layout.shape, tuple(layout.regs[i] for i in keep), layout.lanes, layout.warps, layout.kind)
    index = []
    for r in range(layout.num_regs):
        index.append(sum(1 << n for n, i in enumerate(keep) if r >> i & 1))
    return lean, index


def contiguous_run(layout: Layout, dim: int, unit: int = 1) -> int:
    """How many low register bits step along `dim` by ``unit, 2 unit, 4 unit...``: the length of per-thread runs."""
    n = 0
    for b in layout.regs:
        if b[dim] == unit << n and sum(1 for c in b if c) == 1:
            n += 1
        else:
            break
    return 1 << n


def flat_run(layout: Layout) -> int:
    """How many low register bits step the flat index by 1, 2, 4...: the per-thread contiguous run in memory."""
    n = 0
    for b in layout.regs:
        if flat(b, layout.shape) == 1 << n:
            n += 1
        else:
            break
    return 1 << n
