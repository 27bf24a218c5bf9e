"""The FMA `dot` (f32 operands, or shapes and targets without an mma), in chunks of the contraction axis.

The output is a blocked tile of f32 registers. The contraction axis is cut into
chunks of ``kc`` (as long as a chunk of both operands fits `CHUNK_BYTES` of shared
memory); per chunk: a barrier (the array may still be read), each thread stores
the operand elements it owns whose ``k`` falls in the chunk, a barrier, then a
loop over ``k`` in the chunk has each thread read the ``a[m, k]`` of its output
rows and the ``b[k, n]`` of its output columns (a vector where its columns are
consecutive) and accumulate ``acc += a * b``. An operand that is an exact f32
copy of narrow data (``cast_f32(load_bf16)``, through permutes) is kept narrow in
shared memory and widened when read.
"""
from __future__ import annotations

from ...ir import BinaryOp
from ...ir.tile import nodes as t
from ...ir.simt.nodes import Reg, SharedAlloc
from ...ir.types import float32, int32
from .context import Lowering
from .convert import writer_mask
from ...ir.types import row_major_strides as strides
from .layouts import Layout, contiguous_run, log2
from .plan import default_layout
from .values import Regs, pieces, splat

CHUNK_BYTES = 16 * 1024


def _source(lw: Lowering, v: t.Value) -> tuple[t.Value, tuple[int, ...]]:
    """The array to keep in shared memory for operand `v`, and for each dim of `v` the dim of that array."""
    src, perm = v, tuple(range(len(v.shape)))
    op = lw.plan.defs.get(v.name)
    while isinstance(op, t.Permute):
        src, perm = op.x, tuple(op.perm[p] for p in perm)
        op = lw.plan.defs.get(src.name)
    if isinstance(op, t.Cast) and op.x.dtype.storage_only and op.out.dtype == float32 and (
            lw.opts.sm_number >= 89 or not isinstance(lw.plan.defs.get(op.x.name), t.Cast)):
        src = op.x    # the narrow data itself: less shared memory (e4m3 from f32 needs sm_89's cvt)
    return src, perm


def _registers(lw: Lowering, v: t.Value) -> Regs:
    return lw.get(v, default_layout(v.shape, lw.plan.warps, v.dtype.itemsize) if lw.plan.is_lazy(v) else None)


