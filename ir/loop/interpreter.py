"""The numpy interpreter of the Loop IR: the executable semantics (the oracle).

Each loop nest runs vectorized: an expression is evaluated over the nest's
iteration space as one numpy array per node, with a dimension per axis (size 1
where the node does not depend on that axis), so no Python loop runs per
element. Sums of products of two operands (matmul-shaped reductions) go through
`numpy.matmul` instead of materializing the whole iteration space.

Evaluation is a rule table keyed by node type (no visitor class hierarchy).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import ml_dtypes
import numpy as np

from .expr import (Axis, Binary, Cast, Computed, Const, Expr, IndexExpr, IndexValue, Length, Load, Select, Strided, Unary,
                   contraction, walk)
from ..semantics import BINARY_FUNCS, REDUCERS, UNARY_FUNCS, BinaryOp, ReduceOp
from .. import topk as topk_semantics
from .index import index_value
from .rewrite import decisions_decided, in_work_precision, read_as_held, reads
from .rescale_error import SERIES, SMALL_STEP, exponent_of, rescale_corrected
from .nodes import Compute, FusedLoop, OnlineState, Program, Reduce, Stmt, TopK, TopKState, written
from ..types import from_numpy

Space = tuple[Axis, ...]


class Env(dict):
    """Buffer name -> array, plus the chunk window of a fused loop being run.

    Inside a `FusedLoop`, `window` is ``(axis name, start, stop)``: loads of global
    buffers along that axis read ``start:stop``; buffers in `chunk_local` were
    computed for the chunk only and are read whole.
    """

    window: tuple[str, int, int] | None = None
    chunk_local: frozenset[str] = frozenset()

    def child(self, window: tuple[str, int, int], chunk_local: frozenset[str]) -> "Env":
        env = Env(self)
        env.window, env.chunk_local = window, chunk_local
        return env


DEFAULT_CHUNK = 64
"""Chunk length the interpreter runs fused loops with (an option of the interpret backend)."""


def load_array(arr: np.ndarray, indices: tuple[IndexExpr, ...], space: Space,
               window: tuple[str, int, int] | None = None, env: "Env | None" = None) -> np.ndarray:
    """``arr[indices]`` laid out over `space`: one dim per axis, size 1 where unused.

    With a `window` ``(axis, start, stop)``, dims indexed by that axis read ``start:stop``
    (the axis in `space` then has extent ``stop - start``). A strided or computed index reads its
    positions, clamped into the dim (`Strided`, `Computed`); a computed one reading data (a gather)
    evaluates in `env`.
    """
    def span(a: Axis) -> tuple[int, int]:
        return (window[1], window[2]) if window is not None and a.name == window[0] else (0, a.extent)

    named = [i.name for i in indices if isinstance(i, Axis)]
    if any(isinstance(i, Strided | Computed) for i in indices) or len(set(named)) < len(named):
        return _gather(arr, indices, space, window, env)      # (an axis twice, s[i, i]: a diagonal)

    def pick(i: Axis | int):
        if isinstance(i, int):
            return i
        lo, hi = span(i)
        return slice(None) if (lo, hi) == (0, i.extent) else slice(lo, hi)

    picked = arr[tuple(pick(i) for i in indices)]  # type: ignore[arg-type]
    used = [i for i in indices if isinstance(i, Axis)]
    position = {a.name: n for n, a in enumerate(space)}
    order = sorted(range(len(used)), key=lambda n: position[used[n].name])
    picked = picked.transpose(order)
    present = {used[n].name for n in order}
    return picked.reshape([a.extent if a.name in present else 1 for a in space])


def _gather(arr: np.ndarray, indices: tuple[IndexExpr, ...], space: Space,
            window: tuple[str, int, int] | None, env: "Env | None") -> np.ndarray:
    """`load_array` by positions: each dim's positions as an array over `space`, then one numpy gather."""
    if env is None:
        env = Env()
        env.window = window
    positions = []
    for dim, i in enumerate(indices):
        if isinstance(i, int):
            positions.append(np.intp(i))
            continue
        at = evaluate(index_value(i), env, space).astype(np.intp)
        positions.append(np.clip(at, 0, arr.shape[dim] - 1))
    shape = np.broadcast_shapes(*(np.shape(p) for p in positions), (1,) * len(space))
    return arr[tuple(positions)].reshape(shape)


