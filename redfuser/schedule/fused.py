"""A fused loop (plus the epilogue nests that read its states pointwise) as one kernel.

The axes every online state shares go to the grid, the last of them tiled by
``block_m`` (query rows in attention); axes only some states have (the head
dimension of attention's ``acc``) stay whole inside the tile. One ``for`` walks
the fused axis in chunks of ``block_n``, carrying the states; per chunk it
computes the locals, then updates the states in cascade order exactly as
`OnlineState` says:

    scaled = prev if no rescale else select(prev == identity, prev, prev * r)
    SUM:     new = scaled + partial
    MAX/MIN: new = maximum/minimum(scaled, partial)

where ``partial`` is the chunk's reduction of the term (a ``dot`` when the term is
a product such as ``exp(s - m) * v``). After the loop the epilogue runs on the
final tiles; only values needed outside the kernel are stored.
"""
from __future__ import annotations

from ..ir import BinaryOp, Compute, DType, FusedLoop, InternalError, ReduceOp, Reduce
from ..ir import tile as t
from .builder import KernelBuilder
from .exprs import ExprLowering, compute_dtype, store_tile
from .nests import _ceil_div, premake
from .options import ScheduleOptions
from .reduce import reduce_axes, reduce_chunk, shape_of
from .space import Binding, Dim, Fixed, Tiled, ordered, place
from .unify import AxisClasses, Unfusable, unify


def _layout(fl: FusedLoop, epilogue: list[Compute], classes: AxisClasses) -> tuple[list[str], str | None, list[str], str]:
    """(grid classes, tiled class, whole classes, fused class) of the kernel."""
    n_locals = len(fl.locals)
    state_keys = [[classes.of(n_locals + j, a) for a in st.axes] for j, st in enumerate(fl.states)]
    fused = classes.of(n_locals, fl.axis) if fl.states else classes.of(0, fl.axis)
    shared = [c for c in state_keys[0] if all(c in ks for ks in state_keys)] if state_keys else []
    seen: list[str] = []
    for keys in state_keys:
        seen += keys
    for n, local in enumerate(fl.locals):
        seen += [classes.of(n, a) for a in local.axes]
    for j, c in enumerate(epilogue):
        seen += [classes.of(n_locals + len(fl.states) + j, a) for a in c.axes]
    whole = [c for c in dict.fromkeys(seen) if c not in shared and c != fused]
    return shared[:-1], (shared[-1] if shared else None), whole, fused


