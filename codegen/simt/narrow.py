"""`narrow_dot_operands`: give a `Dot` its operands in f16/bf16/e4m3 so it can run on tensor cores.

The rewrite is `codegen.narrow_operands` (shared with the host's AMX tiles, whose module docstring says
why each form is exact) with the tensor cores' shapes: a dot is narrowed where it can use an mma
instruction (shape and target, `plan.mma_shape`). An f32 operand beside an exact low-precision one (``P``
in ``P @ V``) is rounded to that type where numpy holds it in that type (`Dot.held`: f16 attention's ``P``);
otherwise, beside bf16 data, it is split into three bf16 values that sum to it exactly, each multiplied in
its own mma, chained through the accumulator: three tensor-core instructions where one would do, against a
``[M, K] x [K, N]`` loop of FMAs.
Guarantees: verified Tile IR in and out; exact operands give the same result.
"""
from __future__ import annotations

from ...ir.tile import nodes as t
from ..narrow_operands import BF16_MAX, SPLIT_PARTS, narrow_operands
from .options import GpuOptions
from .plan import mma_shape


def narrow_dot_operands(k: t.TileKernel, opts: GpuOptions) -> t.TileKernel:
    """`k` (verified) with tensor-core-ready dot operands (see the module docstring); verified. A kernel
    without a dot is returned as it is: the analyses are not run and there is nothing new to verify."""
    return narrow_operands(k, lambda probe: mma_shape(probe, opts) is not None, pass_name="narrow_dot_operands")


__all__ = ["narrow_dot_operands", "BF16_MAX", "SPLIT_PARTS"]
