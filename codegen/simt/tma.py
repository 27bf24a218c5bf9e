"""wgmma operand tiles loaded by the tensor memory accelerator (TMA, ``sm_90a``; the ``tma`` option).

Without it, the threads of a block load a wgmma operand (``K`` seen transposed in ``Q @ Kᵀ``, ``V`` in
``P @ V``, a GEMM's ``x`` and ``w`` tiles) into registers and store it, swizzled, into the operand's shared
tile (`wgmma._store_tile`): per element an address, a load and a share of a store. With it, one thread asks
the copy engine for the box of the buffer the tile covers and the engine writes it into the tile swizzled
exactly as the wgmma descriptors read it; no register holds the operand.

When (`plan_tma`): the operand is a load (unmasked, or masked by ``row < N`` only: a ragged last block, whose
rows past the end the copy engine fills with zeros, `_masked_past_the_last_row`) of a dense buffer of a
wgmma type whose offsets
step by 1 along one dim of the tile and by the buffer's row length along the other (the tile is rows of
the buffer's last two dims), read by that one dot alone (directly, or through a transpose: ``Kᵀ``, and a
GEMM's ``w``, which the scheduler loads as ``[n, k]``), and the operand tile's layout follows the load: a
K-major tile (A; B whose K runs along the buffer's rows: ``Kᵀ``) has K along them, an MN-major one (16-bit B
whose N runs along them: ``V``, ``w``) has N. And the tile's rows provably lie in one block of the buffer's
second-to-last dim (`_rows_stay_in_one_block`): a box is bounded per dim, so rows of a reshaped ``x`` that
run on into the next block would read zeros. The box is ``(rows, panel)`` of the last two
dims, ``panel`` the tile's swizzle span (64 f16 for 128 bytes), one copy a panel: K-major panels are
``rows x panel`` blocks one after another, exactly the tile's layout (`wgmma.TileGeometry`), and so are
MN-major ones (a panel of N, each K one swizzle row). One tensor map a buffer (`runtime/tensor_maps.py`):
a second operand of the same buffer with another box keeps the threads' staging.

How (`stage`): after the barrier that frees the tile (every warpgroup's wgmma reading its previous contents
has been waited for), thread 0 arrives on the staging point's mbarrier expecting the copies' bytes and
issues them; every thread waits on the mbarrier's phase. The barrier is set up once, in front of every loop
(``mbarrier.init`` with one arrival, then ``fence.proxy.async`` so the copy engine sees it, and a block
barrier). Its phase parity at a staging point is the number of times the point ran before, mod 2, derived
from the enclosing loops' counters (`phase_parity`): a point in loops of trips ``T_1 .. T_d`` (outermost
first) has run ``sum_l i_l * prod_{l' > l} T_l'`` times, so the parity is the XOR of ``i_l & 1`` over the
loops whose inner trip counts are all odd. A point whose parity needs a run-time trip count keeps the
threads' staging, as does one in a loop with a step that is not a power of two.

Rings (`ring_stages`, `plan_ring`; the ``tma_stages`` option): a staging point directly in a loop's body
cycles through ``S`` tiles and ``S`` mbarriers. Run ``n`` (`run_count`, mod ``2S``) reads stage ``n mod S``
and waits for parity ``(n / S) mod 2``; after the barrier that frees the tiles, thread 0 first issues run
``n``'s own copies where it is the loop's first iteration, then the next iteration's into stage
``(n + 1) mod S`` where there is one (``iv + step < stop``), their origins this one's plus a constant
(`_iteration_step`). The block barrier is the ring's "empty" barrier: the stage the next copy overwrites was
last read by the previous iteration's wgmmas, which every warpgroup waited for before it (with a producer
warp, per-stage empty mbarriers would take its place). Which stages a kernel can afford in shared memory,
`kernel.py` decides (`rings_cost_blocks`, `ring_budget`, `lw.ring_budget`).

The copy fills elements past the buffer's end with zeros: a masked load's ``other`` where its mask is the
rows' bound; an unmasked load's box never reaches past the end. Checked by the simulator (`codegen/simulator/tma.py`: the mbarrier protocol, the swizzle,
a copy into a tile a wgmma still reads) and, for each kernel, against the same kernel staged by the threads
(tests/test_tma_lowering.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...ir.errors import InternalError
from ...ir.semantics import BinaryOp
from ...ir.simt.nodes import Reg, SharedAlloc
from ...ir.simt.types import IntOp
from ...ir.tile import nodes as t
from ...ir.sizes import Size, SizeLike, SizeOp, ceil_div, size_op
from ...ir.types import int32, int64
from .affine import AffineInfo
from .layouts import log2, origin
from . import wgmma   # (a module: wgmma imports this one too)

MAX_BOX = 256
"""The largest extent of a TMA box dimension."""


@dataclass(frozen=True, slots=True)
class TmaOperand:
    """A dot operand the copy engine stages: `load`, a tile of `rows` rows of its buffer (its second-to-last
    dim) by `cols` consecutive elements (its last), into a tile laid out as `geometry`."""

    load: t.Load
    geometry: wgmma.TileGeometry
    rows: int
    cols: int

    @property
    def panels(self) -> int:
        return self.cols // self.geometry.panel_elements

    @property
    def box(self) -> tuple[int, ...]:
        """The copy's box, outermost dim first: one swizzle span of rows."""
        rank = len(self.load.buffer.shape)
        return (1,) * (rank - 2) + (self.rows, self.geometry.panel_elements)

    @property
    def nbytes(self) -> int:
        return self.rows * self.cols * self.load.buffer.dtype.itemsize


