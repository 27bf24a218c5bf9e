"""A float reduction along the last axis of a tile in memory, as explicit vectors.

A row of ``n`` elements is combined ``L`` lanes at a time into one vector accumulator (contiguous vector
loads), then across the lanes once per row (LLVM's ``vector.reduce`` intrinsics). LLVM's own
vectorizer does this for sums of scalar loops, but not for ``max``/``min``: numpy's NaN-propagating
maximum (``llvm.maximum``) is a reduction it leaves scalar, a compare and a blend per element, which
was a twentieth of a CPU attention kernel. Only rows already in memory (a stack array or a load read
in place, `KernelEmitter.global_view`) with ``n`` a multiple of ``L`` take this path; the elements
combined and the combine are the same as the scalar loop's (a sum or product in another order, which
the scalar loop's ``reassoc`` flags allow too).

``max`` and ``min`` keep NaN apart from the values: each vector is combined by ``x > acc ? x : acc`` (one
``vmaxps``; a NaN ``x`` leaves ``acc`` as it was) and its NaN lanes are or-ed into a mask, so the running
value's dependency chain is one instruction long (``llvm.maximum`` on AVX2 is two blends, a max, a
compare and a blend, all on the chain). The lanes are then combined by halving shuffles, and the row is
NaN where the mask has a lane set. Which of two equal zeros of opposite sign comes out is unspecified
here, as in numpy (whose reductions return either, by position; the fuzzer's oracle treats the sign of
a zero from max or min as unsure).
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
from .rules import fenced_factor

_ACROSS = {ReduceOp.SUM: "fadd", ReduceOp.PROD: "fmul"}


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
    extremum = op.op in (ReduceOp.MAX, ReduceOp.MIN)
    mask = ir.VectorType(ir.IntType(1), lanes)
    acc = entry_alloca(b, vec, name=f"{op.out.name}.vacc")
    nans = entry_alloca(b, mask, name=f"{op.out.name}.vnan") if extremum else None
    with em.nest(op.out.shape, name=f"{op.out.name}.") as idx:
        b.store(ir.Constant(vec, [identity.constant] * lanes), acc)
        if nans is not None:
            b.store(ir.Constant(mask, [0] * lanes), nans)
        with em.loop(n // lanes, f"{op.out.name}.rv") as r:
            col = b.mul(r, ir.Constant(I64, lanes), flags=("nsw", "nuw"))
            x = b.load(em.address(src, idx + (col,)), typ=vec, align=d.itemsize)
            cur = b.load(acc, typ=vec)
            if op.op is ReduceOp.SUM:
                nxt = b.fadd(cur, x, flags=("reassoc",))
            elif op.op is ReduceOp.PROD:
                nxt = b.fmul(cur, fenced_factor(em, x), flags=("reassoc",))
            else:
                nxt = _pick(b, op.op, x, cur)
                b.store(b.or_(b.load(nans, typ=mask), b.fcmp_unordered("uno", x, x)), nans)
            b.store(nxt, acc)
        final = b.load(acc, typ=vec)
        if nans is not None:
            row = _across_lanes(b, op.op, final, lanes)
            found = call_intrinsic(b, f"llvm.vector.reduce.or.v{lanes}i1", ir.IntType(1), [b.load(nans, typ=mask)])
            row = b.select(found, constant(d, float("nan")), row)
        else:   # these take a start value; reassoc: any order (a tree)
            name = f"llvm.vector.reduce.{_ACROSS[op.op]}.{suffix}"
            fn = declare_intrinsic(b.module, name, scalar, [scalar, vec])
            row = b.call(fn, [identity, final], fastmath=("reassoc",))
        em.write(out, idx, row)
    return True


def _pick(b: ir.IRBuilder, op: ReduceOp, x: ir.Value, cur: ir.Value) -> ir.Value:
    """``x > cur ? x : cur`` for max (``<`` for min): one ``vmaxps``/``vminps``; a NaN ``x`` keeps ``cur``."""
    return b.select(b.fcmp_ordered(">" if op is ReduceOp.MAX else "<", x, cur), x, cur)


def _across_lanes(b: ir.IRBuilder, op: ReduceOp, v: ir.Value, lanes: int) -> ir.Value:
    """The max (min) of `v`'s NaN-free lanes: the upper half picked against the lower, halving to one."""
    width = lanes
    while width > 1:
        width //= 2
        lo = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), width), list(range(width))))
        hi = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                list(range(width, 2 * width))))
        v = _pick(b, op, hi, lo)
    return b.extract_element(v, ir.Constant(ir.IntType(32), 0))
