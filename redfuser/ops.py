"""The op namespace a kernel body uses (``rf.exp``, ``rf.sum``, ``@``...).

Every op has one definition here. On plain numpy arrays (no traced argument)
it returns exactly what numpy returns, so the undecorated kernel body is the
reference. On traced values it records one loop nest into the active trace;
result dtypes are found by asking numpy itself (on one-element arrays), so
promotion always matches the reference, including NEP 50 weak Python scalars.
"""
from __future__ import annotations

import builtins
import math
from typing import Callable, Sequence

import numpy as np

from .ir import topk as topk_semantics
from .ir import (
    Axis,
    BufferType,
    TopK,
    Binary,
    BinaryOp,
    Cast,
    Compute,
    Const,
    DType,
    DTypeError,
    Expr,
    IndexValue,
    Reduce,
    ReduceOp,
    Select,
    ShapeError,
    Unary,
    UnaryOp,
    UnsupportedError,
)
from .ir import types as T
from .source_info import user_loc
from .tracer import Fixed, Tracer, _install_operators, active_builder

inf = math.inf
Scalar = bool | int | float | np.generic


# ---------------------------------------------------------------------------------------------
# helpers: operands, shapes, dtypes
# ---------------------------------------------------------------------------------------------
def describe(x: object) -> str:
    """An operand as an error message shows it: ``f32[2,3]`` or ``python float``."""
    if isinstance(x, Tracer):
        return f"{x.ir_dtype}[{','.join(map(str, x.shape))}]"
    if isinstance(x, np.ndarray):
        d = T.from_numpy(x.dtype)
        return f"numpy array {d or x.dtype}[{','.join(map(str, x.shape))}]"
    return f"python {type(x).__name__}" if not isinstance(x, np.generic) else f"numpy {x.dtype} scalar"


def _check_operand(op: str, x: object) -> None:
    if isinstance(x, Tracer) or isinstance(x, bool | int | float | np.generic):
        return
    if isinstance(x, np.ndarray):
        raise UnsupportedError(
            f"a numpy array {describe(x)} mixed with traced values; pass every array as a kernel argument",
            op=op, loc=user_loc())
    raise UnsupportedError(f"operand of type {type(x).__name__} is not an array or a scalar", op=op, loc=user_loc())


def _probe_value(x: object) -> object:
    return np.ones((1,) * x.ndim, dtype=x.dtype) if isinstance(x, Tracer) else x


def result_dtype(op: str, fn: Callable, *args: object, **kwargs: object) -> DType:
    """The dtype numpy gives for `fn(*args)`, as an IR dtype (raises `DTypeError`)."""
    try:
        with np.errstate(all="ignore"):
            out = fn(*(_probe_value(a) for a in args), **kwargs)
    except Exception as exc:  # numpy's own refusal: no common dtype, no loop for this dtype
        raise DTypeError(
            f"not defined for {', '.join(describe(a) for a in args)} ({exc})", op=op, loc=user_loc()) from None
    dtype = T.from_numpy(np.asarray(out).dtype)
    if dtype is None:
        raise DTypeError(f"gives dtype {np.asarray(out).dtype}, which RedFuser does not support "
                         f"(operands {', '.join(describe(a) for a in args)})", op=op, loc=user_loc())
    return dtype


def broadcast_shapes(op: str, *xs: object) -> tuple[int, ...]:
    shapes = [x.shape for x in xs if isinstance(x, Tracer)]
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"shapes do not broadcast: {' and '.join(describe(x) for x in xs if isinstance(x, Tracer))}",
                         op=op, loc=user_loc()) from None


def cast(e: Expr, dtype: DType) -> Expr:
    """`e` converted to `dtype` (no node when it already has it)."""
    if e.dtype == dtype:
        return e
    if isinstance(e, Const):
        return constant(e.value, dtype)
    return Cast(e, dtype)


def constant(value: Scalar, dtype: DType) -> Const:
    v = value.item() if isinstance(value, np.generic) else value
    if dtype.is_bool:
        return Const(bool(v), dtype)
    if dtype.is_int:
        return Const(int(v), dtype)
    return Const(float(v), dtype)


def operand(x: object, axes: tuple[Axis, ...], dtype: DType) -> Expr:
    """`x` as an expression inside a nest over `axes` (right-aligned broadcasting), cast to `dtype`."""
    if isinstance(x, Tracer):
        lead = len(axes) - x.ndim
        return cast(x.expr_for(axes[lead:]), dtype)
    return constant(x, dtype)


