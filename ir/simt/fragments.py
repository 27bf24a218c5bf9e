"""Which lane of a warp holds which matrix element of a tensor-core ``mma`` (PTX ISA facts, pure Python).

PTX ISA, "Matrix Fragments for mma.m16n8k16 / m16n8k32": A (16 x k, row-major) is 4 registers per
lane, B (k x 8, "col" layout) 2, the f32 accumulator C/D 4; a register packs 32/bits elements, low bits
first. The SIMT IR's `Mma` operands are these per-lane fragments: the GPU lowering lays its registers
out by them (`redfuser.codegen.simt.layouts`, checked against them in the tests) and the SIMT simulator
executes `Mma` by them, so the two agree with each other and with the hardware.
"""
from __future__ import annotations

from ..errors import InternalError


def fragment_a(lane: int, k: int) -> list[list[tuple[int, int]]]:
    """(row, col) of A (16 x k, row-major) held by `lane`: 4 registers, each 32/bits elements, low bits first.

    `k` is 16 (16-bit elements, 2 per register) or 32 (8-bit elements, 4 per register).
    """
    per_reg = _per_reg(k)
    group, tig = lane >> 2, lane & 3
    return [[(group + 8 * (reg & 1), (reg >> 1) * (k // 2) + tig * per_reg + j) for j in range(per_reg)]
            for reg in range(4)]


def fragment_b(lane: int, k: int) -> list[list[tuple[int, int]]]:
    """(row, col) of B (k x 8, "col" layout) held by `lane`: 2 registers, low bits first."""
    per_reg = _per_reg(k)
    group, tig = lane >> 2, lane & 3
    return [[(reg * (k // 2) + tig * per_reg + j, group) for j in range(per_reg)] for reg in range(2)]


def fragment_c(lane: int) -> list[tuple[int, int]]:
    """(row, col) of the 16 x 8 f32 accumulator held by `lane`: 4 registers c0..c3."""
    group, tig = lane >> 2, lane & 3
    return [(group + 8 * (i >> 1), tig * 2 + (i & 1)) for i in range(4)]


def _per_reg(k: int) -> int:
    if k not in (16, 32):
        raise InternalError(f"mma k={k}: only m16n8k16 (16-bit) and m16n8k32 (8-bit) are supported", pass_name="nvvm")
    return 2 if k == 16 else 4
