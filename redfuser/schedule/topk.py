"""Top-k on tiles: the candidates of a chunk, the running list's update, and the kernel of a `TopK` nest.

A chunk's candidates are the term's values over (rows..., chunk) with their
positions along the ranked axis as i64 indices; lanes past the axis' end get
index -1, so the Tile IR `TopK` op never keeps them. Values are ranked in
`rank_dtype`: f32 for f32 and the narrow floats (rounded to their own type
first, so ties the reference sees stay ties), f64 for f64, i32 and bool (exact).
The list is carried with its rank axis in the tile's canonical dim order; the
`TopK` op here ranks along the last dim, so the candidates and the list are
permuted there and back (identities when the chunk and the rank are the last
dims already, as in MoE routing).
"""
from __future__ import annotations

from ..ir import BackendError, BinaryOp, DType, Expr, TopK
from ..ir.loop.rewrite import ranked_key
from ..ir.sizes import divides, is_static
from ..ir.source import UNKNOWN, SourceLoc
from ..ir.tile import nodes as t
from ..ir.types import float32, float64, int32, int64
from .builder import KernelBuilder
from .exprs import ExprLowering, store_tile
from .nests import bind_grid
from .options import ScheduleOptions
from .space import Binding, Dim, Tiled, index_tile, mask_tile, ordered, place


def rank_dtype(d: DType) -> DType:
    """The float type values of dtype `d` are ranked in (exactly, see the module docstring)."""
    if d == int64:
        raise BackendError("ranking int64 values (rf.topk, rf.argmax, rf.argmin) is not compiled: their float64 "
                           "ranking key rounds; use backend='interpret', or int32 values")
    if d == float64 or d == int32 or d.is_bool:
        return float64
    return float32


def ranked_values(lw: ExprLowering, e: Expr, b: dict[str, Binding], results: frozenset[str] = frozenset()) -> Tiled:
    """`e` lowered rounded where numpy rounds it (`ir.loop.rewrite.ranked_key`: a ranking decides; `results` the
    buffers earlier statements computed, which `e` may read from memory), rounded to its own dtype when that is
    narrow, in `rank_dtype`."""
    x = lw.lower(ranked_key(e, results | lw.unrounded, lw.extrema), b)
    v = x.value
    if e.dtype.storage_only:
        v = lw.kb.cast(lw.kb.cast(v, e.dtype), float32)
    return Tiled(lw.kb.cast(v, rank_dtype(e.dtype)), x.dims)


def candidate_indices(kb: KernelBuilder, kdim: Dim, dims: tuple[Dim, ...]) -> t.Value:
    """Positions of `kdim`'s lanes as i64, -1 past the axis' end, placed on `dims`."""
    idx = kb.cast(index_tile(kb, kdim).value, int64, hint=f"{kdim.key}_pos")
    mask = mask_tile(kb, (kdim,))
    if mask is not None:
        idx = kb.select(mask, idx, kb.const(-1, int64, idx.shape), hint=f"{kdim.key}_cand")
    return place(kb, Tiled(idx, (kdim,)), dims)


def empty_list(kb: KernelBuilder, dtype: DType, dims: tuple[Dim, ...], hint: str) -> tuple[t.Value, t.Value]:
    """k empty slots (NaN, -1) over `dims`."""
    shape = tuple(d.size for d in dims)
    return kb.const(float("nan"), dtype, shape, hint=f"{hint}0"), kb.const(-1, int64, shape, hint=f"{hint}_idx0")


def update_list(kb: KernelBuilder, values: t.Value, indices: t.Value, rows: tuple[Dim, ...], kdim: Dim,
                acc: tuple[t.Value, t.Value], dims: tuple[Dim, ...], rank: Dim, hint: str,
                loc: SourceLoc = UNKNOWN) -> tuple[t.Value, t.Value]:
    """The list `acc` (on `dims`, rank included) merged with candidates (`values`, `indices` on rows + kdim)."""
    last = tuple(d for d in dims if d.key != rank.key) + (rank,)
    to_last = tuple(dims.index(d) for d in last)
    acc_v, acc_i = kb.permute(acc[0], to_last), kb.permute(acc[1], to_last)
    cand = ordered(rows + (kdim,))
    chunk_last = tuple(n for n, d in enumerate(cand) if d.key != kdim.key) + (cand.index(kdim),)
    values, indices = kb.permute(values, chunk_last), kb.permute(indices, chunk_last)
    v, i = kb.topk(values, indices, len(cand) - 1, rank.size, (acc_v, acc_i), hint=hint, loc=loc)
    back = tuple(last.index(d) for d in dims)
    return kb.permute(v, back), kb.permute(i, back)


def rescale_list(kb: KernelBuilder, values: t.Value, r: t.Value) -> t.Value:
    """A list's values times the positive factor `r` (empty slots hold NaN and stay NaN)."""
    return kb.binary(BinaryOp.MUL, values, r, hint=f"{values.name}_scaled")


def topk_kernel(s: TopK, name: str, opts: ScheduleOptions, index: DType,
                needed: frozenset[str] | set[str] | None = None, results: frozenset[str] = frozenset()) -> t.TileKernel:
    """``values, indices = top k over reduce_axis of value``: rows tiled, the axis in chunks of ``block_k``;
    stores the buffers in `needed` (None: both; a program may use only the values or only the indices).
    `results`: the buffers earlier statements of the program computed (`ranked_values`)."""
    kb = KernelBuilder(name, index)
    par = s.parallel
    tiled = [(par[-1], opts.tile(opts.rows(), par[-1].extent), 0)] if par else []
    bindings, grid = bind_grid(kb, par[: len(par) - len(tiled)], tiled)
    rows = tuple(b for b in (bindings[a.name] for a, _, _ in tiled) if isinstance(b, Dim))
    k = opts.tile(s.k, s.k)   # a power of two on the GPU: the extra slots rank below the k stored
    rank = Dim(f"{s.values.name}.rank", 1, k, s.k, None, k > s.k)
    dims = ordered(rows + (rank,))
    lw = ExprLowering.of(kb, opts)
    d = rank_dtype(s.values.dtype)
    acc = empty_list(kb, d, dims, s.values.name)
    n = s.reduce_axis.extent
    size = opts.tile(opts.k_block(), n)

    def chunk(kdim: Dim, acc: tuple[t.Value, t.Value]) -> tuple[t.Value, t.Value]:
        b = dict(bindings)
        b[s.reduce_axis.name] = kdim
        cand = ordered(rows + (kdim,))
        values = place(kb, ranked_values(lw, s.value, b, results), cand)
        return update_list(kb, values, candidate_indices(kb, kdim, cand), rows, kdim, acc, dims, rank, s.values.name,
                           loc=s.loc)

    if is_static(n) and size >= n:
        acc = chunk(Dim(f"{s.values.name}.{s.reduce_axis.name}", 2, size, n, None, size > n), acc)
    else:
        with kb.loop(0, n, size, acc, hint=s.reduce_axis.name,
                     arg_hints=(f"{s.values.name}_run", f"{s.indices.name}_run")) as lp:
            kdim = Dim(f"{s.values.name}.{s.reduce_axis.name}", 2, size, n, lp.iv, not divides(size, n))
            lp.yield_(*chunk(kdim, lp.args))
        acc = lp.results
    positions: list[Binding | int] = [rank if i == s.rank else bindings[a.name] for i, a in enumerate(s.axes)]
    for buffer, tile in ((s.values, acc[0]), (s.indices, acc[1])):
        if needed is None or buffer.name in needed:
            store_tile(kb, buffer, Tiled(tile, dims), positions)
    return kb.finish(tuple(grid))
