"""Views and index builders: `swapaxes`, `transpose`, indexing, and `arange`."""
from __future__ import annotations

import builtins
import math
from typing import Sequence

import numpy as np

from ..ir import (
    Binary,
    BinaryOp,
    Compute,
    DTypeError,
    Expr,
    IndexValue,
    Length,
    ShapeError,
    UnsupportedError,
)
from ..ir import types as T
from ..source_info import user_loc
from ..probes import ProbeLength
from ..tracer import Fixed, Mapped, Stepped, Tracer, ViewIndex, active_builder, redirect, view_index
from .common import (
    _traced,
    constant,
    describe,
)
from ..ir import Const


def _dim(op: str, x: Tracer, d: object) -> int:
    if isinstance(d, bool) or not isinstance(d, int | np.integer):
        raise UnsupportedError(f"axis must be an int, got {d!r}", op=op, loc=user_loc())
    if not -x.ndim <= d < x.ndim:
        raise ShapeError(f"axis {d} is out of bounds for {describe(x)}", op=op, loc=user_loc())
    return int(d) % x.ndim


def _permute(x: Tracer, perm: Sequence[int]) -> Tracer:
    """The view whose dim ``n`` is `x`'s dim ``perm[n]``."""
    where_to = {old: new for new, old in enumerate(perm)}
    view = tuple(redirect(v, where_to.__getitem__) for v in x.positions)
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
    """``x[key]`` for keys made of ``None``, ``...``, slices ``start:stop:step`` and integers (a view, as numpy
    makes one: no data moves; a slice reads its positions through a strided index)."""
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
    new_of_old: dict[int, ViewIndex] = {}
    shape: list[int] = []
    dim = 0
    for k in expanded:
        if k is None:
            shape.append(1)
            continue
        size = x.shape[dim]
        if isinstance(k, slice):
            start, step = _slice_map(x, dim, k)
            whole = (start, step) == (0, 1) and len(range(*k.indices(size))) == size
            new_of_old[dim] = len(shape) if whole else Stepped(len(shape), start, step)
            shape.append(len(range(*k.indices(size))))
        elif isinstance(k, int | np.integer) and not isinstance(k, bool):
            if not -size <= k < size:
                raise ShapeError(f"index {k} is out of bounds for dim {dim} of {describe(x)}", op="getitem",
                                 loc=user_loc())
            x.builder.need_length(size, int(k) + 1 if k >= 0 else -int(k))
            if k < 0 and isinstance(size, ProbeLength) and size.is_one_symbol:
                # ``x[:, -1]`` of a symbolic axis: the position is its run-time length minus 1, so the axis stays
                # symbolic (as a constant ``n - 1`` it made a kernel per length; found by a helper)
                new_of_old[dim] = Mapped(Binary(BinaryOp.ADD, Length((size,), T.int64), Const(int(k), T.int64),
                                                T.int64))
            else:
                new_of_old[dim] = Fixed(int(k) % size)
        else:
            raise UnsupportedError(f"index {k!r} of type {type(k).__name__} is not supported (use None, ..., "
                                   "slices or ints; rf.take_along_axis gathers)", op="getitem", loc=user_loc())
        dim += 1
    view = tuple(redirect(v, new_of_old.__getitem__) for v in x.positions)
    # numpy: an index with an ellipsis returns an array (0-d included); integers alone down to 0-d, a scalar
    return x.with_view(view, tuple(shape), array0d=builtins.any(k is Ellipsis for k in items))


def _slice_map(x: Tracer, dim: int, k: slice) -> tuple[int, int]:
    """``(start, step)`` of slice `k` on `x`'s dim: the view's position ``n`` reads ``start + step * n``."""
    for bound in (k.start, k.stop, k.step):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int | np.integer)):
            raise UnsupportedError(f"slice bounds must be static ints or None, got {k}", op="getitem",
                                   loc=user_loc())
    if k.step is not None and int(k.step) == 0:
        raise ShapeError("slice step cannot be zero", op="getitem", loc=user_loc())
    size = x.shape[dim]
    start, stop, step = k.indices(size)
    whole_always = (k.start is None or int(k.start) == 0) and (k.stop is None or k.stop is size) \
        and (k.step is None or int(k.step) == 1)
    if not whole_always and isinstance(size, ProbeLength):
        # a partial slice of a length, or one whole only at these lengths (``x[:, -32768:]`` is whole at the
        # probes and partial past 32768): the kernel specializes on that length
        size.note_read()
    return start, step


def reshape(a, shape=None, order="C"):
    """``numpy.reshape`` in C order: the same elements in a new shape (one length may be -1). A view, as numpy
    makes one of a contiguous array: a dim split in two is read at ``16*g + c``, dims merged into one at
    ``n // 16`` and ``n % 16`` (computed positions; nothing is copied)."""
    if not _traced(a):
        return np.reshape(a, shape, order=order)
    if order != "C":
        raise UnsupportedError(f"order={order!r}: only C order is supported", op="reshape", loc=user_loc())
    new = _new_shape(a, shape)
    if new == a.shape:
        return a.with_view(a.positions, a.shape)
    for n in a.shape:
        if isinstance(n, ProbeLength):
            n.note_read()       # the positions compile in the lengths: the kernel specializes on them
    if a.size == 0:             # nothing to read: an empty array of the new shape
        builder, loc = a.builder, user_loc()
        return builder.emit("reshape", a.ir_dtype, new, lambda out: Compute(
            out, builder.axes(new), constant(0, a.ir_dtype), loc=loc))
    to = _reshape_map(a.shape, new)
    return a.with_view(tuple(redirect(v, to.__getitem__) for v in a.positions), new)


