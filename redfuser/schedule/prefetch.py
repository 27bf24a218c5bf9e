"""Prefetch: a loop's tensor-core operand tiles are loaded one iteration ahead.

In attention's key loop each iteration loads a ``k`` and a ``v`` tile and cannot start its products until
they arrive: a full trip to global memory, twice an iteration, hidden only by the other blocks on the SM.
`prefetch_operands` software-pipelines such a load by one stage::

    k_first = load k[off(start)]                          # in front of the loop
    for j ... iter (..., k_cur = k_first):
        j_next = j + step < stop ? j + step : j           # the last iteration re-reads its own tile
        k_next = load k[off(j_next)]                      # issued first, used by the next iteration
        ... every use of the tile reads k_cur ...
        yield ..., k_next

so the load of iteration ``j + step`` is in flight while iteration ``j`` computes. The re-read on the last
iteration keeps every address one the original loop reads: no mask is needed and nothing out of bounds is
touched. A loop whose constant range is empty is left alone; where the stop is computed (a causal row
tile's skipped key blocks, `masked.py`; the full chunks of a run-time length, `chunks.py`, which may be
none) the first tile is loaded only where ``start < stop``: the first iteration of a range that runs no
iteration need not be in bounds (fuzz seed 1, example 7350: a shape-polymorphic GEMM over 3 keys read
past its operand). The cost is registers: the next
tile is held across the body, in its load layout (a 64 x 64 f16 tile is 16 registers a thread of 128). So
loads are taken in body order while the 2-d tiles the loop carries -- its state (attention's output
accumulator) and the prefetched tiles -- stay within `BUDGET_BYTES` a thread; the rest load as before.

A load is prefetched when:
- it is a 2-d tile of 16- or 8-bit floats at the top level of a loop body;
- it reads a buffer the kernel never stores;
- its offsets and mask are computed from the loop counter and values from outside the loop alone;
- its tile reaches a `Dot` operand through casts, views and masking selects.

These are the loads whose latency the products wait on. A memory-bound stream, such as softmax's rows,
has other blocks to hide its latency and would only pay the registers.
"""
from __future__ import annotations

import math
from dataclasses import replace
from collections.abc import Mapping

from ..ir.tile import nodes as t
from ..ir.semantics import BinaryOp
from ..ir.tile.verifier import verify_tile_program
from ..ir.types import bool_
from .cleanup import free_reads, rename_operands

_VIEWS = (t.Cast, t.Permute, t.ExpandDims, t.Broadcast)

BUDGET_BYTES = 256
"""Bytes of 2-d tiles a loop may carry a thread, its state and its prefetched tiles together: 64 of the 255
registers, the rest left to the body. With 4 warps, attention at head 64 carries a 128-byte accumulator
and fits its k and v tiles (64 bytes each); at head 128 the accumulator alone is 256 bytes, and
prefetching even k made the bf16 kernel spill (116 bytes, nvJitLink, sm_90) and the FP8 corpus GEMM
(a 256-byte accumulator) spill on sm_80. With 8 warps, head 128 fits both again."""


def prefetch_operands(p: t.TileProgram, threads: int | Mapping[str, int],
                      budget: int = BUDGET_BYTES) -> t.TileProgram:
    """`p` with the eligible tensor-core operand loads of its loops issued one iteration ahead, within
    `budget` bytes a thread of a kernel's block of `threads` threads (one count for every kernel, or one per
    kernel name) (see the module docstring); the result is verified and computes the same values on every
    input."""
    per_kernel = threads if isinstance(threads, Mapping) else {k.name: threads for k in p.kernels}
    kernels = tuple(_kernel(k, per_kernel[k.name], budget) for k in p.kernels)
    if all(a is b for a, b in zip(kernels, p.kernels)):
        return p
    return verify_tile_program(replace(p, kernels=kernels), pass_name="prefetch_operands")


def _kernel(k: t.TileKernel, threads: int, budget: int) -> t.TileKernel:
    stored = {b.name for b in k.stored()}
    names = t.FreshValues(k)
    body = _ops(k.body, stored, names, threads, budget)
    if body is k.body:
        return k
    return replace(k, body=t.drop_dead(body, set()))


class _Budget:
    """What is left of the bytes of 2-d tiles a loop may carry a thread."""

    def __init__(self, loop: t.For, threads: int, budget: int) -> None:
        self.threads = max(1, threads)
        self.left = budget - sum(self.bytes(a) for a in loop.body.args if len(a.shape) == 2)

    def bytes(self, v: t.Value) -> int:
        return math.ceil(v.type.size * v.dtype.itemsize / self.threads)

    def take(self, v: t.Value) -> bool:
        need = self.bytes(v)
        if need > self.left:
            return False
        self.left -= need
        return True


def _ops(ops: tuple[t.Op, ...], stored: set[str], names: t.FreshValues, threads: int, budget: int) -> tuple[t.Op, ...]:
    out: list[t.Op] = []
    changed = False
    for op in ops:
        if isinstance(op, t.For):
            inner = _ops(op.body.ops, stored, names, threads, budget)
            loop = op if inner is op.body.ops else replace(op, body=replace(op.body, ops=inner))
            pre, loop = _pipeline(loop, stored, names, _Budget(loop, threads, budget))
            changed |= loop is not op
            out += pre
            out.append(loop)
        else:
            out.append(op)
    return tuple(out) if changed else ops


