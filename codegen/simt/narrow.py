"""`narrow_dot_operands`: give a `Dot` its operands in f16/bf16/e4m3 so it can run on tensor cores.

The scheduler computes in f32, so a ``dot`` of half-precision data reads
``permute(cast_f32(load_f16))``. This Tile IR -> Tile IR pass rewrites such an
operand to ``permute(load_f16)`` — the same values, exactly (`Dot` multiplies in
the accumulator's dtype) — when the dot can use an mma instruction (shape and
target, `plan.mma_shape`). When only one operand is exactly low precision,
the other (an f32 computation, like ``P`` in ``P @ V``) is rounded to that type
only if `GpuOptions.round_operands` and every value the dot's result reaches is
stored in that precision or coarser (`store_precision`): the rounding is then
smaller than what the store rounds away anyway. Otherwise, when the exact operand is
bf16, the f32 operand is *split*: three bf16 values that sum to it exactly, each
multiplied by the exact operand in its own mma, the three chained through the
accumulator (numpy computes ``bf16 @ bf16`` in f32, so an f32 ``P @ V`` is what a
bf16 attention written in numpy asks for). Otherwise the dot stays f32 (FMA).
Guarantees: verified Tile IR in and out; exact operands give the same result.

Why the split is exact. bf16 has f32's exponent range and 8 of its 24 significant
bits. ``a1 = bf16(a)`` (round to nearest) leaves ``a - a1`` exactly representable in
f32 with at most 16 significant bits; ``a2 = bf16(a - a1)`` leaves at most 8, which
``a3`` holds exactly. So ``a1 + a2 + a3 == a``, and every product with a bf16 value is
exact in f32: the three mmas add the very products the FMA path adds, in another
order (the smallest part first, so ``a3 + a2 == a - a1`` exactly and no partial sum
overflows where ``a`` does not). Two edges: what ``a1`` and ``a2`` are cast from is
clamped to bf16's largest finite value, so an f32 beyond it (up to f32's largest)
does not round to inf, and an infinity reaches ``a3`` unclamped (``inf - max =
inf``) and stays one; bits of ``a`` below bf16's smallest subnormal (2**-133, only
when ``|a| < 2**-110``) are lost. NaN stays NaN. The cost is three tensor-core
instructions where one would do, against a ``[M, K] x [K, N]`` loop of FMAs.
"""
from __future__ import annotations

from ...ir.tile import nodes as t
from ..narrow_operands import BF16_MAX, SPLIT_PARTS, narrow_operands, store_precision
from .options import GpuOptions
from .plan import mma_shape


def narrow_dot_operands(k: t.TileKernel, opts: GpuOptions) -> t.TileKernel:
    """`k` (verified) with tensor-core-ready dot operands (see the module docstring); verified. A kernel
    without a dot is returned as it is: the analyses are not run and there is nothing new to verify."""
    return narrow_operands(k, lambda probe: mma_shape(probe, opts) is not None, opts.round_operands,
                           pass_name="narrow_dot_operands")


__all__ = ["narrow_dot_operands", "store_precision", "BF16_MAX", "SPLIT_PARTS"]
