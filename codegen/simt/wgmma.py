"""`Dot` on Hopper's warpgroup tensor cores (``wgmma.mma_async``, sm_90a): when and how.

When (`wgmma_plan`): the target is ``sm_90a``, A and B are f16, bf16 or e4m3 and the result f32, the
block's warps form whole warpgroups, and the output's rows give every warp its own 16-row slices (``m`` a
multiple of 16 per warp: `layouts.mma_warps` then puts every warp along the rows, ``wn = 1``). Then the
``mma.sync`` accumulator layout `layouts.mma_acc` *is* the wgmma accumulator: warpgroup ``g`` holds rows
``64 g + 16 warps · mi`` onwards of its ``mi``-th m64 slice, each warp 16 of them, in the order
``ir/simt/wgmma_fragments.accumulator`` gives, and register ``4 (mi · NT + ni) + c`` of the layout is value
``4 ni + c`` of that slice's instruction. So everything after the dot reads the result as it reads an
``mma.sync`` one; only the operands and the issue differ.

How (`lower_wgmma`): both operands are staged in shared memory as K-major tiles (rows of K: A's rows, B's
columns) under the widest swizzle a row allows (128 bytes: 64 f16 or 128 e4m3 per row; a 64- or 32-byte
swizzle for K = 32 or 16 f16), K cut into panels of one swizzled row each (`TileGeometry`). Each thread
stores the elements its registers hold where the swizzle puts them: the unswizzled byte offset is a sum of
disjoint bit fields of the thread index and the register number, and the swizzle is an XOR of address
bits, so a thread's part is swizzled once and each register's constant XORed in (a vector store where its
registers run along K within a 16-byte chunk). Then ``fence.proxy.async`` (the stores become visible to
the tensor cores' async proxy), a barrier, ``wgmma.fence``, and per m64 slice and N chunk (at most 256) a
chain of wgmmas over K, each reading both operands through descriptors; one commit and a wait for all.
A barrier in front of the stores keeps them off tiles another warpgroup's wgmma may still read. An operand
defined outside the dot's loop (``Q``) is staged once, in front of the loop (`_defined_outside`). Where the
operand is a plain load of a buffer's rows, the copy engine writes the same tile instead of the threads
(`tma.py`, the default on sm_90a): no registers, no stores, a wait on an mbarrier.

A comes from registers instead where it already lives in the accumulator layout of its own shape
(`_register_a`: ``P`` in ``P @ V``, rounded to f16/bf16 in registers, needs no shared-memory round trip).

e4m3 products are *promoted*: Hopper's FP8 tensor cores keep only about 14 significant bits of the sum they
accumulate into (DeepSeek-V3's report, section 3.3.2; measured here on an H200: an FP8 GEMM accumulating
all of K = 4096 in the wgmma's C was 1.46x outside the f32 accumulation bound). So an e4m3 chain starts from
zero (no C) for every `E4M3_PROMOTE_STEPS` K steps, and each chain's result is added to the accumulator in
f32 registers, as CUTLASS's and DeepGEMM's FP8 kernels do: the reduced precision then covers at most 128
products, whose sum is far smaller than the running total (`redfuser.testing.quantization` bounds it).

B goes to an MN-major (N-major) tile instead where its registers run along N (`_b_geometry`: ``V`` in
``P @ V``, ``w`` in ``x @ w``): the instruction's imm-trans-b, 16-byte vector stores where a K-major tile
took one 2-byte store an element (on an H200 the 4096^3 f16 GEMM on wgmma went from 1.64 to 0.58 ms,
benchmarks/device_notes.md runs 9-10).

An e4m3 B stored N-major (a GEMM's ``w[k, n]``) is read from a K-major copy the program makes once
(`redfuser/schedule/k_major.py`), whose tiles TMA copies.

Not yet: MN-major A, several groups in flight and warp specialization (HOPPER.md). A copied tile in a loop
has a ring of stages (`tma.ring_stages`): the tile allocation holds them one after another and the
descriptors start at the stage this iteration reads.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...ir.errors import InternalError
from ...ir.semantics import BinaryOp
from ...ir.simt.nodes import Reg, SharedAlloc, WgmmaShape
from ...ir.simt.types import IntOp
from ...ir.simt.wgmma_fragments import M as WGMMA_M
from ...ir.simt.wgmma_fragments import WARPGROUP_THREADS, Swizzle, swizzle
from ...ir.tile import nodes as t
from ...ir.types import bfloat16, float8_e4m3fn, float16, float32, int32
from .convert import writer_mask
from .layouts import Layout, blocked, contiguous_run, default_vec, log2, mapped, mma_acc, mma_warps
from .values import Regs, from_registers, map_chunks, pieces
from . import tma

WGMMA_TYPES = (float16, bfloat16, float8_e4m3fn)
MAX_N = 256
"""The widest ``wgmma`` N."""
E4M3_PROMOTE_STEPS = 4
"""K steps of an e4m3 wgmma chain (4 x 32 = 128 products) before its sum is added to the f32 accumulator."""


@dataclass(frozen=True, slots=True)
class TileGeometry:
    """An operand tile of `rows` rows (M or N) by `k` elements of `itemsize` bytes in shared memory.

    K-major: K cut into panels of one swizzled row (`row_bytes`: 32, 64 or 128), a panel's rows one after
    another. MN-major (`mn_major`, 16-bit B only: ``V`` in ``P @ V``, whose registers run along N): the rows
    cut into panels of one swizzled row, each K index one swizzle row of a panel, the panels one after
    another (the descriptor's leading byte offset is the panel size, ``k * row_bytes``)."""

    rows: int
    k: int
    itemsize: int
    mn_major: bool = False

    @property
    def row_bytes(self) -> int:
        return min(128, (self.rows if self.mn_major else self.k) * self.itemsize)

    @property
    def mode(self) -> Swizzle:
        return {128: Swizzle.B128, 64: Swizzle.B64, 32: Swizzle.B32}[self.row_bytes]

    @property
    def panel_elements(self) -> int:
        return self.row_bytes // self.itemsize

    @property
    def nbytes(self) -> int:
        return self.rows * self.k * self.itemsize

    def unswizzled(self, row: int, k: int) -> int:
        """The byte offset of (`row`, `k`) before the swizzle: panel, then swizzle row, then column; for
        coordinates that are powers of two (or sums of distinct ones) the three fields never overlap."""
        if self.mn_major:
            panel, col = divmod(row, self.panel_elements)
            return panel * self.k * self.row_bytes + k * self.row_bytes + col * self.itemsize
        panel, col = divmod(k, self.panel_elements)
        return panel * self.rows * self.row_bytes + row * self.row_bytes + col * self.itemsize

    @property
    def leading(self) -> int:
        """The descriptor's leading byte offset: unused by swizzled K-major tiles (16 by convention); from one
        panel of rows to the next in an MN-major one."""
        return self.k * self.row_bytes if self.mn_major else 16

    def offset(self, row: int, k: int) -> int:
        """The byte offset of element (`row`, `k`) in the swizzled tile."""
        return swizzle(self.unswizzled(row, k), self.mode)


@dataclass(frozen=True, slots=True)
class WgmmaPlan:
    """How one `Dot` runs on wgmma: the instruction, its N chunk, the operand tiles' geometry."""

    shape: WgmmaShape
    m_slices: int            # m64 slices per warpgroup
    a: TileGeometry
    b: TileGeometry


def has_wgmma(sm: str) -> bool:
    """Whether code for target `sm` may issue ``wgmma`` (only the architecture-specific ``sm_90a``)."""
    return sm == "sm_90a"


def wgmma_plan(op: t.Dot, sm: str, warps: int) -> WgmmaPlan | None:
    """The wgmma plan for `op`, or None where ``mma.sync`` (or FMA) runs it (see the module docstring)."""
    dtype = op.a.dtype
    if not has_wgmma(sm) or dtype not in WGMMA_TYPES or op.b.dtype != dtype or op.out.dtype != float32:
        return None
    (m, k), n = op.a.shape, op.b.shape[1]
    if warps % 4 or m % (16 * warps) or n % 8 or mma_warps(m, n, warps) != (warps, 1):
        return None
    shape = WgmmaShape(min(n, MAX_N), dtype)
    if k % shape.k or n % shape.n:
        return None
    return WgmmaPlan(shape, m // (16 * warps), TileGeometry(m, k, dtype.itemsize), TileGeometry(n, k, dtype.itemsize))


def _store_tile(lw, regs: Regs, alloc: SharedAlloc, geometry: TileGeometry, k_dim: int) -> None:
    """Every element of `regs` (one writer each) into the swizzled tile `alloc` laid out as `geometry` says;
    `k_dim` is the dim of the tile value that runs along K (1 for A's ``[m, k]``, 0 for B's ``[k, n]``). A
    thread's registers go out as vectors where they run along a swizzle row (K in a K-major tile, the rows in
    an MN-major one)."""
    b, layout = lw.b, regs.layout
    row_dim = 1 - k_dim
    item = geometry.itemsize

    def unswizzled(coord) -> int:
        return geometry.unswizzled(coord[row_dim], coord[k_dim])

    mask = writer_mask(lw, layout)
    along = row_dim if geometry.mn_major else k_dim          # the dim running along a swizzle row
    run = max(1, min(contiguous_run(layout, along), 16 // item, regs.chunk_len))
    thread = b.thread_field(lw.tid, [unswizzled(x) for x in layout.thread_bases])
    # swizzle(t + c) = swizzle(t) ^ swizzle(c): the fields are disjoint bits and the swizzle is linear over them
    chunk_bits = geometry.mode.row_bytes // 16 - 1
    high = b.int_arith(IntOp.AND, b.int_arith(IntOp.SHR, thread, b.const_of(7, int32)), b.const_of(chunk_bits, int32))
    swizzled = b.int_arith(IntOp.XOR, thread, b.int_arith(IntOp.SHL, high, b.const_of(4, int32)))
    base = b.int_arith(IntOp.SHR, swizzled, b.const_of(log2(item), int32))        # bytes -> elements
    for r in range(0, layout.num_regs, run):
        constant = swizzle(unswizzled(layout.reg_coord(r)), geometry.mode) // item
        index = b.int_arith(IntOp.XOR, base, b.const_of(constant, int32)) if constant else base
        b.store_shared(alloc, index, pieces(b, regs, r, run), mask=mask)


def _operand(lw, v: t.Value, k_dim: int) -> Regs:
    """`v` in registers to stage: its planned layout when it has one, a transposed view in its source's
    layout (no data moves), else a blocked layout running along K (16-byte vector stores)."""
    if lw.plan.layouts.get(v.name) is not None:
        return lw.get(v)
    op = lw.plan.defs.get(v.name)
    if isinstance(op, t.Permute) and lw.plan.layouts.get(op.x.name) is not None:   # B = w.T: w's registers
        home, perm = lw.planned(op.x), op.perm
        return lw.get(v, mapped(home, v.shape, lambda basis: tuple(basis[p] for p in perm)))
    order = (k_dim, 1 - k_dim)
    return lw.get(v, blocked(v.shape, lw.plan.warps, order, default_vec(v.shape, lw.plan.warps, v.dtype.itemsize)))


def _copied(lw, v: t.Value) -> tma.TmaOperand | None:
    """How the copy engine stages `v` (`tma.py`), else None: not planned for it, or its staging point's phase
    needs a run-time trip count."""
    operand = lw.plan.tma.get(v.name)
    if operand is None:
        return None
    depth = lw.plan.depth.get(v.name, 0) if _defined_outside(lw, v) else lw.b.depth
    return operand if tma.phase_known(lw, depth) else None


def _defined_outside(lw, v: t.Value) -> bool:
    """Whether `v` is defined outside the loop the dot is in (``Q`` in attention's ``Q @ Kᵀ``): its tile is then
    staged once, in front of that loop (the tile is the dot's own, so nothing overwrites it), rather than on
    every iteration, and its registers need not live through the loop. The ``fence.proxy.async`` and the
    barrier in front of every issue order those stores before the wgmmas as they do the loop's own."""
    return lw.plan.depth.get(v.name, 0) < lw.b.depth


def mn_major_geometry(plan: WgmmaPlan, n: int, k: int) -> TileGeometry | None:
    """An MN-major tile for B ``[k, n]``, or None where the instruction cannot read one: it needs a 16-bit
    type, whole swizzle rows of N and a power-of-two K (`TileGeometry`)."""
    mn = TileGeometry(n, k, plan.b.itemsize, mn_major=True)
    if plan.b.itemsize != 2 or n * plan.b.itemsize < 32 or n % mn.panel_elements or k & (k - 1):
        return None
    return mn


def _b_geometry(plan: WgmmaPlan, regs: Regs) -> TileGeometry:
    """B's tile: MN-major (`mn_major_geometry`) where B's registers run along N further than along K (a
    row-major ``[K, N]`` value, ``V``), so that its stores are 16-byte vectors instead of one element each;
    else `plan.b` (K-major)."""
    k, n = regs.layout.shape
    mn = mn_major_geometry(plan, n, k)
    if mn is None or contiguous_run(regs.layout, 1) <= contiguous_run(regs.layout, 0):
        return plan.b
    return mn


def _register_a(lw, v: t.Value, shape: WgmmaShape) -> Regs | None:
    """`v`'s registers as wgmma A fragments, or None (A goes through shared memory). A 16-bit value planned in
    the accumulator layout of its own shape (``P = f16(exp(S - m))`` in ``P @ V``) already is: the m64k16 A
    fragment is the accumulator map with N = 16 (`wgmma_fragments.register_a`), so the fragment of m64 slice
    ``mi`` and K step ``s`` is registers ``4 (mi · K/8 + 2 s)`` to ``+ 8`` of `layouts.mma_acc`."""
    if v.dtype.itemsize != 2 or shape.a_type.length != 8:
        return None
    m, k = v.shape
    if lw.plan.is_lazy(v) or lw.plan.layouts.get(v.name) != mma_acc(m, k, lw.plan.warps):
        return None
    return lw.get(v)


def _accumulator_part(b, c: Regs, first: int, length: int) -> Reg:
    """Registers ``first .. first + length - 1`` of `c` as one new register (a wgmma's C). Always a new one,
    a `Pack` even of a single part: the wgmma's D takes C's registers, and a part may be a register others
    still read (a constant zero accumulator is one register for the whole kernel; extracts are shared)."""
    step = min(length, c.chunk_len)
    return b.pack([pieces(b, c, first + i, step) for i in range(0, length, step)])


def lower_wgmma(lw, op: t.Dot, plan: WgmmaPlan, layout: Layout, acc: Regs | None) -> Regs:
    """``acc + a @ b`` (`acc` None: ``a @ b``) on wgmma, in the accumulator `layout` (`layouts.mma_acc`)."""
    b = lw.b
    (m, k), n = op.a.shape, op.b.shape[1]
    warps = lw.plan.warps
    if layout != mma_acc(m, n, warps):
        raise InternalError(f"wgmma result {op.out} asked for in {layout.kind}, not the mma accumulator layout",
                            pass_name="lower_to_simt")
    shape, nt = plan.shape, n // 8
    a_fragments = _register_a(lw, op.a, shape)
    copied_a = _copied(lw, op.a) if a_fragments is None else None
    copied_b = _copied(lw, op.b)
    b_regs = _operand(lw, op.b, 0) if copied_b is None else None
    b_geometry = copied_b.geometry if copied_b is not None else _b_geometry(plan, b_regs)
    a_regs = _operand(lw, op.a, 1) if a_fragments is None and copied_a is None else None
    # the copied tiles staged here, after one barrier, share a ring; one staged in front of the loop has its own
    copied_here = [c for c, v in ((copied_a, op.a), (copied_b, op.b)) if c is not None and not _defined_outside(lw, v)]
    stages_here = tma.ring_stages(lw, copied_here, b.depth) if copied_here else 1

    def stages(copied: tma.TmaOperand | None, v: t.Value) -> int:
        if copied is None:
            return 1
        return tma.ring_stages(lw, [copied], lw.plan.depth.get(v.name, 0)) if _defined_outside(lw, v) else stages_here

    b_stages, a_stages = stages(copied_b, op.b), stages(copied_a, op.a)
    b_tile = b.shared(f"{op.out.name}_b_tile", op.b.dtype, (b_stages * n * k,), align=1024)
    a_tile = b.shared(f"{op.out.name}_a_tile", op.a.dtype, (a_stages * m * k,), align=1024) \
        if a_fragments is None else None
    operands = ((a_regs, copied_a, a_tile, plan.a, 1, op.a, a_stages),
                (b_regs, copied_b, b_tile, b_geometry, 0, op.b, b_stages))
    here, parts_here = [], []                        # the tiles staged here, after one barrier
    offsets: dict[str, Reg | int] = {}              # by tile: the byte offset of the stage this run reads
    for regs, copied, tile, geometry, k_dim, value, tile_stages in operands:
        if regs is None and copied is None:
            continue
        if _defined_outside(lw, value):              # staged once, in front of the loop
            depth = lw.plan.depth.get(value.name, 0)
            with b.at(depth):
                b.barrier()
                if copied is not None:
                    ring = tma.plan_ring(lw, [copied], depth, tile_stages)
                    tma.stage(lw, [(copied, tile)], value.name, ring)
                    offsets[tile.name] = _stage_offset(b, ring, copied)
                else:
                    _store_tile(lw, regs, tile, geometry, k_dim)
        elif copied is not None:
            parts_here.append((copied, tile))
        else:
            here.append((regs, tile, geometry, k_dim))
    b.barrier()
    if parts_here:
        ring = tma.plan_ring(lw, [copied for copied, _ in parts_here], b.depth, stages_here)
        tma.stage(lw, parts_here, op.out.name, ring)
        offsets.update((tile.name, _stage_offset(b, ring, copied)) for copied, tile in parts_here)
    for regs, tile, geometry, k_dim in here:
        _store_tile(lw, regs, tile, geometry, k_dim)
    slices = [(mi, n0) for mi in range(plan.m_slices) for n0 in range(0, n, shape.n)]
    steps = list(range(0, k, shape.k))
    promote = op.a.dtype == float8_e4m3fn      # chains of at most E4M3_PROMOTE_STEPS, summed in f32 (docstring)
    chains = [steps[i:i + E4M3_PROMOTE_STEPS] for i in range(0, len(steps), E4M3_PROMOTE_STEPS)] if promote \
        else [steps]
    # every C and A register is written (packed) before the fence that orders those writes before the wgmmas
    inits = {s: None if acc is None or promote else
             _accumulator_part(b, acc, 4 * (s[0] * nt + s[1] // 8), shape.n // 2) for s in slices}
    a_parts = None if a_fragments is None else {
        (mi, k0): pieces(b, a_fragments, 4 * (mi * (k // 8) + k0 // 8), shape.a_type.length)
        for mi in range(plan.m_slices) for k0 in range(0, k, shape.k)}
    if any(regs is not None for regs, *_ in operands):
        # the threads' stores become visible to the tensor cores' async proxy; tiles the copy engine wrote
        # are visible once the mbarrier wait returns
        b.fence_proxy_async()
        b.barrier()
    b.wgmma_fence()
    b_base = _tile_address(b, b_tile, offsets.get(b_tile.name, 0))
    a_base = None
    if a_tile is not None:
        group = b.int_arith(IntOp.SHR, lw.tid, b.const_of(log2(WARPGROUP_THREADS), int32))
        a_base = b.arith(BinaryOp.ADD, _tile_address(b, a_tile, offsets.get(a_tile.name, 0)),
                         b.int_arith(IntOp.SHL, group, b.const_of(log2(WGMMA_M * plan.a.row_bytes), int32)))
    outs: list[list[Reg]] = [[] for _ in chains]      # per chain, a D per slice
    for mi, n0 in slices:
        for chain, chain_outs in zip(chains, outs):
            d = inits[(mi, n0)]
            for k0 in chain:
                db = _descriptor(b, b_base, b_geometry, n0, k0)
                a_operand = {"a": a_parts[(mi, k0)]} if a_parts is not None else \
                    {"a_desc": _descriptor(b, a_base, plan.a, 16 * warps * mi, k0)}
                d = b.wgmma(shape, **a_operand, b_desc=db, c=d, b_mn_major=b_geometry.mn_major)
            chain_outs.append(d)
    b.wgmma_commit()
    b.wgmma_wait(0)
    step = min(shape.n // 2, layout.num_regs, 16)
    sums = [from_registers(b, layout, float32, [b.extract(d, i, step) for d in ds
                                                for i in range(0, shape.n // 2, step)]) for ds in outs]
    # promoted chains are added to the accumulator in f32; otherwise the one chain already holds it
    total, parts = (acc, sums) if promote and acc is not None else (sums[0], sums[1:])
    for part in parts:
        total = Regs(layout, float32, map_chunks((total, part), lambda x, y: b.arith(BinaryOp.ADD, x, y)))
    return total


def _stage_offset(b, ring: tma.Ring, copied: tma.TmaOperand) -> Reg | int:
    """The byte offset, in its ring's tile allocation, of the stage this run reads."""
    if not isinstance(ring.stage, Reg):
        return ring.stage * copied.nbytes
    return b.arith(BinaryOp.MUL, ring.stage, b.const_of(copied.nbytes, int32))


def _tile_address(b, tile: SharedAlloc, offset: Reg | int) -> Reg:
    """The shared address of `tile`, `offset` bytes on (a ring's stage)."""
    address = b.shared_address(tile)
    return b.arith(BinaryOp.ADD, address, offset) if isinstance(offset, Reg) else address


def _descriptor(b, base: Reg, geometry: TileGeometry, row: int, k: int) -> Reg:
    """The descriptor of the instruction reading rows `row`.. (a multiple of 8) at K step `k`: its start is the
    *unswizzled* offset, the hardware applying the swizzle to the address as the tile was written."""
    address = b.arith(BinaryOp.ADD, base, b.const_of(geometry.unswizzled(row, k), int32))
    return b.wgmma_descriptor(address, leading=geometry.leading, stride=8 * geometry.row_bytes,
                              swizzle=geometry.mode.value)