def _slice(load: t.Load, defs: dict[str, t.Op], iv: str) -> list[t.Op] | None:
    """The body ops `load`'s offsets and mask are computed by, in body order, when they read only the loop
    counter and values from outside the loop (None otherwise, or when they do not read the counter)."""
    need, seen, reads_iv = [v for v in t.operands(load)], set(), False
    while need:
        v = need.pop()
        if v.name in seen:
            continue
        seen.add(v.name)
        if v.name == iv:
            reads_iv = True
            continue
        op = defs.get(v.name)
        if op is None:
            continue                                  # defined outside the loop
        if isinstance(op, t.For | t.Load | t.TopK | t.Store):
            return None                               # a loop-carried or loaded value: not known ahead
        need += t.operands(op)
    if not reads_iv:
        return None
    return [op for op in defs.values() if any(r.name in seen for r in t.results(op))]


def _tensor_core_operand(v: t.Value) -> bool:
    """A 16- or 8-bit float tile: what a product runs on tensor cores from (f32 products are FMA loops that
    stage their operands in chunks of their own, and carrying a whole f32 tile spills)."""
    return v.dtype.is_float and v.dtype.itemsize <= 2 and len(v.shape) == 2


def _feeds_dot(load: t.Load, ops: tuple[t.Op, ...]) -> bool:
    views = {load.out.name}
    for op in ops:
        if isinstance(op, _VIEWS) and op.x.name in views \
                or isinstance(op, t.Select) and {op.a.name, op.b.name} & views:    # a tail's masking
            views.add(op.out.name)
        elif isinstance(op, t.Dot) and {op.a.name, op.b.name} & views:
            return True
    return False


def _pipeline(loop: t.For, stored: set[str], names: t.FreshValues, budget: _Budget) -> tuple[list[t.Op], t.For]:
    """(ops to put in front of `loop`, `loop` with its operand loads one iteration ahead)."""
    body = loop.body
    if isinstance(loop.stop, int) and loop.stop <= loop.start:
        return [], loop                   # never runs: its first tile's addresses need not exist
    defs = {r.name: op for op in body.ops for r in t.results(op)}
    nested = set().union(*(free_reads(op) for op in body.ops if isinstance(op, t.For)))   # not renamed there
    chosen = [(op, s) for op in body.ops if isinstance(op, t.Load) and op.buffer.name not in stored
              and _tensor_core_operand(op.out) and op.out.name not in nested and _feeds_dot(op, body.ops)
              and (s := _slice(op, defs, body.iv.name)) is not None and budget.take(op.out)]
    if not chosen:
        return [], loop
    iv = body.iv
    step = names(f"{iv.name}_step", iv.type)
    after = names(f"{iv.name}_after", iv.type)
    stop = loop.stop
    if isinstance(stop, int):
        stop_value = names(f"{iv.name}_stop", iv.type)
        head = [t.Constant(stop_value, stop)]
        stop = stop_value
    else:
        head = []
    start = names(f"{iv.name}_first", iv.type)
    more = names(f"{iv.name}_more", t.TileType(bool_, ()))
    following = names(f"{iv.name}_next", iv.type)
    pre: list[t.Op] = [t.Constant(start, loop.start)] + head
    top: list[t.Op] = [t.Constant(step, loop.step), t.Binary(after, BinaryOp.ADD, iv, step),
                       t.Binary(more, BinaryOp.LT, after, stop), t.Select(following, more, after, iv)]
    inits, args, yields, results = [], [], [], []
    carried: dict[str, t.Value] = {}
    runs = None
    if not isinstance(loop.stop, int):   # a computed stop may let the loop run no iteration (module docstring)
        runs = names(f"{iv.name}_runs", t.TileType(bool_, ()))
        pre.append(t.Binary(runs, BinaryOp.LT, start, stop))
    for load, ops in chosen:
        first = _copy(ops + [load], {iv.name: start}, names, "first")
        if runs is not None:
            first = first[:-1] + _only_if(first[-1], runs, names)
        ahead = _copy(ops + [load], {iv.name: following}, names, "next")
        pre += first
        top += ahead
        current = names(f"{load.out.name}_cur", load.out.type)
        carried[load.out.name] = current
        inits.append(first[-1].out)
        args.append(current)
        yields.append(ahead[-1].out)
        results.append(names(f"{load.out.name}_last", load.out.type))
    dropped = {id(load) for load, _ in chosen}
    rest = tuple(rename_operands(op, carried) for op in body.ops if id(op) not in dropped)
    new_body = replace(body, args=body.args + tuple(args), ops=tuple(top) + rest,
                       yields=tuple(carried.get(y.name, y) for y in body.yields) + tuple(yields))
    return pre, replace(loop, results=loop.results + tuple(results), inits=loop.inits + tuple(inits),
                        body=new_body)


def _only_if(load: t.Load, runs: t.Value, names: t.FreshValues) -> list[t.Op]:
    """`load` reading nothing unless the scalar `runs` is true (its tile is then all `other`)."""
    shape = load.out.type.shape
    everywhere = names(f"{runs.name}_b", t.TileType(bool_, shape))
    ops: list[t.Op] = [t.Broadcast(everywhere, runs)]
    mask = everywhere
    if load.mask is not None:
        mask = names(f"{load.mask.name}_runs", t.TileType(bool_, shape))
        ops.append(t.Binary(mask, BinaryOp.AND, load.mask, everywhere))
    return ops + [replace(load, mask=mask, other=load.other if load.mask is not None else 0.0)]


def _copy(ops: list[t.Op], names_in: dict[str, t.Value], names: t.FreshValues, suffix: str) -> list[t.Op]:
    """`ops` again, reading `names_in` for the values named, each result a fresh value."""
    renamed = dict(names_in)
    out = []
    for op in ops:
        op = rename_operands(op, renamed)
        fresh = names(f"{op.out.name}_{suffix}", op.out.type)
        renamed[op.out.name] = fresh
        out.append(replace(op, out=fresh))
    return out
