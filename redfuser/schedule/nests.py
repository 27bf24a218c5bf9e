"""One kernel per unfused loop nest (`Compute` or `Reduce`).

Leading axes go to the grid, one program per index; the last one or two
parallel axes are tiled (``block_m`` x ``block_n``, masks on ragged edges).
A `Reduce` tiles its last parallel axis by ``block_m`` (both last axes when it is
a matmul, which becomes ``dot``) and loops over chunks of its reduced axes.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Axis, Binary, BinaryOp, Compute, DType, Load, Reduce, loads, walk
from ..ir.tile import nodes as t
from ..ir.sizes import SizeLike, ceil_div
from .builder import KernelBuilder
from .exprs import ExprLowering, footprint, store_tile
from .options import ScheduleOptions, gemm_rows
from .reduce import reduce_axes
from .space import Binding, Dim, Fixed, index_tile, mask_tile


def premake(kb: KernelBuilder, dim: Dim) -> None:
    """Build a kernel-wide dim's indices and mask up front, so every loop reuses them."""
    index_tile(kb, dim)
    mask_tile(kb, (dim,))


def bind_grid(kb: KernelBuilder, grid_axes: tuple[Axis, ...], tiled: list[tuple[Axis, int, int]]
              ) -> tuple[dict[str, Binding], list[int]]:
    """Program ids for `grid_axes` (one index each) and for tiles of `tiled` ``(axis, size, order)``."""
    bindings: dict[str, Binding] = {}
    grid: list[SizeLike] = []
    for a in grid_axes:
        bindings[a.name] = Fixed(kb.program_id(len(grid), hint=f"pid_{a.name}"), a.extent)
        grid.append(a.extent)
    for a, size, order in tiled:
        pid = kb.program_id(len(grid), hint=f"pid_{a.name}")
        tiles = ceil_div(a.extent, size)
        base = pid if size == 1 else kb.binary(BinaryOp.MUL, pid, kb.const(size, kb.index_dtype), hint=f"{a.name}_start")
        bindings[a.name] = Dim.make(a.name, order, size, a.extent, base, tiles * size)
        premake(kb, bindings[a.name])
        grid.append(tiles)
    return bindings, grid


def compute_kernel(s: Compute, name: str, opts: ScheduleOptions, index: DType) -> t.TileKernel:
    """``out[axes] = value`` as tiles of its last two axes."""
    kb = KernelBuilder(name, index)
    axes = s.axes
    if len(axes) >= 2:
        tiled = [(axes[-2], opts.tile(opts.rows(), axes[-2].extent), 0),
                 (axes[-1], opts.tile(opts.columns(), axes[-1].extent), 1)]
    elif axes:
        tiled = [(axes[-1], opts.tile(opts.rows() * opts.columns(), axes[-1].extent), 0)]
    else:
        tiled = []
    bindings, grid = bind_grid(kb, axes[: len(axes) - len(tiled)], tiled)
    lw = ExprLowering.of(kb, opts)
    value = lw.lower(s.value, bindings)
    store_tile(kb, s.out, value, [bindings[a.name] for a in axes])
    return kb.finish(tuple(grid))


def is_matmul(s: Reduce) -> bool:
    """A sum over the last reduced axis of ``a * b``, `a` free of the last parallel axis and `b` of the one before."""
    v = s.value
    if s.op.value != "sum" or len(s.axes) < 2 or not s.reduce_axes or not (isinstance(v, Binary) and v.op is BinaryOp.MUL):
        return False
    m, n, k = s.axes[-2].name, s.axes[-1].name, s.reduce_axes[-1].name
    a, b = footprint(v.a)[0], footprint(v.b)[0]
    return any(k in x and k in y and m in x and n not in x and n in y and m not in y for x, y in ((a, b), (b, a)))


def _reduced_innermost(s: Reduce) -> bool:
    """Whether the loads read their innermost dimension along the last reduced axis (then it goes last)."""
    r = s.reduce_axes[-1].name if s.reduce_axes else None
    inner = [n.indices[-1] for n in walk(s.value) if isinstance(n, Load) and n.indices]
    if any(isinstance(i, Axis) and i.name == r for i in inner):
        return True
    return not any(isinstance(i, Axis) and i.name == s.axes[-1].name for i in inner) if s.axes else True


def matmul_tile(s: Reduce, opts: ScheduleOptions) -> tuple[int, int, ScheduleOptions]:
    """(rows, columns) of a matmul's output tile and the options its contraction's chunks follow:
    ``block_m`` x ``block_n`` and ``block_k``, or on the cpu `ScheduleOptions.gemm_tile`'s 256 x 512 tile and
    512-long chunks (`options.GEMM_TILE`; `half_gemm_tile` for 16-bit floats; rows halved while a static grid would idle a worker: `options.gemm_rows`), the tile a
    fused GEMM state takes: the host GEMM core's register blocks and the right operand's panels are
    amortized over it (a 1024^3 f32 GEMM on one AVX2 core: docs/cpu-backend.md)."""
    m, n = s.axes[-2], s.axes[-1]
    tile = opts.matmul_tile(all(ld.buffer.dtype.itemsize == 2 for ld in loads(s.value)))
    if tile is None:
        return opts.tile(opts.rows(), m.extent), opts.tile(opts.columns(), n.extent), opts
    rows, chunk, cols = tile
    cols = opts.tile(cols, n.extent)
    batch: SizeLike = 1
    for a in s.axes[:-2]:
        batch = batch * a.extent
    rows = gemm_rows(rows, lambda r: batch * ceil_div(m.extent, opts.tile(r, m.extent)) * ceil_div(n.extent, cols),
                     opts.workers)
    return opts.tile(rows, m.extent), cols, replace(opts, block_k=chunk)


def reduce_kernel(s: Reduce, name: str, opts: ScheduleOptions, index: DType) -> t.TileKernel:
    """``out[axes] = op over reduce_axes of value``; matmuls tile (m, n) and become ``dot``."""
    kb = KernelBuilder(name, index)
    axes = s.axes
    if is_matmul(s):
        rows, cols, opts = matmul_tile(s, opts)
        tiled = [(axes[-2], rows, 0), (axes[-1], cols, 1)]
    elif axes:
        tiled = [(axes[-1], opts.tile(opts.rows(), axes[-1].extent), 0)]
    else:
        tiled = []
    bindings, grid = bind_grid(kb, axes[: len(axes) - len(tiled)], tiled)
    out_dims = tuple(b for b in (bindings[a.name] for a, _, _ in tiled))
    order = len(tiled) if _reduced_innermost(s) else -1
    lw = ExprLowering.of(kb, opts)
    value = reduce_axes(lw, opts, s.op, s.value, out_dims, bindings, s.reduce_axes, order, hint=s.out.name)
    store_tile(kb, s.out, value, [bindings[a.name] for a in axes])
    return kb.finish(tuple(grid))
