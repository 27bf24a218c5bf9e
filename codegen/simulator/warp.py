"""Warp-collective statements: ``shfl.sync``, ``ldmatrix.sync`` and ``mma.sync``, as the PTX ISA defines them.

All need all 32 lanes of a warp (full member mask): a warp with some lanes
active and some not is a `SimulationError` (``divergent_warp_op``); a warp with
no active lane does not execute the statement.

The shuffle follows the ISA's pseudo-code for ``shfl.sync`` with
``c = ((32 - width) << 8) | 31`` (what `codegen.nvvm` emits): a lane reads lane
``j`` of its warp, or keeps its own value when ``j`` is past its segment's last
lane. ``ldmatrix`` reads each row at the index its address lane gives (bounds,
16-byte alignment and races checked like any shared load) and hands the elements
out by the ISA's fragment rule (`LdMatrix`). The mma fragments are `redfuser.ir.simt.fragments`'
`fragment_a/b/c`, the same tables the lowering's register layouts and the hardware tests follow.
"""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from ...ir.simt.nodes import WARP_SIZE, LdMatrix, Mma, MmaShape, Reg, Shuffle, ShuffleKind, Stmt
from ...ir.simt.fragments import fragment_a, fragment_b, fragment_c
from .memory import fail_at
from .tma import check_landed
from .state import Block


def check_converged(s: Stmt, block: Block, what: str, size: int = WARP_SIZE, unit: str = "warp",
                    members: str = "lanes") -> np.ndarray:
    """Fail unless every group of `size` consecutive threads (a warp, or a warpgroup of 128) is either fully
    active or fully inactive; the groups that execute `s` (a bool per group)."""
    if block.threads % size:
        block.fail(f"divergent_{unit}_op", f"{what} needs whole {unit}s of {size} threads; the block has "
                   f"{block.threads}", s)
    per_group = block.active.reshape(-1, size)
    split = np.flatnonzero(per_group.any(axis=1) & ~per_group.all(axis=1))
    if split.size:
        g = int(split[0])
        idle = int(np.flatnonzero(~per_group[g])[0]) + g * size
        block.fail(f"divergent_{unit}_op", f"{what} needs all {size} {members} of {unit} {g}, but "
                   f"{block.thread_name(idle)} is not active here (divergent control flow)", s)
    return per_group.all(axis=1)


def check_warps_converged(s: Stmt, block: Block, what: str) -> None:
    """Fail unless every warp is either fully active or fully inactive."""
    check_converged(s, block, what)


def shuffle_sources(kind: ShuffleKind, lane: np.ndarray, b: np.ndarray, width: int) -> np.ndarray:
    """The lane each lane reads for ``shfl.sync.<kind>`` with operand `b` (PTX ISA pseudo-code)."""
    segmask = (WARP_SIZE - width) & 31          # c[12:8]
    clamp = 31                                  # c[4:0]
    b = b & 31
    max_lane = (lane & segmask) | (clamp & ~segmask)
    min_lane = lane & segmask
    if kind is ShuffleKind.BFLY:
        j = lane ^ b
    elif kind is ShuffleKind.DOWN:
        j = lane + b
    else:
        j = min_lane | (b & ~segmask)
    return np.where(j <= max_lane, j, lane)


def _shuffle(s: Shuffle, block: Block) -> None:
    check_warps_converged(s, block, f"shfl.sync.{s.kind.value}")
    tid = block.tid
    lane = tid & 31
    b = block[s.lane] if isinstance(s.lane, Reg) else np.full_like(tid, s.lane)
    src = (tid - lane) + shuffle_sources(s.kind, lane, b, s.width)
    block.set(s.out, block[s.value][src])