def _const(e: Const, env: Env, space: Space) -> np.ndarray:
    return np.full((1,) * len(space), e.value, dtype=e.dtype.numpy)


def _length(e: Length, env: Env, space: Space) -> np.ndarray:
    # (the interpreter runs a program whose probes are the call's lengths: `sizes` are ints)
    return np.full((1,) * len(space), e.count, dtype=e.dtype.numpy)


def _index_value(e: IndexValue, env: Env, space: Space) -> np.ndarray:
    shape = [a.extent if a.name == e.axis.name else 1 for a in space]
    lo, hi = 0, e.axis.extent
    if env.window is not None and env.window[0] == e.axis.name:
        lo, hi = env.window[1], env.window[2]
    return np.arange(lo, hi, dtype=e.dtype.numpy).reshape(shape)


def _load(e: Load, env: Env, space: Space) -> np.ndarray:
    window = None if e.buffer.name in env.chunk_local else env.window
    return load_array(env[e.buffer.name], e.indices, space, window, env)


def _unary(e: Unary, env: Env, space: Space) -> np.ndarray:
    return UNARY_FUNCS[e.op](evaluate(e.x, env, space)).astype(e.dtype.numpy, copy=False)


def _binary(e: Binary, env: Env, space: Space) -> np.ndarray:
    a, b = evaluate(e.a, env, space), evaluate(e.b, env, space)
    return BINARY_FUNCS[e.op](a, b).astype(e.dtype.numpy, copy=False)


def _select(e: Select, env: Env, space: Space) -> np.ndarray:
    c, a, b = (evaluate(x, env, space) for x in (e.cond, e.a, e.b))
    return np.where(c, a, b).astype(e.dtype.numpy, copy=False)


def _cast(e: Cast, env: Env, space: Space) -> np.ndarray:
    return evaluate(e.x, env, space).astype(e.dtype.numpy)


EVAL_RULES: dict[type, Callable[..., np.ndarray]] = {
    Const: _const,
    IndexValue: _index_value,
    Length: _length,
    Load: _load,
    Unary: _unary,
    Binary: _binary,
    Select: _select,
    Cast: _cast,
}


def evaluate(e: Expr, env: Env, space: Space) -> np.ndarray:
    """`e` over the iteration `space` (broadcastable: size 1 on axes it does not read)."""
    with np.errstate(all="ignore"):
        return EVAL_RULES[type(e)](e, env, space)


def _matmul_reduce(s: Reduce, env: Env, work: np.dtype | None = None) -> np.ndarray | None:
    """A sum over products of two operands as one `numpy.matmul`, or None if not that shape.

    `work`: the dtype the products are summed and returned in (a fused loop's f32 running state for
    16-bit operands: one chunk's sum must not be rounded to 16 bits); None: the product's dtype."""
    v = s.value
    if s.op is not ReduceOp.SUM or not (isinstance(v, Binary) and v.op is BinaryOp.MUL):
        return None
    space = s.axes + s.reduce_axes
    a, b = evaluate(v.a, env, space), evaluate(v.b, env, space)
    npar = len(s.axes)
    if any(a.shape[d] != b.shape[d] or a.shape[d] != space[d].extent for d in range(npar, len(space))):
        return None  # a reduced axis one operand does not read: not a contraction
    batch = [d for d in range(npar) if a.shape[d] == b.shape[d]]
    rows = [d for d in range(npar) if a.shape[d] != 1 and b.shape[d] == 1]  # != 1: a 0-length dim too
    cols = [d for d in range(npar) if b.shape[d] != 1 and a.shape[d] == 1]
    red = list(range(npar, len(space)))
    nrow = int(np.prod([a.shape[d] for d in rows], dtype=np.int64))
    ncol = int(np.prod([b.shape[d] for d in cols], dtype=np.int64))
    nred = int(np.prod([a.shape[d] for d in red], dtype=np.int64))
    a2 = a.transpose(batch + rows + cols + red).reshape([a.shape[d] for d in batch] + [nrow, nred])
    b2 = b.transpose(batch + red + rows + cols).reshape([b.shape[d] for d in batch] + [nred, ncol])
    if work is not None:
        a2, b2 = a2.astype(work, copy=False), b2.astype(work, copy=False)
    with np.errstate(all="ignore"):
        out = np.matmul(a2, b2)
    bshape = list(out.shape[: len(batch)])
    out = out.reshape(bshape + [a.shape[d] for d in rows] + [b.shape[d] for d in cols])
    order = batch + rows + cols
    out = out.transpose([order.index(d) for d in range(npar)])
    return out.astype(work if work is not None else v.dtype.numpy, copy=False)