def plan_tma(k: t.TileKernel, dots: dict, defs: dict[str, t.Op], affine: AffineInfo) -> dict[str, TmaOperand]:
    """The wgmma operands of `k` the copy engine stages, by the name of the value the dot reads (see the module
    docstring); `dots` are the kernel's `plan.DotPlan`s by result name."""
    uses = _use_counts(k.body)
    boxes: dict[str, tuple[int, ...]] = {}
    out: dict[str, TmaOperand] = {}
    for op in t.walk_ops(k.body):
        planned = dots.get(op.out.name) if isinstance(op, t.Dot) else None
        if planned is None or planned.wgmma is None:
            continue
        for value, is_a in ((op.a, True), (op.b, False)):
            found = _operand(value, is_a, planned.wgmma, defs, affine, uses, k.grid)
            if found is not None and boxes.setdefault(found.load.buffer.name, found.box) == found.box:
                out[value.name] = found
    return out


def _use_counts(ops: tuple[t.Op, ...]) -> dict[str, int]:
    """How many ops read each value, among the ops `t.drop_dead` keeps: rewrites such as `narrow.py` leave ops
    behind that nothing reads (the lowering never emits them)."""
    counts: dict[str, int] = {}
    for op in t.walk_ops(t.drop_dead(ops, set())):
        for v in t.operands(op) + (op.body.yields if isinstance(op, t.For) else ()):
            counts[v.name] = counts.get(v.name, 0) + 1
    return counts


def _operand(value: t.Value, is_a: bool, plan: wgmma.WgmmaPlan, defs: dict[str, t.Op], affine: AffineInfo,
             uses: dict[str, int], grid: tuple = ()) -> TmaOperand | None:
    """`value`'s `TmaOperand` when the copy engine can stage it (the module docstring's conditions), else None."""
    op = defs.get(value.name)
    transposed = isinstance(op, t.Permute)
    if uses.get(value.name) != 1:
        return None
    if transposed:
        if op.perm != (1, 0) or uses.get(op.x.name) != 1:
            return None
        op = defs.get(op.x.name)
    if not isinstance(op, t.Load) or len(op.out.shape) != 2:
        return None
    buffer, shape, item = op.buffer, op.buffer.shape, op.buffer.dtype.itemsize
    if (buffer.type.strides is not None or len(shape) < 2 or not isinstance(shape[-1], int)
            or buffer.dtype not in wgmma.WGMMA_TYPES or shape[-1] * item % 16
            or any(isinstance(n, int) and n >= 1 << 31 for n in shape)):
        return None
    form = affine.of(op.offsets)
    if form is None or sorted(form.strides) != sorted((shape[-1], 1)) or shape[-1] == 1:
        return None
    inner = form.strides.index(1)            # the load tile's dim along the buffer's rows
    rows, cols = op.out.shape[1 - inner], op.out.shape[inner]
    in_bounds = _rows_stay_in_one_block(op.offsets, inner, rows, shape, defs, affine) if op.mask is None else \
        _masked_past_the_last_row(op, inner, shape, defs, affine, grid)
    if rows > MAX_BOX or cols > shape[-1] or not in_bounds or not _columns_in_one_row(op.offsets, inner, cols,
                                                                                       shape[-1], defs, affine):
        return None
    along = inner if not transposed else 1 - inner      # the operand's dim that runs along the buffer's rows
    if is_a:                                  # A [m, k]: K-major only
        geometry = plan.a if along == 1 else None
    else:                                     # B [k, n]: K-major where K runs along the rows, else MN-major
        geometry = plan.b if along == 0 else wgmma.mn_major_geometry(plan, cols, rows)
    if geometry is None or cols % geometry.panel_elements:
        return None
    expected = (cols, rows) if geometry.mn_major else (rows, cols)
    if (geometry.rows, geometry.k) != expected:
        raise InternalError(f"a TMA tile of {rows} x {cols} for a {geometry}", pass_name="lower_to_simt")
    return TmaOperand(op, geometry, rows, cols)