def _builder(op: str, *xs: object):
    tracers = [x for x in xs if isinstance(x, Tracer)]
    builder = tracers[0].builder
    if any(t.builder is not builder for t in tracers):
        raise UnsupportedError("a traced value from another kernel's trace was used", op=op, loc=user_loc())
    return builder


def _traced(*xs: object) -> bool:
    return any(isinstance(x, Tracer) for x in xs)


# ---------------------------------------------------------------------------------------------
# elementwise ops
# ---------------------------------------------------------------------------------------------
def _elementwise(op: str, np_fn: Callable, args: Sequence[object], make: Callable[[list[Expr], DType], Expr],
                 operand_dtype: Callable[[DType], DType] | None = None) -> Tracer:
    for a in args:
        _check_operand(op, a)
    loc = user_loc()
    shape = broadcast_shapes(op, *args)
    out_dtype = result_dtype(op, np_fn, *args)
    in_dtype = operand_dtype(out_dtype) if operand_dtype else out_dtype
    builder = _builder(op, *args)
    axes = builder.axes(shape)
    exprs = [operand(a, axes, in_dtype) for a in args]
    return builder.emit(op, out_dtype, shape, lambda out: Compute(out, axes, make(exprs, out_dtype), loc=loc))


def _unary(op: UnaryOp, np_fn: Callable) -> Callable:
    def fn(x):
        if not _traced(x):
            return np_fn(x)
        return _elementwise(op.value, np_fn, [x], lambda e, d: Unary(op, e[0], d))

    fn.__name__ = op.value
    fn.__doc__ = f"Elementwise ``{op.value}``; numpy's result on arrays."
    return fn


def _rsqrt_numpy(x):
    x = np.asarray(x) if not isinstance(x, np.generic) else x
    return 1 / np.sqrt(x)


exp = _unary(UnaryOp.EXP, np.exp)
exp2 = _unary(UnaryOp.EXP2, np.exp2)
log = _unary(UnaryOp.LOG, np.log)
log2 = _unary(UnaryOp.LOG2, np.log2)
sqrt = _unary(UnaryOp.SQRT, np.sqrt)
rsqrt = _unary(UnaryOp.RSQRT, _rsqrt_numpy)
rsqrt.__doc__ = "Elementwise ``1 / sqrt(x)`` (numpy: ``1 / np.sqrt(x)``)."
abs = _unary(UnaryOp.ABS, np.abs)
negative = _unary(UnaryOp.NEG, np.negative)


def logical_not(x):
    """Elementwise ``~x`` on bool (numpy's ``logical_not``)."""
    if not _traced(x):
        return np.logical_not(x)
    return _elementwise("not", np.logical_not, [x], lambda e, d: Unary(UnaryOp.NOT, _truth(e[0]), d),
                        operand_dtype=lambda d: e_dtype(x))


def e_dtype(x: object) -> DType:
    return x.ir_dtype if isinstance(x, Tracer) else T.from_numpy(np.asarray(x).dtype)


def _truth(e: Expr) -> Expr:
    return e if e.dtype.is_bool else Binary(BinaryOp.NE, e, constant(0, e.dtype), T.bool_)


def _binary(op: BinaryOp, np_fn: Callable, name: str) -> Callable:
    def fn(a, b):
        if not _traced(a, b):
            return np_fn(a, b)
        return _elementwise(name, np_fn, [a, b], lambda e, d: Binary(op, e[0], e[1], d))

    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{op.value}`` with broadcasting; numpy's result on arrays."
    return fn


add = _binary(BinaryOp.ADD, np.add, "add")
subtract = _binary(BinaryOp.SUB, np.subtract, "subtract")
multiply = _binary(BinaryOp.MUL, np.multiply, "multiply")
divide = _binary(BinaryOp.DIV, np.true_divide, "divide")
maximum = _binary(BinaryOp.MAX, np.maximum, "maximum")
minimum = _binary(BinaryOp.MIN, np.minimum, "minimum")


def power(a, b):
    """``a ** b`` with a constant (Python or numpy scalar) exponent."""
    if not _traced(a, b):
        return np.power(a, b)
    if isinstance(b, Tracer) or not isinstance(a, Tracer):
        raise UnsupportedError(f"only a constant exponent is supported, got {describe(a)} ** {describe(b)}",
                               op="power", loc=user_loc())
    return _elementwise("power", np.power, [a, b], lambda e, d: Binary(BinaryOp.POW, e[0], e[1], d))


