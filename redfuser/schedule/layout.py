"""Where the axes of a fused loop's kernel go, and the kernel builder that binds them.

`fused_layout` classifies the (unified, see `unify.py`) axes of a fused loop and
its epilogue: the axes every state shares go to the grid, the last of them tiled
by ``block_m`` (query rows in attention; `FusedLayout.rows`); axes only some states have (attention's
head dimension, a running top-k's rank) stay whole inside the tile; the fused
axis is walked in chunks. A state axis too long to stay whole (longer than ``block_n`` and than
``whole_max`` in a loop with a dot among its locals, attention's head dimension, or `CHEAP_RECOMPUTE_MAX` in
any other, the N columns of a quantized GEMM's ``y[M, N]``) is *grid-tiled*: tiled by ``block_n`` (on the
cpu, the columns of ``gemm_tile``: `FusedLayout.grid_tile`) with one more grid dimension over its tiles.
Each such program recomputes the states that lack the axis (the GEMM's per-row
absmax) -- exact, since they never read the axis (`_gridable`). `FusedBuilder`
opens a kernel on that layout: program ids for the grid (plus, for a split
reduction, one more grid dimension for the slice), a `Dim` per tiled or whole
axis, and helpers to bind a statement's axes.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import (Axis, BinaryOp, Compute, DType, FusedLoop, OnlineState, Reduce, ReduceOp, TopKState, index_axes,
                  loads, reads_axis)
from ..ir.sizes import SizeLike, assumed_at_least, ceil_div, is_static, same_length
from ..ir.tile import nodes as t
from .builder import KernelBuilder
from .exprs import ExprLowering
from .masked import live_bound
from .nests import premake
from .options import (ACC_TILE, CHEAP_RECOMPUTE_MAX, DOT_ROWS_LEAST, MASKED_DOT_ROWS, ONE_PASS_MAX, ONE_PASS_ROWS,
                      ONE_PASS_TILE, ROW_TILE_LEAST, WIDE_ROWS, ScheduleOptions, chunk_within_tile, gemm_rows)
from .reduce import reads_only_narrow
from .space import Binding, Dim, Fixed, ordered
from .unify import AxisClasses, Unfusable, rank_axis, state_axes, unify


@dataclass(frozen=True)
class FusedLayout:
    """The roles of a fused kernel's axis classes (see the module docstring)."""

    fl: FusedLoop
    epilogue: tuple[Compute, ...]
    classes: AxisClasses
    grid_keys: tuple[str, ...]
    tiled_key: str | None
    whole_keys: tuple[str, ...]
    fused_key: str
    rank_keys: frozenset[str]
    gridable: tuple[str, ...] = ()
    sweep_key: str | None = None

    def grid_tiled(self, opts: ScheduleOptions) -> tuple[str, ...]:
        """The whole keys tiled across the grid under `opts` (see the module docstring): those longer than
        ``whole_max`` in a loop with a contraction among its locals (each program would recompute it),
        `CHEAP_RECOMPUTE_MAX` in any other, and ``block_n``."""
        limit = max(opts.whole_max if self.contracts else CHEAP_RECOMPUTE_MAX, opts.block_n)
        return tuple(k for k in self.gridable if not is_static(self.classes.extent[k]) or self.classes.extent[k] > limit)

    def state_stmt(self, j: int) -> int:
        """The statement number of state `j` in `classes`."""
        return len(self.fl.locals) + j

    def epilogue_stmt(self, j: int) -> int:
        return len(self.fl.locals) + len(self.fl.states) + j

    @property
    def per_row_states(self) -> bool:
        """Whether every state is one value (or one short top-k list) per row of the tiled axis: softmax's
        ``m`` and ``l``, MoE routing's running top-k. No state has a whole axis (attention's head
        dimension), so nothing feeds tensor cores; an epilogue's own small axes do not count."""
        n_locals = len(self.fl.locals)
        keys = {self.classes.of(n_locals + j, a) for j, st in enumerate(self.fl.states) for a in st.axes}
        return not (keys & set(self.whole_keys)) - self.rank_keys

    def rows(self, opts: ScheduleOptions) -> int:
        """The tile rows of the tiled axis under `opts`: `ScheduleOptions.rows`; for a one-pass loop
        `one_pass_rows`; `WIDE_ROWS` on the GPU (``block_m`` None) for a loop that feeds tensor cores
        while its accumulator tile stays within `ACC_TILE` elements."""
        one = self.one_pass_rows(opts)
        if one:
            return one
        if opts.block_m is None and self.feeds_tensor_cores and WIDE_ROWS * self.state_width(opts) <= ACC_TILE:
            return WIDE_ROWS
        gemm = self.gemm_tile(opts)
        if gemm is not None:
            return gemm_rows(gemm[0], lambda rows: self.programs(opts, rows), opts.workers)
        tile = self.dot_tile(opts) or self.row_tile(opts)
        if tile is not None:
            return tile[0]
        return opts.rows(self.per_row_states)

    def row_tile(self, opts: ScheduleOptions) -> tuple[int, int] | None:
        """(rows, chunk) under `opts.row_tile` (the cpu's `ROW_TILE`) for a loop of per-row states over a static
        axis that ends in a sweep of its rows (what gains: the sweep reads them again from L1 or L2; cross-entropy,
        whose loop has none, ran 10-25% slower in such tiles than in 32 x 64), with no contraction, GEMM state
        or running top-k (whose sorting network grows with the chunk):
        the axis whole up to the longest chunk, as many rows as the tile's elements hold, halved while the
        grid would leave a worker idle and a tile keeps more than `ROW_TILE_LEAST` elements. None otherwise."""
        n = self.fl.axis.extent
        if (opts.row_tile is None or self.sweep_key is None or not is_static(n) or not self.per_row_states
                or self.contracts or self.gemm_state or any(isinstance(st, TopKState) for st in self.fl.states)):
            return None
        elements, longest = opts.row_tile
        chunk = opts.tile(longest, n)
        rows = max(1, elements // chunk)
        while rows > 1 and rows * chunk > ROW_TILE_LEAST and not assumed_at_least(self.programs(opts, rows),
                                                                                   opts.workers):
            rows //= 2
        return rows, chunk

    def dot_tile(self, opts: ScheduleOptions) -> tuple[int, int] | None:
        """(rows, chunk): `opts.dot_tile` where a local of the loop contracts (see `contracts`), else the first
        two of `opts.gemm_tile` where a state does (`gemm_state`), else None.

        A contracting loop's rows are `opts.dot_tile`'s, at most `MASKED_DOT_ROWS` where the loop's mask lets
        it stop early (causal attention: `masked.live_bound`; each tile's diagonal chunks are computed whole,
        and more rows a tile make more of them), and halved, down to `DOT_ROWS_LEAST`, while the grid would
        leave a worker idle."""
        if self.contracts:
            if opts.dot_tile is None:
                return None
            rows, chunk = opts.dot_tile
            if (opts.skip_masked or opts.skip_exact) and live_bound(self.fl, self.classes, self.fused_key):
                rows = min(rows, MASKED_DOT_ROWS)
            while rows > DOT_ROWS_LEAST and not assumed_at_least(self.programs(opts, rows), opts.workers):
                rows //= 2
            return rows, chunk
        gemm = self.gemm_tile(opts)
        return gemm[:2] if gemm is not None else None

    def gemm_tile(self, opts: ScheduleOptions) -> tuple[int, int, int] | None:
        """`opts.gemm_tile` where a state of the loop is a GEMM (`gemm_state`) and no local contracts, else
        None."""
        return opts.gemm_tile if self.gemm_state and not self.contracts else None

    def grid_tile(self, opts: ScheduleOptions) -> int:
        """The tile of a grid-tiled axis (`grid_tiled`): ``block_n``, or a GEMM state's columns
        (`gemm_tile`: the program's copy of ``w``'s block and its rows' statistics serve more of them)."""
        gemm = self.gemm_tile(opts)
        return gemm[2] if gemm is not None else opts.columns()

    @property
    def contracts(self) -> bool:
        """Whether a local of the loop is a sum of products of two loaded operands (a ``dot``)."""
        return any(isinstance(local, Reduce) and local.op is ReduceOp.SUM and len(loads(local.value)) > 1
                   for local in self.fl.locals)

    @property
    def gemm_state(self) -> bool:
        """Whether a state of the loop is a running sum over the loop axis of products of two inputs read
        along it (layer norm + GEMM's ``sum over j of (x[i, j] - c[i]) * w[j, n]``, a quantized GEMM's output;
        not softmax's ``sum over j of exp(x[i, j] - m[i])``, whose second read is a state's)."""
        axis = self.fl.axis.name

        def along(st: OnlineState) -> set[str]:
            return {ld.buffer.name for ld in loads(st.term) if any(reads_axis(i, axis) for i in ld.indices)}
        return any(isinstance(st, OnlineState) and st.op is ReduceOp.SUM and len(along(st)) > 1
                   for st in self.fl.states)

    @property
    def feeds_tensor_cores(self) -> bool:
        """Whether a local of the loop is a sum of products of 16- or 8-bit floats (attention's ``q @ k^T``):
        a contraction `codegen.simt.narrow` hands to tensor cores."""
        return any(isinstance(local, Reduce) and local.op is ReduceOp.SUM and len(loads(local.value)) > 1
                   and reads_only_narrow(local.value) for local in self.fl.locals)

    def state_width(self, opts: ScheduleOptions) -> int:
        """Elements a row of the tile holds along the whole axes (attention's head dimension; a grid-tiled
        one's tile), the width of the widest state's accumulator."""
        width = 1
        tiled = self.grid_tiled(opts)
        for key in self.whole_keys:
            if key in self.rank_keys:
                continue
            extent = self.classes.extent[key]
            width *= opts.tile(self.grid_tile(opts) if key in tiled else extent, extent)
        return width

    def chunk(self, opts: ScheduleOptions) -> int:
        """The chunk length of the fused axis: ``block_n``, or the whole axis for a one-pass loop."""
        n = self.fl.axis.extent
        if self.one_pass_rows(opts):
            return opts.tile(n, n)
        tile = self.dot_tile(opts) or self.row_tile(opts)
        size = opts.tile(tile[1] if tile is not None else opts.block_n, n)
        if opts.pow2 and not self.contracts and not (self.gemm_state and all(
                st.acc.dtype.is_float for st in self.fl.states if isinstance(st, OnlineState))):
            # (a GPU chunk whose terms are materialized whole, no dot: at most `CHUNK_TILE` elements with the
            # state tile; an int32 matmul's state over two symbolic axes took 64 x 64 x 64 lanes)
            size = chunk_within_tile(size, self.rows(opts) * self.state_width(opts))
        return size

    def sweep_chunk(self, opts: ScheduleOptions) -> int:
        """The chunk length of the closing sweep's axis: ``block_n``, or in a one-pass kernel the whole
        axis when it is as long as the fused one (softmax's output row: the same tile as the loop's,
        so its load merges with the loop's and the row is read once)."""
        n = self.classes.extent[self.sweep_key]
        whole = self.one_pass_rows(opts) and same_length(n, self.fl.axis.extent)
        rows = self.row_tile(opts) if same_length(n, self.fl.axis.extent) else None
        return opts.tile(n if whole else rows[1] if rows else opts.block_n, n)   # (the loop's chunks: `row_tile`)

    def one_pass_rows(self, opts: ScheduleOptions) -> int:
        """The rows of a tile when `opts.whole_rows` makes the fused axis one chunk, else 0.

        That takes states that are per-row values (not a running top-k, whose sorting network grows with
        the chunk) over an axis of at most `ONE_PASS_MAX`. A tile holds as many whole rows as
        `ONE_PASS_TILE` elements do (at most `ONE_PASS_ROWS`), fewer while there are fewer tiles than workers. With fewer than half
        as many tiles as workers even at one row a tile, the loop is chunked and split across programs
        instead (`split.py`): more SMs then read, if each element twice."""
        n = self.fl.axis.extent
        if not is_static(n):
            return 0      # a row of run-time length is walked in chunks
        if not (opts.whole_rows and self.per_row_states and 0 < opts.tile(n, n) <= ONE_PASS_MAX
                and not any(isinstance(st, TopKState) for st in self.fl.states)):
            return 0
        rows = min(ONE_PASS_ROWS, max(1, ONE_PASS_TILE // self._row_elements(opts)))
        while rows > 1 and not assumed_at_least(self.programs(opts, rows), opts.workers):
            rows //= 2
        return rows if assumed_at_least(2 * self.programs(opts, rows), opts.workers) else 0

    def _row_elements(self, opts: ScheduleOptions) -> int:
        """Elements a tile holds per row in a one-pass loop: the whole fused axis, or a local's contraction chunk
        where that is wider (a row-sized ``x @ w`` whose operand tile is rows by the chunk: 8192 rows of a
        2-element row by a 64-long chunk unrolled half a million shared-memory stores; example 14499 of
        the long campaign at 6a1ff44, a 30-minute compile on simulate)."""
        n = self.fl.axis.extent
        width = opts.tile(n, n)
        for local in self.fl.locals:
            if isinstance(local, Reduce) and local.reduce_axes:
                last = local.reduce_axes[-1].extent
                chunk = opts.chunk(last, reads_only_narrow(local.value)) if is_static(last) else opts.k_block(
                    reads_only_narrow(local.value))
                width = max(width, chunk)
        return width

    def programs(self, opts: ScheduleOptions, rows: int | None = None) -> int:
        """How many program instances the grid has (without a split), with tiles of `rows` (default:
        `rows(opts)`)."""
        n = 1
        for key in self.grid_keys:
            n *= self.classes.extent[key]
        if self.tiled_key is not None:
            extent = self.classes.extent[self.tiled_key]
            n *= ceil_div(extent, opts.tile(rows or self.rows(opts), extent))
        for key in self.grid_tiled(opts):
            extent = self.classes.extent[key]
            n *= ceil_div(extent, opts.tile(self.grid_tile(opts), extent))
        return n


def fused_layout(fl: FusedLoop, epilogue: list[Compute] | tuple[Compute, ...],
                 classes: AxisClasses | None = None) -> FusedLayout:
    """The layout of `fl` and `epilogue` in one kernel; raises `Unfusable` when they cannot share one.

    `classes` may come from unifying more nests than `epilogue` (to ask whether one more would join).
    """
    classes = classes or unify(fl, list(epilogue))
    n_locals = len(fl.locals)
    raw = [[classes.of(n_locals + j, a) for a in st.axes] for j, st in enumerate(fl.states)]
    ranks = {classes.of(n_locals + j, rank_axis(st)) for j, st in enumerate(fl.states) if isinstance(st, TopKState)}
    fused = classes.of(n_locals, fl.axis) if fl.states else classes.of(0, fl.axis)
    shared = [c for c in raw[0] if all(c in ks for ks in raw)] if raw else []
    if ranks & set(shared):
        raise Unfusable("a top-k rank axis meets an axis every state has")
    seen: list[str] = []
    for j, st in enumerate(fl.states):
        seen += [classes.of(n_locals + j, a) for a in state_axes(st)]
    for n, local in enumerate(fl.locals):
        seen += [classes.of(n, a) for a in local.axes]
    sweep = _sweep_key(fl, epilogue, classes, fused, set(seen) | set(shared))
    for j, c in enumerate(epilogue):
        seen += [classes.of(n_locals + len(fl.states) + j, a) for a in c.axes]
    whole = [c for c in dict.fromkeys(seen) if c not in shared and c != fused and c != sweep]
    grid, tiled = shared[:-1], (shared[-1] if shared else None)
    if tiled is not None and (classes.extent[tiled] == 1 or _tiling_reuses_nothing(fl, classes, tiled, fused, set(grid))):
        grid, tiled = grid + [tiled], None   # one program per row
    gridable = _gridable(fl, classes, whole, ranks)
    return FusedLayout(fl, tuple(epilogue), classes, tuple(grid), tiled, tuple(whole), fused, frozenset(ranks),
                       gridable, sweep)


def _sweep_key(fl: FusedLoop, epilogue, classes: AxisClasses, fused: str, before: set[str]) -> str | None:
    """The axis a *sweep* walks: the last epilogue statement may add one axis of the fused axis's length that
    no earlier statement has (softmax's ``out[i, j] = exp(x[i, j] - m[i]) / l[i]``). The kernel then runs a
    second loop over that axis in chunks after the states are final, instead of a kernel of its own that
    would read the states back from memory."""
    if not epilogue:
        return None
    last = len(fl.locals) + len(fl.states) + len(epilogue) - 1
    earlier = set(before)
    for j, c in enumerate(epilogue[:-1]):
        earlier |= {classes.of(len(fl.locals) + len(fl.states) + j, a) for a in c.axes}
    new = [k for k in dict.fromkeys(classes.of(last, a) for a in epilogue[-1].axes) if k not in earlier and k != fused]
    longer = [k for k in new if classes.extent[k] != 1]
    if len(new) > 1 and len(longer) == 1:
        new = longer     # (a length-1 axis of its own besides: a fixed 0, as in `fused.joins`)
    if len(new) == 1 and same_length(classes.extent[new[0]], classes.extent[fused]):
        return new[0]
    return None


def _tiling_reuses_nothing(fl: FusedLoop, classes: AxisClasses, tiled: str, fused: str, grid: set[str]) -> bool:
    """Whether tiling `tiled` by ``block_m`` would only stack independent rows into a 3-d chunk.

    Tiling the rows pays when the chunk's loads along the fused axis are shared by the rows (attention's
    ``k[j, d]`` serves every query row). When a load indexed by the fused axis and at least one more
    axis is indexed by the rows too (flash decoding's heads: each head has its own ``k[h, j, d]``),
    nothing is shared and the chunk becomes a ``rows x chunk x d`` tile of elementwise products:
    block_m times the registers and code for no reuse. Such rows go to the grid instead. Only loads of
    memory the loop does not compute count (a local such as ``s[i, j]`` is made per chunk), and only
    axes inside the tile (not the grid's)."""
    n_locals = len(fl.locals)
    computed = {local.out.name for local in fl.locals} | {st.prev.name for st in fl.states}
    stmts = [(n, local.value) for n, local in enumerate(fl.locals)]
    stmts += [(n_locals + j, st.term) for j, st in enumerate(fl.states)]
    for stmt, expr in stmts:
        for ld in loads(expr):
            if ld.buffer.name in computed:
                continue
            keys = {classes.of(stmt, a) for i in ld.indices for a in index_axes(i) if (stmt, a.name) in classes.key}
            keys -= grid
            if tiled in keys and fused in keys and len(keys) >= 3:
                return True
    return False


def _gridable(fl: FusedLoop, classes: AxisClasses, whole: list[str], ranks: set[str]) -> tuple[str, ...]:
    """The whole keys a program may own only a tile of: axes of some state, not a top-k rank, never reduced.

    A local reducing over the axis would need all of it in one program. Any statement reading a value
    that varies along the axis has the axis itself (reads unify axes), so a statement without it, a
    state recomputed by every tile's program, reads nothing that differs between those programs.
    """
    n_locals = len(fl.locals)
    reduced = {classes.of(n, a) for n, local in enumerate(fl.locals) if isinstance(local, Reduce)
               for a in local.reduce_axes}
    on_states = {classes.of(n_locals + j, a) for j, st in enumerate(fl.states) for a in st.axes}
    return tuple(k for k in whole if k in on_states and k not in ranks and k not in reduced)


def _chunk_first(lay: FusedLayout) -> bool:
    """Whether a state's term loads memory whose innermost index is a whole axis (not the fused one)."""
    whole = set(lay.whole_keys)
    for j, st in enumerate(lay.fl.states):
        stmt = lay.state_stmt(j)
        for ld in loads(st.term):
            last = ld.indices[-1] if ld.indices else None
            if isinstance(last, Axis) and (stmt, last.name) in lay.classes.key and lay.classes.of(stmt, last) in whole:
                return True
    return False


class FusedBuilder:
    """A kernel under construction on a `FusedLayout`: its builder, expression lowering and axis bindings.

    With `split` > 0 the grid gets one more (last) dimension of that many slices,
    whose program id is `split_pid`.
    """

    def __init__(self, lay: FusedLayout, name: str, opts: ScheduleOptions, index: DType, split: int = 0) -> None:
        self.lay, self.opts = lay, opts
        # the buffers a later kernel reads (a 16-bit epilogue value among them is read here as it is stored)
        self.read_later: frozenset[str] = frozenset()
        self.kb = KernelBuilder(name, index)
        self.lw = ExprLowering.of(self.kb, opts)
        self.binding: dict[str, Binding] = {}
        self.grid: list[SizeLike] = []
        kb, extent = self.kb, lay.classes.extent
        for key in lay.grid_keys:
            self.binding[key] = Fixed(kb.program_id(len(self.grid), hint=f"pid_{key}"), extent[key])
            self.grid.append(extent[key])
        if lay.tiled_key is not None:
            n = extent[lay.tiled_key]
            size = opts.tile(lay.rows(opts), n)
            pid = kb.program_id(len(self.grid), hint=f"pid_{lay.tiled_key}")
            base = pid if size == 1 else kb.binary(BinaryOp.MUL, pid, kb.const(size, index), hint=f"{lay.tiled_key}_start")
            self.binding[lay.tiled_key] = Dim.make(lay.tiled_key, 0, size, n, base, ceil_div(n, size) * size)
            premake(kb, self.binding[lay.tiled_key])
            self.grid.append(ceil_div(n, size))
        # the chunk's dim goes before the whole dims when memory runs along a whole dim (decoding's v[j, d]),
        # so reductions over the chunk combine whole rows in place instead of gathering columns
        chunk_first = _chunk_first(lay)
        self.fused_order = 1 if chunk_first else 1 + len(lay.whole_keys)
        first_whole = 2 if chunk_first else 1
        grid_tiled = lay.grid_tiled(opts)
        for n_whole, key in enumerate(lay.whole_keys):
            n = extent[key]
            if n == 1 and key not in lay.rank_keys:  # index 0, not a dim (a top-k keeps its list axis)
                self.binding[key] = Fixed(kb.const(0, index), 1)
                continue
            if key in grid_tiled:  # this program's tile of the axis, at pid * size
                size = opts.tile(lay.grid_tile(opts), n)
                tiles = ceil_div(n, size)
                pid = kb.program_id(len(self.grid), hint=f"pid_{key}")
                base = kb.binary(BinaryOp.MUL, pid, kb.const(size, index), hint=f"{key}_start")
                self.binding[key] = Dim.make(key, first_whole + n_whole, size, n, base, tiles * size)
                self.grid.append(tiles)
            else:
                size = opts.tile(max(n, 1), n)
                self.binding[key] = Dim(key, first_whole + n_whole, size, n, None, size > n)
            premake(kb, self.binding[key])
        self.split_pid: t.Value | None = None
        if split:
            self.split_pid = kb.program_id(len(self.grid), hint="pid_split")
            self.grid.append(split)
        self.local_order = 2 + len(lay.whole_keys)  # then the reduced dims of locals, one each

    # -- bindings ---------------------------------------------------------------------------------
    def bind(self, stmt: int, axes: tuple[Axis, ...]) -> dict[str, Binding]:
        """Statement `stmt`'s `axes` bound to the kernel's grid ids and dims."""
        return {a.name: self.binding[self.lay.classes.of(stmt, a)] for a in axes}

    @staticmethod
    def dims(b: dict[str, Binding], axes: tuple[Axis, ...]) -> tuple[Dim, ...]:
        """The tile dims of `axes` under `b`, in canonical order."""
        return ordered(b[a.name] for a in axes if isinstance(b[a.name], Dim))

    def state_binding(self, j: int) -> dict[str, Binding]:
        """State `j`'s buffer axes (with a top-k's rank) bound."""
        st = self.lay.fl.states[j]
        return self.bind(self.lay.state_stmt(j), state_axes(st))

    def state_dims(self, j: int) -> tuple[Dim, ...]:
        """The tile dims of state `j`'s value (a top-k's rank dim included)."""
        st = self.lay.fl.states[j]
        return self.dims(self.state_binding(j), state_axes(st))

    def row_dims(self, j: int) -> tuple[Dim, ...]:
        """The tile dims of state `j`'s `axes` (without a top-k's rank)."""
        return self.dims(self.state_binding(j), self.lay.fl.states[j].axes)

    def rank_dim(self, j: int) -> Dim:
        """The rank dim of running top-k `j`."""
        st = self.lay.fl.states[j]
        assert isinstance(st, TopKState)
        dim = self.state_binding(j)[rank_axis(st).name]
        assert isinstance(dim, Dim)
        return dim

    def positions(self, j: int, lead: list[Binding] | None = None) -> list[Binding | int]:
        """Bindings of state `j`'s buffer dims, after `lead` (a split partial's slice index)."""
        st = self.lay.fl.states[j]
        b = self.state_binding(j)
        return list(lead or []) + [b[a.name] for a in state_axes(st)]

    def finish(self) -> t.TileKernel:
        return self.kb.finish(tuple(self.grid))
