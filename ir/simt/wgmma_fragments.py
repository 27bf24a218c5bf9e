"""Hopper's warpgroup MMA (``wgmma.mma_async``) as data: fragments, shared-memory descriptors, swizzles.

PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" (sm_90a). A warpgroup is four
consecutive warps (128 threads) that issue one ``wgmma.mma_async.sync.aligned.m64nNkK`` together:
D (64 x N) = A (64 x K) * B (K x N) + D, with K = 16 for f16/bf16 and 32 for e4m3/e5m2.

- D (and the accumulator C) lives in registers: thread ``t`` (warp ``w = t / 32``, lane ``l = t % 32``)
  holds ``N / 2`` f32 values; value ``i`` is element

      row = 16 w + l / 4 + 8 ((i >> 1) & 1),   col = 8 (i >> 2) + 2 (l % 4) + (i & 1)

  (`accumulator`). Rows 16w..16w+15 belong to warp ``w``: each warp holds an m16 slice, laid out like
  ``mma.sync``'s m16n8 accumulator repeated every 8 columns (`ir.simt.fragments.fragment_c`).
- A may come from registers: for 16-bit types the m64k16 A fragment is the same map with N = 16, two
  values packed per 32-bit register, low half first (`register_a`). So an f32 accumulator rounded to
  f16/bf16 pairs is already an A fragment of the next wgmma: P in P·V needs no shared-memory round trip.
  (The 8-bit A fragment packs four values per register in another order; not modelled here.)
- B (and A when not in registers) is read from shared memory through a 64-bit *matrix descriptor*
  (`MatrixDescriptor`): start address, leading and stride byte offsets (all in units of 16 bytes, 14
  bits each), a 3-bit base offset and a 2-bit swizzle mode. The descriptor must be the same in every
  thread of the warpgroup.
- Swizzled layouts (`swizzle`): in a 128-byte swizzle, the 16-byte chunk ``c`` of the 128-byte row ``r``
  of an 8-row (1024-byte) atom is stored at chunk ``c ^ (r % 8)``; 64- and 32-byte swizzles XOR the low
  2 or 1 chunk bits with the same address bits 7-8 or 7 (periods of 512 and 256 bytes). TMA writes the
  same patterns, so a tile TMA loads with a swizzle is read by a descriptor of the same mode.

Pure Python, no GPU: the GPU lowering lays registers and shared memory out by these maps, and the SIMT
simulator executes ``wgmma`` by them (tests/test_wgmma_fragments.py checks them against an independent
transcription of CUTLASS's published layouts).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, TypeVar

from ..errors import InternalError

if TYPE_CHECKING:
    import numpy as np

Offset = TypeVar("Offset", int, "np.ndarray")

WARPGROUP_THREADS = 128
"""Four warps issue one ``wgmma``."""

M = 64
"""The M of every ``wgmma`` shape."""


def check_n(n: int) -> None:
    """`n` must be a multiple of 8 from 8 to 256 (the ``nN`` of ``m64nNkK``)."""
    if not (8 <= n <= 256 and n % 8 == 0):
        raise InternalError(f"wgmma n={n}: N is a multiple of 8 from 8 to 256", pass_name="wgmma")


def accumulator(thread: int, i: int, n: int) -> tuple[int, int]:
    """(row, col) of the 64 x `n` f32 accumulator that value `i` (0 .. n/2 - 1) of `thread` (0 .. 127) holds."""
    check_n(n)
    if not (0 <= thread < WARPGROUP_THREADS and 0 <= i < n // 2):
        raise InternalError(f"wgmma accumulator: thread {thread}, value {i} outside a warpgroup's m64n{n} fragment",
                            pass_name="wgmma")
    warp, lane = thread >> 5, thread & 31
    return 16 * warp + (lane >> 2) + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * (lane & 3) + (i & 1)


def register_a(thread: int, reg: int) -> list[tuple[int, int]]:
    """(row, col) of the 64 x 16 A operand held by 32-bit register `reg` (0 .. 3) of `thread`, for 16-bit
    types: two values, the low half first."""
    if not 0 <= reg < 4:
        raise InternalError(f"wgmma register A: register {reg} of 4", pass_name="wgmma")
    return [accumulator(thread, 2 * reg + half, 16) for half in range(2)]


class Swizzle(Enum):
    """A descriptor's layout type (bits 62-63) and the TMA swizzle of the same name."""

    NONE = 0
    B128 = 1
    B64 = 2
    B32 = 3

    @property
    def row_bytes(self) -> int:
        """The span of one swizzled row (16 bytes for NONE: one core-matrix row)."""
        return {Swizzle.NONE: 16, Swizzle.B128: 128, Swizzle.B64: 64, Swizzle.B32: 32}[self]