def _comparison(op: BinaryOp, np_fn: Callable, name: str) -> Callable:
    def fn(a, b):
        if not _traced(a, b):
            return np_fn(a, b)
        common = result_dtype(name, np.add, a, b) if not (_is_bool(a) and _is_bool(b)) else T.bool_
        return _elementwise(name, np_fn, [a, b], lambda e, d: Binary(op, e[0], e[1], d),
                            operand_dtype=lambda d: common)

    fn.__name__ = name
    fn.__doc__ = f"Elementwise ``{op.value}``, giving bool; numpy's result on arrays."
    return fn


def _is_bool(x: object) -> bool:
    return isinstance(x, bool | np.bool_) or (isinstance(x, Tracer) and x.ir_dtype.is_bool)


less = _comparison(BinaryOp.LT, np.less, "less")
less_equal = _comparison(BinaryOp.LE, np.less_equal, "less_equal")
greater = _comparison(BinaryOp.GT, np.greater, "greater")
greater_equal = _comparison(BinaryOp.GE, np.greater_equal, "greater_equal")
equal = _comparison(BinaryOp.EQ, np.equal, "equal")
not_equal = _comparison(BinaryOp.NE, np.not_equal, "not_equal")


def _logical(op: BinaryOp, np_fn: Callable, name: str) -> Callable:
    def fn(a, b):
        if not _traced(a, b):
            return np_fn(a, b)
        return _elementwise(name, np_fn, [a, b],
                            lambda e, d: Binary(op, _truth(e[0]), _truth(e[1]), d),
                            operand_dtype=lambda d: d)

    fn.__name__ = name
    fn.__doc__ = f"Elementwise logical ``{op.value}`` (truth values), giving bool."
    return fn


def _logical_operand(op: BinaryOp, np_fn: Callable, name: str) -> Callable:
    inner = _logical(op, np_fn, name)

    def fn(a, b):
        if _traced(a, b):
            for x in (a, b):
                if not _is_bool(x):
                    raise DTypeError(f"& and | need bool operands (use comparisons), got {describe(x)}",
                                     op=name, loc=user_loc())
            return _elementwise(name, np_fn, [a, b], lambda e, d: Binary(op, e[0], e[1], d))
        return inner(a, b)

    fn.__name__ = name
    return fn


logical_and = _logical_operand(BinaryOp.AND, np.logical_and, "logical_and")
logical_or = _logical_operand(BinaryOp.OR, np.logical_or, "logical_or")


def where(cond, a, b):
    """``a`` where ``cond`` is true, else ``b`` (numpy's ``where``, three arguments)."""
    if not _traced(cond, a, b):
        return np.where(cond, a, b)
    for x in (cond, a, b):
        _check_operand("where", x)
    value_dtype = result_dtype("where", lambda c, x, y: np.where(True, x, y), cond, a, b)

    def make(e: list[Expr], d: DType) -> Expr:
        return Select(_truth(e[0]), cast(e[1], d), cast(e[2], d), d)

    loc = user_loc()
    shape = broadcast_shapes("where", cond, a, b)
    builder = _builder("where", cond, a, b)
    axes = builder.axes(shape)
    c_dtype = e_dtype(cond) if isinstance(cond, Tracer) else T.bool_
    exprs = [operand(cond, axes, c_dtype), operand(a, axes, value_dtype), operand(b, axes, value_dtype)]
    return builder.emit("where", value_dtype, shape, lambda out: Compute(out, axes, make(exprs, value_dtype), loc=loc))


def astype(x, dtype):
    """``x`` converted to ``dtype`` (one of the dtypes ``redfuser`` exports)."""
    target = T.from_numpy(dtype)
    if not _traced(x):
        return np.asarray(x).astype(dtype) if not isinstance(x, np.ndarray) else x.astype(dtype)
    if target is None:
        raise DTypeError(f"cannot convert {describe(x)} to {dtype!r}: supported dtypes are "
                         f"{', '.join(d.numpy_name for d in T.ALL_DTYPES)}", op="astype", loc=user_loc())
    loc = user_loc()
    builder = x.builder
    axes = builder.axes(x.shape)
    return builder.emit("astype", target, x.shape, lambda out: Compute(out, axes, cast(x.expr_for(axes), target), loc=loc))


