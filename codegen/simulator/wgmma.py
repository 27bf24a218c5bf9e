"""Hopper's asynchronous warpgroup MMA in the simulator: ``wgmma`` and its fences, commits and waits.

The executable definition of the SIMT IR's `Wgmma` family (PTX ISA, "Asynchronous Warpgroup Level Matrix
Multiply-Accumulate"), with the checks that make a kernel wrong on the hardware even where the simulator's
arithmetic would happen to come out right. Each failure is a `SimulationError` of its own kind:

- ``divergent_warpgroup_op``: a ``.sync.aligned`` op (wgmma, its fence, commit and wait) needs all 128
  threads of a warpgroup, or none, active; the block must be whole warpgroups;
- ``nonuniform_descriptor``: a descriptor that differs between the threads of one warpgroup;
- ``wgmma_fence``: the first wgmma before any `WgmmaFence`, or a wgmma reading a register (its A
  fragment, or a C that no earlier wgmma produced) written since the last one;
- ``fence_proxy_async``: a wgmma reading shared memory that a store wrote since the last `FenceProxyAsync`
  (stores are the generic proxy, wgmma reads through the async proxy);
- ``wgmma_in_flight``: a statement reading a wgmma's result before a `WgmmaWait` that covers its commit
  group (another wgmma taking it as its C is the exception: accumulator chaining), or reading a C
  register after a wgmma took it (D overwrites C's registers asynchronously);
- ``descriptor_out_of_bounds``: a descriptor whose tile is not inside one shared allocation.

Shared memory is byte-addressed for descriptors: allocation ``a`` starts at ``nodes.shared_offsets``'s
offset, and a descriptor's start address, byte offsets and swizzle select the elements a K-major (or, for
an N-major B, MN-major) tile of ``rows x K`` reads (`tile_elements`). Each warpgroup reads through its own
descriptor (with two warpgroups each reads its own rows of A). Reads are recorded by the race tracker like
loads (so a missing barrier between the threads that stored the tile and the wgmma is a race). The product
is exact in float64 (the operands are 16- or 8-bit floats) and the sum is rounded to f32 once, as for
``mma``. That is a model, not the hardware's bits: on an H200 an f16 chain's sums differ from it by about an
ulp, and e4m3 wgmmas keep only about 14 bits of what they accumulate (benchmarks/device_notes.md, run 9;
`codegen/simt/wgmma.py` promotes e4m3 chains for it). Tests compare wgmma kernels with ``mma.sync`` ones
in the simulator bit for bit, and on a device within the tolerance rules.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...ir.simt.nodes import (FenceProxyAsync, SetMaxNReg, SharedAddress, SimtKernel, Stmt, Wgmma, WgmmaCommit,
                              WgmmaDescriptor, WgmmaFence, WgmmaWait, shared_offsets)
from ...ir.simt.wgmma_fragments import WARPGROUP_THREADS, MatrixDescriptor, Swizzle, accumulator, swizzle
from .memory import fail_at
from .state import Block, WgmmaState
from .tma import check_landed
from .warp import check_converged


def _whole_warpgroups(s: Stmt, block: Block, what: str) -> np.ndarray:
    """The warpgroups executing `s` (a bool per warpgroup), after checking none is partly active."""
    return check_converged(s, block, what, WARPGROUP_THREADS, "warpgroup", "threads")


def tile_elements(kernel: SimtKernel, desc: MatrixDescriptor, rows: int, k: int, itemsize: int,
                  mn_major: bool = False) -> tuple[str, np.ndarray] | str:
    """(the shared allocation, the element index of each (row, k) of a ``rows x k`` tile) that descriptor
    `desc` reads, or why it reads outside one allocation.

    K-major, swizzled: row ``r`` at ``start + (r / 8) stride + (r % 8) row_bytes``, the address then
    swizzled; no swizzle: 8 x 16-byte core matrices, ``leading`` apart along K and ``stride`` apart along
    the rows. MN-major (`mn_major`, swizzled only): K index ``k`` is a swizzle row, ``start + (k / 8) stride
    + (k % 8) row_bytes``, holding ``W = row_bytes / itemsize`` consecutive rows of the tile; the next ``W``
    rows are ``leading`` bytes on (the PTX ISA's leading byte offset of a swizzled MN-major layout: from one
    swizzle-width of rows to the next)."""
    r = np.arange(rows)[:, None]
    kk = np.arange(k)[None, :]
    if mn_major:
        if desc.mode is Swizzle.NONE:
            return "an MN-major tile without a swizzle (interleaved core matrices) is not modelled"
        width = desc.mode.row_bytes // itemsize
        byte = (desc.start + (r // width) * desc.leading + (kk // 8) * desc.stride + (kk % 8) * desc.mode.row_bytes
                + (r % width) * itemsize)
        byte = swizzle(byte, desc.mode)
    elif desc.mode is Swizzle.NONE:
        kk = kk * itemsize
        byte = desc.start + (r // 8) * desc.stride + (kk // 16) * desc.leading + (r % 8) * 16 + kk % 16
    else:
        byte = desc.start + (r // 8) * desc.stride + (r % 8) * desc.mode.row_bytes + kk * itemsize
        byte = swizzle(byte, desc.mode)
    offsets = shared_offsets(kernel.shared)
    first, last = int(byte.min()), int(byte.max()) + itemsize
    for alloc in kernel.shared:
        base = offsets[alloc.name]
        if base <= first and last <= base + alloc.nbytes:
            if alloc.dtype.itemsize != itemsize:
                return f"the tile at byte {first} is in {alloc.name}, which holds {alloc.dtype}"
            return alloc.name, (byte - base) // itemsize
    return f"the tile spans shared bytes {first}..{last}, not inside one allocation"


def _descriptors(s: Wgmma, block: Block, reg, groups: np.ndarray) -> list[MatrixDescriptor]:
    """The descriptor each active warpgroup passes in `reg` (uniform within a warpgroup; warpgroups may
    differ: each reads its own rows of A)."""
    values = block[reg].reshape(-1, WARPGROUP_THREADS)[groups]
    if (values != values[:, :1]).any():
        block.fail("nonuniform_descriptor", f"descriptor {reg} differs between the threads of a warpgroup", s)
    return [MatrixDescriptor.decode(int(v) & ((1 << 64) - 1)) for v in values[:, 0]]


def _read_tiles(s: Wgmma, block: Block, reg, rows: int, groups: np.ndarray, mn_major: bool = False) -> np.ndarray:
    """``[active warpgroups, rows, k]``: the tile each active warpgroup's descriptor in `reg` reads."""
    return np.stack([_read_tile(s, block, desc, g, rows, mn_major)
                     for desc, g in zip(_descriptors(s, block, reg, groups), np.flatnonzero(groups))])


