"""The results' shapes of a kernel whose argument lengths are a framework's symbols (a torch fake tensor's
``SymInt``s), from tracing alone.

A framework that compiles a graph around a RedFuser op with symbolic sizes (``torch.compile``'s dynamic
shapes) needs each result's shape as an expression of its inputs' symbols, valid for *every* value the
graph will be run with, or guards saying where it is not. `symbolic_output_types` gives both:

- each symbol is traced at a probe length (`redfuser.probes`) and again at another; a result length that is
  a symbol's probe in both traces is that symbol, one that is the same number in both is static;
- a symbol whose length the body reads as a number (a branch on it, a mean's ``1 / n``) or that RedFuser
  compiles in (a partial slice, where concatenated pieces meet, a reshape of it) is **specialized**: the
  caller guards it to its present value and the results are traced at that value. So a result length
  that is some other function of the symbols (``n + m``, ``n - 1``, ``n * m``) is always traced at values
  the framework guards on, never guessed from probes;
- symbols the body combines as equal lengths (``x + y`` where the framework gave ``x`` and ``y``
  separate symbols) fail to trace at distinct probes; where their present values are equal they are
  **merged** (one probe, and the caller asserts the equality), else every symbol is specialized and the
  trace at the present values raises the user's own error.

The same rules as a shape class's (docs/shapes.md), so the graph and the kernel behind it specialize on the
same lengths.

A symbol may have no present value (a **data-dependent** length, torch's unbacked ``u0`` of ``x[x > 0]``):
it is probed like any other, without the check against the call's own length, and is never merged with
another; where the results would need its value (it is specialized) `DataDependentLength` says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import numpy as np

from .arguments import ShapeDtype
from .ir import UnsupportedError
from .probes import CHECK_PROBES, PROBE_LENGTHS, PROBES, ProbeRead, noting_probe_reads


@dataclass(frozen=True)
class SymbolicTypes:
    """What `symbolic_output_types` found: `results`, each result's shape (ints and input symbols) and
    dtype; `specialized`, the symbols the caller must guard to their present values (the results hold
    their values there); `merged`, groups of symbols the caller must assert equal."""

    results: tuple[tuple[tuple, np.dtype], ...]
    specialized: frozenset
    merged: tuple[tuple, ...]


class DataDependentLength(UnsupportedError):
    """The results need the value of symbols that have none (data-dependent lengths): `symbols`."""

    def __init__(self, symbols: Sequence[Hashable], message: str = "", *, op: str | None = None) -> None:
        self.symbols = tuple(symbols)
        super().__init__(message or f"the result shapes need the value of the data-dependent length(s) "
                         f"{', '.join(map(str, self.symbols))}, which has none while the graph is traced", op=op)


def symbolic_output_types(output_types: Callable[..., tuple[ShapeDtype, ...]],
                          inputs: Sequence[tuple[tuple, np.dtype]], value: Callable[[Hashable], int | None]
                          ) -> SymbolicTypes:
    """The results of `output_types` (a kernel's, on `ShapeDtype`s) for `inputs`, each a shape of ints
    and symbols (hashable, not ints) and a dtype; `value` gives a symbol's present value (its hint), None
    for a data-dependent one (`DataDependentLength` where the results need it)."""
    symbols = list(dict.fromkeys(d for shape, _ in inputs for d in shape if not isinstance(d, int)))
    values = {s: value(s) for s in symbols}
    value = values.__getitem__
    statics = {d for shape, _ in inputs for d in shape if isinstance(d, int)}
    # a static length equal to a probe could not be told from a symbol: every symbol is specialized
    specialized = set(symbols) if statics & PROBE_LENGTHS else set()
    groups = [(s,) for s in symbols]
    merged_once = False
    while True:
        free = [g for g in groups if g[0] not in specialized]
        if len(free) > len(PROBES) or {value(s) for s in specialized} & PROBE_LENGTHS:
            specialized = set(symbols)
            free = []
        unknown = [s for s in symbols if s in specialized and value(s) is None]
        if unknown:
            raise DataDependentLength(unknown)
        try:
            found = _probed(output_types, inputs, free, value)
        except Exception:       # (a RedFuserError, or the body's own: an assert on a length)
            if not free:
                raise           # traced at the present values: the user's own error
            together = _equal_valued(groups, specialized, value)
            if not merged_once and len(together) < len(groups):
                groups, merged_once = together, True
            else:
                specialized = set(symbols)
            continue
        if found is None or isinstance(found, set):
            specialized |= found if found else set(symbols)
            continue
        merged = tuple(g for g in groups if len(g) > 1)
        return SymbolicTypes(found, frozenset(specialized), merged)


def _equal_valued(groups: list[tuple], specialized: set, value: Callable[[Hashable], int | None]) -> list[tuple]:
    """`groups` with the free ones of equal present value joined (one without a value stays alone)."""
    joined: dict[object, tuple] = {}
    for g in groups:
        known = g[0] not in specialized and value(g[0]) is not None
        key = ("value", value(g[0])) if known else ("alone", g)
        joined[key] = joined.get(key, ()) + g
    return list(joined.values())


def _probed(output_types: Callable[..., tuple[ShapeDtype, ...]], inputs: Sequence[tuple[tuple, np.dtype]],
            free: list[tuple], value: Callable[[Hashable], int | None]):
    """The results with the `free` symbol groups as symbols (the others at their present values), or the set
    of free symbols the body read as numbers (to specialize), or None when the two traces disagree otherwise
    (specialize every symbol)."""
    def specs(lengths: Sequence[int]) -> list[ShapeDtype]:
        at = {s: n for g, n in zip(free, lengths) for s in g}
        return [ShapeDtype(tuple(d if isinstance(d, int) else at[d] if d in at else value(d) for d in shape), dtype)
                for shape, dtype in inputs]

    # (the call's own length of each probe, where it has one: a data-dependent length is not checked)
    lengths = {p: value(g[0]) for g, p in zip(free, PROBES) if value(g[0]) is not None}
    with noting_probe_reads(stop=True, lengths=lengths) as reads:
        try:
            first = output_types(*specs(PROBES))
        except ProbeRead:
            pass            # (the read is in `reads`; the rest of the trace is not needed)
    read = {s for g, p in zip(free, PROBES) if p in reads for s in g}
    if read:
        return read
    if not free:
        return tuple((s.shape, np.dtype(s.dtype)) for s in first)
    second = output_types(*specs(CHECK_PROBES))
    symbol_of = {p: g[0] for g, p in zip(free, PROBES)}
    partner = dict(zip(PROBES, CHECK_PROBES))
    results = []
    for a, b in zip(first, second):
        if len(a.shape) != len(b.shape) or np.dtype(a.dtype) != np.dtype(b.dtype):
            return None
        shape = []
        for m, n in zip(a.shape, b.shape):
            if m in symbol_of and n == partner[m]:
                shape.append(symbol_of[m])
            elif m == n and m not in PROBE_LENGTHS:
                shape.append(int(m))
            else:
                return None         # some other function of the lengths
        results.append((tuple(shape), np.dtype(a.dtype)))
    return tuple(results) if len(first) == len(second) else None


__all__ = ["DataDependentLength", "SymbolicTypes", "symbolic_output_types"]