# ---------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------
def normalize_axes(op: str, x: Tracer, axis: object) -> tuple[int, ...]:
    """`axis` (None, int or tuple of ints) as sorted non-negative dims of `x`."""
    if axis is None:
        return tuple(range(x.ndim))
    items = axis if isinstance(axis, tuple | list) else (axis,)
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


def _reduction(op: ReduceOp, np_fn: Callable) -> Callable:
    name = op.value

    def fn(x, axis=None, keepdims=False):
        if not _traced(x):
            return np_fn(x, axis=axis, keepdims=keepdims)
        _check_operand(name, x)
        dims = normalize_axes(name, x, axis)
        out_dtype = result_dtype(name, lambda v: np_fn(v, axis=dims), x)
        if op is not ReduceOp.SUM and any(x.shape[d] == 0 for d in dims):
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

    fn.__name__ = name
    fn.__doc__ = f"``{name}`` over ``axis`` (None: all), optionally keeping reduced dims; numpy's on arrays."
    return fn


sum = _reduction(ReduceOp.SUM, np.sum)
max = _reduction(ReduceOp.MAX, np.max)
min = _reduction(ReduceOp.MIN, np.min)


# ---------------------------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------------------------
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
    value = Binary(BinaryOp.MUL, cast(a.expr_for(a_axes), out_dtype), cast(b.expr_for(b_axes), out_dtype), out_dtype)
    return builder.emit("matmul", out_dtype, shape, lambda out: Reduce(out, axes, (r,), ReduceOp.SUM, value, loc=loc))


# ---------------------------------------------------------------------------------------------
# views: transposes, indexing
# ---------------------------------------------------------------------------------------------
def _dim(op: str, x: Tracer, d: object) -> int:
    if isinstance(d, bool) or not isinstance(d, int | np.integer):
        raise UnsupportedError(f"axis must be an int, got {d!r}", op=op, loc=user_loc())
    if not -x.ndim <= d < x.ndim:
        raise ShapeError(f"axis {d} is out of bounds for {describe(x)}", op=op, loc=user_loc())
    return int(d) % x.ndim


def _permute(x: Tracer, perm: Sequence[int]) -> Tracer:
    """The view whose dim ``n`` is `x`'s dim ``perm[n]``."""
    where_to = {old: new for new, old in enumerate(perm)}
    view = tuple(v if isinstance(v, Fixed) else where_to[v] for v in x.view)
    return x.with_view(view, tuple(x.shape[p] for p in perm))


def swapaxes(x, axis1: int, axis2: int):
    """``x`` with two axes exchanged (a view)."""
    if not _traced(x):
        return np.swapaxes(x, axis1, axis2)
    a, b = _dim("swapaxes", x, axis1), _dim("swapaxes", x, axis2)
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(x, perm)


def transpose(x, *axes):
    """``x`` with axes permuted (reversed when none are given), like ``numpy.transpose``."""
    if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], tuple | list)):
        axes = tuple(axes[0]) if axes[0] is not None else ()
    if not _traced(x):
        return np.transpose(x, axes or None)
    if not axes:
        return _permute(x, list(reversed(range(x.ndim))))
    perm = [_dim("transpose", x, a) for a in axes]
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"axes {tuple(axes)} are not a permutation of {describe(x)}'s dims", op="transpose",
                         loc=user_loc())
    return _permute(x, perm)