def _read_tile(s: Wgmma, block: Block, desc: MatrixDescriptor, group: int, rows: int, mn_major: bool) -> np.ndarray:
    """The ``[rows, k]`` tile descriptor `desc` of warpgroup `group` reads."""
    shape = s.shape
    found = tile_elements(block.kernel, desc, rows, shape.k, shape.dtype.itemsize, mn_major)
    if isinstance(found, str):
        block.fail("descriptor_out_of_bounds", f"warpgroup {group}'s descriptor: {found}", s)
    name, elems = found
    if name in block.wgmma.proxy_dirty:
        block.fail("fence_proxy_async", f"the wgmma reads shared {name}, stored to since the last "
                   "fence.proxy.async (stores are the generic proxy; wgmma reads through the async proxy)", s)
    tracker = block.shared_trackers.get(name)
    if tracker is not None:   # the warpgroup reads the tile (recorded as its first thread's read)
        flat = elems.ravel()
        reader = np.full(flat.size, block.gid[group * WARPGROUP_THREADS])
        tracker.read(flat, reader, block.launch.epoch, fail_at(block, s))
    check_landed(block, name, elems, s)
    block.wgmma.reads.setdefault(s.out.name, []).append((name, elems))
    return block.shared[name][elems].astype(np.float64)


_FRAGMENT_CACHE: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _fragment(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column index arrays ``[128, n / 2]`` of the m64nN accumulator fragment."""
    if n not in _FRAGMENT_CACHE:
        pairs = [[accumulator(t, i, n) for i in range(n // 2)] for t in range(WARPGROUP_THREADS)]
        arr = np.array(pairs, dtype=np.int64)
        _FRAGMENT_CACHE[n] = (arr[..., 0], arr[..., 1])
    return _FRAGMENT_CACHE[n]


def _wgmma(s: Wgmma, block: Block) -> None:
    state = block.wgmma
    groups = _whole_warpgroups(s, block, f"wgmma.{s.shape.value}")
    if not state.fenced:
        block.fail("wgmma_fence", "the first wgmma of the warpgroup comes before any wgmma.fence", s)
    for reg, what in ((s.a, "its A fragment"), (s.c, "its accumulator C")):
        if reg is not None and reg.name in state.unfenced and reg.name not in state.produced:
            block.fail("wgmma_fence", f"the wgmma reads {reg} ({what}), written since the last wgmma.fence", s)
    shape = s.shape
    b = _read_tiles(s, block, s.b_desc, shape.n, groups, s.b_mn_major)      # [groups, n, k]
    if s.a_desc is not None:
        a = _read_tiles(s, block, s.a_desc, 64, groups)                       # [groups, 64, k]
    else:
        rows, cols = _fragment(16)
        a = np.zeros((int(groups.sum()), 64, 16))
        regs = block[s.a].astype(np.float64).reshape(-1, WARPGROUP_THREADS, 8)[groups]
        a[:, rows, cols] = regs
    rows, cols = _fragment(shape.n)
    c = np.zeros((int(groups.sum()), 64, shape.n))
    if s.c is not None:   # (None: scale-d false, D = A·B)
        c[:, rows, cols] = block[s.c].astype(np.float64).reshape(-1, WARPGROUP_THREADS, shape.n // 2)[groups]
    d = (a @ np.swapaxes(b, 1, 2) + c).astype(np.float32)
    out = np.zeros((block.threads // WARPGROUP_THREADS, WARPGROUP_THREADS, shape.n // 2), np.float32)
    out[groups] = d[:, rows, cols]
    block.set(s.out, out.reshape(block.threads, shape.n // 2))
    state.unfenced.discard(s.out.name)
    state.produced.add(s.out.name)
    if s.c is not None:
        state.taken.add(s.c.name)
    state.uncommitted.append(s.out.name)
    state.in_flight.add(s.out.name)


def _commit(s: WgmmaCommit, block: Block) -> None:
    _whole_warpgroups(s, block, "wgmma.commit_group")
    state = block.wgmma
    state.groups.append(state.uncommitted)
    state.uncommitted = []


def _wait(s: WgmmaWait, block: Block) -> None:
    _whole_warpgroups(s, block, f"wgmma.wait_group {s.pending}")
    state = block.wgmma
    while len(state.groups) > s.pending:
        done = state.groups.pop(0)
        state.in_flight.difference_update(done)
        for name in done:
            state.reads.pop(name, None)


def _fence(s: WgmmaFence, block: Block) -> None:
    _whole_warpgroups(s, block, "wgmma.fence")
    block.wgmma.unfenced.clear()
    block.wgmma.fenced = True


def _proxy_fence(s: FenceProxyAsync, block: Block) -> None:
    block.wgmma.proxy_dirty.clear()


def _descriptor_rule(s: WgmmaDescriptor, block: Block) -> None:
    address = block[s.address].astype(np.int64)
    bits = [MatrixDescriptor(int(a), s.leading, s.stride, 0, Swizzle(s.swizzle)).encode() for a in address]
    block.set(s.out, np.array(bits, dtype=np.uint64).view(np.int64))


def _shared_address(s: SharedAddress, block: Block) -> None:
    block.set(s.out, np.full(block.threads, shared_offsets(block.kernel.shared)[s.alloc.name], np.int32))


def _set_max_nreg(s: SetMaxNReg, block: Block) -> None:
    """Only its warpgroup-uniformity is checked: the simulator has no register file to size."""
    _whole_warpgroups(s, block, f"setmaxnreg {s.count}")


RULES: dict[type, Callable[..., None]] = {
    SetMaxNReg: _set_max_nreg,
    SharedAddress: _shared_address,
    WgmmaDescriptor: _descriptor_rule,
    Wgmma: _wgmma,
    WgmmaCommit: _commit,
    WgmmaWait: _wait,
    WgmmaFence: _fence,
    FenceProxyAsync: _proxy_fence,
}

__all__ = ["WgmmaState", "tile_elements", "RULES"]
