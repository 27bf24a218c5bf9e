"""Shrinking a failing program: greedy simplifications kept while the failure keeps its signature.

`shrink(program, fails)` tries, in rounds until none applies or the budget is
spent: fewer calls (the failing one kept), fewer outputs, an earlier value as
the only output, a node bypassed (its uses read one of its operands), dead nodes
and unused parameters removed, fewer kernel options, default layouts, smaller
dims (one size replaced everywhere it occurs, so broadcasting still holds), no
broadcast base, simpler values (small integers, no special values, f32), and
finally literal values. `fails` says whether a candidate still fails the same
way (same backend, kind and exception type: `Failure.signature`).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

from .program import Arg, Node, Program
from .program_data import LITERAL_LIMIT, ArrayData
from .program_judge import Failure, run


def same_failure(target: Failure) -> Callable[[Program], bool]:
    """A predicate: the program, run on the target's backend, fails with the target's signature."""
    def fails(p: Program) -> bool:
        try:
            outcome = run(p, target.backend)
        except Exception:  # the oracle itself cannot run this candidate
            return False
        return any(f.signature() == target.signature() for f in outcome.failures)
    return fails


def shrink(p: Program, fails: Callable[[Program], bool], budget: int = 300,
           seconds: float = 120.0) -> tuple[Program, int]:
    """The simplest variant of `p` found that still `fails`, and how many candidates were tried."""
    tried, deadline = 0, time.monotonic() + seconds
    improved = True
    while improved and tried < budget and time.monotonic() < deadline:
        improved = False
        for candidate in _candidates(p):
            if candidate is None or candidate == p:
                continue
            tried += 1
            if fails(candidate):
                p, improved = candidate, True
                break
            if tried >= budget or time.monotonic() >= deadline:
                break
    literal = _literal(p)
    if literal != p and tried < budget + 20 and fails(literal):
        p = literal
    return p, tried


# ---------------------------------------------------------------------------------------------
# candidates, roughly from the biggest simplification to the smallest
# ---------------------------------------------------------------------------------------------
def _candidates(p: Program) -> Iterator[Program | None]:
    for k in range(len(p.calls)):
        if len(p.calls) > 1:
            yield _clean(replace(p, calls=p.calls[:k] + p.calls[k + 1:]))
    for k in range(len(p.calls) - 1, 0, -1):
        yield _clean(replace(p, calls=p.calls[:k]))
    for o in p.outputs:
        if len(p.outputs) > 1:
            yield _clean(replace(p, outputs=(o,)))
    for node in p.nodes[:-1]:
        for out in node.outs:
            if out not in p.outputs:
                yield _clean(replace(p, outputs=(out,)))
    for k, node in enumerate(p.nodes):
        for arg in dict.fromkeys(node.args):
            if arg in p.params or any(arg in n.outs for n in p.nodes[:k]):
                yield _bypass(p, k, arg)
    for k in range(len(p.options)):
        yield replace(p, options=p.options[:k] + p.options[k + 1:])
    yield from _call_simplifications(p)
    for size in sorted({s for a in _array_args(p) for s in a.data.shape if s > 1}, reverse=True):
        for smaller in sorted({1, 2, 3, size // 2}):
            if smaller < size:
                yield _resize(p, size, smaller)
    yield from _value_simplifications(p)


def _array_args(p: Program) -> list[Arg]:
    return [a for call in p.calls for a in call if a.is_array]


def _bypass(p: Program, k: int, arg: str) -> Program:
    """Node `k` removed: what read its outputs reads `arg` instead."""
    gone = set(p.nodes[k].outs)
    nodes = [replace(n, args=tuple(arg if a in gone else a for a in n.args)) for n in p.nodes[k + 1:]]
    outputs = tuple(dict.fromkeys(arg if o in gone else o for o in p.outputs))
    return _clean(replace(p, nodes=p.nodes[:k] + tuple(nodes), outputs=outputs))


def _clean(p: Program) -> Program:
    """Nodes no output needs, and parameters nothing reads, removed (with their arguments)."""
    need = set(p.outputs)
    keep: list[Node] = []
    for node in reversed(p.nodes):
        if need & set(node.outs):
            keep.append(node)
            need |= set(node.args)
    used = [k for k, name in enumerate(p.params) if name in need]
    if len(used) == len(p.params) and len(keep) == len(p.nodes):
        return p
    calls = tuple(tuple(call[k] for k in used) for call in p.calls)
    return replace(p, params=tuple(p.params[k] for k in used), nodes=tuple(reversed(keep)), calls=calls)


def _map_args(p: Program, fn: Callable[[Arg], Arg]) -> Program:
    return replace(p, calls=tuple(tuple(fn(a) for a in call) for call in p.calls))


def _call_simplifications(p: Program) -> Iterator[Program]:
    if any(a.is_array and a.layout != "c" for a in _array_args(p)):
        yield _map_args(p, lambda a: replace(a, layout="c") if a.is_array else a)
    for k in range(len(p.params)):
        column = [call[k] for call in p.calls]
        if any(a.is_array and a.layout != "c" for a in column):
            yield replace(p, calls=tuple(call[:k] + (replace(call[k], layout="c"),) + call[k + 1:] for call in p.calls))
        if len(p.calls) > 1 and column[0].is_array and any(a.data != column[0].data for a in column):
            first = column[0].data  # every call on the first call's data
            yield replace(p, calls=tuple(call[:k] + (replace(call[k], data=first),) + call[k + 1:] for call in p.calls))


def _resize(p: Program, size: int, smaller: int) -> Program:
    return _map_args(p, lambda a: replace(a, data=_resized(a.data, size, smaller)) if a.is_array else a)


def _resized(d: ArrayData, size: int, smaller: int) -> ArrayData:
    if size not in d.shape:
        return d
    shape = tuple(smaller if s == size else s for s in d.shape)
    base = tuple(1 if b == 1 else t for b, t in zip(d.base, shape)) if d.base is not None else None
    if d.values is not None:  # keep the leading block of the literal values
        vals = d.base_values()[tuple(slice(0, s) for s in (base or shape))]
        return replace(d, shape=shape, base=base, values=tuple(vals.reshape(-1).tolist()))
    limit = int(np.prod(base or shape))
    return replace(d, shape=shape, base=base, specials=tuple(x for x in d.specials if x[0] < limit))


def _value_simplifications(p: Program) -> Iterator[Program]:
    params = len(p.params)
    for k in range(params):
        column = [call[k] for call in p.calls]
        if not column[0].is_array:
            continue
        d = column[0].data
        options: list[ArrayData] = []
        if d.base is not None:
            options.append(replace(d, base=None))
        for n in range(len(d.specials)):
            options.append(replace(d, specials=d.specials[:n] + d.specials[n + 1:]))
        if d.values is None and d.kind not in ("ints", "int_small", "bool"):
            options.append(replace(d, kind="ints" if d.dtype not in ("int32",) else "int_small"))
        if d.dtype in ("float16", "bfloat16"):
            options.append(replace(d, dtype="float32"))
        for new in options:
            yield replace(p, calls=tuple(call[:k] + (replace(call[k], data=_same_change(call[k].data, d, new)),) +
                                         call[k + 1:] for call in p.calls))


def _same_change(data: ArrayData, old: ArrayData, new: ArrayData) -> ArrayData:
    """Apply the change `old` -> `new` to another call's data for the same parameter."""
    if data == old:
        return new
    changes = {f: getattr(new, f) for f in ("base", "kind", "dtype") if getattr(new, f) != getattr(old, f)}
    if len(new.specials) != len(old.specials):
        changes["specials"] = tuple(s for s in data.specials if s in new.specials)
    return replace(data, **changes)


def _literal(p: Program) -> Program:
    """Every small array as literal values (what the reproducer prints)."""
    def lit(a: Arg) -> Arg:
        if a.is_array and a.data.values is None and a.data.size() <= LITERAL_LIMIT:
            return replace(a, data=a.data.literal_form())
        return a
    return _map_args(p, lit)
