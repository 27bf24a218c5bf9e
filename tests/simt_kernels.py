"""Hand-built SIMT kernels shared by the SIMT IR, simulator and NVPTX tests (small blocks and grids).

Each builder returns a verified `SimtKernel`; keyword flags plant the bugs the
simulator must catch (a missing barrier, an off-by-one mask, a divergent
barrier, an uninitialized shared read).
"""
from __future__ import annotations

import math

from redfuser.ir.semantics import BinaryOp, UnaryOp
from redfuser.ir.simt.nodes import IntOp, MmaShape, Reg, ShuffleKind, SimtKernel
from redfuser.ir.simt.builder import SimtBuilder
from redfuser.ir.types import DType, bfloat16, float16, float32, int32, int64


def _c(b: SimtBuilder, value, dtype: DType = int32) -> Reg:
    return b.const(value, dtype)


def elementwise(n: int = 1000, warps: int = 2, *, index64: bool = False, off_by_one: bool = False) -> SimtKernel:
    """``out = y > 0 ? exp(x) * y + 1 : sqrt(|y|)`` and its bf16 copy, for ``i < n`` (ragged last block)."""
    threads = warps * 32
    b = SimtBuilder("elementwise" + ("64" if index64 else ""), warps=warps, grid=(-(-n // threads),))
    x, y = b.buffer("x", float16, (n,)), b.buffer("y", float32, (n,))
    out, out16 = b.buffer("out", float32, (n,)), b.buffer("out_bf16", bfloat16, (n,))
    itype = int64 if index64 else int32
    n_reg = b.scalar_param("n", itype)
    bid, tid = b.block_idx(), b.thread_idx()
    if index64:   # widen before multiplying: the product may pass 2**31
        bid, tid = b.cast(bid, int64), b.cast(tid, int64)
    i = b.add(b.mul(bid, _c(b, threads, itype)), tid)
    inside = b.binary(BinaryOp.LE if off_by_one else BinaryOp.LT, i, n_reg)
    xv = b.cast(b.load_global(x, i, mask=inside, other=0.0), float32)
    yv = b.load_global(y, i, mask=inside, other=0.0)
    grown = b.add(b.mul(b.unary(UnaryOp.EXP, xv), yv), _c(b, 1.0, float32))
    shrunk = b.unary(UnaryOp.SQRT, b.unary(UnaryOp.ABS, yv))
    value = b.select(b.binary(BinaryOp.GT, yv, _c(b, 0.0, float32)), grown, shrunk)
    b.store_global(out, i, value, mask=inside)
    b.store_global(out16, i, b.cast(value, bfloat16), mask=inside)
    return b.build()


def vector_scale(n: int = 1001, dtype: DType = float32, warps: int = 1) -> SimtKernel:
    """``out = x * scale`` with one 16-byte vector per thread, a scalar masked loop for the ragged tail."""
    per = 16 // dtype.itemsize
    threads = warps * 32
    b = SimtBuilder(f"vector_scale_{dtype}", warps=warps, grid=(-(-n // (threads * per)),))
    x, out = b.buffer("x", dtype, (n,)), b.buffer("out", dtype, (n,))
    scale = b.scalar_param("scale", float32)
    gid = b.add(b.mul(b.cast(b.block_idx(), int64), _c(b, threads, int64)), b.cast(b.thread_idx(), int64))
    first = b.mul(gid, _c(b, per, int64))
    n64 = _c(b, n, int64)
    whole = b.binary(BinaryOp.LE, b.add(first, _c(b, per, int64)), n64)

    def vector_path():
        v = b.load_global(x, first, length=per)
        wide = b.mul(b.cast(v, float32), b.pack([scale] * per))
        b.store_global(out, first, b.cast(wide, dtype))

    def tail(j: Reg):
        i = b.add(first, b.cast(j, int64))
        inside = b.lt(i, n64)
        v = b.cast(b.load_global(x, i, mask=inside, other=0.0), float32)
        b.store_global(out, i, b.cast(b.mul(v, scale), dtype), mask=inside)

    def scalar_path():
        b.for_(0, per, 1, [], tail)

    b.if_(whole, vector_path, scalar_path)
    return b.build()


def block_sum(rows: int = 3, n: int = 300, warps: int = 4, *, barrier: bool = True, slots: int | None = None,
              divergent_barrier: bool = False) -> SimtKernel:
    """``out[r] = sum(x[r, :])``, one block per row: strided per-thread partials, warp butterflies,
    one partial per warp in shared memory, a barrier, then warp 0 reduces the partials."""
    threads = warps * 32
    slots = warps if slots is None else slots
    b = SimtBuilder("block_sum", warps=warps, grid=(rows,))
    x, out = b.buffer("x", float32, (rows, n)), b.buffer("out", float32, (rows,))
    partials = b.shared("partials", float32, (max(warps, slots),))
    row, tid, lane, warp = b.block_idx(), b.thread_idx(), b.lane_id(), b.warp_id()
    base = b.mul(row, _c(b, n))
    (acc,) = b.for_(tid, n, threads, [_c(b, 0.0, float32)],
                    lambda k, run: [b.add(run, b.load_global(x, b.add(base, k)))], iv_type=tid.type)
    total = b.butterfly(acc, b.add)
    lane0 = b.eq(lane, _c(b, 0))
    b.store_shared(partials, warp, total, mask=lane0)
    if divergent_barrier:
        b.if_(b.lt(tid, _c(b, 32)), lambda: b.barrier())
    elif barrier:
        b.barrier()

    def warp0():
        mine = b.load_shared(partials, lane, mask=b.lt(lane, _c(b, slots)), other=0.0)
        b.store_global(out, row, b.butterfly(mine, b.add), mask=lane0)

    b.if_(b.eq(warp, _c(b, 0)), warp0)
    return b.build()


def _merge(b: SimtBuilder, ma: Reg, la: Reg, mb: Reg, lb: Reg) -> tuple[Reg, Reg]:
    """Two online-softmax states (m, l) merged: ``l = l_a exp(m_a - m) + l_b exp(m_b - m)``, m = max."""
    m = b.binary(BinaryOp.MAX, ma, mb)
    safe = b.select(b.eq(m, _c(b, -math.inf, float32)), _c(b, 0.0, float32), m)   # exp(-inf - 0) = 0, not NaN
    l = b.add(b.mul(la, b.unary(UnaryOp.EXP, b.sub(ma, safe))), b.mul(lb, b.unary(UnaryOp.EXP, b.sub(mb, safe))))
    return m, l


def softmax_stats(rows: int = 3, n: int = 70, warps: int = 4) -> SimtKernel:
    """Per row ``m = max(x)``, ``l = sum(exp(x - m))`` and ``lse = m + log(l)``: online states per thread,
    merged across lanes by shuffles and across warps through shared memory (every thread merges all)."""
    threads = warps * 32
    b = SimtBuilder("softmax_stats", warps=warps, grid=(rows,))
    x = b.buffer("x", float32, (rows, n))
    m_out, l_out, lse_out = (b.buffer(name, float32, (rows,)) for name in ("m", "l", "lse"))
    m_s, l_s = b.shared("m_part", float32, (warps,)), b.shared("l_part", float32, (warps,))
    row, tid, lane, warp = b.block_idx(), b.thread_idx(), b.lane_id(), b.warp_id()
    base = b.mul(row, _c(b, n))

    def step(k: Reg, m: Reg, l: Reg):
        v = b.load_global(x, b.add(base, k))
        return _merge(b, m, l, v, _c(b, 1.0, float32))   # one element is the state (x, 1)

    m, l = b.for_(tid, n, threads, [_c(b, -math.inf, float32), _c(b, 0.0, float32)], step, iv_type=tid.type)
    for offset in (16, 8, 4, 2, 1):
        m, l = _merge(b, m, l, b.shuffle(ShuffleKind.BFLY, m, offset), b.shuffle(ShuffleKind.BFLY, l, offset))
    lane0 = b.eq(lane, _c(b, 0))
    b.store_shared(m_s, warp, m, mask=lane0)
    b.store_shared(l_s, warp, l, mask=lane0)
    b.barrier()
    m, l = b.for_(0, warps, 1, [_c(b, -math.inf, float32), _c(b, 0.0, float32)],
                  lambda w, mr, lr: _merge(b, mr, lr, b.load_shared(m_s, w), b.load_shared(l_s, w)))
    first = b.eq(tid, _c(b, 0))
    b.store_global(m_out, row, m, mask=first)
    b.store_global(l_out, row, l, mask=first)
    b.store_global(lse_out, row, b.add(m, b.unary(UnaryOp.LOG, l)), mask=first)
    return b.build()


def mma_gemm(shape: MmaShape = MmaShape.M16N8K16_F16, m: int = 32, n: int = 16, k: int | None = None) -> SimtKernel:
    """``c = a @ b`` (f32) on tensor cores: a and b staged in shared memory with 16-byte vector copies,
    one warp per 16 rows, ``n / 8`` accumulators carried through the loop over k."""
    dtype = shape.operand_dtype
    kk = shape.k
    k = 2 * kk if k is None else k
    per = 16 // dtype.itemsize             # elements per 16-byte vector
    pair = 4 // dtype.itemsize             # elements per 32-bit fragment register
    warps = m // 16
    b = SimtBuilder(f"mma_gemm_{shape.operand_dtype}", warps=warps, grid=(1,))
    a, bm, c = b.buffer("a", dtype, (m, k)), b.buffer("b", dtype, (k, n)), b.buffer("c", float32, (m, n))
    a_s, b_s = b.shared("a_tile", dtype, (m, k)), b.shared("b_tile", dtype, (k, n))
    tid, lane, warp = b.thread_idx(), b.lane_id(), b.warp_id()
    for src, dst, size in ((a, a_s, m * k), (bm, b_s, k * n)):
        def copy(v: Reg, src=src, dst=dst):
            at = b.mul(v, _c(b, per))
            b.store_shared(dst, at, b.load_global(src, at, length=per))
        b.for_(tid, size // per, warps * 32, [], copy, iv_type=tid.type)
    b.barrier()
    group, tig = b.int_op(IntOp.SHR, lane, _c(b, 2)), b.int_op(IntOp.AND, lane, _c(b, 3))
    row0 = b.add(b.mul(warp, _c(b, 16)), group)

    def k_step(k0: Reg, *accs: Reg):
        regs = []
        for r in range(4):
            row = b.add(row0, _c(b, 8 * (r & 1)))
            col = b.add(b.add(k0, _c(b, (r >> 1) * (kk // 2))), b.mul(tig, _c(b, pair)))
            regs.append(b.load_shared(a_s, b.add(b.mul(row, _c(b, k)), col), length=pair))
        a_frag = b.pack(regs)
        out = []
        for t, acc in enumerate(accs):
            elems = []
            for r in range(2):
                for j in range(pair):
                    krow = b.add(k0, b.add(_c(b, r * (kk // 2) + j), b.mul(tig, _c(b, pair))))
                    elems.append(b.load_shared(b_s, b.add(b.mul(krow, _c(b, n)), b.add(group, _c(b, 8 * t)))))
            out.append(b.mma(shape, a_frag, b.pack(elems), acc))
        return out

    zeros = [b.const(0.0, float32, 4) for _ in range(n // 8)]
    accs = b.for_(0, k, kk, zeros, k_step)
    for t, acc in enumerate(accs):
        for half in range(2):   # c0,c1 and c2,c3 are two adjacent columns of one row
            row = b.add(row0, _c(b, 8 * half))
            col = b.add(_c(b, 8 * t), b.mul(tig, _c(b, 2)))
            b.store_global(c, b.add(b.mul(row, _c(b, n)), col), b.extract(acc, 2 * half, 2))
    return b.build()


def shuffle_probe(kind: ShuffleKind, lane_value: int, width: int, *, by_register: bool = False) -> SimtKernel:
    """``out[tid] = shfl.<kind>(tid, lane_value, width)`` on one warp: what each lane reads."""
    b = SimtBuilder(f"shfl_{kind.value}", warps=1, grid=(1,))
    out = b.buffer("out", int32, (32,))
    tid = b.thread_idx()
    lane = b.const(lane_value, int32) if by_register else lane_value
    b.store_global(out, tid, b.shuffle(kind, tid, lane, width))
    return b.build()


def uninitialized_read(warps: int = 2) -> SimtKernel:
    """Every thread reads a shared slot only warp 0 wrote: warp 1's slots were never written."""
    b = SimtBuilder("uninitialized_read", warps=warps, grid=(1,))
    out = b.buffer("out", float32, (warps * 32,))
    smem = b.shared("slots", float32, (warps * 32,))
    tid = b.thread_idx()
    b.store_shared(smem, tid, b.cast(tid, float32), mask=b.eq(b.warp_id(), _c(b, 0)))
    b.barrier()
    b.store_global(out, tid, b.load_shared(smem, tid))
    return b.build()


__all__ = ["elementwise", "vector_scale", "block_sum", "softmax_stats", "mma_gemm", "shuffle_probe",
           "uninitialized_read"]


FLOAT_UNARY = (UnaryOp.NEG, UnaryOp.ABS, UnaryOp.EXP, UnaryOp.EXP2, UnaryOp.EXP2_FTZ, UnaryOp.LOG, UnaryOp.LOG2,
               UnaryOp.SQRT, UnaryOp.RSQRT)
FLOAT_BINARY = (BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.DIV, BinaryOp.POW, BinaryOp.MAX, BinaryOp.MIN,
                BinaryOp.LT, BinaryOp.LE, BinaryOp.GT, BinaryOp.GE, BinaryOp.EQ, BinaryOp.NE)
INT_BINARY = (BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.MAX, BinaryOp.MIN, BinaryOp.LT, BinaryOp.NE)
CASTS = (float16, bfloat16, int32, int64, float32)


def all_ops(*, portable: bool = False, lanes: int = 1) -> tuple[SimtKernel, list[str]]:
    """One warp applies every arithmetic op and cast to per-lane inputs ``f``, ``g > 0``, ``i``, ``j != 0`` and
    fp8 bytes ``q``; result ``r`` (as f32) goes to ``out[r * 32 + lane]``. Returns the kernel and the result
    names in order. `portable` leaves out shuffles and f16/bf16 (for running the LLVM IR on the host CPU).
    With `lanes` > 1 (even) every register is a `lanes`-vector (thread t reads and writes elements
    ``t * lanes ...``), so each op is emitted as a vector op, and packs and extracts mix vector parts."""
    b = SimtBuilder("all_ops" if lanes == 1 else f"all_ops_x{lanes}", warps=1, grid=(1,))
    size = 32 * lanes
    bufs = {name: b.buffer(name, dtype, (size,)) for name, dtype in
            (("f", float32), ("g", float32), ("i", int32), ("j", int32), ("q", MmaShape.M16N8K32_E4M3.operand_dtype))}
    names: list[str] = []
    results: list[Reg] = []
    tid = b.thread_idx()
    first = tid if lanes == 1 else b.mul(tid, _c(b, lanes))
    f, g, i, j, q = (b.load_global(bufs[name], first, length=lanes) for name in ("f", "g", "i", "j", "q"))

    def emit(name: str, value: Reg) -> None:
        names.append(name)
        results.append(value if value.dtype == float32 else b.cast(value, float32))

    for op in FLOAT_UNARY:
        emit(op.value, b.unary(op, g if op in (UnaryOp.LOG, UnaryOp.LOG2, UnaryOp.SQRT, UnaryOp.RSQRT) else f))
    for op in FLOAT_BINARY:
        emit(f"f{op.value}", b.binary(op, g if op is BinaryOp.POW else f, f if op is BinaryOp.POW else g))
    for op in INT_BINARY:
        emit(f"i{op.value}", b.binary(op, i, j))
    for op in IntOp:
        shift = op in (IntOp.SHL, IntOp.SHR)
        emit(op.value, b.int_op(op, i, b.int_op(IntOp.AND, j, b.const(7, int32, lanes)) if shift else j))
    emit("ineg", b.unary(UnaryOp.NEG, i))
    emit("iabs", b.unary(UnaryOp.ABS, i))
    emit("not", b.unary(UnaryOp.NOT, b.lt(f, g)))
    for dtype in CASTS:
        if not (portable and dtype in (float16, bfloat16)):
            emit(f"cast_{dtype}", b.cast(b.cast(f, dtype), float32))
    emit("cast_bool", b.cast(f, b.lt(f, f).dtype))
    emit("i2f", b.cast(i, float32))
    emit("e4m3", b.cast(q, float32))
    emit("select", b.select(b.lt(f, g), f, g))
    if lanes == 1:
        vec = b.pack([f, g, b.cast(i, float32), f])
        emit("extract", b.add(b.extract(vec, 1), b.extract(b.extract(vec, 2, 2), 0)))
    else:   # [f, g] halves; scalars then a vector part at an offset; a vector part first, then scalars
        half = lanes // 2
        emit("halves", b.extract(b.pack([f, g]), lanes, lanes))
        emit("mixed", b.pack([b.extract(g, k) for k in range(half)] + [b.extract(f, half, lanes - half)]))
        emit("part_first", b.pack([b.extract(f, 0, half)] + [b.extract(g, k) for k in range(half, lanes)]))
    if not portable and lanes == 1:
        emit("shfl_idx", b.shuffle(ShuffleKind.IDX, f, b.int_op(IntOp.AND, j, b.const(31, int32)), 8))
        emit("shfl_down", b.shuffle(ShuffleKind.DOWN, i, 3, 16))
    out = b.buffer("out", float32, (size * len(results),))
    for r, value in enumerate(results):
        b.store_global(out, b.add(first, b.const(size * r, int32)), value)
    return b.build(), names


def fp8_roundtrip(n: int = 64) -> SimtKernel:
    """``out = f32(e4m3(x))`` and ``bits = e4m3(x)`` (saturating), with 16-element fp8 vectors in registers."""
    b = SimtBuilder("fp8_roundtrip", warps=n // 32, grid=(1,))
    x, out = b.buffer("x", float32, (n,)), b.buffer("out", float32, (n,))
    q = b.buffer("q", MmaShape.M16N8K32_E4M3.operand_dtype, (n,))
    tid = b.thread_idx()
    v = b.cast(b.load_global(x, tid), q.dtype)
    b.store_global(q, tid, v)
    b.store_global(out, tid, b.cast(v, float32))
    return b.build()


def branchy(warps: int = 1) -> SimtKernel:
    """Divergent structured control flow with carried values: thread t sums ``k + 1`` for ``k < t % 5``, then
    picks by ``t % 3`` through nested ifs that yield (one branch loops again)."""
    b = SimtBuilder("branchy", warps=warps, grid=(2,))
    out = b.buffer("out", int32, (2 * warps * 32,))
    tid = b.thread_idx()
    gid = b.add(b.mul(b.block_idx(), b.const(warps * 32, int32)), tid)
    stop = b.int_op(IntOp.REM, gid, b.const(5, int32))
    (total,) = b.for_(0, stop, 1, [b.const(0, int32)], lambda k, acc: [b.add(acc, b.add(k, b.const(1, int32)))],
                      names=["total"])
    third = b.int_op(IntOp.REM, gid, b.const(3, int32))

    def not_first():
        def second():
            (doubled,) = b.for_(0, 2, 1, [total], lambda k, acc: [b.add(acc, acc)], names=["doubled"])
            return [doubled]
        return b.if_(b.eq(third, b.const(1, int32)), second, lambda: [b.unary(UnaryOp.NEG, total)])

    (picked,) = b.if_(b.eq(third, b.const(0, int32)), lambda: [gid], not_first)
    b.store_global(out, gid, picked)
    return b.build()


def branchy_reference(warps: int = 1) -> list[int]:
    out = []
    for g in range(2 * warps * 32):
        total = sum(range(1, g % 5 + 1))
        out.append(g if g % 3 == 0 else 4 * total if g % 3 == 1 else -total)
    return out


def ldmatrix_probe(count: int, trans: bool, dtype: DType = float16, rows: int = 64) -> SimtKernel:
    """One warp: ``smem = x`` (a ``rows x 8`` tile), lane ``t`` gives row index ``starts[t]``, then
    ``ldmatrix.x<count>[.trans]``; ``out[t, :]`` is what lane ``t`` received."""
    b = SimtBuilder(f"ldmatrix_x{count}{'_t' if trans else ''}", warps=1, grid=(1,))
    n = rows * 8
    x, starts = b.buffer("x", dtype, (n,)), b.buffer("starts", int32, (32,))
    out = b.buffer("out", dtype, (32, 2 * count))
    smem = b.shared("tile", dtype, (n,))
    tid = b.thread_idx()
    for i in range(0, n, 32):                  # each lane copies every 32nd element
        at = b.add(tid, _c(b, i))
        b.store_shared(smem, at, b.load_global(x, at))
    b.barrier()
    got = b.ldmatrix(smem, b.load_global(starts, tid), count, trans=trans)
    b.store_global(out, b.mul(tid, _c(b, 2 * count)), got)
    return b.build()