def _columns_in_one_row(offsets: t.Value, inner: int, cols: int, c: int, defs: dict[str, t.Op],
                        affine: AffineInfo) -> bool:
    """Whether the tile's `cols` columns provably lie in one row of ``c`` elements: a box is bounded per dim, so
    columns running past the row's end would read zeros where a flat load reads the next row. Sufficient:
    ``c`` a multiple of `cols` and the terms that vary along the columns starting at multiples of `cols` (the
    schedule's column tiles: ``k0 + arange``)."""
    if c % cols:
        return False
    for term in _sum_terms(offsets, defs):
        form = affine.of(term)
        if form is not None and form.strides[inner] != 0 and form.strides[1 - inner] == 0 \
                and not _starts_at_multiple(term, cols, defs, affine):
            return False
    return True


def _rows_stay_in_one_block(offsets: t.Value, inner: int, rows: int, shape: tuple, defs: dict[str, t.Op],
                            affine: AffineInfo) -> bool:
    """Whether the tile's `rows` rows provably lie in one block of the buffer's second-to-last dim (length
    ``N = shape[-2]``): the copy's box is bounded per dim, so a tile whose rows run on into the next block --
    a program that merged dims with a reshape and tiles the merged rows -- would read zeros where the load
    reads the next block's rows. Sufficient: ``N`` a multiple of `rows` and the first row a multiple of
    `rows`, which the offsets' terms that do not vary along the columns show (each starts at a multiple of
    ``rows * shape[-1]``: `_starts_at_multiple`); the column terms (the tile's first column, within a row)
    are set apart. A run-time ``N`` (a shape-polymorphic kernel): `_rows_within_the_loop`."""
    n = shape[-2]
    if isinstance(n, Size):
        return _rows_within_the_loop(offsets, inner, rows, shape, defs, affine)
    if n % rows:
        return False
    for term in _sum_terms(offsets, defs):
        form = affine.of(term)
        if form is None:
            return False
        if form.strides[inner]:
            if form.strides[1 - inner]:
                return False                   # a term that mixes rows and columns: nothing to set apart
            continue
        if not _starts_at_multiple(term, rows * shape[-1], defs, affine):
            return False
    return True


def _masked_past_the_last_row(load: t.Load, inner: int, shape: tuple, defs: dict[str, t.Op],
                              affine: AffineInfo, grid: tuple) -> bool:
    """Whether masked `load` reads exactly what a copy of its box reads, the copy engine filling with zeros
    the rows past the buffer's last (``N = shape[-2]``): a ragged last key block, or query tile. So: `other`
    is +0; the mask is ``r < N`` for the tile's row positions ``r`` (a vector along the tile's rows, the same
    value the offsets multiply by the row length ``C = shape[-1]``); the tile's first row ``r_0`` is below
    ``N`` wherever the load runs (`_first_row_below`: a loop counter below a stop of at most ``N``, a program
    id whose grid ends before ``N``), so the coordinates unravelled from the tile's first element are
    ``r_0`` and its block's; and every other term of the offsets is a column term or starts at a multiple of
    ``N C`` (the block)."""
    if not (isinstance(load.other, int | float) and load.other == 0 and math.copysign(1.0, load.other) > 0):
        return False
    n, c = shape[-2], shape[-1]
    rows = _along(load.mask, inner, defs)                  # the mask: one bool a row, broadcast along the columns
    compare = defs.get(rows.name) if rows is not None else None
    if not (isinstance(compare, t.Binary) and compare.op is BinaryOp.LT and _same_size(_size_of(compare.b, defs), n)):
        return False
    index = compare.a
    return _row_term_and_blocks(load.offsets, index, inner, shape, defs, affine) and \
        _first_row_below(index, n, defs, grid)


def _row_term_and_blocks(offsets: t.Value, index: t.Value, inner: int, shape: tuple, defs: dict[str, t.Op],
                         affine: AffineInfo) -> bool:
    """Whether the offsets are ``index * C`` (the row term, ``C = shape[-1]``), column terms, and terms that
    start at a multiple of a whole block ``N C`` (``N = shape[-2]``, a run-time extent or not)."""
    n, c = shape[-2], shape[-1]
    found = False
    for term in _sum_terms(offsets, defs):
        scaled = _along(term, inner, defs)
        product = defs.get(scaled.name) if scaled is not None else None
        if not found and isinstance(product, t.Binary) and product.op is BinaryOp.MUL and product.a.name == \
                index.name and _constant(product.b, defs) == c:
            found = True                                   # the row term: r * C
            continue
        form = affine.of(term)
        if form is None or form.strides[1 - inner] != 0:
            return False                                   # a row term of another kind, or rows and columns mixed
        if form.strides[inner] == 0 and not _starts_at_multiple(term, _times(n, c), defs, affine):
            return False
    return found


