"""Reductions over tile dimensions: one chunk at a time, as `dot` where the term is a product.

`reduce_chunk` folds one chunk of a reduced axis (a `Dim`) into an accumulator;
a sum of ``a * b`` where ``a`` varies over (m, k) and ``b`` over (k, n) and the
result over (m, n) becomes ``dot(a, b, acc)``. `reduce_axes` runs a whole
``op over reduce_axes of value`` as loops over chunks (outer reduced axes one
index at a time, the last one in chunks of `block_k`).
"""
from __future__ import annotations

import math

from ..ir import Axis, Binary, BinaryOp, DType, Expr, Load, ReduceOp, UnaryOp, loads
from ..ir.sizes import divides, is_static
from ..ir.tile import nodes as t
from ..ir.types import float32, float64
from .builder import KernelBuilder
from .exprs import ExprLowering, compute_dtype
from .options import ScheduleOptions, chunk_within_tile
from .space import Binding, Dim, Fixed, Tiled, mask_tile, ordered, place

COMBINE = {op: op.combine for op in ReduceOp}


def shape_of(dims: tuple[Dim, ...]) -> tuple[int, ...]:
    return tuple(d.size for d in dims)


def _dot_operands(lw: ExprLowering, value: Expr, out_dims: tuple[Dim, ...], rdim: Dim,
                  bindings: dict[str, Binding]) -> tuple[t.Value, t.Value, tuple[DType | None, DType | None]] | None:
    """``(a [m,k], b [k,n], held)`` when `value` is such a product over (m, n) = `out_dims`, else None;
    `held`: the 16-bit or narrower float type the program gives each operand it computes (`t.Dot.held`; a load
    is exact as it is)."""
    if not _product_over_2d(value, out_dims):
        return None
    acc_dtype = compute_dtype(value.dtype)
    if not acc_dtype.is_float:
        return None
    x, y = lw.lower_as(value.a, acc_dtype, bindings), lw.lower_as(value.b, acc_dtype, bindings)
    held = tuple(e.dtype if e.dtype.storage_only and not isinstance(e, Load) else None for e in (value.a, value.b))
    m, n = out_dims
    want_a, want_b = {m.key, rdim.key}, {rdim.key, n.key}
    keys = lambda z: {d.key for d in z.dims}  # noqa: E731
    if keys(x) != want_a or keys(y) != want_b:
        x, y, held = y, x, held[::-1]
    if keys(x) != want_a or keys(y) != want_b:
        return None
    kb = lw.kb
    mask = mask_tile(kb, (rdim,))
    operands = []
    for z, first in ((x, m), (y, rdim)):
        v = z.value
        if mask is not None:  # padded lanes of k must add nothing, whatever the operand computed there
            zero = kb.const(0.0, acc_dtype, v.shape)
            v = kb.select(place(kb, Tiled(mask, (rdim,)), z.dims), v, zero, hint=f"{v.name}_k")
        operands.append(v if z.dims[0].key == first.key else kb.permute(v, (1, 0)))
    return operands[0], operands[1], held


def _product_over_2d(value: Expr, out_dims: tuple[Dim, ...]) -> bool:
    """Whether `value` is a product summed into a 2-d output: the shape a `dot` can take."""
    return len(out_dims) == 2 and isinstance(value, Binary) and value.op is BinaryOp.MUL


def _narrow_dot(value: Expr, out_dims: tuple[Dim, ...]) -> bool:
    """Whether the sum of `value` over a reduced axis is a `dot` of low-precision data (f16/bf16/e4m3), whose
    operands `codegen.simt.narrow` hands to tensor cores."""
    return _product_over_2d(value, out_dims) and reads_only_narrow(value)


def reads_only_narrow(value: Expr) -> bool:
    """Whether `value` reads memory, and only 16- or 8-bit floats (f16/bf16/e4m3): what tensor cores take."""
    found = loads(value)
    return bool(found) and all(ld.buffer.dtype.storage_only for ld in found)