def run_topk(s: TopK, env: Env) -> dict[str, np.ndarray]:
    """Execute a top-k nest; return its values and indices."""
    space = s.parallel + (s.reduce_axis,)
    full = np.broadcast_to(evaluate(s.value, env, space), [a.extent for a in space])
    values, indices = topk_semantics.topk(full, s.k, axis=-1)
    return {s.values.name: np.ascontiguousarray(np.moveaxis(values, -1, s.rank)),
            s.indices.name: np.ascontiguousarray(np.moveaxis(indices, -1, s.rank))}


def identity(op: ReduceOp, dtype: np.dtype) -> np.ndarray:
    """`op`'s identity as a value of `dtype`.

    A float type without infinities (float8 e4m3fn) cannot hold max's ``-inf``: cast, it is NaN, which
    poisons every max. Its lowest finite value is the identity there instead (max(lowest, x) == x for
    every value of the type, and NaN still propagates); likewise its highest for min.
    """
    value = op.identity(from_numpy(dtype))
    if isinstance(value, float) and np.isinf(value) and np.isnan(np.asarray(value).astype(dtype)):
        value = float(np.copysign(float(ml_dtypes.finfo(dtype).max), value))  # np.finfo knows it from ml_dtypes 0.7 on
    return np.asarray(value).astype(dtype)


def rescale_partial(op: ReduceOp, part: np.ndarray, r: np.ndarray | None) -> np.ndarray:
    """A partial state times its rescale `r`; the monoid's identity stays itself (see `OnlineState`)."""
    if r is None:
        return part
    identity_value = identity(op, part.dtype)
    return np.where(part == identity_value, part, part * np.broadcast_to(r, part.shape))