def _rows_within_the_loop(offsets: t.Value, inner: int, rows: int, shape: tuple, defs: dict[str, t.Op],
                          affine: AffineInfo) -> bool:
    """For a run-time ``N = shape[-2]`` (a shape-polymorphic kernel): whether the unmasked tile's rows are ``iv +
    arange(rows)`` for the counter of a loop from 0 in steps of `rows` to a stop of ``(N // rows) * rows`` (the
    whole blocks of rows; the ragged rest is a masked loop of its own), so every tile's rows lie below ``N``;
    the offsets' other terms as `_row_term_and_blocks` says."""
    for term in _sum_terms(offsets, defs):
        scaled = _along(term, inner, defs)
        product = defs.get(scaled.name) if scaled is not None else None
        if not (isinstance(product, t.Binary) and product.op is BinaryOp.MUL):
            continue
        found = _ramp_start(product.a, defs)
        if found is None:
            continue
        start, loop, ramp = found
        if ramp.shape == (rows,) and isinstance(loop, t.For) and start.name == loop.body.iv.name \
                and loop.start == 0 and loop.step == rows \
                and _same_size(_size_of(loop.stop, defs), _whole_blocks(shape[-2], rows)):
            return _row_term_and_blocks(offsets, product.a, inner, shape, defs, affine)
    return False


def _ramp_start(index: t.Value, defs: dict[str, t.Op]) -> tuple[t.Value, t.Op | None, t.Value] | None:
    """For row positions ``index = start + arange`` (either order; ``start`` a scalar, broadcast): (``start``,
    the op defining it, the arange), else None."""
    op = defs.get(index.name)
    if not (isinstance(op, t.Binary) and op.op is BinaryOp.ADD):
        return None
    for start, ramp in ((op.a, op.b), (op.b, op.a)):
        if isinstance(defs.get(ramp.name), t.Arange):
            scalar = defs.get(start.name)
            if isinstance(scalar, t.Broadcast):
                start = scalar.x
                scalar = defs.get(start.name)
            return start, scalar, ramp
    return None


def _whole_blocks(n: SizeLike, step: int) -> SizeLike:
    """``(n // step) * step``: the whole blocks of `step` rows of a run-time `n` (a loop's stop)."""
    return size_op("*", size_op("//", n, step), step)


def _size_of(v: t.Value | int, defs: dict[str, t.Op]) -> SizeLike | None:
    """The length scalar (or broadcast scalar) `v` holds: a constant, or a run-time extent; else None."""
    if isinstance(v, int):
        return v
    op = _through_views(v, defs)
    if isinstance(op, t.Extent):
        return op.size
    k = _constant(v, defs)
    return None if isinstance(k, bool) else k


def _same_size(a: SizeLike | None, b: SizeLike) -> bool:
    """Whether `a` is the length `b` for every value of the symbols (no decision on a symbol's value)."""
    if a is None:
        return False
    if isinstance(a, Size) or isinstance(b, Size):
        return isinstance(a, Size) and isinstance(b, Size) and a == b
    return a == b


def _times(n: SizeLike, c: int) -> SizeLike:
    return n * c if isinstance(n, int) else size_op("*", n, c)


def _along(v: t.Value, inner: int, defs: dict[str, t.Op]) -> t.Value | None:
    """The vector `v` (a 2-d tile) repeats along its dim `inner` (``broadcast(expand_dims(x, inner))``), else
    None."""
    op = defs.get(v.name)
    if isinstance(op, t.Broadcast):
        op = defs.get(op.x.name)
    if isinstance(op, t.ExpandDims) and op.axis == inner and len(op.x.shape) == 1:
        return op.x
    return None


