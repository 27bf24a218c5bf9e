"""Clean-up passes on a scheduled kernel: inline one-iteration loops, merge duplicates, hoist loop
invariants, drop dead values.

`peel_single_trips` replaces a loop that runs once by its body, so what it loads can merge with a
later load of the same tile (a softmax whose chunk is the whole row reads it once, not twice).

`merge_duplicates` (CSE) replaces an op that repeats an earlier visible op with the
same operands by that op's value (index arithmetic repeats across loads).

`hoist_invariants` moves pure ops whose operands do not change in a loop out in
front of it (attention's ``q`` tile is loaded once, not per chunk of keys).
Loads move only from buffers the kernel never stores. `drop_dead` (`ir/tile/nodes.py`) removes pure ops
whose results nobody uses. Both keep the kernel's meaning on every input.
"""
from __future__ import annotations

import functools
from dataclasses import fields, replace

from ..ir import BinaryOp
from ..ir.tile import nodes as t
from ..ir.types import scalar_key


@functools.cache
def _fields(cls: type, skip: tuple[str, ...]) -> tuple[str, ...]:
    """The field names of op class `cls` but those in `skip` (``dataclasses.fields`` is slow per call)."""
    return tuple(f.name for f in fields(cls) if f.name not in skip)


def _pure(op: t.Op, stored: set[str]) -> bool:
    if isinstance(op, t.Store | t.For):
        return False
    return not (isinstance(op, t.Load) and op.buffer.name in stored)


def _hoist(ops: tuple[t.Op, ...], stored: set[str]) -> tuple[t.Op, ...]:
    out: list[t.Op] = []
    for op in ops:
        if not isinstance(op, t.For):
            out.append(op)
            continue
        body = op.body
        inner = _hoist(body.ops, stored)
        variant = {body.iv.name} | {a.name for a in body.args}
        kept: list[t.Op] = []
        for x in inner:
            reads = {v.name for v in t.operands(x)}
            if isinstance(x, t.For):
                reads |= free_reads(x)
            if _pure(x, stored) and not reads & variant:
                out.append(x)
            else:
                kept.append(x)
                variant |= {r.name for r in t.results(x)}
        out.append(replace(op, body=replace(body, ops=tuple(kept))))
    return tuple(out)


def free_reads(op: t.For) -> set[str]:
    """Every value a loop's body reads (including values defined in the body itself)."""
    names = {v.name for v in op.body.yields}
    for x in t.walk_ops(op.body.ops):
        names |= {v.name for v in t.operands(x)}
        if isinstance(x, t.For):
            names |= {v.name for v in x.body.yields}
    return names


def _subst(x, names: dict[str, t.Value]):
    """`x` (an op, region, value or tuple of them) with values renamed by `names` (`x` itself, the same
    object, when nothing in it is renamed)."""
    if isinstance(x, t.Value):
        return names.get(x.name, x)
    if isinstance(x, tuple):
        renamed = tuple(_subst(v, names) for v in x)
        return x if all(a is b for a, b in zip(renamed, x)) else renamed
    if isinstance(x, t.Region):
        yields = _subst(x.yields, names)
        return x if yields is x.yields else replace(x, yields=yields)
    return x


def rename_operands(op: t.Op, names: dict[str, t.Value]) -> t.Op:
    """`op` reading ``names[v]`` for each operand `v` named there (a loop's inits and yields too, not the ops
    inside its body); `op` itself when none is."""
    if not names:
        return op
    changes = {}
    for name in _fields(type(op), ("out", "out_indices", "results", "body", "loc")):
        old = getattr(op, name)
        new = _subst(old, names)
        if new is not old:
            changes[name] = new
    return replace(op, **changes) if changes else op


COMMUTATIVE = frozenset({BinaryOp.ADD, BinaryOp.MUL, BinaryOp.EQ, BinaryOp.NE, BinaryOp.AND, BinaryOp.OR})
"""Binary ops whose operands `merge_duplicates` compares as a set: ``a * b`` and ``b * a`` are the same
bits in IEEE arithmetic (attention's ``s * 0.125`` for the max and ``0.125 * s`` for the exponentials
were two multiplies of the score tile). Not ``maximum``/``minimum``, which may pick between -0 and +0
by operand order."""


