"""Reductions: `sum`, `max`, `min`, `@` (a sum over the contracted axis) and `topk`."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..ir import (
    Axis,
    Binary,
    BinaryOp,
    BufferType,
    Reduce,
    ReduceOp,
    ShapeError,
    TopK,
    UnsupportedError,
)
from ..ir import topk as topk_semantics
from ..ir import types as T
from ..source_info import user_loc
from ..tracer import Tracer
from .common import (
    _builder,
    _check_operand,
    _traced,
    cast,
    describe,
    result_dtype,
)
from .views import _dim


def normalize_axes(op: str, x: Tracer, axis: object, ufunc: bool = False) -> tuple[int, ...]:
    """`axis` (None, int or tuple of ints) as sorted non-negative dims of `x`. A list is refused, as numpy's
    reductions refuse it (a TypeError there: the body, the kernel's reference, could not run). With `ufunc`
    (numpy's ufunc reductions: sum, max, min, prod, any, all), an int axis 0 or -1 of a 0-d `x` reduces over
    nothing, as numpy's does (``np.sum(np.float32(1.5), axis=0)`` is 1.5; a tuple ``(0,)`` is refused there)."""
    if axis is None:
        return tuple(range(x.ndim))
    if ufunc and axis_of_a_0d_array(x, axis):
        return ()
    if isinstance(axis, list):
        raise UnsupportedError(f"axis must be an int, a tuple of ints or None, got the list {axis!r} (numpy "
                               f"refuses a list too; write axis={tuple(axis)!r})", op=op, loc=user_loc())
    items = axis if isinstance(axis, tuple) else (axis,)
    out = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, int | np.integer):
            raise UnsupportedError(f"axis must be an int, a tuple of ints or None, got {a!r}", op=op, loc=user_loc())
        if not -x.ndim <= a < x.ndim:
            raise ShapeError(f"axis {a} is out of bounds for {describe(x)}", op=op, loc=user_loc())
        out.append(int(a) % x.ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"repeated axis in {axis!r}", op=op, loc=user_loc())
    return tuple(sorted(out))


def axis_of_a_0d_array(x: Tracer, axis: object) -> bool:
    """Whether `axis` is an int 0 or -1 and `x` is 0-d: numpy's ufunc reductions and arg-extrema take it as
    the one element (a tuple ``(0,)`` is out of bounds there)."""
    return x.ndim == 0 and not isinstance(axis, bool) and isinstance(axis, int | np.integer) and axis in (0, -1)


def check_keepdims(op: str, keepdims: object) -> None:
    """numpy's rule for a reduction's `keepdims`: a Python bool or int (its truth); None, a string, a float
    or a numpy bool are a TypeError there, so an error here, not a meaning picked by truthiness."""
    if type(keepdims) not in (bool, int):
        raise UnsupportedError(f"keepdims must be a bool, got {keepdims!r} (numpy refuses it too)", op=op,
                               loc=user_loc())


def _reduction(op: ReduceOp, np_fn: Callable) -> Callable:
    name = op.value

    def fn(x, axis=None, keepdims=False):
        if not _traced(x):
            return np_fn(x, axis=axis, keepdims=keepdims)
        _check_operand(name, x)
        check_keepdims(name, keepdims)
        dims = normalize_axes(name, x, axis, ufunc=True)
        out_dtype = result_dtype(name, lambda v: np_fn(v, axis=dims), x)
        if op is ReduceOp.SUM and out_dtype == T.float8_e4m3fn:
            # numpy adds e4m3 values in e4m3, one at a time: 64 ones sum to 16 (17 rounds back to 16) and a
            # partial sum past 448 is NaN, where a kernel's running sum is f32 (64; found by a helper). No
            # tolerance describes that, so it is refused as mean, var and std of e4m3 are.
            raise UnsupportedError(f"sum of {describe(x)}: numpy adds e4m3 values in e4m3 one at a time (64 ones "
                                   "sum to 16, NaN past 448) and a kernel in f32; take the sum of "
                                   "x.astype(rf.float32)", op=name, loc=user_loc())
        if op not in (ReduceOp.SUM, ReduceOp.PROD) and any(x.shape[d] == 0 for d in dims):
            raise ShapeError(f"{name} over an empty axis of {describe(x)} has no identity", op=name, loc=user_loc())
        loc = user_loc()
        builder = x.builder
        full: list[Axis] = []
        kept: list[Axis] = []
        reduced: list[Axis] = []
        for d, size in enumerate(x.shape):
            if d in dims:
                a = Axis(f"r{len(reduced)}", size)
                reduced.append(a)
            else:
                a = Axis(f"i{len(kept)}", size)
                kept.append(a)
            full.append(a)
        shape = tuple(a.extent for a in kept)
        value = cast(x.expr_for(tuple(full)), out_dtype)
        t = builder.emit(name, out_dtype, shape,
                         lambda out: Reduce(out, tuple(kept), tuple(reduced), op, value, loc=loc))
        if keepdims:
            view = tuple(d for d in range(x.ndim) if d not in dims)
            return t.with_view(view, tuple(1 if d in dims else s for d, s in enumerate(x.shape)))
        return t

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``{name}`` over ``axis`` (None: all), optionally keeping reduced dims; numpy's on arrays."
    return fn


sum = _reduction(ReduceOp.SUM, np.sum)
max = _reduction(ReduceOp.MAX, np.max)
min = _reduction(ReduceOp.MIN, np.min)
prod = _reduction(ReduceOp.PROD, np.prod)




def matmul(a, b):
    """``a @ b`` with numpy's batched semantics (1-d operands promoted and dropped)."""
    if not _traced(a, b):
        return np.matmul(a, b)
    for x in (a, b):
        _check_operand("matmul", x)
        if not isinstance(x, Tracer) or x.ndim == 0:
            raise ShapeError(f"operands must have at least one dimension, got {describe(a)} @ {describe(b)}",
                             op="matmul", loc=user_loc())
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim > 1 else b.shape[0]
    if ka != kb:
        raise ShapeError(f"contracted dimensions differ: {describe(a)} @ {describe(b)} ({ka} vs {kb})",
                         op="matmul", loc=user_loc())
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    try:
        batch = tuple(np.broadcast_shapes(batch_a, batch_b))
    except ValueError:
        raise ShapeError(f"batch dimensions do not broadcast: {describe(a)} @ {describe(b)}",
                         op="matmul", loc=user_loc()) from None
    out_dtype = result_dtype("matmul", lambda x, y: np.matmul(x.reshape(1, 1), y.reshape(1, 1)), a, b)
    loc = user_loc()
    builder = _builder("matmul", a, b)
    shape = batch + ((a.shape[-2],) if a.ndim > 1 else ()) + ((b.shape[-1],) if b.ndim > 1 else ())
    axes = builder.axes(shape)
    r = Axis("r0", ka)
    batch_axes = axes[: len(batch)]
    a_axes = (batch_axes[len(batch) - len(batch_a):] + (axes[len(batch)], r)) if a.ndim > 1 else (r,)
    b_axes = (batch_axes[len(batch) - len(batch_b):] + (r, axes[-1])) if b.ndim > 1 else (r,)
    # numpy's matmul of bools is an or of ands: the Loop IR says so (it has no arithmetic on bools)
    product, monoid = (BinaryOp.AND, ReduceOp.MAX) if out_dtype.is_bool else (BinaryOp.MUL, ReduceOp.SUM)
    value = Binary(product, cast(a.expr_for(a_axes), out_dtype), cast(b.expr_for(b_axes), out_dtype), out_dtype)
    return builder.emit("matmul", out_dtype, shape, lambda out: Reduce(out, axes, (r,), monoid, value, loc=loc))




def _check_k(n: int, k: object, axis: int, x: object) -> None:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= n:
        raise ShapeError(f"k must be an int in [1, {n}] for axis {axis} of {describe(x)}, got {k!r}",
                         op="topk", loc=user_loc())


def topk(x, k: int, axis: int = -1):
    """The `k` largest values along `axis`, descending, and their indices (int64).

    Ties go to the lower index; NaN counts as smaller than every number. On arrays this is
    `redfuser.ir.topk.topk`, the definition every backend follows.
    """
    if not _traced(x):
        x = np.asarray(x)
        _check_k(x.shape[_dim("topk", x, axis)], k, axis, x)     # on arrays as in a kernel: k >= 1
        return topk_semantics.topk(x, k, axis)
    _check_operand("topk", x)
    d = _dim("topk", x, axis)
    n = x.shape[d]
    _check_k(n, k, axis, x)
    x.builder.need_length(n, int(k))
    loc = user_loc()
    r = Axis("r0", n)
    out_axes = tuple(Axis("t0", int(k)) if i == d else Axis(f"i{i}", s) for i, s in enumerate(x.shape))
    value = x.expr_for(tuple(r if i == d else a for i, a in enumerate(out_axes)))
    shape = tuple(a.extent for a in out_axes)
    types = (BufferType(x.ir_dtype, shape), BufferType(T.int64, shape))
    return x.builder.emit_pair(("topk_values", "topk_indices"), types,
                               lambda v, i: TopK(v, i, out_axes, d, r, value, loc=loc))