def fused_kernel(fl: FusedLoop, epilogue: list[Compute], needed: set[str], name: str, opts: ScheduleOptions,
                 index: DType) -> t.TileKernel:
    """The kernel of `fl` and `epilogue`; stores exactly the buffers named in `needed`."""
    try:
        classes = unify(fl, epilogue)
    except Unfusable as why:
        raise InternalError(f"cannot tile fused loop over {fl.axis.name}: {why}", pass_name="schedule") from None
    grid_keys, tiled_key, whole_keys, fused_key = _layout(fl, epilogue, classes)
    if tiled_key is not None and classes.extent[tiled_key] == 1:  # nothing to tile: one program per row
        grid_keys, tiled_key = grid_keys + [tiled_key], None
    kb = KernelBuilder(name, index)
    lw = ExprLowering(kb)
    binding: dict[str, Binding] = {}
    grid: list[int] = []
    for key in grid_keys:
        binding[key] = Fixed(kb.program_id(len(grid), hint=f"pid_{key}"), classes.extent[key])
        grid.append(classes.extent[key])
    if tiled_key is not None:
        extent = classes.extent[tiled_key]
        size = opts.tile(opts.block_m, extent)
        pid = kb.program_id(len(grid), hint=f"pid_{tiled_key}")
        base = pid if size == 1 else kb.binary(BinaryOp.MUL, pid, kb.const(size, index), hint=f"{tiled_key}_start")
        binding[tiled_key] = Dim(tiled_key, 0, size, extent, base, _ceil_div(extent, size) * size > extent)
        premake(kb, binding[tiled_key])
        grid.append(_ceil_div(extent, size))
    for n, key in enumerate(whole_keys):
        extent = classes.extent[key]
        if extent == 1:  # a length-1 axis is index 0, not a tile dimension
            binding[key] = Fixed(kb.const(0, index), 1)
            continue
        size = opts.tile(max(extent, 1), extent)
        binding[key] = Dim(key, 1 + n, size, extent, None, size > extent)
        premake(kb, binding[key])
    fused_order = 1 + len(whole_keys)

    def bind(stmt: int, axes) -> dict[str, Binding]:
        return {a.name: binding[classes.of(stmt, a)] for a in axes}

    def tile_dims(b: dict[str, Binding], axes) -> tuple[Dim, ...]:
        return ordered(b[a.name] for a in axes if isinstance(b[a.name], Dim))

    n_locals = len(fl.locals)
    state_dims = [tile_dims(bind(n_locals + j, st.axes), st.axes) for j, st in enumerate(fl.states)]
    inits = tuple(kb.const(st.op.identity(st.acc.dtype), compute_dtype(st.acc.dtype), shape_of(dims),
                           hint=f"{st.acc.name}0") for st, dims in zip(fl.states, state_dims))
    n = fl.axis.extent
    size = opts.tile(opts.block_n, n)
    with kb.loop(0, n, size, inits, hint=fused_key, arg_hints=tuple(st.prev.name for st in fl.states)) as lp:
        kdim = Dim(fused_key, fused_order, size, n, lp.iv, n % size != 0)
        binding[fused_key] = kdim
        for st, arg, dims in zip(fl.states, lp.args, state_dims):
            lw.tiles[st.prev.name] = lw.tiles[st.acc.name] = Tiled(arg, dims)
        for i, local in enumerate(fl.locals):
            b = bind(i, local.axes)
            dims = tile_dims(b, local.axes)
            if isinstance(local, Reduce):
                value = reduce_axes(lw, opts, local.op, local.value, dims, b, local.reduce_axes,
                                    fused_order + 1 + i, hint=local.out.name).value
            else:
                value = place(kb, lw.lower(local.value, b), dims)
            lw.tiles[local.out.name] = Tiled(value, dims)
        news = []
        for j, (st, prev, dims) in enumerate(zip(fl.states, lp.args, state_dims)):
            b = bind(n_locals + j, st.axes + (fl.axis,))
            acc = prev
            if st.rescale is not None:
                d = compute_dtype(st.acc.dtype)
                r = place(kb, lw.lower_as(st.rescale, d, b), dims)
                scaled = kb.binary(BinaryOp.MUL, prev, r, hint=f"{st.acc.name}_scaled")
                # the identity stays put (-inf * 0 must stay -inf; 0 * NaN must stay 0)
                empty = kb.binary(BinaryOp.EQ, prev, kb.const(st.op.identity(st.acc.dtype), d, r.shape))
                acc = kb.select(empty, prev, scaled, hint=f"{st.acc.name}_rescaled")
            new = reduce_chunk(lw, st.op, st.term, dims, kdim, b, acc, hint=st.acc.name)
            lw.tiles[st.acc.name] = Tiled(new, dims)
            news.append(new)
        lp.yield_(*news)
    for j, (st, result, dims) in enumerate(zip(fl.states, lp.results, state_dims)):
        lw.tiles[st.acc.name] = Tiled(result, dims)
        lw.tiles.pop(st.prev.name, None)
        if st.acc.name in needed:
            b = bind(n_locals + j, st.axes)
            store_tile(kb, st.acc, lw.tiles[st.acc.name], [b[a.name] for a in st.axes])
    for j, c in enumerate(epilogue):
        b = bind(n_locals + len(fl.states) + j, c.axes)
        dims = tile_dims(b, c.axes)
        lw.tiles[c.out.name] = Tiled(place(kb, lw.lower(c.value, b), dims), dims)
        if c.out.name in needed:
            store_tile(kb, c.out, lw.tiles[c.out.name], [b[a.name] for a in c.axes])
    return kb.finish(tuple(grid))


def joins(fl: FusedLoop, epilogue: list[Compute], candidate: Compute) -> bool:
    """Whether `candidate` can run in `fl`'s kernel after `epilogue`: it reads the kernel's tiles pointwise
    and adds no axis of its own."""
    from .unify import Unfusable

    try:
        classes = unify(fl, epilogue + [candidate])
    except Unfusable:
        return False
    grid_keys, tiled_key, whole_keys, _ = _layout(fl, epilogue, classes)
    known = set(grid_keys) | set(whole_keys) | ({tiled_key} if tiled_key else set())
    me = len(fl.locals) + len(fl.states) + len(epilogue)
    return all(classes.of(me, a) in known for a in candidate.axes)
