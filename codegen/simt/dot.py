"""`Dot` (``acc + a @ b``): tensor cores where the operands allow, an FMA loop otherwise.

Tensor cores (`plan.mma_shape`): f16/bf16 operands use ``mma.sync.m16n8k16``,
float8_e4m3fn ``m16n8k32`` (sm_89+), both accumulating in f32. The operands are
read in the fragment layouts (`layouts.mma_a/mma_b`: through shared memory from
a load's blocked layout, or by renaming registers when the operand is itself an
accumulator, as ``P`` in ``P @ V``), and each warp runs, per output tile
``(mi, ni)``, one mma per ``k_inst`` step of the contraction, left to right.

On ``sm_90a``, where the warps form warpgroups along the output's rows, Hopper's ``wgmma`` (`wgmma.py`).
FMA otherwise (f32 operands, shapes or targets without an mma): `fma.py`.
"""
from __future__ import annotations

from ...ir.tile import nodes as t
from .context import Lowering, value_rule
from .fma import fma_dot
from .wgmma import lower_wgmma
from .layouts import Layout, mma_a, mma_b, mma_warps
from .values import Regs, from_registers, pieces, splat


def _accumulator(lw: Lowering, op: t.Dot, layout: Layout) -> Regs:
    if op.acc is not None:
        return lw.get(op.acc, layout)
    return splat(lw.b, layout, op.out.dtype, 0.0)


def _mma(lw: Lowering, op: t.Dot, layout: Layout) -> Regs:
    b = lw.b
    shape = lw.plan.dots[op.out.name].mma
    (m, k), n = op.a.shape, op.b.shape[1]
    warps = lw.plan.warps
    a = lw.get(op.a, mma_a(m, k, n, warps, shape.k))
    bb = lw.get(op.b, mma_b(k, n, m, warps, shape.k))
    c = _accumulator(lw, op, layout)
    wm, wn = mma_warps(m, n, warps)
    mt, nt, kt = m // (16 * wm), n // (8 * wn), k // shape.k
    a_len, b_len = shape.a_type.length, shape.b_type.length
    tiles = []
    for mi in range(mt):
        for ni in range(nt):
            d = pieces(b, c, 4 * (mi * nt + ni), 4)
            for ki in range(kt):
                d = b.mma(shape, pieces(b, a, a_len * (mi * kt + ki), a_len), pieces(b, bb, b_len * (ni * kt + ki), b_len), d)
            tiles.append(d)
    return from_registers(b, layout, op.out.dtype, tiles)


@value_rule(t.Dot)
def _dot(lw: Lowering, op: t.Dot, layout: Layout) -> Regs:
    plan = lw.plan.dots[op.out.name]
    if plan.wgmma is not None:
        return lower_wgmma(lw, op, plan.wgmma, layout, lw.get(op.acc, layout) if op.acc is not None else None)
    if plan.mma is not None:
        return _mma(lw, op, layout)
    return fma_dot(lw, op, layout, lw.get(op.acc, layout) if op.acc is not None else None)
