"""Global loads and stores: coalesced, vectorized where alignment allows, masked on ragged edges.

For affine offsets (`affine.py`) a thread's address is ``base + field(tid) +
c_r``: the base once (the offsets tile evaluated at the origin), one bit field of
the thread index, and a constant per register. A load or store moves ``n``
registers at once (16 bytes at most) when they are consecutive elements along a
dim the offsets step through by 1, every other step of the layout is a multiple
of ``n``, the base is a multiple of ``n`` and the mask is constant over each
group of ``n`` (`AffineInfo.constancy`). Other offsets are computed per register.
Masked-off lanes are never dereferenced; a store is issued once per element
(threads that replicate another thread's registers stay quiet).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...ir import BinaryOp
from ...ir.tile import nodes as t
from ...ir.simt.nodes import Reg
from .context import Lowering, effect_rule, value_rule
from .convert import writer_mask
from .elementwise import coerce
from .layouts import Layout, contiguous_run, origin
from .plan import memory_layout
from .values import Regs, chunk_len, from_registers, pieces


@dataclass(frozen=True)
class Access:
    """How one load/store walks its tile: `width` registers per access, index and mask of the access at a register."""

    width: int
    index: Callable[[int], Reg]
    mask: Callable[[int], Reg | None]


def _fast_dim(layout: Layout) -> int | None:
    if not layout.regs:
        return None
    nonzero = [d for d, c in enumerate(layout.regs[0]) if c]
    return nonzero[0] if len(nonzero) == 1 else None


def _width(lw: Lowering, op: t.Load | t.Store, layout: Layout, itemsize: int) -> int:
    form = lw.plan.affine.of(op.offsets)
    fast = _fast_dim(layout)
    if form is None or fast is None or form.strides[fast] != 1:
        return 1
    n = min(contiguous_run(layout, fast), 16 // itemsize, chunk_len(layout.num_regs))
    if op.mask is not None:
        n = min(n, lw.plan.affine.constancy(op.mask, fast))

    def step(basis) -> int:
        return sum(s * c for s, c in zip(form.strides, basis))

    while n > 1:
        skip = n.bit_length() - 1          # the first log2(n) register bits form the vector
        others = layout.regs[skip:] + layout.thread_bases
        if form.div % n == 0 and all(step(x) % n == 0 for x in others):
            break
        n //= 2
    return max(n, 1)


def access(lw: Lowering, op: t.Load | t.Store, layout: Layout, itemsize: int) -> Access:
    """The `Access` of `op` over a tile in `layout`."""
    b = lw.b
    mask_regs = lw.get(op.mask, layout) if op.mask is not None else None

    def mask(r: int) -> Reg | None:
        return None if mask_regs is None else pieces(b, mask_regs, r, 1)

    form = lw.plan.affine.of(op.offsets) if layout.shape else None
    if form is None:
        offsets = lw.get(op.offsets, layout)
        return Access(1, lambda r: pieces(b, offsets, r, 1), mask)
    dtype = op.offsets.dtype
    base = lw.get(op.offsets, origin(layout.shape, lw.plan.warps)).chunks[0]

    def step(basis) -> int:
        return sum(s * c for s, c in zip(form.strides, basis))

    thread = b.thread_field(lw.tid, [step(x) for x in layout.thread_bases], dtype)
    start = b.arith(BinaryOp.ADD, base, thread)

    def index(r: int) -> Reg:
        at = step(layout.reg_coord(r))
        return b.arith(BinaryOp.ADD, start, b.const_of(at, dtype))

    return Access(_width(lw, op, layout, itemsize), index, mask)


@value_rule(t.Load)
def _load(lw: Lowering, op: t.Load, layout: Layout) -> Regs:
    b, dtype = lw.b, op.out.dtype
    how = access(lw, op, layout, dtype.itemsize)
    other = coerce(op.other, dtype)
    parts = []
    for r in range(0, layout.num_regs, how.width):
        m = how.mask(r)
        parts.append(b.load_global(op.buffer, how.index(r), length=how.width, mask=m, other=other))
    return from_registers(b, layout, dtype, parts)


@effect_rule(t.Store)
def _store(lw: Lowering, op: t.Store) -> None:
    b, value = lw.b, op.value
    if not value.shape:
        layout = lw.scalar
    elif lw.plan.is_lazy(value):
        layout = memory_layout(op, value.shape, value.dtype.itemsize, lw.plan)
    else:
        layout = lw.planned(value)
        if value.dtype.itemsize == 1 and _width(lw, op, layout, 1) == 1:
            # bytes stored one at a time across rows (a transposing copy of an e4m3 matrix: `schedule/k_major.py`)
            # go through a layout conversion in shared memory to the store's own, 16 bytes an access
            wide = memory_layout(op, value.shape, 1, lw.plan)
            if _width(lw, op, wide, 1) > 1:
                layout = wide
    regs = lw.get(value, layout)
    how = access(lw, op, layout, value.dtype.itemsize)
    writer = writer_mask(lw, layout)
    for r in range(0, layout.num_regs, how.width):
        m = how.mask(r)
        if writer is not None:
            m = writer if m is None else b.binary(BinaryOp.AND, m, writer)
        b.store_global(op.buffer, how.index(r), pieces(b, regs, r, how.width), mask=m)