def _ldmatrix(s: LdMatrix, block: Block) -> None:
    check_warps_converged(s, block, f"ldmatrix.x{s.count}")
    array, name = block.shared[s.alloc.name], s.alloc.name
    threads = np.flatnonzero(block.active)
    lane = block.tid[threads] & 31
    givers = threads[lane < 8 * s.count]                # the lanes whose index is where a row starts
    first = block[s.index][givers].astype(np.int64)
    for bad, kind, why in (((first < 0) | (first + 8 > array.size), "out_of_bounds", f"{name} has {array.size} elements"),
                           (first % 8 != 0, "misaligned", "a row starts at a multiple of 8 elements (16 bytes)")):
        hit = np.flatnonzero(bad)
        if hit.size:
            k = hit[0]
            block.fail(kind, f"ldmatrix row {name}[{first[k]}:{first[k] + 8}] given by "
                       f"{block.thread_name(givers[k])}: {why}", s)
    elems = first[:, None] + np.arange(8)
    if block.tma.copies:
        check_landed(block, name, elems, s)
    tracker = block.shared_trackers.get(name)
    if tracker is not None:
        tracker.read(elems.ravel(), np.repeat(block.gid[givers], 8), block.launch.epoch, fail_at(block, s))
    # rows[warp, m, r]: row r of matrix m, read where lane 8 m + r of the warp said
    rows = np.zeros((block.threads // WARP_SIZE, s.count, 8, 8), dtype=array.dtype)
    given = block.tid[givers]
    rows[given // WARP_SIZE, (given & 31) // 8, given & 7] = array[elems]
    mine = rows[block.tid[threads] // WARP_SIZE]        # [active threads, count, 8, 8]
    r, w = lane // 4, lane % 4
    out = np.zeros((block.threads, 2 * s.count), dtype=array.dtype)
    at = np.arange(len(threads))
    for m in range(s.count):
        for e in range(2):
            out[threads, 2 * m + e] = mine[at, m, 2 * w + e, r] if s.trans else mine[at, m, r, 2 * w + e]
    block.set(s.out, out)


@functools.cache
def _layout(shape: MmaShape) -> tuple[np.ndarray, ...]:
    """(rows, cols) index arrays ``[32, elements]`` of the A, B and C fragments of `shape`."""
    k = shape.k

    def flat(coords_of_lane: Callable[[int], list]) -> tuple[np.ndarray, np.ndarray]:
        coords = [[rc for reg in coords_of_lane(lane) for rc in (reg if isinstance(reg, list) else [reg])]
                  for lane in range(WARP_SIZE)]
        arr = np.array(coords, dtype=np.int64)
        return arr[..., 0], arr[..., 1]

    return (*flat(lambda lane: fragment_a(lane, k)), *flat(lambda lane: fragment_b(lane, k)),
            *flat(fragment_c))


def mma_tiles(shape: MmaShape, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per-warp A ``[W,16,k]``, B ``[W,k,8]``, C ``[W,16,8]`` gathered from per-lane fragments ``[W*32, n]``."""
    a_rows, a_cols, b_rows, b_cols, c_rows, c_cols = _layout(shape)
    warps = a.shape[0] // WARP_SIZE
    w = np.arange(warps)[:, None, None]
    tiles = (np.zeros((warps, 16, shape.k)), np.zeros((warps, shape.k, 8)), np.zeros((warps, 16, 8)))
    for tile, rows, cols, frag in zip(tiles, (a_rows, b_rows, c_rows), (a_cols, b_cols, c_cols), (a, b, c)):
        tile[w, rows[None], cols[None]] = frag.astype(np.float64).reshape(warps, WARP_SIZE, -1)
    return tiles


def _mma(s: Mma, block: Block) -> None:
    check_warps_converged(s, block, f"mma.sync.{s.shape.value}")
    a, b, c = mma_tiles(s.shape, block[s.a], block[s.b], block[s.c])
    # Products of f16/bf16/e4m3 values are exact in f64; the sum is rounded once to f32.
    d = (a @ b + c).astype(np.float32)
    _, _, _, _, c_rows, c_cols = _layout(s.shape)
    w = np.arange(d.shape[0])[:, None, None]
    block.set(s.out, d[w, c_rows[None], c_cols[None]].reshape(block.threads, 4))


RULES: dict[type, Callable[..., None]] = {
    Shuffle: _shuffle,
    LdMatrix: _ldmatrix,
    Mma: _mma,
}