def getitem(x: Tracer, key: object) -> Tracer:
    """``x[key]`` for keys made of ``None``, ``...``, full slices ``:`` and integers (a view)."""
    items = key if isinstance(key, tuple) else (key,)
    if builtins.sum(1 for k in items if k is Ellipsis) > 1:
        raise ShapeError("an index can only have one ellipsis ('...')", op="getitem", loc=user_loc())
    consumed = builtins.sum(1 for k in items if k is not None and k is not Ellipsis)
    if consumed > x.ndim:
        raise ShapeError(f"too many indices for {describe(x)}", op="getitem", loc=user_loc())
    expanded: list[object] = []
    for k in items:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (x.ndim - consumed))
        else:
            expanded.append(k)
    if not builtins.any(k is Ellipsis for k in items):  # not `in`: that compares array keys with ==
        expanded.extend([slice(None)] * (x.ndim - consumed))
    new_of_old: dict[int, int | Fixed] = {}
    shape: list[int] = []
    dim = 0
    for k in expanded:
        if k is None:
            shape.append(1)
            continue
        size = x.shape[dim]
        if isinstance(k, slice):
            start, stop, step = k.indices(size)
            if (start, stop, step) != (0, size, 1):
                raise UnsupportedError(f"only full slices ':' are supported, got {k} on {describe(x)} dim {dim}",
                                       op="getitem", loc=user_loc())
            new_of_old[dim] = len(shape)
            shape.append(size)
        elif isinstance(k, int | np.integer) and not isinstance(k, bool):
            if not -size <= k < size:
                raise ShapeError(f"index {k} is out of bounds for dim {dim} of {describe(x)}", op="getitem",
                                 loc=user_loc())
            new_of_old[dim] = Fixed(int(k) % size)
        else:
            raise UnsupportedError(f"index {k!r} of type {type(k).__name__} is not supported (use None, ..., ':' "
                                   "or an int)", op="getitem", loc=user_loc())
        dim += 1
    view = tuple(v if isinstance(v, Fixed) else new_of_old[v] for v in x.view)
    return x.with_view(view, tuple(shape))


# ---------------------------------------------------------------------------------------------
# arange
# ---------------------------------------------------------------------------------------------
def arange(start, stop=None, step=1, dtype=None):
    """``numpy.arange`` with static bounds; inside a kernel it is a traced 1-d array."""
    builder = active_builder()
    if builder is None:
        return np.arange(start, stop, step, dtype=dtype) if stop is not None else np.arange(start, dtype=dtype)
    for v in (start, stop, step):
        if isinstance(v, Tracer):
            raise UnsupportedError("arange bounds must be static Python numbers (use x.shape)", op="arange",
                                   loc=user_loc())
    ref = np.arange(start, stop, step, dtype=dtype) if stop is not None else np.arange(start, dtype=dtype)
    out_dtype = T.from_numpy(ref.dtype)
    if out_dtype is None:
        raise DTypeError(f"dtype {ref.dtype} is not supported", op="arange", loc=user_loc())
    lo, st = (0, 1) if stop is None else (start, step)
    axes = builder.axes(ref.shape)
    value: Expr = IndexValue(axes[0], out_dtype)
    if st != 1:
        value = Binary(BinaryOp.MUL, value, constant(st, out_dtype), out_dtype)
    if lo != 0:
        value = Binary(BinaryOp.ADD, constant(lo, out_dtype), value, out_dtype)
    loc = user_loc()
    return builder.emit("arange", out_dtype, ref.shape, lambda out: Compute(out, axes, value, loc=loc))


# ---------------------------------------------------------------------------------------------
# top-k
# ---------------------------------------------------------------------------------------------
def topk(x, k: int, axis: int = -1):
    """The `k` largest values along `axis`, descending, and their indices (int64).

    Ties go to the lower index; NaN counts as smaller than every number. On arrays this is
    `redfuser.ir.topk.topk`, the definition every backend follows.
    """
    if not _traced(x):
        return topk_semantics.topk(np.asarray(x), k, axis)
    _check_operand("topk", x)
    d = _dim("topk", x, axis)
    n = x.shape[d]
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= n:
        raise ShapeError(f"k must be an int in [1, {n}] for axis {axis} of {describe(x)}, got {k!r}",
                         op="topk", loc=user_loc())
    loc = user_loc()
    r = Axis("r0", n)
    out_axes = tuple(Axis("t0", int(k)) if i == d else Axis(f"i{i}", s) for i, s in enumerate(x.shape))
    value = x.expr_for(tuple(r if i == d else a for i, a in enumerate(out_axes)))
    shape = tuple(a.extent for a in out_axes)
    types = (BufferType(x.ir_dtype, shape), BufferType(T.int64, shape))
    return x.builder.emit_pair(("topk_values", "topk_indices"), types,
                               lambda v, i: TopK(v, i, out_axes, d, r, value, loc=loc))


UFUNC_OPERATORS: dict[np.ufunc, Callable] = {
    np.add: add, np.subtract: subtract, np.multiply: multiply, np.true_divide: divide, np.power: power,
    np.less: less, np.less_equal: less_equal, np.greater: greater, np.greater_equal: greater_equal,
    np.equal: equal, np.not_equal: not_equal, np.matmul: matmul,
}

_install_operators()