def _new_shape(a: Tracer, shape: object) -> tuple[int, ...]:
    """The target shape with its -1 inferred, numpy's refusals as `ShapeError`s."""
    items = (shape,) if isinstance(shape, int | np.integer) else tuple(shape) if isinstance(shape, tuple | list) \
        else None
    if items is None or any(isinstance(n, bool) or not isinstance(n, int | np.integer) for n in items):
        raise UnsupportedError(f"shape must be static ints, got {shape!r}", op="reshape", loc=user_loc())
    dims = [int(n) for n in items]
    if sum(1 for n in dims if n == -1) > 1 or any(n < -1 for n in dims):
        raise ShapeError(f"can only specify one unknown dimension (-1) and no other negative one: {tuple(dims)}",
                         op="reshape", loc=user_loc())
    known = math.prod(int(n) for n in dims if n != -1)     # (Python ints: 2**64 must not overflow to a bare error)
    size = int(a.size)
    if -1 in dims:
        if known == 0 or size % known:
            raise ShapeError(f"cannot reshape {describe(a)} of size {size} into shape {tuple(items)}",
                             op="reshape", loc=user_loc())
        dims[dims.index(-1)] = size // known
    elif known != size:
        raise ShapeError(f"cannot reshape {describe(a)} of size {size} into shape {tuple(dims)}", op="reshape",
                         loc=user_loc())
    return tuple(dims)


def _reshape_map(old: tuple[int, ...], new: tuple[int, ...]) -> dict[int, ViewIndex]:
    """For each old view dim, what indexes it in the new view (a non-empty reshape): a new dim where the two
    match one to one, a fixed 0 for a length-1 dim, else a position computed from the new dims of its block
    (the fewest consecutive dims of each shape holding the same number of elements)."""
    to: dict[int, ViewIndex] = {d: Fixed(0) for d, n in enumerate(old) if n == 1}
    olds = [d for d, n in enumerate(old) if n != 1]
    news = [k for k, n in enumerate(new) if n != 1]
    i = k = 0
    while i < len(olds):
        block_old, block_new = [olds[i]], [news[k]]
        p_old, p_new = old[olds[i]], new[news[k]]
        i, k = i + 1, k + 1
        while p_old != p_new:
            if p_old < p_new:
                block_old.append(olds[i])
                p_old, i = p_old * old[olds[i]], i + 1
            else:
                block_new.append(news[k])
                p_new, k = p_new * new[news[k]], k + 1
        if len(block_old) == len(block_new) == 1:
            to[block_old[0]] = block_new[0]
            continue
        flat: Expr | None = None
        for n in block_new:                       # the block's flat position, row-major over its new dims
            flat = view_index(n) if flat is None else _index(BinaryOp.ADD, _index(
                BinaryOp.MUL, flat, Const(new[n], T.int64)), view_index(n))
        inner = p_old
        for m, d in enumerate(block_old):         # each old dim's digit of it
            inner //= old[d]
            digit = flat if inner == 1 else _index(BinaryOp.FLOORDIV, flat, Const(inner, T.int64))  # type: ignore
            to[d] = Mapped(digit if m == 0 else _index(BinaryOp.MOD, digit, Const(old[d], T.int64)))
    return to


def _index(op: BinaryOp, a: Expr, b: Expr) -> Expr:
    return Binary(op, a, b, T.int64)


def arange(start, stop=None, step=1, dtype=None):
    """``numpy.arange`` with static bounds; inside a kernel it is a traced 1-d array."""
    builder = active_builder()
    if builder is None:
        return np.arange(start, stop, step, dtype=dtype) if stop is not None else np.arange(start, dtype=dtype)
    for v in (start, stop, step):
        if isinstance(v, Tracer):
            raise UnsupportedError("arange bounds must be static Python numbers (use x.shape)", op="arange",
                                   loc=user_loc())
    try:
        ref_dtype, length = _arange_type(start, stop, step, dtype)
    except (TypeError, ValueError) as exc:   # numpy's own refusal (a bool range longer than 2, a bad dtype...)
        raise DTypeError(f"numpy refuses arange({start!r}, {stop!r}, {step!r}, dtype={dtype!r}): {exc}",
                         op="arange", loc=user_loc()) from None
    out_dtype = T.from_numpy(ref_dtype)
    if out_dtype is None:
        raise DTypeError(f"dtype {ref_dtype} is not supported", op="arange", loc=user_loc())
    lo, st = (0, 1) if stop is None else (start, step)
    shape = (length,)
    axes = builder.axes(shape)
    value: Expr = IndexValue(axes[0], out_dtype)
    if st != 1:
        value = Binary(BinaryOp.MUL, value, constant(st, out_dtype), out_dtype)
    if lo != 0:
        value = Binary(BinaryOp.ADD, constant(lo, out_dtype), value, out_dtype)
    loc = user_loc()
    return builder.emit("arange", out_dtype, shape, lambda out: Compute(out, axes, value, loc=loc))


def _arange_type(start, stop, step, dtype) -> tuple[np.dtype, int]:
    """numpy's dtype and length of ``arange(start, stop, step, dtype)``, without making a long one: a shape
    class is traced at probe lengths, and ``arange(x.size)`` of three symbolic axes is 10^12 elements
    (numpy's arange of integer bounds is as long as Python's range, its dtype that of its first elements)."""
    bounds = (start, step) if stop is None else (start, stop, step)
    if all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in bounds) \
            and (dtype is None or np.dtype(dtype) != np.bool_):
        lo, hi = (0, start) if stop is None else (start, stop)
        length = len(range(int(lo), int(hi), int(step)))
        if length > 64:
            return np.arange(lo, lo + 2 * step, step, dtype=dtype).dtype, length
    ref = np.arange(start, stop, step, dtype=dtype) if stop is not None else np.arange(start, dtype=dtype)
    return ref.dtype, ref.shape[0]