def reduce_chunk(lw: ExprLowering, op: ReduceOp, value: Expr, out_dims: tuple[Dim, ...], rdim: Dim,
                 bindings: dict[str, Binding], acc: t.Value | None, hint: str = "part",
                 work: DType | None = None) -> t.Value:
    """``op`` over the lanes of `rdim` of `value`, combined with `acc` (None: no accumulator); `work`: the
    dtype the lanes are combined in where wider than the value's (a long f32 product's f64)."""
    kb = lw.kb
    acc_dtype = work or compute_dtype(value.dtype)
    if op is ReduceOp.SUM:
        pair = _dot_operands(lw, value, out_dims, rdim, bindings)
        if pair is not None:
            return kb.dot(pair[0], pair[1], acc, acc_dtype, hint=f"{hint}_dot", held=pair[2])
    x = lw.lower_as(value, acc_dtype, bindings)
    dims = ordered(out_dims + (rdim,))
    v = place(kb, x, dims)
    mask = mask_tile(kb, (rdim,))
    if mask is not None:
        identity = kb.const(op.identity(value.dtype), acc_dtype, v.shape)
        v = kb.select(place(kb, Tiled(mask, (rdim,)), dims), v, identity, hint=f"{hint}_in")
    partial = kb.reduce(op, v, dims.index(rdim), hint=hint)
    return partial if acc is None else kb.binary(COMBINE[op], acc, partial, hint=f"{hint}_acc")


def compensable(op: ReduceOp, value: Expr) -> bool:
    """Whether a running ``op`` over chunks of `value` may keep a compensation (`compensated_add`): an f32 sum.
    (Each caller leaves out the contractions it lowers as a `dot`, whose accumulator tile takes its chunks in
    the dot itself.)"""
    return op is ReduceOp.SUM and compute_dtype(value.dtype) == float32


def compensated_add(kb: "KernelBuilder", acc: t.Value, comp: t.Value, partial: t.Value, hint: str
                    ) -> tuple[t.Value, t.Value]:
    """``acc + partial`` as a compensated (Kahan) sum: `comp` holds what the running value lost to rounding so
    far, subtracted from the next chunk's partial. A loop adds one chunk partial at a time, a chain of
    ``n / chunk`` additions whose roundings pile up in one direction on long rows (one f32 row of 4M values
    ``1e4 + N(0, 1)`` summed 2.2e-4 off; numpy's pairwise sum 1e-8); compensated, the running value stays
    within an ulp or two of the exact sum of the partials. The compensation is 0 where the new value is not
    finite (``inf - inf`` would make it NaN and poison the next chunk: an infinite or NaN sum stays as plain
    addition makes it), and a partial of 0 leaves both as they are."""
    y = kb.binary(BinaryOp.SUB, partial, comp, hint=f"{hint}_y")
    total = kb.binary(BinaryOp.ADD, acc, y, hint=f"{hint}_sum")
    lost = kb.binary(BinaryOp.SUB, kb.binary(BinaryOp.SUB, total, acc), y, hint=f"{hint}_lost")
    inf, zero = kb.const(float("inf"), float32, total.shape), kb.const(0.0, float32, total.shape)
    finite = kb.binary(BinaryOp.LT, kb.unary(UnaryOp.ABS, total), inf)
    lost = kb.select(finite, lost, zero, hint=f"{hint}_lost_finite")
    # a partial of 0 (a chunk a mask empties) changes nothing, as plain addition's `acc + 0` does: skipping
    # such chunks (`skip_masked`, `skip_exact`) stays bit for bit the loop that visits them
    nothing = kb.binary(BinaryOp.EQ, partial, zero)
    return (kb.select(nothing, acc, total, hint=f"{hint}_acc"),
            kb.select(nothing, comp, lost, hint=f"{hint}_comp"))


