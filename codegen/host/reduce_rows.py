"""A float reduction along the last axis of a tile in memory, as explicit vectors.

A row of ``n`` elements is combined ``L`` lanes at a time into one vector accumulator (contiguous vector
loads), then across the lanes once per row (LLVM's ``vector.reduce`` intrinsics). LLVM's own
vectorizer does this for sums of scalar loops, but not for ``max``/``min``: numpy's NaN-propagating
maximum (``llvm.maximum``) is a reduction it leaves scalar, a compare and a blend per element, which
was a twentieth of a CPU attention kernel. Only rows already in memory (a stack array or a load read
in place, `KernelEmitter.global_view`) with ``n`` a multiple of ``L`` take this path; the elements
combined and the combine are the same as the scalar loop's (a sum or product in another order, which
the scalar loop's ``reassoc`` flags allow too).
"""
from __future__ import annotations

import llvmlite.ir as ir

from ...ir import ReduceOp
from ...ir.tile import nodes as t
from ...ir.types import float32, float64
from ..llvm_dtypes import constant, memory_type
from ..llvm_utils import I64, call_intrinsic, declare_intrinsic, entry_alloca
from .emitter import KernelEmitter, Slot
from .blocking import vector_registers

_LANEWISE = {ReduceOp.MAX: "maximum", ReduceOp.MIN: "minimum"}
_ACROSS = {ReduceOp.SUM: "fadd", ReduceOp.PROD: "fmul", ReduceOp.MAX: "fmaximum", ReduceOp.MIN: "fminimum"}


def emit_vector_row_reduction(em: KernelEmitter, op: t.Reduce, out: Slot) -> bool:
    """`op` (over the last axis) written to `out` as explicit vectors; False where it does not apply."""
    d = op.x.dtype
    src = em.slots.get(op.x.name)
    if d not in (float32, float64) or op.axis != len(op.x.shape) - 1 or src is None:
        return False
    if src.strides is not None and src.strides[-1] != 1:
        return False
    lanes = vector_registers()[0] // d.itemsize
    n = op.x.shape[-1]
    if n % lanes:
        return False
    b = em.b
    scalar = memory_type(d)
    vec = ir.VectorType(scalar, lanes)
    suffix = f"v{lanes}{'f32' if d == float32 else 'f64'}"
    identity = constant(d, op.op.identity(d))
    acc = entry_alloca(b, vec, name=f"{op.out.name}.vacc")
    with em.nest(op.out.shape, name=f"{op.out.name}.") as idx:
        b.store(ir.Constant(vec, [identity.constant] * lanes), acc)
        with em.loop(n // lanes, f"{op.out.name}.rv") as r:
            col = b.mul(r, ir.Constant(I64, lanes), flags=("nsw", "nuw"))
            x = b.load(em.address(src, idx + (col,)), typ=vec, align=d.itemsize)
            cur = b.load(acc, typ=vec)
            if op.op is ReduceOp.SUM:
                nxt = b.fadd(cur, x, flags=("reassoc",))
            elif op.op is ReduceOp.PROD:
                nxt = b.fmul(cur, x, flags=("reassoc",))
            else:
                nxt = call_intrinsic(b, f"llvm.{_LANEWISE[op.op]}.{suffix}", vec, [cur, x])
            b.store(nxt, acc)
        final = b.load(acc, typ=vec)
        name = f"llvm.vector.reduce.{_ACROSS[op.op]}.{suffix}"
        if op.op in (ReduceOp.SUM, ReduceOp.PROD):   # these take a start value; reassoc: any order (a tree)
            fn = declare_intrinsic(b.module, name, scalar, [scalar, vec])
            row = b.call(fn, [identity, final], fastmath=("reassoc",))
        else:
            row = call_intrinsic(b, name, scalar, [final])
        em.write(out, idx, row)
    return True
