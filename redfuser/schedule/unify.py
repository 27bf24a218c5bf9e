"""Which axes of a fused kernel's statements are the same axis (union-find over reads).

Inside a fused loop every statement (local nests, online states, fused epilogue
nests) names its own axes. Two axes are one kernel axis when a statement reads a
buffer computed in the kernel with one at a position the producer runs the
other over (``l``'s term reads ``s[i0, i1, i2, k]``: l's ``i2`` is s's ``i2``).
Reads at fixed positions (except index 0 of a length-1 axis that is no top-1 list's
rank: the kernel keeps a rank as a tile dim), or one statement
axis meeting another of the same statement, cannot be tiled this way and raise
`Unfusable`.

Sibling states (reductions that read the same input and no result of each other:
``sum(x)`` beside ``max(x)``, ``sum(x)`` beside ``x @ w``) share no computed
buffer, so the reads above never join their axes, and a kernel whose states share
no axis has no grid: one program would hold the whole tensor. So two states that
load the same input buffer at the same axes (every index an axis, the same fused
axis position) join those axes too, where that keeps every class valid (no
statement meets itself, one length); otherwise they stay apart.

A running top-k's list has one more axis than its `axes`: the rank (0 = best),
of length k, at position `rank` of its buffers. `rank_axis` names it, so the
epilogue's reads of the values and indices line up with it like any other axis.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..ir import Axis, Compute, Expr, FusedLoop, Load, OnlineState, Reduce, TopKState, walk

Node = tuple[int, str]  # (statement number, axis name)


class Unfusable(Exception):
    """The statements cannot share one tiled kernel (internal to the scheduler)."""


@dataclass
class AxisClasses:
    """The result: each (statement, axis) node's class key, and each class's extent."""

    key: dict[Node, str]
    extent: dict[str, int]

    def of(self, stmt: int, axis: Axis) -> str:
        return self.key[(stmt, axis.name)]


def rank_axis(st: TopKState) -> Axis:
    """The rank axis of a running top-k (a name no traced axis has)."""
    return Axis(f"rank.{st.acc.name}", st.k)


def state_axes(st: OnlineState | TopKState) -> tuple[Axis, ...]:
    """The axes of a state's buffers, in buffer order (a top-k's rank axis included)."""
    if isinstance(st, TopKState):
        return st.axes[: st.rank] + (rank_axis(st),) + st.axes[st.rank:]
    return st.axes


def statement_axes(fl: FusedLoop, epilogue: list[Compute]) -> list[tuple[tuple[Axis, ...], list[Expr], str]]:
    """Per statement: its axes (parallel, then fused axis for states), the expressions it evaluates, its output."""
    out: list[tuple[tuple[Axis, ...], list[Expr], str]] = []
    for local in fl.locals:
        extra = local.reduce_axes if isinstance(local, Reduce) else ()
        out.append((local.axes + extra, [local.value], local.out.name))
    for st in fl.states:
        exprs = [st.term] + [e for e in (st.rescale, getattr(st, "carry", None)) if e is not None]
        out.append((state_axes(st) + (fl.axis,), exprs, st.acc.name))
    for c in epilogue:
        out.append((c.axes, [c.value], c.out.name))
    return out


def unify(fl: FusedLoop, epilogue: list[Compute]) -> AxisClasses:
    """Classes of the axes of `fl` and `epilogue` (raises `Unfusable`, see the module docstring)."""
    stmts = statement_axes(fl, epilogue)
    parent: dict[Node, Node] = {}

    def find(n: Node) -> Node:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    def union(a: Node, b: Node) -> None:
        parent[find(a)] = find(b)

    producers: dict[str, tuple[int, tuple[Axis, ...]]] = {}
    extents: dict[Node, int] = {}
    for n, (axes, _, out) in enumerate(stmts):
        for a in axes:
            parent[(n, a.name)] = (n, a.name)
            extents[(n, a.name)] = a.extent
    for n, local in enumerate(fl.locals):
        producers[local.out.name] = (n, local.axes)
    ranks: list[Node] = []
    for j, st in enumerate(fl.states):
        producers[st.acc.name] = producers[st.prev.name] = (len(fl.locals) + j, state_axes(st))
        if isinstance(st, TopKState):
            producers[st.indices.name] = producers[st.acc.name]
            ranks.append((len(fl.locals) + j, rank_axis(st).name))
    for j, c in enumerate(epilogue):
        producers[c.out.name] = (len(fl.locals) + len(fl.states) + j, c.axes)
    first_fused = None
    for n, (axes, _, _) in enumerate(stmts):
        if any(a.name == fl.axis.name for a in axes):
            node = (n, fl.axis.name)
            first_fused = first_fused or node
            union(node, first_fused)
    for n, (_, exprs, _) in enumerate(stmts):
        for e in exprs:
            for load in (x for x in walk(e) if isinstance(x, Load) and x.buffer.name in producers):
                p, p_axes = producers[load.buffer.name]
                for idx, pa in zip(load.indices, p_axes):
                    if not isinstance(idx, Axis):
                        if pa.extent == 1 and find((p, pa.name)) not in {find(r) for r in ranks}:
                            continue  # index 0 of a length-1 axis: the kernel keeps that axis as a fixed 0
                        # (not a top-1 list's rank: the kernel keeps that one as a tile dim)
                        raise Unfusable(f"{load.buffer.name} is read at a fixed, shifted or strided position")
                    union((n, idx.name), (p, pa.name))
    _join_sibling_states(fl, stmts, producers, parent, extents, find)
    groups: dict[Node, list[Node]] = {}
    for node in parent:
        groups.setdefault(find(node), []).append(node)
    key: dict[Node, str] = {}
    extent: dict[str, int] = {}
    fused_root = find(first_fused) if first_fused else None
    for root, nodes in groups.items():
        if len({n for n, _ in nodes}) != len(nodes):
            raise Unfusable(f"two axes of one statement meet in kernel axis {nodes[0][1]}")
        if len({extents[n] for n in nodes}) != 1:
            raise Unfusable(f"axes of different lengths meet in kernel axis {nodes[0][1]}")
        base = fl.axis.name if root == fused_root else nodes[0][1]
        name, i = base, 1
        while name in extent:
            name, i = f"{base}_{i}", i + 1
        extent[name] = extents[nodes[0]]
        for n in nodes:
            key[n] = name
    return AxisClasses(key, extent)


def _join_sibling_states(fl: FusedLoop, stmts: list[tuple[tuple[Axis, ...], list[Expr], str]], producers: dict,
                         parent: dict[Node, Node], extents: dict[Node, int], find: Callable[[Node], Node]) -> None:
    """Join the axes at which two states load one input buffer alike (module docstring), one pair of loads at
    a time, undoing a pair that would put two axes of a statement, or two lengths, in one class."""
    first = len(fl.locals)
    reads: dict[tuple[str, tuple[int, ...]], list[tuple[int, tuple[Axis, ...]]]] = {}
    for n in range(first, first + len(fl.states)):
        for e in stmts[n][1]:
            for load in (x for x in walk(e) if isinstance(x, Load) and x.buffer.name not in producers):
                if not load.indices or not all(isinstance(i, Axis) and (n, i.name) in parent for i in load.indices):
                    continue
                fused_at = tuple(k for k, i in enumerate(load.indices) if i.name == fl.axis.name)
                reads.setdefault((load.buffer.name, fused_at), []).append((n, load.indices))
    for loads_of_buffer in reads.values():
        n0, idx0 = loads_of_buffer[0]
        for n, idx in loads_of_buffer[1:]:
            if n == n0:
                continue
            saved = dict(parent)
            for a, b in zip(idx0, idx):
                if a.name != fl.axis.name:
                    parent[find((n, b.name))] = find((n0, a.name))
            if not _valid(parent, extents, find):
                parent.clear()
                parent.update(saved)


def _valid(parent: dict[Node, Node], extents: dict[Node, int], find: Callable[[Node], Node]) -> bool:
    """Whether every class has one axis per statement and one length."""
    seen: dict[Node, tuple[set[int], set[int]]] = {}
    for node in parent:
        stmts, lengths = seen.setdefault(find(node), (set(), set()))
        if node[0] in stmts:
            return False
        stmts.add(node[0])
        lengths.add(extents[node])
    return all(len(lengths) == 1 for _, lengths in seen.values())
