"""The numpy interpreter of the Loop IR: the executable semantics (the oracle).

Each loop nest runs vectorized: an expression is evaluated over the nest's
iteration space as one numpy array per node, with a dimension per axis (size 1
where the node does not depend on that axis), so no Python loop runs per
element. Sums of products of two operands (matmul-shaped reductions) go through
`numpy.matmul` instead of materializing the whole iteration space.

Evaluation is a rule table keyed by node type (no visitor class hierarchy).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .expr import (
    Axis,
    Binary,
    BinaryOp,
    Cast,
    Const,
    Expr,
    IndexValue,
    Load,
    ReduceOp,
    Select,
    Unary,
    UnaryOp,
)
from .loop import Compute, Program, Reduce, Stmt

Env = dict[str, np.ndarray]
Space = tuple[Axis, ...]

_UNARY: dict[UnaryOp, Callable[[np.ndarray], np.ndarray]] = {
    UnaryOp.NEG: np.negative,
    UnaryOp.ABS: np.abs,
    UnaryOp.EXP: np.exp,
    UnaryOp.EXP2: np.exp2,
    UnaryOp.LOG: np.log,
    UnaryOp.LOG2: np.log2,
    UnaryOp.SQRT: np.sqrt,
    UnaryOp.RSQRT: lambda x: np.asarray(1, dtype=x.dtype) / np.sqrt(x),
    UnaryOp.NOT: np.logical_not,
}
_BINARY: dict[BinaryOp, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    BinaryOp.ADD: np.add,
    BinaryOp.SUB: np.subtract,
    BinaryOp.MUL: np.multiply,
    BinaryOp.DIV: np.true_divide,
    BinaryOp.POW: np.power,
    BinaryOp.MAX: np.maximum,
    BinaryOp.MIN: np.minimum,
    BinaryOp.LT: np.less,
    BinaryOp.LE: np.less_equal,
    BinaryOp.GT: np.greater,
    BinaryOp.GE: np.greater_equal,
    BinaryOp.EQ: np.equal,
    BinaryOp.NE: np.not_equal,
    BinaryOp.AND: np.logical_and,
    BinaryOp.OR: np.logical_or,
}
REDUCERS: dict[ReduceOp, Callable[..., np.ndarray]] = {
    ReduceOp.SUM: np.sum,
    ReduceOp.MAX: np.max,
    ReduceOp.MIN: np.min,
}


def load_array(arr: np.ndarray, indices: tuple[Axis | int, ...], space: Space) -> np.ndarray:
    """``arr[indices]`` laid out over `space`: one dim per axis, size 1 where unused."""
    picked = arr[tuple(i if isinstance(i, int) else slice(None) for i in indices)]
    used = [i for i in indices if isinstance(i, Axis)]
    position = {a.name: n for n, a in enumerate(space)}
    order = sorted(range(len(used)), key=lambda n: position[used[n].name])
    picked = picked.transpose(order)
    present = {used[n].name for n in order}
    return picked.reshape([a.extent if a.name in present else 1 for a in space])


def _const(e: Const, env: Env, space: Space) -> np.ndarray:
    return np.full((1,) * len(space), e.value, dtype=e.dtype.numpy)


def _index_value(e: IndexValue, env: Env, space: Space) -> np.ndarray:
    shape = [a.extent if a.name == e.axis.name else 1 for a in space]
    return np.arange(e.axis.extent, dtype=e.dtype.numpy).reshape(shape)


def _load(e: Load, env: Env, space: Space) -> np.ndarray:
    return load_array(env[e.buffer.name], e.indices, space)


def _unary(e: Unary, env: Env, space: Space) -> np.ndarray:
    return _UNARY[e.op](evaluate(e.x, env, space)).astype(e.dtype.numpy, copy=False)


def _binary(e: Binary, env: Env, space: Space) -> np.ndarray:
    a, b = evaluate(e.a, env, space), evaluate(e.b, env, space)
    return _BINARY[e.op](a, b).astype(e.dtype.numpy, copy=False)


def _select(e: Select, env: Env, space: Space) -> np.ndarray:
    c, a, b = (evaluate(x, env, space) for x in (e.cond, e.a, e.b))
    return np.where(c, a, b).astype(e.dtype.numpy, copy=False)


def _cast(e: Cast, env: Env, space: Space) -> np.ndarray:
    return evaluate(e.x, env, space).astype(e.dtype.numpy)


EVAL_RULES: dict[type, Callable[..., np.ndarray]] = {
    Const: _const,
    IndexValue: _index_value,
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


def _matmul_reduce(s: Reduce, env: Env) -> np.ndarray | None:
    """A sum over products of two operands as one `numpy.matmul`, or None if not that shape."""
    v = s.value
    if s.op is not ReduceOp.SUM or not (isinstance(v, Binary) and v.op is BinaryOp.MUL):
        return None
    space = s.axes + s.reduce_axes
    a, b = evaluate(v.a, env, space), evaluate(v.b, env, space)
    npar = len(s.axes)
    if any(a.shape[d] != b.shape[d] or a.shape[d] != space[d].extent for d in range(npar, len(space))):
        return None  # a reduced axis one operand does not read: not a contraction
    batch = [d for d in range(npar) if a.shape[d] == b.shape[d]]
    rows = [d for d in range(npar) if a.shape[d] > 1 and b.shape[d] == 1]
    cols = [d for d in range(npar) if b.shape[d] > 1 and a.shape[d] == 1]
    red = list(range(npar, len(space)))
    nrow = int(np.prod([a.shape[d] for d in rows], dtype=np.int64))
    ncol = int(np.prod([b.shape[d] for d in cols], dtype=np.int64))
    nred = int(np.prod([a.shape[d] for d in red], dtype=np.int64))
    a2 = a.transpose(batch + rows + cols + red).reshape([a.shape[d] for d in batch] + [nrow, nred])
    b2 = b.transpose(batch + red + rows + cols).reshape([b.shape[d] for d in batch] + [nred, ncol])
    with np.errstate(all="ignore"):
        out = np.matmul(a2, b2)
    bshape = list(out.shape[: len(batch)])
    out = out.reshape(bshape + [a.shape[d] for d in rows] + [b.shape[d] for d in cols])
    order = batch + rows + cols
    out = out.transpose([order.index(d) for d in range(npar)])
    return out.astype(v.dtype.numpy, copy=False)


def run_stmt(s: Stmt, env: Env) -> np.ndarray:
    """Execute one loop nest and return the array it writes."""
    shape = tuple(a.extent for a in s.axes)
    if isinstance(s, Compute):
        value = evaluate(s.value, env, s.axes)
    elif isinstance(s, Reduce):
        value = _matmul_reduce(s, env)
        if value is None:
            space = s.axes + s.reduce_axes
            full = np.broadcast_to(evaluate(s.value, env, space), [a.extent for a in space])
            reduced = tuple(range(len(s.axes), len(space)))
            with np.errstate(all="ignore"):
                value = REDUCERS[s.op](full, axis=reduced, initial=s.op.identity(s.out.dtype))
    else:
        raise TypeError(f"the interpreter has no rule for {type(s).__name__}")
    return np.ascontiguousarray(np.broadcast_to(value, shape).astype(s.out.dtype.numpy, copy=False))


def run_program(p: Program, args: list[np.ndarray] | tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Run `p` on numpy arrays (one per input); return its outputs. Inputs are never written."""
    env: Env = {b.name: a for b, a in zip(p.inputs, args)}
    for s in p.body:
        env[s.out.name] = run_stmt(s, env)
    return tuple(env[b.name] for b in p.outputs)