def combine(op: ReduceOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a (+) b`` for the monoid `op` (max/min propagate NaN, like numpy)."""
    if op is ReduceOp.SUM:
        return a + b
    if op is ReduceOp.PROD:
        return a * b
    return (np.maximum if op is ReduceOp.MAX else np.minimum)(a, b)


def rescale_list(values: np.ndarray, indices: np.ndarray, r: np.ndarray | None) -> np.ndarray:
    """A running top-k's values times `r` (one per list, positive: the order stays); empty slots stay."""
    if r is None:
        return values
    r = np.broadcast_to(r, values.shape[:-1])[..., None]
    return np.where(indices >= 0, values * r, values).astype(values.dtype)


def _topk_chunk(st: TopKState, inner: Env, lists: dict, axis: Axis, start: int, stop: int) -> None:
    """One chunk of a running top-k: the chunk's best k merge with the rescaled previous list."""
    space = st.axes + (Axis(axis.name, stop - start),)
    with np.errstate(all="ignore"):
        full = np.broadcast_to(evaluate(st.term, inner, space), [a.extent for a in space])
        k = st.k
        v, i = topk_semantics.topk(full, min(k, stop - start), axis=-1)
        ev, ei = topk_semantics.empty(v.shape[:-1], k - v.shape[-1], v.dtype)
        v, i = np.concatenate([v, ev], -1), np.concatenate([i + start, ei], -1)
        pv, pi = lists[st.acc.name]
        pv = rescale_list(pv, pi, None if st.rescale is None else evaluate(st.rescale, inner, st.axes))
        lists[st.acc.name] = topk_semantics.merge(pv, pi, v.astype(st.acc.dtype.numpy), i)


def _windowed(axes: Space, env: Env) -> Space:
    """`axes` with the windowed axis shortened to the chunk's length."""
    if env.window is None:
        return axes
    name, lo, hi = env.window
    return tuple(Axis(a.name, hi - lo) if a.name == name else a for a in axes)


def _as_kernels_compute(st: OnlineState) -> OnlineState:
    """`st` in its work precision (`rewrite.in_work_precision`), each decision's operand in its term first rounded
    as the compiled kernels round it inside the loop (`rewrite.decided`, as `schedule.exprs` lowers it): an f16
    quantized GEMM, carried in f32, took ``rint(x / s)`` of the f32 quotient (-59.49: -59) where numpy and the
    other backends round the f16 one (-59.5: -60; found by a helper, hunt_quant/01)."""
    if st.carried_dtype == st.acc.dtype:
        return st
    return in_work_precision(replace(st, term=decisions_decided(st.term)))


def run_fused_loop(s: FusedLoop, env: Env, chunk: int = DEFAULT_CHUNK,
                   span: tuple[int, int] | None = None, hold: bool = False) -> dict[str, np.ndarray]:
    """Run a fused cascade chunk by chunk, exactly as its online update rules say.

    `span` ``(lo, hi)`` runs only that part of the axis (a partial state, for the merge rule). With `hold`,
    the sums, maxima and minima carried in f32 though their type is narrower come back in f32
    (`held_results`), the rest rounded to their types.
    """
    # A running sum of f16/bf16/e4m3 values is carried in f32 (`OnlineState.carried_dtype`), its term, rescale
    # and carry computed in f32 too; after the loop it is rounded to its buffer's dtype unless `hold`.
    work = {st.acc.name: st.carried_dtype.numpy for st in s.states if isinstance(st, OnlineState)}
    acc = {st.acc.name: np.full([a.extent for a in st.axes], identity(st.op, work[st.acc.name]))
           for st in s.states if isinstance(st, OnlineState)}
    computed = {st.acc.name: _as_kernels_compute(st) for st in s.states if isinstance(st, OnlineState)}
    lists = {st.acc.name: topk_semantics.empty(tuple(a.extent for a in st.axes), st.k, st.acc.dtype.numpy)
             for st in s.states if isinstance(st, TopKState)}
    # an f32 running sum no shift law carries keeps a compensation (Kahan), as the compiled kernels' do
    # (`schedule.reduce.compensated_add`): one chunk partial at a time is a chain of additions whose roundings
    # pile up on long rows, where numpy's pairwise sum stays exact to a few ulps
    comp = {st.acc.name: np.zeros([a.extent for a in st.axes], np.float32) for st in s.states
            if isinstance(st, OnlineState) and st.op is ReduceOp.SUM and st.carry is None
            and work[st.acc.name] == np.float32}
    # (their rescale's rounding error carried in the compensation too, `rescale_error`: a matmul's partial, which
    # the interpreter takes whole, keeps none)
    corrected = rescale_corrected(s, lambda st: st.acc.name in comp and not contraction(st.term, s.axis.name))
    lo, hi = span if span is not None else (0, s.axis.extent)
    local_names = frozenset(l.out.name for l in s.locals)
    for start in range(lo, hi, max(1, chunk)):
        stop = min(hi, start + max(1, chunk))
        inner = env.child((s.axis.name, start, stop), local_names)
        for st in s.states:
            if isinstance(st, OnlineState):
                inner[st.prev.name] = acc[st.acc.name]
                inner[st.acc.name] = acc[st.acc.name]
        for local in s.locals:
            inner[local.out.name] = run_stmt(local, inner)
        for st in s.states:
            if isinstance(st, TopKState):
                _topk_chunk(st, inner, lists, s.axis, start, stop)
                continue
            chunk_axis = Axis(s.axis.name, stop - start)
            wd = work[st.acc.name]
            term = computed[st.acc.name].term    # (a matmul's operands in f32 too: f16(exp(s - m)) rounds once)
            partial = _matmul_reduce(Reduce(st.acc, st.axes, (chunk_axis,), st.op, term), inner, wd)
            matmul = partial is not None
            r = None
            with np.errstate(all="ignore"):
                if partial is None:
                    space = st.axes + (chunk_axis,)
                    full = np.broadcast_to(evaluate(term, inner, space), [a.extent for a in space])
                    partial = REDUCERS[st.op](full.astype(wd, copy=False), axis=-1)
                partial = partial.astype(work[st.acc.name], copy=False)
                prev = inner[st.prev.name]
                carry, rescale = computed[st.acc.name].carry, computed[st.acc.name].rescale
                if carry is not None:
                    scaled = np.broadcast_to(evaluate(carry, inner, st.axes), prev.shape)
                else:
                    r = None if rescale is None else evaluate(rescale, inner, st.axes)
                    scaled = rescale_partial(st.op, prev, r)
                if st.acc.name in comp and not matmul:
                    c = comp[st.acc.name] if r is None else np.where(comp[st.acc.name] == 0, comp[st.acc.name],
                                                                   comp[st.acc.name] * r)
                    if st.acc.name in corrected:
                        d = evaluate(exponent_of(computed[st.acc.name]), inner, st.axes)
                        c = c - _rescale_residual(prev, d, r)
                    y = partial - c
                    total = scaled + y
                    lost = np.where(np.abs(total) < np.inf, (total - scaled) - y, 0)
                    new = np.where(partial == 0, scaled, total)      # (a partial of 0 changes nothing)
                    comp[st.acc.name] = np.where(partial == 0, c, lost).astype(np.float32)
                else:
                    new = combine(st.op, scaled, partial)
            new = np.broadcast_to(new, prev.shape).astype(work[st.acc.name], order="C")  # fresh (0-d stays 0-d)
            inner[st.acc.name] = acc[st.acc.name] = new
    kept = held_results(s) if hold else frozenset()
    for st in s.states:
        if isinstance(st, OnlineState) and st.acc.name not in kept:
            with np.errstate(all="ignore"):
                acc[st.acc.name] = acc[st.acc.name].astype(st.acc.dtype.numpy)
        if isinstance(st, TopKState):
            values, indices = lists[st.acc.name]
            acc[st.acc.name] = np.ascontiguousarray(np.moveaxis(values, -1, st.rank))
            acc[st.indices.name] = np.ascontiguousarray(np.moveaxis(indices, -1, st.rank))
    return acc


def _rescale_residual(prev: np.ndarray, d: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``prev * (exp(d) - r)`` where ``|d| < SMALL_STEP`` and `prev` is finite, else 0 (`rescale_error`), in f32
    as the compiled kernels compute it."""
    d = np.asarray(d, np.float32)
    series = np.float32(SERIES[-1])
    for c in SERIES[-2::-1]:
        series = np.float32(c) + d * series
    lo = d * series - (np.asarray(r, np.float32) - np.float32(1))
    use = (np.abs(d) < np.float32(SMALL_STEP)) & (np.abs(prev) < np.inf)
    return np.where(use, prev * np.where(use, lo, np.float32(0)), np.float32(0)).astype(np.float32)


def held_results(s: FusedLoop) -> frozenset[str]:
    """The sums, maxima and minima `s` carries in f32 though their type is narrower (16-bit ones): a compiled
    kernel keeps each in f32 after its loop, and so does `run_program` (`run_stmt`'s `held`). An internal state
    of fusion (attention's ``out_acc``, a centred sum's count) may exceed its type's range where the user's
    values do not: rounded to f16 after the loop, attention over 8192 keys of values 10 gave inf where numpy
    gives 10. A max read rounded where the loop's terms used it unrounded made a bf16 softmax of ``x = logits *
    1.5`` divide ``exp(x - f16(m))`` by the sum of ``exp(x - m)``."""
    return frozenset(st.acc.name for st in s.states
                     if isinstance(st, OnlineState) and st.op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN)
                     and st.carried_dtype != st.acc.dtype)


def held_extrema(s: FusedLoop) -> frozenset[str]:
    """The maxima and minima among `held_results` (a decision reads them rounded wherever it reads them:
    `rewrite.decided`)."""
    return held_results(s) & frozenset(st.acc.name for st in s.states
                                    if isinstance(st, OnlineState) and st.op in (ReduceOp.MAX, ReduceOp.MIN))


def run_stmt(s: Stmt, env: Env, held: frozenset[str] = frozenset(),
             extrema: frozenset[str] = frozenset(), keep_held: bool = False) -> np.ndarray:
    """Execute one loop nest and return the array it writes (inside a fused loop's chunk too). `held`: results
    in `env` in f32 though their type is narrower (`held_results`; `extrema` the maxima and minima among them); a
    nest reading one is evaluated as the compiled kernels evaluate it (`rewrite.read_as_held`), and with
    `keep_held` its value comes back in f32 (an epilogue value a kernel holds unrounded)."""
    if env.window is not None:
        s = _restrict(s, env)
    shape = tuple(a.extent for a in s.axes)
    value_expr = s.value
    if held and any(isinstance(n, Load) and n.buffer.name in held for n in walk(value_expr)):
        value_expr = read_as_held(value_expr, held, extrema)
    if isinstance(s, Compute):
        value = evaluate(value_expr, env, s.axes)
    elif isinstance(s, Reduce):
        if value_expr is not s.value:
            s = replace(s, value=value_expr)
        value = _matmul_reduce(s, env)
        if value is None:
            space = s.axes + s.reduce_axes
            full = np.broadcast_to(evaluate(s.value, env, space), [a.extent for a in space])
            reduced = tuple(range(len(s.axes), len(space)))
            with np.errstate(all="ignore"):
                value = REDUCERS[s.op](full, axis=reduced, initial=identity(s.op, s.out.dtype.numpy))
    else:
        raise TypeError(f"the interpreter has no rule for {type(s).__name__}")
    # always a fresh, writable array: `value` may be a read-only broadcast view of an input
    keep = keep_held and value_expr is not s.value and s.out.dtype.storage_only
    return np.broadcast_to(value, shape).astype(np.float32 if keep else s.out.dtype.numpy, order="C")


def _restrict(s: Stmt, env: Env) -> Stmt:
    """A chunk-local nest with the windowed axis shortened (its loads keep the window)."""
    if isinstance(s, Reduce):
        return replace(s, axes=_windowed(s.axes, env), reduce_axes=_windowed(s.reduce_axes, env))
    return replace(s, axes=_windowed(s.axes, env))


def run_program(p: Program, args: list[np.ndarray] | tuple[np.ndarray, ...],
                chunk: int = DEFAULT_CHUNK) -> tuple[np.ndarray, ...]:
    """Run `p` on numpy arrays (one per input); return its outputs. Inputs are never written.

    Fused loops run in chunks of `chunk` along their axis.
    """
    env = Env({b.name: a for b, a in zip(p.inputs, args)})
    buffers = {b.name: b for s in p.body for b in written(s)}
    held: frozenset[str] = frozenset()     # 16-bit sums, maxima and minima kept in f32 after their loop
    extrema: frozenset[str] = frozenset()
    body = list(p.body)
    read = [frozenset(reads(s)) for s in body]
    for i, s in enumerate(body):
        if isinstance(s, Compute | Reduce):
            env[s.out.name] = run_stmt(s, env, held, extrema, keep_held=True)
            if env[s.out.name].dtype != s.out.dtype.numpy:    # (an epilogue value held in f32 as it is)
                held |= {s.out.name}
            continue
        if isinstance(s, TopK):     # (it ranks the values as the compiled kernels compute them)
            if held & read[i]:
                s = replace(s, value=read_as_held(s.value, held, extrema, ranked=True))
            env.update(run_topk(s, env))
            continue
        # (a later fused loop, a kernel of its own, reads a held result as it is stored: rounded)
        for name in held & read[i]:
            with np.errstate(all="ignore"):
                env[name] = env[name].astype(buffers[name].dtype.numpy)
        held -= read[i]
        if isinstance(s, FusedLoop):
            env.update(run_fused_loop(s, env, chunk, hold=True))
            held |= held_results(s)
            extrema = (extrema & held) | held_extrema(s)
    with np.errstate(all="ignore"):
        return tuple(env[b.name].astype(b.dtype.numpy, copy=False) for b in p.outputs)