def store_chunk(lw: Lowering, regs: Regs, alloc: SharedAlloc, offset: int, kdim: int, chunk: int, kc: int) -> None:
    """The elements of `regs` with ``chunk * kc <= coord[kdim] < (chunk + 1) * kc``, row-major in `alloc` at
    `offset` as a tile whose `kdim` is ``kc`` long (each element once)."""
    b, layout = lw.b, regs.layout
    bits = log2(kc)
    local_strides = strides(tuple(kc if d == kdim else s for d, s in enumerate(layout.shape)))

    def local(x) -> int:
        return sum((c & (kc - 1) if d == kdim else c) * s for d, (c, s) in enumerate(zip(x, local_strides)))

    thread_local = b.thread_field(lw.tid, [local(x) for x in layout.thread_bases])
    high = [x[kdim] >> bits for x in layout.thread_bases]
    thread_high = b.thread_field(lw.tid, high) if any(high) else None
    writer = writer_mask(lw, layout)
    run = 0
    while run < len(layout.regs) and layout.regs[run][kdim] < kc and local(layout.regs[run]) == 1 << run:
        run += 1
    n = max(1, min(1 << run, 16 // regs.dtype.itemsize, regs.chunk_len))
    while offset % n:
        n //= 2
    for r in range(0, layout.num_regs, n):
        coord = layout.reg_coord(r)
        need = chunk - (coord[kdim] >> bits)      # the thread part of the chunk index this register needs
        if need < 0 or need > sum(high) or (thread_high is None and need):
            continue
        mask = writer
        if thread_high is not None:
            mine = b.binary(BinaryOp.EQ, thread_high, b.const_of(need, int32))
            mask = mine if mask is None else b.binary(BinaryOp.AND, mask, mine)
        index = b.arith(BinaryOp.ADD, thread_local, b.const_of(offset + local(coord), int32))
        b.store_shared(alloc, index, pieces(b, regs, r, n), mask=mask)


def _chunk(k: int, rows: int, cols: int, a_bytes: int, b_bytes: int) -> int:
    kc = k
    while kc > 1 and kc * (rows * a_bytes + cols * b_bytes) > CHUNK_BYTES:
        kc //= 2
    return kc


def fma_dot(lw: Lowering, op: t.Dot, layout: Layout, acc: Regs | None) -> Regs:
    """``acc + a @ b`` in `layout` (blocked), see the module docstring."""
    b = lw.b
    (m, k), n = op.a.shape, op.b.shape[1]
    (a_src, a_perm), (b_src, b_perm) = _source(lw, op.a), _source(lw, op.b)
    kc = _chunk(k, m, n, a_src.dtype.itemsize, b_src.dtype.itemsize)
    a_dims = strides(tuple(kc if d == a_perm[1] else s for d, s in enumerate(a_src.shape)))
    b_dims = strides(tuple(kc if d == b_perm[0] else s for d, s in enumerate(b_src.shape)))
    a_m, a_k = a_dims[a_perm[0]], a_dims[a_perm[1]]
    b_k, b_n = b_dims[b_perm[0]], b_dims[b_perm[1]]
    same = a_src.dtype == b_src.dtype
    a_smem = lw.arena(a_src.dtype, m * kc + (kc * n if same else 0))
    b_smem, b_at = (a_smem, m * kc) if same else (lw.arena(b_src.dtype, kc * n), 0)
    # Everything computed before the first store: conversions use the same shared arrays.
    acc = acc if acc is not None else splat(b, layout, op.out.dtype, 0.0)
    a_regs, b_regs = _registers(lw, a_src), _registers(lw, b_src)
    rows = [i for i, x in enumerate(layout.regs) if x[0]]
    cols = [i for i, x in enumerate(layout.regs) if x[1]]
    row_of = [sum(layout.regs[i][0] for n_, i in enumerate(rows) if j >> n_ & 1) for j in range(1 << len(rows))]
    col_of = [sum(layout.regs[i][1] for n_, i in enumerate(cols) if j >> n_ & 1) for j in range(1 << len(cols))]
    a_thread = b.thread_field(lw.tid, [x[0] * a_m for x in layout.thread_bases])
    b_thread = b.thread_field(lw.tid, [x[1] * b_n for x in layout.thread_bases])
    run = contiguous_run(Layout(layout.shape, tuple(layout.regs[i] for i in cols), layout.lanes, layout.warps), 1)
    width = max(1, min(run, 16 // b_src.dtype.itemsize, len(col_of))) if b_n == 1 else 1
    while b_at % width or b_k % width:   # vector reads stay aligned
        width //= 2

    def index(r: int, bits: list[int]) -> int:
        return sum(1 << n_ for n_, i in enumerate(bits) if r >> i & 1)

    def widen(x: Reg) -> Reg:   # products and sums in the accumulator's dtype (f32, f64 from numpy promotion)
        return x if x.dtype == op.out.dtype else b.cast(x, op.out.dtype)

    def body(kk: Reg, *chunks: Reg) -> list[Reg]:
        with lw.region():
            a_row = b.arith(BinaryOp.ADD, a_thread, b.arith(BinaryOp.MUL, kk, b.const_of(a_k, int32)))
            a_vals = [widen(b.load_shared(a_smem, b.arith(BinaryOp.ADD, a_row, b.const_of(r * a_m, int32))))
                      for r in row_of]
            b_row = b.arith(BinaryOp.ADD, b_thread, b.arith(BinaryOp.MUL, kk, b.const_of(b_k, int32)))
            b_vals: list[Reg] = []
            for j in range(0, len(col_of), width):
                at = b.const_of(b_at + col_of[j] * b_n, int32)
                vec = widen(b.load_shared(b_smem, b.arith(BinaryOp.ADD, b_row, at), length=width))
                b_vals += [vec] if width == 1 else [b.piece(vec, e) for e in range(width)]
            out = []
            v = chunks[0].length
            for c, chunk in enumerate(chunks):
                regs = range(c * v, (c + 1) * v)
                av = b.pack([a_vals[index(r, rows)] for r in regs]) if v > 1 else a_vals[index(c, rows)]
                bv = b.pack([b_vals[index(r, cols)] for r in regs]) if v > 1 else b_vals[index(c, cols)]
                out.append(b.binary(BinaryOp.ADD, chunk, b.binary(BinaryOp.MUL, av, bv)))
            return out

    chunks = list(acc.chunks)
    for c in range(k // kc):
        b.barrier()                       # the arrays may still be read by an earlier use
        store_chunk(lw, a_regs, a_smem, 0, a_perm[1], c, kc)
        store_chunk(lw, b_regs, b_smem, b_at, b_perm[0], c, kc)
        b.barrier()
        chunks = b.for_(0, kc, 1, chunks, body, names=[f"{op.out.name}_acc"] * len(chunks), iv_name="kk")
    return Regs(layout, op.out.dtype, tuple(chunks))

