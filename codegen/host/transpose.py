"""A materialized 2-D transpose as blocked register transposes (``Kᵀ`` for the ``Q·Kᵀ`` of attention).

A ``dot`` reads its operands from row-major stack arrays (`plan.py`), so ``q @ k.T`` materializes
``k.T``: element ``[d, j]`` is ``k[j, d]``. Filled element by element in the result's order, the
loop vectorizes along ``j`` and reads ``k`` with a stride of a whole row: a gather per vector, which
cost a third of a CPU attention kernel's time. Here the source is read in its own order (contiguous
vector loads; copied to a row-major stack array first unless it is one already; only where that order
is the contiguous one, `reads_rows`) and the result is
written in blocks of ``L x L`` elements, ``L`` the lanes of one vector register: ``L`` rows are loaded
as vectors, transposed in registers, and stored as ``L`` vectors.

The in-register transpose swaps off-diagonal blocks: for each ``b`` in ``1, 2, 4 .. L/2`` and each row
pair ``(i, i + b)`` with bit ``b`` of ``i`` clear, element ``(i, c + b)`` trades places with
``(i + b, c)`` for every column ``c`` with bit ``b`` clear (two two-input shuffles per pair). Each
step moves one bit of the column index into the row index for the elements whose bits differ, so
after all ``log2 L`` steps ``(r, c)`` is at ``(c, r)``. Values are moved, never computed: exact.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ...ir.tile import nodes as t
from ..llvm_dtypes import memory_type, register_type
from ..llvm_utils import I32, I64, entry_alloca
from ..simt.affine import AffineInfo
from .emitter import KernelEmitter, Slot
from .blocking import vector_registers


def emit_permute(em: KernelEmitter, op: t.Permute) -> None:
    """A permute's statement rule: materialized (where the plan keeps it) as blocked register transposes
    where it is a 2-D transpose they tile, element by element otherwise; inline values are left to their
    readers, as for every view."""
    if op.out.shape == ():
        em.scalars[op.out.name] = em.inline(op.out, ())
    elif op.out.name in em.plan.materialized and not _blocked_transpose(em, op):
        em.materialize(op.out)


def transpose_lanes(op: t.Permute) -> int | None:
    """The block side ``L`` of a transpose the register blocks tile (None: they do not)."""
    if op.perm != (1, 0) or len(op.out.shape) != 2:
        return None
    d = op.out.dtype
    if d.itemsize not in (4, 8) or memory_type(d) != register_type(d):   # f32, i32, f64, i64
        return None
    lanes = vector_registers()[0] // d.itemsize
    rows, cols = op.x.shape
    return lanes if rows % lanes == 0 and cols % lanes == 0 else None


def reads_rows(em: KernelEmitter, x: t.Value) -> bool:
    """Whether `x` is cheapest read in its own row-major order: a stack array, or a value computed from loads
    none of which steps by one element along its first dim while striding along its last. (A load laid out
    the other way round, as a GEMM's ``B`` block often is, makes the transpose's own order the contiguous
    one: the element-by-element copy is the fast one.) A load of computed positions (RoPE's rotated half)
    counts as read along its rows, which is how the schedule lays such positions out."""
    affine = AffineInfo(em.plan.defs)
    seen: set[str] = set()

    def rows(v: t.Value) -> bool:
        if v.name in seen or len(v.shape) != 2:
            return True          # a broadcast of a lower-rank value is read the same either way
        seen.add(v.name)
        slot = em.slots.get(v.name)
        if slot is not None:
            return slot.strides is None or slot.strides[-1] == 1
        op = em.plan.defs.get(v.name)
        if isinstance(op, t.Load):
            form = affine.of(op.offsets)
            return form is None or len(form.strides) != 2 or not (form.strides[0] == 1 and form.strides[1] != 1)
        if isinstance(op, t.Unary | t.Binary | t.Select | t.Cast):
            return all(rows(o) for o in t.operands(op))
        return not isinstance(op, t.Permute)   # a transposed view reads the other way round

    return rows(x)


def _shuffle_masks(lanes: int, b: int) -> tuple[list[int], list[int]]:
    """The two shuffles of rows ``(i, i + b)``: the new row ``i`` and the new row ``i + b``."""
    low = [c if not c & b else lanes + c - b for c in range(lanes)]
    high = [c + b if not c & b else lanes + c for c in range(lanes)]
    return low, high


def _blocked_transpose(em: KernelEmitter, op: t.Permute) -> bool:
    lanes = transpose_lanes(op)
    if lanes is None or not reads_rows(em, op.x):
        return False
    b, d = em.b, op.out.dtype
    scalar = memory_type(d)
    src = em.slots.get(op.x.name) or em.global_view(op.x)
    if src is None:   # read in its own order once, contiguously, into a private row-major array
        src = Slot(entry_alloca(b, scalar, name=f"{op.x.name}.rows", count=op.x.type.size, align=64),
                   op.x.shape, d)
        with em.nest(op.x.shape, name=f"{op.x.name}.rows") as idx:
            em.write(src, idx, em.value(op.x, idx))
    transpose_blocks(em, src, em.new_slot(op.out), lanes, op.out.name)
    return True


def transpose_blocks(em: KernelEmitter, src: Slot, out: Slot, lanes: int, name: str, align: int | None = None) -> None:
    """``out = src^T`` for 2-D slots of one 4- or 8-byte type, rows of `src` contiguous: blocks of `lanes` x
    `lanes` elements loaded as rows, transposed in registers by ``log2(lanes)`` rounds of shuffles, and stored
    as rows of `out` (`lanes` must divide both sides). `align`: what `src`'s rows are aligned to (default: the
    element size)."""
    b, d = em.b, src.dtype
    src_align = align or d.itemsize
    vec = ir.VectorType(memory_type(d), lanes)
    rows, cols = src.shape
    masks = {step: _shuffle_masks(lanes, step) for step in _steps(lanes)}
    with em.loop(rows // lanes, f"{name}.tr") as rb:
        r0 = b.mul(rb, ir.Constant(I64, lanes), flags=("nsw", "nuw"))
        with em.loop(cols // lanes, f"{name}.tc") as cb:
            c0 = b.mul(cb, ir.Constant(I64, lanes), flags=("nsw", "nuw"))
            v = [b.load(em.address(src, (_plus(b, r0, r), c0)), typ=vec, align=src_align) for r in range(lanes)]
            for step, (low, high) in masks.items():
                for i in range(lanes):
                    if i & step:
                        continue
                    lo = b.shuffle_vector(v[i], v[i + step], ir.Constant(ir.VectorType(I32, lanes), low))
                    hi = b.shuffle_vector(v[i], v[i + step], ir.Constant(ir.VectorType(I32, lanes), high))
                    v[i], v[i + step] = lo, hi
            for c in range(lanes):
                b.store(v[c], em.address(out, (_plus(b, c0, c), r0)), align=d.itemsize)


def _steps(lanes: int) -> list[int]:
    out, step = [], 1
    while step < lanes:
        out.append(step)
        step *= 2
    return out


def _plus(b: ir.IRBuilder, x: ir.Value, k: int) -> ir.Value:
    return x if k == 0 else b.add(x, ir.Constant(I64, k), flags=("nsw", "nuw"))