def _signature(op: t.Op) -> tuple | None:
    if isinstance(op, t.For | t.Store | t.ProgramId | t.TopK):  # top-k has two results: never merged
        return None
    if isinstance(op, t.Binary) and op.op in COMMUTATIVE:
        return ("Binary", op.out.type, op.op, frozenset((op.a.name, op.b.name)))
    parts = [type(op).__name__, op.out.type]
    for name in _fields(type(op), ("out", "loc")):
        v = getattr(op, name)
        # by type and bits: -0.0 and 0.0 compare equal, but x / -0.0 is -inf
        parts.append(v.name if isinstance(v, t.Value) else scalar_key(v))
    return tuple(parts)


def _merge(ops: tuple[t.Op, ...], seen: dict[tuple, t.Value], names: dict[str, t.Value],
           stored: set[str]) -> tuple[t.Op, ...]:
    out: list[t.Op] = []
    for op in ops:
        op = rename_operands(op, names)
        if isinstance(op, t.For):
            body = op.body
            inner = _merge(body.ops, dict(seen), names, stored)
            op = replace(op, body=replace(body, ops=inner, yields=_subst(body.yields, names)))
            out.append(op)
            continue
        sig = _signature(op) if _pure(op, stored) else None
        if sig is not None and sig in seen:
            names[op.out.name] = seen[sig]
            continue
        if sig is not None:
            seen[sig] = op.out
        out.append(op)
    return tuple(out)


def merge_duplicates(k: t.TileKernel) -> t.TileKernel:
    """`k` with repeated pure ops merged into their first occurrence."""
    stored = {b.name for b in k.stored()}
    return replace(k, body=_merge(k.body, {}, {}, stored))


def _single_trip(op: t.For) -> bool:
    return isinstance(op.stop, int) and op.start < op.stop <= op.start + op.step


def _peel(ops: tuple[t.Op, ...], names: dict[str, t.Value]) -> tuple[t.Op, ...]:
    """`ops` with every loop of one iteration replaced by its body: the counter a constant, the carried
    values their inits, the results what the body yields (`names` renames the values later ops read)."""
    out: list[t.Op] = []
    for op in ops:
        op = rename_operands(op, names)
        if not isinstance(op, t.For):
            out.append(op)
            continue
        body = op.body
        if not _single_trip(op):
            inner = _peel(body.ops, names)
            out.append(replace(op, body=replace(body, ops=inner, yields=_subst(body.yields, names))))
            continue
        out.append(t.Constant(body.iv, op.start, op.loc))
        names.update({a.name: init for a, init in zip(body.args, op.inits)})
        out += _peel(body.ops, names)
        names.update({r.name: _subst(y, names) for r, y in zip(op.results, body.yields)})
    return tuple(out)


def peel_single_trips(k: t.TileKernel) -> t.TileKernel:
    """`k` with its loops of one iteration inlined (see `_peel`). A fused loop whose chunk is the whole
    axis (softmax with ``block_n`` the row length) then reads its tile as a plain load, which
    `merge_duplicates` merges with the second pass's load of the same tile: one trip to memory."""
    if not any(isinstance(op, t.For) and _single_trip(op) for op in t.walk_ops(k.body)):
        return k
    return replace(k, body=_peel(k.body, {}))


def _select_of_broadcasts(src: t.Op | None, axis: int, defs: dict[str, t.Op]):
    """For ``select(c, a, b)`` whose operands are each a broadcast (of its rank) or a constant, and which all
    leave some dimension other than `axis` unrepeated (size 1 in every broadcast's source): the shape with
    those dimensions at 1, and the operands to select there (sources, or the constants); else None."""
    if not isinstance(src, t.Select):
        return None
    full = src.out.shape
    operands = []
    for v in (src.cond, src.a, src.b):
        op = defs.get(v.name)
        if isinstance(op, t.Broadcast) and op.x.type.rank == len(full):
            operands.append(op.x)
        elif isinstance(op, t.Constant):
            operands.append(op)
        else:
            return None
    sources = [v for v in operands if not isinstance(v, t.Constant)]
    repeated = [d for d in range(len(full)) if d != axis and full[d] > 1
                and all(v.shape[d] == 1 for v in sources)]
    if not sources or not repeated:
        return None
    shape = tuple(1 if d in repeated else n for d, n in enumerate(full))
    return (shape, *operands)