def swizzle(offset: Offset, mode: Swizzle) -> Offset:
    """The byte offset where a swizzled layout of `mode` stores the byte at `offset` of the unswizzled one
    (offsets from a base aligned to the pattern's period: 1024, 512 or 256 bytes). The 16-byte chunk index
    (address bits 4-6, 4-5 or 4) is XORed with address bits 7-9, 7-8 or 7: for 128-byte rows that is chunk
    ``c`` of row ``r`` stored at chunk ``c ^ (r % 8)``. An involution: applying it twice gives `offset`.
    Bit operations only, so an integer numpy array of offsets is swizzled element by element."""
    if mode is Swizzle.NONE:
        return offset
    mask = mode.row_bytes // 16 - 1                     # 7, 3 or 1: the chunk bits that are permuted
    return offset ^ (((offset >> 7) & mask) << 4)


_FIELD_BITS = 14
_MASK18 = (1 << 18) - 1


@dataclass(frozen=True)
class MatrixDescriptor:
    """A wgmma shared-memory matrix descriptor, in bytes (encoded in units of 16 bytes).

    `start`: the operand tile's shared-memory address; `leading`: the leading-dimension byte offset;
    `stride`: the stride-dimension byte offset (for a K-major operand with a 128-byte swizzle, the
    distance between 8-row groups: 1024); `base`: the base offset (0 when the tile is 1024-byte aligned).
    """

    start: int
    leading: int
    stride: int
    base: int = 0
    mode: Swizzle = Swizzle.B128

    def encode(self) -> int:
        """The 64-bit value ``wgmma`` reads: bits 0-13 ``(start & 0x3FFFF) >> 4``, 16-29 ``leading >> 4``,
        32-45 ``stride >> 4``, 49-51 the base offset, 62-63 the swizzle mode."""
        for name, value in (("start", self.start & _MASK18), ("leading", self.leading), ("stride", self.stride)):
            if value % 16 or (value >> 4) >= 1 << _FIELD_BITS:
                raise InternalError(f"wgmma descriptor: {name} = {value} is not a multiple of 16 below 2^18",
                                    pass_name="wgmma")
        if not 0 <= self.base < 8:
            raise InternalError(f"wgmma descriptor: base offset {self.base} does not fit 3 bits", pass_name="wgmma")
        return (((self.start & _MASK18) >> 4) | ((self.leading >> 4) << 16) | ((self.stride >> 4) << 32)
                | (self.base << 49) | (self.mode.value << 62))

    @staticmethod
    def decode(bits: int) -> "MatrixDescriptor":
        """The descriptor `bits` encodes (`start` as its low 18 bits of address)."""
        field = (1 << _FIELD_BITS) - 1
        return MatrixDescriptor(start=(bits & field) << 4, leading=((bits >> 16) & field) << 4,
                                stride=((bits >> 32) & field) << 4, base=(bits >> 49) & 7,
                                mode=Swizzle((bits >> 62) & 3))


def k_major_offset(row: int, k: int, elem_bytes: int, mode: Swizzle = Swizzle.B128) -> int:
    """Byte offset of element (`row`, `k`) of a K-major operand tile whose rows are `mode.row_bytes` long
    (64 f16 or 128 e4m3 values under a 128-byte swizzle), rows stored one after another, swizzled."""
    if k * elem_bytes >= mode.row_bytes:
        raise InternalError(f"k-major tile: column {k} of {elem_bytes}-byte values outside a {mode.row_bytes}-byte row",
                            pass_name="wgmma")
    return swizzle(row * mode.row_bytes + k * elem_bytes, mode)


__all__ = ["WARPGROUP_THREADS", "M", "check_n", "accumulator", "register_a", "Swizzle", "swizzle",
           "MatrixDescriptor", "k_major_offset"]
