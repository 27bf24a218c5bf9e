"""bf16 dots on Intel AMX tiles, where the host has AMX-BF16 and the values make it exact.

A host with AMX (Sapphire Rapids and later) multiplies a 16 x 32 bf16 tile by a 32 x 16 one into a
16 x 16 f32 tile in one instruction (``tdpbf16ps``): 8 192 multiply-adds, where an AVX-512 FMA does 16.
`amx_dot_operands` (a Tile IR pass, `codegen.narrow_operands` with AMX's shapes) gives a dot of bf16 data
its bf16 operands, and keeps an f32 operand multiplied by bf16 data (``P`` in a bf16 attention's
``P @ V``) in f32: `emit_amx_dot` splits it as it packs it into three bf16 parts that sum to it exactly
(`_split`), each multiplied by the same ``B`` tiles. `emit_amx_dot` computes each such dot on the tiles.

Exactness. Each product of two bf16 values is exact in f32, and ``tdpbf16ps`` adds them to the f32
accumulator one at a time, rounding to nearest: the f32 FMA chain of the micro-kernel (`gemm.py`), in
another order (which the tolerance rule allows for any dot). But the instruction treats subnormal inputs
as 0 and flushes subnormal results to 0 (DAZ, FTZ), which numpy does not. So each dot first checks, at run
time, what its operands hold (`_Range`, computed where ``a`` is made, while an f32 one is split, and
while ``b`` is packed): every element finite, no subnormal one, and the smallest non-zero magnitudes ``2^ea`` of ``a``
(of its parts: 2^-23 of its smallest value) and ``2^eb`` of ``b`` with ``ea + eb >= -102``, and no
subnormal in the accumulator it starts from. Then every non-zero product is at
least ``2^-102``, and a partial sum flushed to 0 loses under ``2^-126 = 2^-24 * 2^-102``: less than one f32
rounding of any product it holds. Where the check fails (data of extreme range, infinities, NaN), the dot
runs on the micro-kernel, on the same operands with bf16 ones widened to f32: the exact FMA path. An
attention whose probabilities reach down to about ``2^-70`` (with unit-normal ``v``) keeps its dots on
the tiles.

The tiles. Every tile is configured as 16 rows of 64 bytes (one configuration, `_config`): ``C`` tiles
``tmm0..3`` (16 x 16 f32), ``A`` tiles ``tmm4, 5`` (16 rows x 32 bf16 of ``k``, read in place with the
operand's row stride) and ``B`` tiles ``tmm6, 7`` (16 pairs of ``k`` rows x 16 columns: the *VNNI* layout,
``b[2r, j]`` beside ``b[2r + 1, j]``, which each dot packs from ``b``, or from ``b``'s source where ``b``
is a transpose: `_pack_vnni_transposed`). An output block of up to 2 x 2 tiles keeps its four accumulators
in the tile registers across the whole ``k`` loop. Linux is asked for the tile state once per process
(`codegen.native.amx_permitted`); without it, or on another host, nothing here runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import llvmlite.ir as ir

from ...ir.tile import nodes as t
from ...ir.types import DType, bfloat16, float32, int32
from ..llvm_utils import I8, I16, I32, I64, call_intrinsic, entry_alloca
from ..narrow_operands import SPLIT_PARTS, narrow_operands
from ..native import host_target
from .emitter import Slot
from .transpose import emit_permute, transpose_blocks

if TYPE_CHECKING:
    from .emitter import KernelEmitter
    from .epilogue import Epilogue

TILE_ROWS = 16
"""Rows of every tile (the most a tile holds)."""

TILE_K = 32
"""bf16 elements of ``k`` in one 64-byte row of an ``A`` tile (and pairs of them in a ``B`` tile's 16 rows)."""

MIN_EXPONENT_SUM = 152
"""``ea + eb`` (biased exponents, bias 127) at least this: non-zero products at least ``2^(152 - 254) =
2^-102`` (see the module docstring)."""


def amx_usable() -> bool:
    """Whether this process runs AMX-BF16 code (`codegen.native.amx_permitted`, part of the cache key)."""
    return host_target().amx


def fits(op: t.Dot) -> bool:
    """Whether `op` runs on the tiles: an f32 result, a bf16 ``b`` and a bf16 or f32 ``a`` (split into bf16
    parts as it is packed), ``m`` and ``n`` whole tiles and ``k`` whole ``A`` tile rows."""
    m, n = op.out.shape
    k = op.a.shape[1]
    return (amx_usable() and op.out.dtype == float32 and op.a.dtype in (bfloat16, float32)
            and op.b.dtype == bfloat16 and m % TILE_ROWS == 0 and n % TILE_ROWS == 0 and k % TILE_K == 0 and k > 0)


def amx_dot_operands(k: t.TileKernel) -> t.TileKernel:
    """`k` (verified) with bf16 operands for the dots that `fits` on AMX tiles (`codegen.narrow_operands`; an
    f32 ``a`` beside an exact bf16 ``b`` stays f32, split when packed); verified. Without AMX, `k` itself."""
    if not amx_usable():
        return k
    return narrow_operands(k, fits, pass_name="amx_dot_operands", mixed=True)


@dataclass(frozen=True)
class _Range:
    """What the run-time check reads of one operand (bf16, or an f32 one that is split): the smallest biased
    exponent of its non-zero elements (255 where it has none; 0 where one is subnormal) and the largest (255:
    an inf or NaN)."""

    low: ir.Value
    high: ir.Value


class _RangeScan:
    """Accumulates a `_Range` over vectors of float bit patterns (bf16 as i16, or f32 as i32): the smallest
    non-zero magnitude's bits less one (a zero's, less one, wraps to the largest, so zeros never count) and the
    largest magnitude's bits, lane by lane, reduced once at the end; their exponents are the bits above the
    fraction (7 bits of bf16, 23 of f32)."""

    def __init__(self, em: KernelEmitter, lanes: int, dtype: DType = bfloat16) -> None:
        self.b, self.lanes = em.b, lanes
        width = 8 * dtype.itemsize
        self.fraction = {16: 7, 32: 23}[width]
        self.word = ir.IntType(width)
        self.vec = ir.VectorType(self.word, lanes)
        self.suffix = f"v{lanes}i{width}"
        self.magnitude = (1 << (width - 1)) - 1
        self.low = entry_alloca(self.b, self.vec, name="amx.low")
        self.high = entry_alloca(self.b, self.vec, name="amx.high")
        self.b.store(self._splat(-1), self.low)
        self.b.store(self._splat(0), self.high)

    def _splat(self, v: int) -> ir.Constant:
        return ir.Constant(self.vec, [v] * self.lanes)

    def add(self, bits: ir.Value) -> None:
        b, vec = self.b, self.vec
        magnitude = b.and_(bits, self._splat(self.magnitude))
        b.store(call_intrinsic(b, f"llvm.umin.{self.suffix}", vec, [b.load(self.low, typ=vec),
                                                                    b.sub(magnitude, self._splat(1))]), self.low)
        b.store(call_intrinsic(b, f"llvm.umax.{self.suffix}", vec, [b.load(self.high, typ=vec), magnitude]),
                self.high)

    def finish(self) -> _Range:
        b, vec = self.b, self.vec

        def reduced(kind: str, acc: ir.Value) -> ir.Value:
            value = call_intrinsic(b, f"llvm.vector.reduce.{kind}.{self.suffix}", self.word, [b.load(acc, typ=vec)])
            return value if self.word == I32 else b.zext(value, I32)

        smallest, largest = reduced("umin", self.low), reduced("umax", self.high)
        none = b.icmp_unsigned("==", smallest, ir.Constant(I32, (1 << self.word.width) - 1))
        fraction = ir.Constant(I32, self.fraction)
        low = b.select(none, ir.Constant(I32, 255), b.lshr(b.add(smallest, ir.Constant(I32, 1)), fraction))
        return _Range(low, b.lshr(largest, fraction))


def exponent_range(em: KernelEmitter, slot: Slot) -> _Range:
    """`slot`'s `_Range` (a 2-D bf16 tile, rows contiguous, a whole number of 16-element vectors a row),
    scanned 32 or 16 elements at a time (`_RangeScan`)."""
    return _scan(em, slot, None)


def scan_a(em: KernelEmitter, slot: Slot, name: str) -> tuple[_Range, ir.Value | None]:
    """`slot`'s `_Range` and, where it is a whole number of ``A`` tiles, a copy of it made by the same loads,
    tile after tile (`_ATiles.packed`): ``A`` tiles read in place from rows thousands of bytes apart (a GEMM's
    ``x``) put all 16 rows of a tile in one L1 set, and the tile loads missed; 1 KiB apiece, they stream."""
    rows, cols = slot.shape
    if rows % TILE_ROWS or cols % TILE_K:
        return _scan(em, slot, None), None
    buf = entry_alloca(em.b, I16, name=f"{name}.amx.a", count=rows * cols, align=64)
    return _scan(em, slot, buf), buf


def _scan(em: KernelEmitter, slot: Slot, packed: ir.Value | None) -> _Range:
    b = em.b
    rows, cols = slot.shape
    lanes = 32 if cols % 32 == 0 else TILE_ROWS
    scan = _RangeScan(em, lanes)
    with em.loop(rows, "amx.scan.r", unroll=False) as r, em.loop(cols // lanes, "amx.scan.c") as c:
        col = b.mul(c, ir.Constant(I64, lanes), flags=("nsw", "nuw"))
        bits = b.load(em.address(slot, (r, col)), typ=scan.vec, align=2)
        scan.add(bits)
        if packed is not None:
            b.store(bits, b.gep(packed, [_ATiles.offset(b, r, col, cols)], inbounds=True, source_etype=I16),
                    align=64)
    return scan.finish()


@dataclass(frozen=True)
class _ATiles:
    """Where the ``A`` tiles of one bf16 ``a`` (or one part of a split one) are read: `source` is the operand's
    `Slot` (in place, rows `stride` bytes apart), or a stack array ``[m, k]`` — row-major (`packed` False) or
    tile after tile (`packed`: the 16 x 32 tile ``(i, j)`` at ``(i · k/32 + j) · 512``, its rows 64 bytes
    apart)."""

    source: Slot | ir.Value
    stride: int
    packed: bool = False

    @staticmethod
    def offset(b: ir.IRBuilder, row: ir.Value, col: ir.Value, k: int) -> ir.Value:
        """Element offset of ``(row, col)`` in a tile-after-tile array of `k` columns (`col` a multiple of 32)."""
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        tile = b.add(b.mul(b.udiv(row, c(TILE_ROWS)), c(k // TILE_K), flags=("nsw", "nuw")),
                     b.udiv(col, c(TILE_K)), flags=("nsw", "nuw"))
        return b.add(b.mul(tile, c(TILE_ROWS * TILE_K), flags=("nsw", "nuw")),
                     b.mul(b.urem(row, c(TILE_ROWS)), c(TILE_K), flags=("nsw", "nuw")), flags=("nsw", "nuw"))

    def address(self, em: KernelEmitter, row: ir.Value, k0: ir.Value, k: int) -> ir.Value:
        b = em.b
        if not isinstance(self.source, ir.Value):
            return em.address(self.source, (row, k0))
        at = _ATiles.offset(b, row, k0, k) if self.packed else \
            b.add(b.mul(row, ir.Constant(I64, k), flags=("nsw", "nuw")), k0, flags=("nsw", "nuw"))
        return b.gep(self.source, [at], inbounds=True, source_etype=I16)


def _has_subnormal(em: KernelEmitter, slot: Slot) -> ir.Value:
    """Whether the f32 tile `slot` (row-major) holds a subnormal element (an accumulator AMX would flush)."""
    b = em.b
    lanes = TILE_ROWS
    vec = ir.VectorType(I32, lanes)
    flag = entry_alloca(b, vec, name="amx.subnormal")
    b.store(ir.Constant(vec, [0] * lanes), flag)
    rows, cols = slot.shape
    with em.loop(rows, "amx.acc.r", unroll=False) as r, em.loop(cols // lanes, "amx.acc.c") as c:
        col = b.mul(c, ir.Constant(I64, lanes), flags=("nsw", "nuw"))
        bits = b.load(em.address(slot, (r, col)), typ=vec, align=4)
        exponent_zero = b.icmp_unsigned("==", b.and_(bits, ir.Constant(vec, [0x7F800000] * lanes)),
                                        ir.Constant(vec, [0] * lanes))
        mantissa = b.icmp_unsigned("!=", b.and_(bits, ir.Constant(vec, [0x007FFFFF] * lanes)),
                                   ir.Constant(vec, [0] * lanes))
        hit = b.zext(b.and_(exponent_zero, mantissa), vec)
        b.store(b.or_(b.load(flag, typ=vec), hit), flag)
    any_hit = call_intrinsic(b, "llvm.vector.reduce.or.v16i32", I32, [b.load(flag, typ=vec)])
    return b.icmp_unsigned("!=", any_hit, ir.Constant(I32, 0))


def exact_on_tiles(em: KernelEmitter, a: _Range, b_range: _Range, acc: Slot | None, split: bool) -> ir.Value:
    """The run-time check of the module docstring: true where the tiles compute what the FMA path does. For
    a `split` f32 ``a`` (`a` its f32 exponents), its smallest non-zero part is at least ``2^-23`` of its
    smallest non-zero value: that value must be at least ``2^-103`` (normal parts) and count 23 lower."""
    b = em.b
    c = lambda v: ir.Constant(I32, v)  # noqa: E731
    a_low_min, shift = (24, 23) if split else (1, 0)
    ok = b.and_(b.icmp_unsigned(">=", a.low, c(a_low_min)), b.icmp_unsigned(">=", b_range.low, c(1)))
    ok = b.and_(ok, b.icmp_unsigned(">=", b.add(a.low, b_range.low), c(MIN_EXPONENT_SUM + shift)))
    ok = b.and_(ok, b.and_(b.icmp_unsigned("<", a.high, c(255)), b.icmp_unsigned("<", b_range.high, c(255))))
    if acc is not None:
        ok = b.and_(ok, b.not_(_has_subnormal(em, acc)))
    return ok


def _split(em: KernelEmitter, op: t.Dot, a_slot: Slot) -> tuple[list[ir.Value], _Range]:
    """The f32 ``a`` as `SPLIT_PARTS` bf16 stack arrays ``[m, k]`` that sum to it exactly (smallest part
    first), and its `_Range` of f32 exponents. Each part is the top 16 bits of what the parts before it left
    (truncation, so no part rounds up and the rest is an exact f32 subtraction): 24 significant bits in
    three pieces of 8. Exact for finite ``a`` whose parts are normal, which the check makes sure of
    (an inf or NaN fails it, and the FMA path reads ``a`` itself)."""
    b = em.b
    m, k = op.a.shape
    lanes = TILE_ROWS
    f32v, i32v = ir.VectorType(ir.FloatType(), lanes), ir.VectorType(I32, lanes)
    splat = lambda v: ir.Constant(i32v, [v] * lanes)  # noqa: E731
    # the high halves of two vectors of 16 words: 32 bf16 values (the little-endian upper i16 of each word)
    highs = ir.Constant(ir.VectorType(I16, 2 * lanes), [2 * i + 1 for i in range(2 * lanes)])
    parts = [entry_alloca(b, I16, name=f"{op.out.name}.part{i}", count=m * k, align=64) for i in range(SPLIT_PARTS)]
    scan = _RangeScan(em, lanes, float32)
    with em.loop(m, f"{op.out.name}.split.r", unroll=False) as r, \
            em.loop(k // (2 * lanes), f"{op.out.name}.split.c") as c:
        col = b.mul(c, ir.Constant(I64, 2 * lanes), flags=("nsw", "nuw"))
        rest = [b.load(em.address(a_slot, (r, col if h == 0 else b.add(col, ir.Constant(I64, lanes)))), typ=f32v,
                       align=4) for h in range(2)]
        for x in rest:
            scan.add(b.bitcast(x, i32v))
        at = b.add(b.mul(r, ir.Constant(I64, k), flags=("nsw", "nuw")), col, flags=("nsw", "nuw"))
        for i in range(SPLIT_PARTS):
            words = [b.bitcast(x, ir.VectorType(I16, 2 * lanes)) for x in rest]
            part = call_intrinsic(b, "llvm.x86.avx512.vpermi2var.hi.512", words[0].type,  # each word's top half
                                  [words[0], highs, words[1]])
            b.store(part, b.gep(parts[SPLIT_PARTS - 1 - i], [at], inbounds=True, source_etype=I16), align=2)
            if i + 1 < SPLIT_PARTS:
                rest = [b.fsub(x, b.bitcast(b.and_(b.bitcast(x, i32v), splat(-65536)), f32v)) for x in rest]
    return parts, scan.finish()


def _config(em: KernelEmitter) -> ir.Value:
    """The module's tile configuration (palette 1; every tile 16 rows of 64 bytes), a 64-byte constant."""
    module = em.b.module
    existing = module.globals.get("rf.amx.config")
    if existing is not None:
        return existing
    data = [0] * 64
    data[0] = 1                                   # palette 1
    for tile in range(8):
        data[16 + 2 * tile] = 64                  # bytes per row (little-endian u16)
        data[48 + tile] = TILE_ROWS               # rows
    arr = ir.ArrayType(I8, 64)
    g = ir.GlobalVariable(module, arr, name="rf.amx.config")
    g.global_constant = True
    g.linkage = "internal"
    g.align = 64
    g.initializer = ir.Constant(arr, data)
    return g


def _pack_vnni(em: KernelEmitter, op: t.Dot, b_slot: Slot) -> tuple[ir.Value, _Range]:
    """``b[k, n]`` copied into the VNNI layout ``[k / 2, n, 2]`` (a stack array): row ``r`` of a ``B`` tile
    holds, for each column, ``b[2r, j]`` and ``b[2r + 1, j]`` side by side; and ``b``'s `_Range`, taken
    from the same loads."""
    b = em.b
    k, n = op.b.shape
    lanes = 2 * TILE_ROWS if n % (2 * TILE_ROWS) == 0 else TILE_ROWS   # (whole 64-byte rows where they fit)
    half = ir.VectorType(I16, lanes)
    buf = entry_alloca(b, I16, name=f"{op.out.name}.vnni", count=k * n, align=64)
    scan = _RangeScan(em, lanes)
    interleave = ir.Constant(ir.VectorType(I32, 2 * lanes), [x for i in range(lanes) for x in (i, lanes + i)])
    with em.loop(k // 2, f"{op.out.name}.vnni.r", unroll=False) as r, em.loop(n // lanes, f"{op.out.name}.vnni.c") as c:
        col = b.mul(c, ir.Constant(I64, lanes), flags=("nsw", "nuw"))
        even = b.mul(r, ir.Constant(I64, 2), flags=("nsw", "nuw"))
        odd = b.add(even, ir.Constant(I64, 1), flags=("nsw", "nuw"))
        lo = b.load(em.address(b_slot, (even, col)), typ=half, align=2)
        hi = b.load(em.address(b_slot, (odd, col)), typ=half, align=2)
        scan.add(lo)
        scan.add(hi)
        pairs = b.shuffle_vector(lo, hi, interleave)
        at = b.add(b.mul(r, ir.Constant(I64, 2 * n), flags=("nsw", "nuw")),
                   b.mul(col, ir.Constant(I64, 2), flags=("nsw", "nuw")), flags=("nsw", "nuw"))
        b.store(pairs, b.gep(buf, [at], inbounds=True, source_etype=I16), align=4)
    return buf, scan.finish()


def _pack_vnni_transposed(em: KernelEmitter, op: t.Dot, source: Slot) -> tuple[ir.Value, _Range]:
    """The VNNI layout of ``b = source^T`` (`source` ``[n, k]``, rows contiguous): its pair ``(b[2r, j],
    b[2r + 1, j])`` is the 32-bit word ``r`` of `source`'s row ``j``, so the layout is the transpose of
    `source` read as ``[n, k / 2]`` words (`transpose.transpose_blocks`, 16 x 16 words at a time); and
    ``b``'s `_Range`, scanned from `source`."""
    k, n = op.b.shape
    buf = entry_alloca(em.b, I16, name=f"{op.out.name}.vnni", count=k * n, align=64)
    strides = None if source.strides is None else (source.strides[0] // 2, 1)
    words = Slot(source.ptr, (n, k // 2), int32, strides)
    transpose_blocks(em, words, Slot(buf, (k // 2, n), int32), TILE_ROWS, f"{op.out.name}.vnni", align=2)
    return buf, exponent_range(em, source)


def _row_stride_bytes(slot: Slot) -> int:
    return (slot.strides[0] if slot.strides is not None else slot.shape[1]) * slot.dtype.itemsize


def readable(em: KernelEmitter, op: t.Dot, out: Slot) -> bool:
    """Whether `emit_amx_dot` can read `op`'s operands and write `out` where they are: the dot `fits`, both
    operands have slots with contiguous rows (not panels), a bf16 ``a`` its `_Range` (``b``'s is taken as it
    is packed), and `out` is row-major."""
    a_slot, b_slot = em.slots.get(op.a.name), em.slots.get(op.b.name) or em.amx_sources.get(op.b.name)
    if not fits(op) or a_slot is None or b_slot is None:
        return False
    if op.a.dtype == bfloat16 and op.a.name not in em.amx_ranges:
        return False
    rows_contiguous = all(s.panel is None and (s.strides is None or s.strides[-1] == 1) for s in (a_slot, b_slot))
    return rows_contiguous and out.strides is None and out.panel is None


def emit_amx_dot(em: KernelEmitter, op: t.Dot, out: Slot, from_zero: bool, epilogue: Epilogue | None,
                 fallback: Callable[[], None]) -> None:
    """``out (+)= a @ b`` on AMX tiles where the run-time check holds, else by `fallback()` (the FMA path,
    which must emit the same dot); with an `epilogue`, its value stored as the micro-kernel stores it."""
    b = em.b
    a_slot = em.slots[op.a.name]
    split = op.a.dtype == float32
    if split:
        parts, a_range = _split(em, op, a_slot)
        a_rows = [_ATiles(p, op.a.shape[1] * 2) for p in parts]
    else:
        a_range, packed = em.amx_ranges[op.a.name]
        a_rows = [_ATiles(packed, 2 * TILE_K, packed=True) if packed is not None
                  else _ATiles(a_slot, _row_stride_bytes(a_slot))]
    source = em.amx_sources.get(op.b.name)
    vnni, b_range = (_pack_vnni(em, op, em.slots[op.b.name]) if source is None
                     else _pack_vnni_transposed(em, op, source))
    ok = exact_on_tiles(em, a_range, b_range, None if from_zero else out, split)
    with b.if_else(ok) as (tiles, fma):
        with tiles, em.level():
            _tiles(em, op, out, a_rows, vnni, from_zero, epilogue)
        with fma, em.level():
            transposed = em.amx_sources.get(op.b.name)
            if transposed is not None:   # (the FMA path reads ``b`` copied, in this branch only)
                emit_permute(em, em.plan.defs[op.b.name])
            fallback()
            if transposed is not None:
                del em.slots[op.b.name]


def _tiles(em: KernelEmitter, op: t.Dot, out: Slot, a_rows: list[_ATiles], vnni: ir.Value,
           from_zero: bool, epilogue: Epilogue | None) -> None:
    """The tile loops. `a_rows`: where the ``A`` tiles of each bf16 ``a`` are (one, or the parts of a split
    one, each multiplied by the same ``B`` tiles while they are loaded); `vnni`: ``b`` packed in pairs."""
    b = em.b
    m, n = op.out.shape
    k = op.a.shape[1]
    row_tiles = 2 if (m // TILE_ROWS) % 2 == 0 else 1
    col_tiles = 2 if (n // TILE_ROWS) % 2 == 0 else 1
    tile = lambda i: ir.Constant(I8, i)  # noqa: E731
    out_stride = ir.Constant(I64, n * 4)
    b_stride = ir.Constant(I64, n * 4)
    call_intrinsic(b, "llvm.x86.ldtilecfg", ir.VoidType(), [_config(em)])

    with em.loop(m // (TILE_ROWS * row_tiles), f"{op.out.name}.amx.i", unroll=False) as ib:
        i0 = b.mul(ib, ir.Constant(I64, TILE_ROWS * row_tiles), flags=("nsw", "nuw"))
        with em.loop(n // (TILE_ROWS * col_tiles), f"{op.out.name}.amx.j", unroll=False) as jb:
            j0 = b.mul(jb, ir.Constant(I64, TILE_ROWS * col_tiles), flags=("nsw", "nuw"))
            rows = [b.add(i0, ir.Constant(I64, TILE_ROWS * r), flags=("nsw", "nuw")) for r in range(row_tiles)]
            cols = [b.add(j0, ir.Constant(I64, TILE_ROWS * c), flags=("nsw", "nuw")) for c in range(col_tiles)]
            for r in range(row_tiles):
                for c in range(col_tiles):
                    if from_zero:
                        call_intrinsic(b, "llvm.x86.tilezero", ir.VoidType(), [tile(2 * r + c)])
                    else:
                        call_intrinsic(b, "llvm.x86.tileloadd64", ir.VoidType(),
                                       [tile(2 * r + c), em.address(out, (rows[r], cols[c])), out_stride])
            with em.loop(k // TILE_K, f"{op.out.name}.amx.k", unroll=False) as kb:
                k0 = b.mul(kb, ir.Constant(I64, TILE_K), flags=("nsw", "nuw"))
                pair_row = b.mul(kb, ir.Constant(I64, TILE_K // 2), flags=("nsw", "nuw"))
                for c in range(col_tiles):
                    at = b.add(b.mul(pair_row, ir.Constant(I64, 2 * n), flags=("nsw", "nuw")),
                               b.mul(cols[c], ir.Constant(I64, 2), flags=("nsw", "nuw")), flags=("nsw", "nuw"))
                    call_intrinsic(b, "llvm.x86.tileloadd64", ir.VoidType(),
                                   [tile(6 + c), b.gep(vnni, [at], inbounds=True, source_etype=I16), b_stride])
                for a in a_rows:
                    for r in range(row_tiles):
                        call_intrinsic(b, "llvm.x86.tileloadd64", ir.VoidType(),
                                       [tile(4 + r), a.address(em, rows[r], k0, k), ir.Constant(I64, a.stride)])
                    for r in range(row_tiles):
                        for c in range(col_tiles):
                            call_intrinsic(b, "llvm.x86.tdpbf16ps", ir.VoidType(),
                                           [tile(2 * r + c), tile(4 + r), tile(6 + c)])
            for r in range(row_tiles):
                for c in range(col_tiles):
                    call_intrinsic(b, "llvm.x86.tilestored64", ir.VoidType(),
                                   [tile(2 * r + c), em.address(out, (rows[r], cols[c])), out_stride])
            if epilogue is not None:
                _apply_epilogue(em, out, epilogue, i0, j0, TILE_ROWS * row_tiles, TILE_ROWS * col_tiles)
    call_intrinsic(b, "llvm.x86.tilerelease", ir.VoidType(), [])


def _apply_epilogue(em: KernelEmitter, out: Slot, epilogue: Epilogue, i0: ir.Value, j0: ir.Value,
                    height: int, width: int) -> None:
    """The epilogue's value of the block at ``(i0, j0)``, from the dot's result the tiles stored (in L1)."""
    b = em.b
    vec = ir.VectorType(ir.FloatType(), TILE_ROWS)
    with em.loop(height, "amx.epi.r") as r:
        row = b.add(i0, r, flags=("nsw", "nuw"))
        for v in range(width // TILE_ROWS):
            col = b.add(j0, ir.Constant(I64, v * TILE_ROWS), flags=("nsw", "nuw"))
            acc = b.load(em.address(out, (row, col)), typ=vec, align=4)
            b.store(epilogue.apply(em, row, col, acc), em.address(epilogue.slot, (row, col)), align=4)


__all__ = ["amx_usable", "fits", "amx_dot_operands", "exponent_range", "scan_a", "readable", "emit_amx_dot", "TILE_ROWS",
           "TILE_K"]