def _reduce_first(ops: tuple[t.Op, ...], defs: dict[str, t.Op], fresh: t.FreshValues) -> tuple[t.Op, ...]:
    out: list[t.Op] = []
    for op in ops:
        if isinstance(op, t.For):
            out.append(replace(op, body=replace(op.body, ops=_reduce_first(op.body.ops, defs, fresh))))
            continue
        src = defs.get(op.x.name) if isinstance(op, t.Reduce) else None
        if isinstance(src, t.Broadcast) and src.x.type.rank == src.out.type.rank \
                and src.x.shape[op.axis] == src.out.shape[op.axis]:
            y = src.x
            once = fresh(f"{op.out.name}_once", t.TileType(op.out.dtype, y.shape[:op.axis] + y.shape[op.axis + 1:]))
            out += [t.Reduce(once, y, op.axis, op.op, op.loc), t.Broadcast(op.out, once, op.loc)]
            continue
        masked = _select_of_broadcasts(src, op.axis, defs) if isinstance(op, t.Reduce) else None
        if masked is not None:
            # where(mask, repeated w, 0) with the mask repeated too (a masked chunk): select and reduce the
            # unrepeated tile, then broadcast (layer norm + GEMM over a row length that is not a multiple of
            # the chunk: every chunk summed w per row)
            shape, cond, a, b = masked
            small = t.TileType(src.out.dtype, shape)
            parts = []
            for v in (cond, a, b):
                if isinstance(v, t.Constant):
                    c = fresh(f"{v.out.name}_once", t.TileType(v.out.dtype, shape))
                    out.append(t.Constant(c, v.value, v.loc))
                    parts.append(c)
                elif v.shape != shape:
                    w = fresh(f"{v.name}_once", t.TileType(v.dtype, shape))
                    out.append(t.Broadcast(w, v, op.loc))
                    parts.append(w)
                else:
                    parts.append(v)
            chosen = fresh(f"{src.out.name}_once", small)
            once = fresh(f"{op.out.name}_once", t.TileType(op.out.dtype, shape[:op.axis] + shape[op.axis + 1:]))
            out += [t.Select(chosen, *parts, src.loc), t.Reduce(once, chosen, op.axis, op.op, op.loc),
                    t.Broadcast(op.out, once, op.loc)]
            continue
        for r in t.results(op):
            defs[r.name] = op
        out.append(op)
    return tuple(out)


def reduce_before_broadcast(k: t.TileKernel) -> t.TileKernel:
    """`k` with each reduction of a broadcast along a dimension the broadcast did not repeat done on the
    broadcast's source, its result broadcast instead: every row of the repeated tile reduces the same
    values, so they are reduced once. (Layer norm + GEMM: the sum of ``w`` over a chunk, which the
    running mean's carry reads per output element, was a ``[rows, chunk, n]`` reduction.)"""
    if not any(isinstance(op, t.Reduce) for op in t.walk_ops(k.body)):
        return k
    return replace(k, body=_reduce_first(k.body, {}, t.FreshValues(k)))


def cleanup_kernel(k: t.TileKernel) -> t.TileKernel:
    """`k` with single-iteration loops inlined, reductions of broadcasts done before the broadcast,
    duplicates merged, loop invariants hoisted and dead ops dropped."""
    stored = {b.name for b in k.stored()}
    k = merge_duplicates(reduce_before_broadcast(peel_single_trips(k)))
    return merge_duplicates(replace(k, body=t.drop_dead(_hoist(k.body, stored), set())))