def reduce_axes(lw: ExprLowering, opts: ScheduleOptions, op: ReduceOp, value: Expr, out_dims: tuple[Dim, ...],
                bindings: dict[str, Binding], axes: tuple[Axis, ...], order: int, hint: str) -> Tiled:
    """``op over axes of value`` placed on `out_dims`; new dims get canonical position `order`."""
    kb = lw.kb
    acc_dtype = compute_dtype(value.dtype)
    if not axes:  # a reduction over no axis is the value itself
        return Tiled(place(kb, lw.lower_as(value, acc_dtype, bindings), out_dims), out_dims)
    init = kb.const(op.identity(value.dtype), acc_dtype, shape_of(out_dims), hint=f"{hint}_init")
    if any(a.extent == 0 for a in axes):
        return Tiled(init, out_dims)
    return Tiled(_nest(lw, opts, op, value, out_dims, dict(bindings), axes, order, hint, init, True), out_dims)


def _nest(lw: ExprLowering, opts: ScheduleOptions, op: ReduceOp, value: Expr, out_dims: tuple[Dim, ...],
          bindings: dict[str, Binding], axes: tuple[Axis, ...], order: int, hint: str, acc: t.Value, pristine: bool) -> t.Value:
    kb = lw.kb
    axis, rest = axes[0], axes[1:]
    if rest:  # an outer reduced axis: one index per trip
        if axis.extent == 1:
            bindings[axis.name] = Fixed(kb.const(0, kb.index_dtype), 1)
            return _nest(lw, opts, op, value, out_dims, bindings, rest, order, hint, acc, pristine)
        with kb.loop(0, axis.extent, 1, (acc,), hint=axis.name, arg_hints=(f"{hint}_run",)) as lp:
            bindings[axis.name] = Fixed(lp.iv, axis.extent)
            lp.yield_(_nest(lw, opts, op, value, out_dims, bindings, rest, order, hint, lp.args[0], False))
        return lp.results[0]
    size = opts.chunk(axis.extent, _narrow_dot(value, out_dims))
    if opts.pow2 and opts.block_k is None and not (_product_over_2d(value, out_dims)
                                                    and compute_dtype(value.dtype).is_float):
        # (a GPU chunk this reduction materializes whole: at most `CHUNK_TILE` elements with the output tile)
        size = chunk_within_tile(size, math.prod(d.size for d in out_dims))
    if is_static(axis.extent) and size >= axis.extent:  # one chunk covers the axis: no loop
        dim = Dim(f"{hint}.{axis.name}", order, size, axis.extent, None, size > axis.extent)
        bindings[axis.name] = dim
        return reduce_chunk(lw, op, value, out_dims, dim, bindings, None if pristine else acc, hint)
    if compensable(op, value) and not _product_over_2d(value, out_dims):
        comp0 = kb.const(0.0, float32, acc.shape, hint=f"{hint}_comp0")
        with kb.loop(0, axis.extent, size, (acc, comp0), hint=axis.name,
                     arg_hints=(f"{hint}_run", f"{hint}_comp_run")) as lp:
            dim = Dim(f"{hint}.{axis.name}", order, size, axis.extent, lp.iv, not divides(size, axis.extent))
            bindings[axis.name] = dim
            partial = reduce_chunk(lw, op, value, out_dims, dim, bindings, None, hint)
            lp.yield_(*compensated_add(kb, lp.args[0], lp.args[1], partial, hint))
        return lp.results[0]
    # a long f32 product multiplies in f64: products of values near 1 round with a bias (the grid below 1 is twice
    # as fine as above it), and 2^22 values of 1 +- 5e-5 came out 3% low (numpy's own 0.2-0.4%; found by a
    # helper); in f64 it is the exact product rounded once
    work = float64 if op is ReduceOp.PROD and compute_dtype(value.dtype) == float32 else None
    start = acc if work is None else kb.cast(acc, work, hint=f"{hint}_wide")
    with kb.loop(0, axis.extent, size, (start,), hint=axis.name, arg_hints=(f"{hint}_run",)) as lp:
        dim = Dim(f"{hint}.{axis.name}", order, size, axis.extent, lp.iv, not divides(size, axis.extent))
        bindings[axis.name] = dim
        lp.yield_(reduce_chunk(lw, op, value, out_dims, dim, bindings, lp.args[0], hint, work=work))
    return lp.results[0] if work is None else kb.cast(lp.results[0], float32, hint=f"{hint}_f32")
