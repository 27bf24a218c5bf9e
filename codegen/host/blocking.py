"""The shape of the host GEMM core's register blocks, and which right operands it reads as packed panels.

The host's vector registers (LLVM's host features, part of the compile cache's key) give ``VW`` lanes of
the widest vector (64 bytes with AVX-512, 32 with AVX/AVX2, 16 else) and the size of the register file
(32 vector registers with AVX-512, 16 else). A micro-kernel block (`gemm.py`) is ``rows`` output rows
by ``vectors`` vectors of ``VW`` lanes: ``rows * vectors`` accumulators plus ``vectors`` operand
vectors and a broadcast fit the register file.

A dot's right operand ``b[k, n]`` that the micro-kernel reads is laid out in *panels* of the block's
``cols`` columns: panel ``p`` holds columns ``p*cols .. p*cols + cols`` of every row, row after row, so
one step of the micro-kernel's ``k`` loop reads one contiguous ``cols``-element line and the whole
``k`` loop walks memory in order. Read row-major instead, each step lands ``n`` elements further on, and
the block's lines spread over the L1 sets: measured on an AVX2 core (a 96x128x128 f32 tile in cache,
6x2 blocks) 78 GF/s row-major, 94 GF/s in panels, against a 96 GF/s peak. The copy into panels costs one
pass over ``b``, paid back where at least `PANEL_MIN_BLOCKS` row blocks read it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...ir.tile import nodes as t
from ...ir.types import bfloat16, float16, float32, float64
from ..native import host_target

PANEL_MIN_BLOCKS = 4
"""Row blocks that must read a dot's right operand before it is copied into panels (a decoding step's
one query row reads it once: the copy would double its traffic)."""

PANEL_MIN_BYTES = 16 << 10
"""A right operand this small stays row-major: with ``a``'s rows and the output block it stays in a 32 KiB
L1 across the row blocks in either layout, and the copy into panels only costs (a plain ``a @ b``'s
64x64 f32 block: 8-12% slower in panels, single-threaded on an AVX2 core; layer norm + GEMM's 128x128
block: 1.2-1.4x faster)."""


@dataclass(frozen=True)
class Block:
    """One micro-kernel block: `rows` output rows by `vectors` vectors of `lanes` elements."""

    rows: int
    vectors: int
    lanes: int

    @property
    def cols(self) -> int:
        return self.vectors * self.lanes


def vector_registers() -> tuple[int, int]:
    """(bytes per vector register, number of vector registers) of this host."""
    features = set(host_target().features.split(","))
    if "+avx512f" in features:
        return 64, 32
    if "+avx" in features:
        return 32, 16
    return 16, 16


IN_FLIGHT_FMAS = 12
"""Accumulators a block needs to keep both FMA units busy: an FMA's result is an operand of the next one on
the same accumulator 4-5 cycles later, so two units need 8-10 independent chains, and a few more absorb the
operand loads. With 16 AVX2 registers, 4 x 2 blocks (8 chains, the largest divisor of 256 rows) ran an f32
GEMM at 0.77-0.87x OpenBLAS and 6 x 2 blocks (42 of them and one of 4 rows) at 0.97-1.10x (AMD EPYC, 2 cores,
1024^3 and 4096x1024x1024: 14.3 -> 11.8 and 56.8 -> 45.7 ms; f32 attention 1x8x1024x64 17.8 -> 14.8 ms)."""


def choose_block(m: int, n: int, itemsize: int) -> Block | None:
    """The micro-kernel block for an ``m x n`` output of `itemsize`-byte elements (None: keep the loop
    nest). ``n`` must be a whole number of blocks' columns. The rows are the largest divisor of ``m``
    the register file allows, unless that leaves fewer than `IN_FLIGHT_FMAS` accumulators where the
    register file holds them or is under half of what it allows: then as many as it allows, the last
    ``m mod rows`` rows in a shorter block."""
    width, registers = vector_registers()
    lanes = width // itemsize
    if n % lanes:
        return None
    for vectors in (2, 1):
        if (n // lanes) % vectors:
            continue
        # accumulators + one operand vector each + one broadcast within the register file
        limit = min(14, (registers - vectors - 1) // vectors, m)
        rows = max(r for r in range(1, limit + 1) if m % r == 0)
        if 2 * rows <= limit or rows * vectors < min(IN_FLIGHT_FMAS, limit * vectors):
            rows = limit     # (17 rows: 6 + 6 + a block of 5, not 17 blocks of one; AVX2's 256: 6 x 42 + 4)
        if rows >= 2 or vectors == 1:
            return Block(rows, vectors, lanes)
    return None


def micro_kernel_block(op: t.Dot) -> Block | None:
    """The block `gemm.py` computes `op` with, or None where it keeps the loop nest (a dtype other than f32
    and f64, or operands of another dtype than the result other than bf16 or f16 ones of an f32 dot)."""
    d = op.out.dtype
    widened = (d,) if d == float64 else (float32, bfloat16, float16)
    if d not in (float32, float64) or op.a.dtype not in widened or op.b.dtype not in widened:
        return None
    m, n = op.out.shape
    return choose_block(m, n, d.itemsize)


def panel_columns(op: t.Dot) -> int | None:
    """The panel width `op`'s right operand is laid out in (None: row-major; see the module docstring):
    where at least `PANEL_MIN_BLOCKS` row blocks read it and it takes more than `PANEL_MIN_BYTES`."""
    block = micro_kernel_block(op)
    if block is None or op.out.shape[0] < PANEL_MIN_BLOCKS * block.rows:
        return None
    if op.b.type.size * op.b.dtype.itemsize <= PANEL_MIN_BYTES:
        return None
    return block.cols
