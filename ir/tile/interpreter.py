"""The numpy interpreter of the Tile IR: runs every program instance of every kernel in order.

It is the executable semantics of `tile.py`, so a schedule can be checked
against the Loop IR interpreter on the same inputs. Program instances run one
after another (small shapes only: it is a checker, not a backend). A load or
store at an unmasked offset outside its buffer raises `InternalError`, so a
scheduling bug is caught rather than read as garbage.
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

from ..array_memory import memory_of
from ..sizes import bind_buffers, concrete, evaluate
from ..errors import InternalError
from .. import topk as topk_semantics
from ..semantics import BINARY_FUNCS as _BINARY, REDUCERS, UNARY_FUNCS as _UNARY
from .nodes import (
    Arange,
    Binary,
    Broadcast,
    Cast,
    Constant,
    Dot,
    Extent,
    ExpandDims,
    For,
    Load,
    Op,
    Permute,
    ProgramId,
    Reduce,
    Select,
    Store,
    TileKernel,
    TileProgram,
    TopK,
    Unary,
)
from .nodes import results as t_results

Env = dict[str, np.ndarray]


class _Instance:
    """One program instance: its grid position, the global buffers (flat views) and its values."""

    def __init__(self, kernel: TileKernel, pid: tuple[int, ...], buffers: dict[str, np.ndarray],
                 sizes: dict[str, int]) -> None:
        self.kernel, self.pid, self.buffers, self.sizes = kernel, pid, buffers, sizes
        self.env: Env = {}

    def __getitem__(self, v) -> np.ndarray:
        return self.env[v.name]


def _in_bounds(op: Load | Store, off: np.ndarray, mask: np.ndarray, size: int) -> None:
    bad = mask & ((off < 0) | (off >= size))
    if bad.any():
        raise InternalError(f"{type(op).__name__.lower()} of {op.buffer.name} at offset {int(off[bad].flat[0])} "
                            f"outside [0, {size}) on an unmasked lane", pass_name="tile interpreter")


def _load(op: Load, inst: _Instance) -> np.ndarray:
    flat = inst.buffers[op.buffer.name]
    off = inst[op.offsets].astype(np.int64)
    mask = np.ones(off.shape, bool) if op.mask is None else inst[op.mask]
    _in_bounds(op, off, mask, flat.size)
    dtype = op.out.dtype.numpy
    out = np.full(off.shape, op.other, dtype=dtype)
    out[mask] = flat[off[mask]]
    return out


def _store(op: Store, inst: _Instance) -> None:
    flat = inst.buffers[op.buffer.name]
    off = inst[op.offsets].astype(np.int64)
    mask = np.ones(off.shape, bool) if op.mask is None else inst[op.mask]
    _in_bounds(op, off, mask, flat.size)
    flat[off[mask]] = np.asarray(inst[op.value])[mask]


def _dot(op: Dot, inst: _Instance) -> np.ndarray:
    dtype = op.out.dtype.numpy
    out = np.matmul(inst[op.a].astype(dtype), inst[op.b].astype(dtype))
    return out if op.acc is None else inst[op.acc] + out


def _topk(op: TopK, inst: _Instance) -> tuple[np.ndarray, np.ndarray]:
    """The best k of candidates and acc list by `redfuser.ir.topk.merge`; unfilled slots are (NaN, -1)."""
    def last(v) -> np.ndarray:
        return np.moveaxis(np.asarray(inst[v]), op.axis, -1)

    x, idx = last(op.x), last(op.indices).astype(np.int64)
    if op.acc is not None:
        av, ai = last(op.acc), last(op.acc_indices).astype(np.int64)
    else:
        av, ai = topk_semantics.empty(x.shape[:-1], op.k, x.dtype)
    values, indices = topk_semantics.merge(av, ai, x, idx)
    empty = indices < 0
    values, indices = np.where(empty, np.nan, values), np.where(empty, -1, indices)
    return (np.moveaxis(values, -1, op.axis).astype(op.out.dtype.numpy),
            np.moveaxis(indices, -1, op.axis).astype(op.out_indices.dtype.numpy))


def _for(op: For, inst: _Instance) -> tuple[np.ndarray, ...]:
    carried = tuple(inst[v] for v in op.inits)
    body = op.body
    stop = op.stop if isinstance(op.stop, int) else int(inst[op.stop])
    for i in range(op.start, stop, op.step):
        inst.env[body.iv.name] = np.asarray(i, dtype=body.iv.dtype.numpy)
        for a, value in zip(body.args, carried):
            inst.env[a.name] = value
        run_ops(body.ops, inst)
        carried = tuple(inst[y] for y in body.yields)
    return carried


RULES: dict[type, Callable[..., np.ndarray]] = {
    ProgramId: lambda op, inst: np.asarray(inst.pid[op.axis], dtype=op.out.dtype.numpy),
    Extent: lambda op, inst: np.asarray(evaluate(op.size, inst.sizes), dtype=op.out.dtype.numpy),
    Constant: lambda op, inst: np.full(op.out.shape, op.value, dtype=op.out.dtype.numpy),
    Arange: lambda op, inst: np.arange(op.out.shape[0], dtype=op.out.dtype.numpy),
    Unary: lambda op, inst: np.asarray(_UNARY[op.op](inst[op.x])).astype(op.out.dtype.numpy, copy=False),
    Binary: lambda op, inst: np.asarray(_BINARY[op.op](inst[op.a], inst[op.b])).astype(op.out.dtype.numpy, copy=False),
    Select: lambda op, inst: np.where(inst[op.cond], inst[op.a], inst[op.b]).astype(op.out.dtype.numpy, copy=False),
    Cast: lambda op, inst: np.asarray(inst[op.x]).astype(op.out.dtype.numpy),
    Broadcast: lambda op, inst: np.broadcast_to(inst[op.x], op.out.shape).copy(),
    ExpandDims: lambda op, inst: np.expand_dims(inst[op.x], op.axis),
    Permute: lambda op, inst: np.transpose(inst[op.x], op.perm),
    Load: _load,
    Reduce: lambda op, inst: np.asarray(REDUCERS[op.op](inst[op.x], axis=op.axis)).astype(op.out.dtype.numpy, copy=False),
    Dot: _dot,
}


def run_ops(ops: tuple[Op, ...], inst: _Instance) -> None:
    """Run a block of ops in one program instance."""
    with np.errstate(all="ignore"):
        for op in ops:
            if isinstance(op, Store):
                _store(op, inst)
            elif isinstance(op, For | TopK):
                for r, value in zip(t_results(op), (_for if isinstance(op, For) else _topk)(op, inst)):
                    inst.env[r.name] = value
            else:
                inst.env[op.out.name] = np.asarray(RULES[type(op)](op, inst))


def run_kernel(k: TileKernel, buffers: dict[str, np.ndarray], sizes: dict[str, int] | None = None) -> None:
    """Run every program instance of `k` over `buffers` (name -> flat array), in grid order; `sizes`: the
    value of each symbol of a shape-polymorphic kernel."""
    sizes = sizes or {}
    for pid in itertools.product(*(range(evaluate(g, sizes)) for g in k.grid)):
        run_ops(k.body, _Instance(k, pid, buffers, sizes))


def run_tile_program(p: TileProgram, args: list[np.ndarray] | tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Run `p` on numpy arrays (one per input); return its outputs. Scratch is poisoned with NaN/garbage."""
    buffers: dict[str, np.ndarray] = {}
    sizes = bind_buffers(p.inputs, args)
    for b, a in zip(p.inputs, args):
        buffers[b.name] = memory_of(a, b.type, sizes)   # a view: the memory it spans (array_memory.py)
    for b in p.outputs + p.scratch:
        n = evaluate(b.type.size, sizes)
        buffers[b.name] = np.full(n, np.nan if b.dtype.is_float else 0).astype(b.dtype.numpy)
    for k in p.kernels:
        run_kernel(k, buffers, sizes)
    return tuple(buffers[b.name].reshape(concrete(b.shape, sizes)) for b in p.outputs)