def _first_row_below(index: t.Value, n: SizeLike, defs: dict[str, t.Op], grid: tuple) -> bool:
    """Whether the first element of row positions ``index = start + arange`` is below `n` wherever it is
    computed: ``start`` a constant below `n` (a run-time `n` is at least 2), the counter of a loop from 0 or
    more to a stop of at most `n` (a run-time `n`: `n` itself, or its whole blocks of the loop's step), or
    ``pid * c`` with the grid's extent along that axis ``g`` and ``(g - 1) c < n`` (a run-time `n`: ``g =
    cdiv(n, c)``)."""
    found = _ramp_start(index, defs)
    if found is None:
        return False
    start, scalar, _ = found
    if isinstance(scalar, t.Constant):
        return isinstance(scalar.value, int) and 0 <= scalar.value and (isinstance(n, Size) and scalar.value < 2
                                                                       or isinstance(n, int) and scalar.value < n)
    if isinstance(scalar, t.For) and start.name == scalar.body.iv.name:
        stop = _size_of(scalar.stop, defs)
        if scalar.start < 0 or stop is None:
            return False
        if isinstance(n, int):
            return isinstance(stop, int) and stop <= n
        # a run-time N: the loop runs to N itself, or to its whole blocks of `step` rows
        return _same_size(stop, n) or _same_size(stop, _whole_blocks(n, scalar.step))
    if isinstance(scalar, t.Binary) and scalar.op is BinaryOp.MUL:
        for pid, factor in ((scalar.a, scalar.b), (scalar.b, scalar.a)):
            program = defs.get(pid.name)
            c = _constant(factor, defs)
            if isinstance(program, t.ProgramId) and c is not None and c > 0 and program.axis < len(grid):
                g = grid[program.axis]
                if isinstance(g, int) and isinstance(n, int):
                    return (g - 1) * c < n
                # a run-time N: a grid of cdiv(N, c) programs of c rows
                return isinstance(n, Size) and _same_size(g, ceil_div(n, c))
    return False


