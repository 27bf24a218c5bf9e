"""A tile ``dot`` as a register-blocked micro-kernel: the GEMM core of the host code generator.

``out[m, n] = acc + a[m, k] @ b[k, n]`` with ``a`` materialized row-major (or read in place) and ``b``
in the panels of `blocking.py` (row-major where too few row blocks read it to pay for the copy). The
plain loop nest ``for i, k: for j: out[i, j] += a[i, k] * b[k, j]`` vectorizes along ``j`` but loads and
stores ``out[i, j]`` for every multiply-add: two loads and a store per vector FMA, which bounds it by
the load/store ports at a fraction of the FMA units' rate. Here the output is cut into blocks of ``MR``
rows by ``NV`` vectors of ``VW`` lanes (`blocking.choose_block`), each block's ``MR x NV`` accumulators
stay in vector registers across the whole ``k`` loop, and each step loads ``NV`` vectors of ``b``'s row
``k`` (one contiguous line of its panel) and broadcasts ``MR`` elements of ``a``'s column ``k``:
``MR * NV`` FMAs for ``NV`` loads and ``MR`` broadcasts. Operands of a tile are already in L1 or L2 (the
schedule's blocks are tens of KiB), so ``a`` needs no packing: its elements are scalar loads.

``MR`` and ``NV`` come from `blocking.choose_block` (the register file; ``MR`` the largest divisor of ``m``
it allows, or where that is under half of it as many as it allows, the last ``m mod MR`` rows then a
shorter block). ``NV * VW`` must divide ``n``; a dot the block does not tile (``n`` not a multiple of
``VW``) keeps the loop nest. bf16 and f16 operands of an f32 dot (`amx.py`'s fallback) are widened as
they are loaded, exactly. Each output element is the same sum of products in the same ``k`` order as the
loop nest computes (one rounding per FMA where LLVM fuses ``fmuladd``, as the nest's ``contract`` flags
allow)."""
from __future__ import annotations

import llvmlite.ir as ir

from ...ir.tile import nodes as t
from ...ir.types import float32
from ..llvm_dtypes import memory_type
from ..llvm_utils import I64, broadcast_lanes, call_intrinsic, counted_loop, entry_alloca
from .blocking import micro_kernel_block
from .emitter import KernelEmitter, Slot
from .epilogue import Epilogue


def emit_register_blocked_dot(em: KernelEmitter, op: t.Dot, out: Slot, from_zero: bool = False,
                              epilogue: Epilogue | None = None) -> bool:
    """``out += a @ b`` as the micro-kernel (`out` already holds the accumulator), or with `from_zero`
    ``out = a @ b`` (each block's accumulators start at 0 in registers); with an `epilogue`, what is stored is
    its value computed from the accumulators, in its slot (`epilogue.py`). False where the dot is not one it
    computes, and then nothing is emitted (the caller emits the loop nest)."""
    block = micro_kernel_block(op)
    a_slot, b_slot = em.slots.get(op.a.name), em.slots.get(op.b.name)
    if block is None or a_slot is None or b_slot is None:
        return False
    d = op.out.dtype
    m, n = op.out.shape
    k = op.a.shape[1]
    b = em.b
    scalar = memory_type(d)
    vec = ir.VectorType(scalar, block.lanes)
    a_type, b_type = memory_type(op.a.dtype), ir.VectorType(memory_type(op.b.dtype), block.lanes)
    accs = [[entry_alloca(b, vec, name=f"{op.out.name}.c{r}_{v}") for v in range(block.vectors)]
            for r in range(block.rows)]
    zero_acc = ir.Constant(vec, [ir.Constant(scalar, 0.0)] * block.lanes)
    fma = f"llvm.fmuladd.v{block.lanes}{'f32' if d == float32 else 'f64'}"
    in_panels = b_slot.panel == block.cols

    def rhs(kk: ir.Value, jb: ir.Value, col: ir.Value, v: int) -> ir.Value:
        """The address of ``b[kk, col]``, the first lane of vector `v` of column block `jb`."""
        if in_panels:
            return em.panel_address(b_slot, jb, kk, v * block.lanes)
        return em.address(b_slot, (kk, col))

    def rows_from(i0: ir.Value, height: int) -> None:
        """The micro-kernel on output rows ``i0 .. i0 + height``, every column block."""
        rows = [i0 if r == 0 else b.add(i0, ir.Constant(I64, r), flags=("nsw", "nuw")) for r in range(height)]
        with em.loop(n // block.cols, f"{op.out.name}.nb") as jb:
            j0 = b.mul(jb, ir.Constant(I64, block.cols), flags=("nsw", "nuw"))
            cols = [j0 if v == 0 else b.add(j0, ir.Constant(I64, v * block.lanes), flags=("nsw", "nuw"))
                    for v in range(block.vectors)]
            for r, row in enumerate(rows):
                for v, col in enumerate(cols):
                    start = zero_acc if from_zero else b.load(em.address(out, (row, col)), typ=vec, align=d.itemsize)
                    b.store(start, accs[r][v])
            with counted_loop(b, ir.Constant(I64, 0), ir.Constant(I64, k), name=f"{op.out.name}.k") as kk:
                bv = [em.cast(b.load(rhs(kk, jb, col, v), typ=b_type, align=op.b.dtype.itemsize), op.b.dtype, d)
                      for v, col in enumerate(cols)]
                for r, row in enumerate(rows):
                    x = em.cast(b.load(em.address(a_slot, (row, kk)), typ=a_type), op.a.dtype, d)
                    splat = broadcast_lanes(b, x, block.lanes)
                    for v in range(block.vectors):
                        acc = b.load(accs[r][v], typ=vec)
                        b.store(call_intrinsic(b, fma, vec, [splat, bv[v], acc]), accs[r][v])
            for r, row in enumerate(rows):
                for v, col in enumerate(cols):
                    value = b.load(accs[r][v], typ=vec)
                    if epilogue is None:
                        b.store(value, em.address(out, (row, col)), align=d.itemsize)
                    else:
                        b.store(epilogue.apply(em, row, col, value), em.address(epilogue.slot, (row, col)),
                                align=d.itemsize)

    full, tail = divmod(m, block.rows)
    with em.loop(full, f"{op.out.name}.mb") as ib:
        rows_from(b.mul(ib, ir.Constant(I64, block.rows), flags=("nsw", "nuw")), block.rows)
    if tail:
        rows_from(ir.Constant(I64, full * block.rows), tail)
    return True