def _starts_at_multiple(v: t.Value, m: SizeLike, defs: dict[str, t.Op], affine: AffineInfo) -> bool:
    """Whether the element of integer tile `v` at the origin is provably a multiple of `m`, for every program
    and loop iteration: through sums, products with constants, views and casts down to constants, aranges
    (0 at the origin) and loop counters (start and step multiples), else `affine`'s power-of-two divisor. A
    run-time `m` (a block of a shape-polymorphic buffer, ``N C``): through sums, views and products, down to
    run-time extents that are multiples of it (`_size_multiple`)."""
    if isinstance(m, Size):
        return _starts_at_size_multiple(v, m, defs)
    if m == 1:
        return True
    op = defs.get(v.name)
    if isinstance(op, t.Constant):
        return isinstance(op.value, int) and op.value % m == 0
    if isinstance(op, t.Arange):
        return True
    if isinstance(op, t.Broadcast | t.ExpandDims | t.Permute | t.Cast):
        return _starts_at_multiple(op.x, m, defs, affine)
    if isinstance(op, t.For) and v.name == op.body.iv.name:
        return op.start % m == 0 and op.step % m == 0
    if isinstance(op, t.Binary) and op.op in (BinaryOp.ADD, BinaryOp.SUB):
        return _starts_at_multiple(op.a, m, defs, affine) and _starts_at_multiple(op.b, m, defs, affine)
    if isinstance(op, t.Binary) and op.op is BinaryOp.MUL:
        for x, c in ((op.a, op.b), (op.b, op.a)):
            k = _constant(c, defs)
            if k and _starts_at_multiple(x, m // math.gcd(m, abs(k)), defs, affine):
                return True
    form = affine.of(v)
    return form is not None and form.div % m == 0


def _starts_at_size_multiple(v: t.Value, m: Size, defs: dict[str, t.Op]) -> bool:
    """`_starts_at_multiple` for a run-time `m`."""
    op = defs.get(v.name)
    if isinstance(op, t.Constant):
        return op.value == 0
    if isinstance(op, t.Arange):
        return True
    if isinstance(op, t.Extent):
        return _size_multiple(op.size, m)
    if isinstance(op, t.Broadcast | t.ExpandDims | t.Permute | t.Cast):
        return _starts_at_size_multiple(op.x, m, defs)
    if isinstance(op, t.Binary) and op.op in (BinaryOp.ADD, BinaryOp.SUB):
        return _starts_at_size_multiple(op.a, m, defs) and _starts_at_size_multiple(op.b, m, defs)
    if isinstance(op, t.Binary) and op.op is BinaryOp.MUL:
        return _starts_at_size_multiple(op.a, m, defs) or _starts_at_size_multiple(op.b, m, defs)
    return False


def _factors(size: SizeLike) -> tuple[int, list]:
    """`size` as an integer times a list of run-time factors (the operands of its products)."""
    if isinstance(size, int):
        return size, []
    if isinstance(size, SizeOp) and size.op == "*":
        (ia, fa), (ib, fb) = _factors(size.a), _factors(size.b)
        return ia * ib, fa + fb
    return 1, [size]


def _size_multiple(size: SizeLike, m: SizeLike) -> bool:
    """Whether `size` is a multiple of `m` for every value of the symbols: its integer factor a multiple of
    `m`'s and `m`'s run-time factors among its own."""
    (i, fs), (j, fm) = _factors(size), _factors(m)
    if j == 0 or i % j:
        return i == 0
    rest = list(fs)
    for f in fm:
        if f not in rest:
            return False
        rest.remove(f)
    return True


def _sum_terms(v: t.Value, defs: dict[str, t.Op]) -> list[t.Value]:
    """The terms of the sum `v` is (itself where it is not a sum of two tiles of its shape)."""
    op = defs.get(v.name)
    if isinstance(op, t.Binary) and op.op is BinaryOp.ADD and op.a.shape == op.b.shape == v.shape:
        return _sum_terms(op.a, defs) + _sum_terms(op.b, defs)
    return [v]


def run_count(lw, depth: int, modulus: int) -> Reg | int | None:
    """How many times a statement at builder depth `depth` has run before, mod `modulus` (a power of two; an i32
    register, or 0 outside every loop), from the loops enclosing it (the module docstring): the sum over them of
    their iteration index times the trips of the loops inside them, the trips taken mod `modulus`; None where
    that needs a loop's run-time trip count or a step that is not a power of two."""
    b = lw.b
    shares = _shares(lw, depth, modulus)
    if shares is None:
        return None
    count: Reg | None = None
    for frame, factor in shares:
        iv = frame.iv
        index = b.arith(BinaryOp.SUB, iv, b.const_of(frame.start, iv.dtype)) if frame.start else iv
        if frame.step > 1:
            index = b.int_arith(IntOp.SHR, index, b.const_of(log2(frame.step), iv.dtype))
        if index.dtype != int32:
            index = b.cast(index, int32)
        if factor > 1:
            index = b.arith(BinaryOp.MUL, index, b.const_of(factor, int32))
        count = index if count is None else b.arith(BinaryOp.ADD, count, index)
    return 0 if count is None else b.int_arith(IntOp.AND, count, b.const_of(modulus - 1, int32))


def _enclosing(lw, depth: int) -> list:
    """The `context.LoopFrame`s of the loops enclosing builder depth `depth`, outermost first."""
    return [f for f in lw.loops if f.depth <= depth]


def _shares(lw, depth: int, modulus: int) -> list[tuple[object, int]] | None:
    """The loops enclosing depth `depth` whose iterations count towards `run_count` mod `modulus`, innermost
    first, each with the trips of the loops inside it mod `modulus` (loops further out, whose factor is 0 mod
    `modulus`, are left out); None where a factor needs a run-time trip count, or a step is not a power of two."""
    shares = []
    factor: int | None = 1                # the trips of the loops inside the current one, mod `modulus`
    for frame in reversed(_enclosing(lw, depth)):
        if factor == 0:
            break                         # every outer loop's share is a multiple of `modulus`
        if factor is None or frame.step & (frame.step - 1):
            return None                   # an outer loop's share depends on a run-time trip count
        shares.append((frame, factor))
        factor = None if frame.trips is None else factor * frame.trips % modulus
    return shares


def phase_known(lw, depth: int) -> bool:
    """Whether `phase_parity` can say the phase of a staging point at builder depth `depth` (emits nothing)."""
    return _shares(lw, depth, 2) is not None


def phase_parity(lw, depth: int) -> Reg | int | None:
    """The mbarrier phase parity of a single-stage staging point at builder depth `depth` (`run_count` mod 2)."""
    return run_count(lw, depth, 2)


@dataclass(frozen=True, slots=True)
class Prefetch:
    """How a ring's staging point issues the copies of its loop's next iteration: in the thread that issues,
    where `more` holds (the loop has a next iteration), into stage `next_stage`, each operand's tile origin
    `steps` elements on; where `first` holds (the loop's first iteration) it first issues its own copies,
    which no earlier iteration did."""

    first: Reg
    more: Reg
    next_stage: Reg
    steps: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Ring:
    """A staging point's tiles and mbarriers: `stages` of each, used in turn; this run reads stage `stage`, whose
    barrier completes the phase of parity `parity`. With more than one stage, `prefetch` says how the next
    iteration's copies are issued one iteration ahead."""

    stages: int
    stage: Reg | int
    parity: Reg | int
    prefetch: Prefetch | None = None


def ring_stages(lw, operands: list[TmaOperand], depth: int) -> int:
    """How many stages the ring of the staging point at builder depth `depth` that copies `operands` has, its
    extra stages' bytes added to `lw.ring_bytes` (emits nothing): `lw.tma_stages` where the point is directly
    in a loop's body (runs once an iteration), every operand's tile origin moves by a constant from one
    iteration to the next (`_iteration_step`) and the run count mod twice the stages is known (`run_count`);
    fewer (halved) where the extra stages would take `lw.ring_bytes` past `lw.ring_budget`; else one."""
    stages = lw.tma_stages
    frames = _enclosing(lw, depth)
    if stages == 1 or not frames or frames[-1].depth != depth or _shares(lw, depth, 2 * stages) is None \
            or any(_iteration_step(op.load.offsets, frames[-1], lw) is None for op in operands):
        return 1
    nbytes = sum(op.nbytes for op in operands)
    while stages > 1 and lw.ring_budget is not None and lw.ring_bytes + (stages - 1) * nbytes > lw.ring_budget:
        stages //= 2
    lw.ring_bytes += (stages - 1) * nbytes
    return stages


def plan_ring(lw, operands: list[TmaOperand], depth: int, stages: int) -> Ring:
    """The ring of `stages` (from `ring_stages`) of the staging point at builder depth `depth` that copies
    `operands`: this run's stage and phase parity, and with several stages how the next iteration's copies
    are issued; its registers are emitted at the builder's position."""
    if stages == 1:
        return Ring(1, 0, phase_parity(lw, depth))
    b = lw.b
    frame = _enclosing(lw, depth)[-1]
    steps = tuple(_iteration_step(op.load.offsets, frame, lw) for op in operands)
    count = run_count(lw, depth, 2 * stages)
    count = count if isinstance(count, Reg) else b.const_of(count, int32)
    mask = b.const_of(stages - 1, int32)
    stage = b.int_arith(IntOp.AND, count, mask)
    parity = b.int_arith(IntOp.AND, b.int_arith(IntOp.SHR, count, b.const_of(log2(stages), int32)),
                         b.const_of(1, int32))
    next_stage = b.int_arith(IntOp.AND, b.arith(BinaryOp.ADD, stage, b.const_of(1, int32)), mask)
    iv = frame.iv
    following = b.arith(BinaryOp.ADD, iv, b.const_of(frame.step, iv.dtype))
    stop = frame.stop if isinstance(frame.stop, Reg) else b.const_of(frame.stop, iv.dtype)
    first = b.eq(iv, b.const_of(frame.start, iv.dtype))
    return Ring(stages, stage, parity, Prefetch(first, b.lt(following, stop), next_stage, steps))


def _iteration_step(offsets: t.Value, frame, lw) -> int | None:
    """How many elements the origin element of `offsets` moves from one iteration of `frame`'s loop to the
    next: its coefficient in the loop's counter (`_counter_coefficient`) times the step; None where it is not
    provably a constant."""
    plan = lw.plan
    inside = plan.depth.get(frame.tile_iv)
    if inside is None:
        return None
    c = _counter_coefficient(offsets, frame.tile_iv, inside, plan.defs, plan.depth, {})
    return None if c is None else c * frame.step


def _counter_coefficient(v: t.Value, iv: str, inside: int, defs: dict[str, t.Op], depth: dict[str, int],
                         memo: dict[str, int | None]) -> int | None:
    """`c` where the origin element of integer tile `v` is ``c * iv`` plus what does not change within the loop
    of counter `iv` (whose body values have depth `inside`): through sums, differences, products with
    constants, views and casts; values defined outside the loop, constants and aranges contribute 0. None
    where `v` depends on the counter otherwise (or on another value of the body: a loaded index, a carry)."""
    if v.name == iv:
        return 1
    if depth.get(v.name, 0) < inside:
        return 0
    if v.name in memo:
        return memo[v.name]
    op = defs.get(v.name)
    found: int | None = None
    if isinstance(op, t.Constant | t.Arange | t.ProgramId):
        found = 0
    elif isinstance(op, t.Broadcast | t.ExpandDims | t.Permute | t.Cast):
        found = _counter_coefficient(op.x, iv, inside, defs, depth, memo)
    elif isinstance(op, t.Binary) and op.op in (BinaryOp.ADD, BinaryOp.SUB):
        a = _counter_coefficient(op.a, iv, inside, defs, depth, memo)
        c = _counter_coefficient(op.b, iv, inside, defs, depth, memo)
        found = None if a is None or c is None else a + c if op.op is BinaryOp.ADD else a - c
    elif isinstance(op, t.Binary) and op.op is BinaryOp.MUL:
        for x, factor in ((op.a, op.b), (op.b, op.a)):
            k = _constant(factor, defs)
            if k is not None:
                c = _counter_coefficient(x, iv, inside, defs, depth, memo)
                found = None if c is None else k * c
                break
    memo[v.name] = found
    return found


def _through_views(v: t.Value, defs: dict[str, t.Op]) -> t.Op | None:
    """The op defining `v` under its broadcasts and inserted dims (what every element of `v` is)."""
    op = defs.get(v.name)
    while isinstance(op, t.Broadcast | t.ExpandDims):
        op = defs.get(op.x.name)
    return op


def _constant(v: t.Value, defs: dict[str, t.Op]) -> int | None:
    """The integer every element of `v` provably is (through broadcasts), else None."""
    op = _through_views(v, defs)
    return op.value if isinstance(op, t.Constant) and isinstance(op.value, int) else None


def _base(lw, load: t.Load) -> Reg:
    """The element offset the tile of `load` starts at (its offsets' element at the origin)."""
    return lw.get(load.offsets, origin(load.out.shape, lw.plan.warps)).chunks[0]


def _coordinates(lw, base: Reg, shape: tuple) -> list[Reg]:
    """Element offset `base` of a dense buffer of `shape` as coordinates, outermost dim first, i32 (a run-time
    extent divides by its kernel parameter)."""
    b = lw.b
    coords: list[Reg] = []
    rest = base
    for extent in reversed(shape[1:]):
        if isinstance(extent, Size):
            by = lw.size_param(extent, base.dtype)
            coords.append(b.int_arith(IntOp.REM, rest, by))
            rest = b.int_arith(IntOp.DIV, rest, by)
        elif extent & (extent - 1) == 0:
            coords.append(b.int_arith(IntOp.AND, rest, b.const_of(extent - 1, base.dtype)))
            rest = b.int_arith(IntOp.SHR, rest, b.const_of(log2(extent), base.dtype))
        else:
            coords.append(b.int_arith(IntOp.REM, rest, b.const_of(extent, base.dtype)))
            rest = b.int_arith(IntOp.DIV, rest, b.const_of(extent, base.dtype))
    coords.append(rest)
    return [c if c.dtype == int32 else b.cast(c, int32) for c in reversed(coords)]


def stage(lw, parts: list[tuple[TmaOperand, SharedAlloc]], name: str, ring: Ring) -> None:
    """Copy each operand of `parts` into its tile (`ring.stages` tiles one after another in the allocation) and
    wait for the copies of this run's stage, at the builder's current position (after the barrier that frees
    the tiles: with a ring, the stage the next iteration's copies go to was last read by the previous
    iteration's wgmmas, which every warpgroup has waited for before that barrier)."""
    b = lw.b
    landed = b.shared(f"{name}_landed", int64, (ring.stages,), align=8)
    with b.at(0):                         # in front of every loop: set up once
        first = b.eq(lw.tid, b.const_of(0, int32))

        def init() -> None:
            for s in range(ring.stages):
                b.mbarrier_init(landed, s, 1)
            b.fence_proxy_async()
        b.if_(first, init)
        b.barrier()
    # each tile's first element here (read in the loop's scope); its coordinates are unravelled only where a
    # copy is issued, by the one thread, not every thread every iteration
    bases = [_base(lw, operand.load) for operand, _ in parts]

    def issue(stage: Reg | int, steps: tuple[int, ...]) -> None:
        """Thread 0's copies of every part into stage `stage`, each tile `steps` elements on from here."""
        b.mbarrier_arrive(landed, stage, tx_bytes=sum(operand.nbytes for operand, _ in parts))
        for (operand, tile), base, step in zip(parts, bases, steps):
            if step:
                base = b.arith(BinaryOp.ADD, base, b.const_of(step, base.dtype))
            start = _coordinates(lw, base, operand.load.buffer.shape)
            panel = operand.geometry.panel_elements
            at = b.arith(BinaryOp.MUL, stage, b.const_of(operand.rows * operand.cols, int32)) \
                if isinstance(stage, Reg) else 0
            for p in range(operand.panels):
                coords = start[:-1] + [b.arith(BinaryOp.ADD, start[-1], b.const_of(p * panel, int32))]
                offset = p * operand.rows * panel         # the panel's first element in the stage's tile
                index = at if not offset else b.arith(BinaryOp.ADD, at, b.const_of(offset, int32)) \
                    if isinstance(at, Reg) else offset
                b.tma_load(tile, index, operand.load.buffer, coords, operand.box,
                           swizzle=operand.geometry.mode.value, barrier=landed, barrier_index=stage)

    here = (0,) * len(parts)
    ahead = ring.prefetch
    if ahead is None:
        b.if_(first, lambda: issue(ring.stage, here))
    else:
        def issue_ahead() -> None:
            b.if_(ahead.first, lambda: issue(ring.stage, here))
            b.if_(ahead.more, lambda: issue(ahead.next_stage, ahead.steps))
        b.if_(first, issue_ahead)
    b.mbarrier_wait(landed, ring.stage, ring.parity)


__all__ = ["MAX_BOX", "Prefetch", "Ring", "TmaOperand", "phase_known", "phase_parity", "plan_ring", "plan_tma", "ring_stages", "run_count", "stage"]
