"""Which tile values the host code keeps in memory, and which it recomputes where they are used.

On the CPU a tile is either *materialized* (a stack array filled by one loop
nest where the value is defined) or *inline* (its element at an index is
computed inside the loop nest of whoever reads it, so elementwise chains,
broadcasts and index arithmetic fuse into one loop with no memory traffic).

Materialized: results of ``reduce``, ``dot``, ``topk`` and ``for``; ``dot`` operands (laid
out row-major for the inner loop) and ``topk`` candidates (read more than once); values a loop yields (but see
`in_place_yields`); and values that are
costly to recompute (loads, float arithmetic) when more than one consumer reads
them or a loop deeper than their definition does (loop invariants are computed
once). Views (broadcast, expand_dims, permute) and integer/bool index
arithmetic are always inline. Scalars (shape ``()``) are plain SSA registers.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...ir.tile import nodes as t

VIEWS = (t.Broadcast, t.ExpandDims, t.Permute)


@dataclass(frozen=True)
class Plan:
    """`materialized`: names of values stored in stack arrays; `defs`: each value's defining op;
    `in_place_yields`: yielded values computed, at the end of their loop's body, straight into the slot of the
    carried value they replace (`in_place_yields`)."""

    materialized: frozenset[str]
    defs: dict[str, t.Op]
    in_place_yields: frozenset[str] = frozenset()


def _costly(op: t.Op) -> bool:
    if isinstance(op, t.Load):
        return True
    if isinstance(op, t.Unary | t.Binary | t.Select | t.Cast):
        return op.out.dtype.is_float or (isinstance(op, t.Unary) and op.op.value in ("exp", "log"))
    return False


def plan_kernel(k: t.TileKernel) -> Plan:
    """The materialization plan of `k` (see the module docstring)."""
    defs: dict[str, t.Op] = {}
    depth: dict[str, int] = {}
    consumers: dict[str, set[int]] = {}
    deeper: set[str] = set()
    forced: set[str] = set()
    in_place: set[str] = set()

    def source(v: t.Value) -> str:
        op = defs.get(v.name)
        while isinstance(op, VIEWS):
            v = op.x
            op = defs.get(v.name)
        return v.name

    def use(v: t.Value, user: int, level: int) -> None:
        src = source(v)
        consumers.setdefault(src, set()).add(user)
        if level > depth.get(src, 0):
            deeper.add(src)

    def visit(ops: tuple[t.Op, ...], level: int) -> None:
        for op in ops:
            for r in t.results(op):
                defs[r.name], depth[r.name] = op, level
            if isinstance(op, VIEWS):
                continue  # a view's readers count as readers of its source
            for v in t.operands(op):
                use(v, id(op), level)
            if isinstance(op, t.Dot):
                forced.update(v.name for v in (op.a, op.b))
            if isinstance(op, t.TopK):
                # a top-k reads each candidate more than once (compared, then kept): a computed one
                # (MoE routing's exp(x - m) / sum) is computed once, not at every read
                forced.add(op.x.name)
            if isinstance(op, t.Reduce | t.Dot | t.TopK):
                forced.update(r.name for r in t.results(op))
            if isinstance(op, t.For):
                body = op.body
                for a in (body.iv,) + body.args:
                    defs[a.name], depth[a.name] = op, level + 1
                forced.update(r.name for r in op.results)
                forced.update(a.name for a in body.args)
                visit(body.ops, level + 1)
                for y in body.yields:
                    use(y, id(body), level + 1)
                lazy = in_place_yields(body)
                in_place.update(lazy)
                forced.update(y.name for y in body.yields if y.name not in lazy)

    visit(k.body, 0)
    chosen = set(forced)
    for name, op in defs.items():
        if _costly(op) and (len(consumers.get(name, ())) > 1 or name in deeper):
            chosen.add(name)
    shaped = {n for n in chosen if n in defs and _shape_of(defs[n], n) != ()}
    return Plan(frozenset(shaped), defs, frozenset(in_place))


ELEMENTWISE = (t.Unary, t.Binary, t.Select, t.Cast)


def in_place_yields(body: t.Region) -> set[str]:
    """Values `body` yields that need no stack array of their own: each is computed elementwise (its defining
    op and the inline ops under it: elementwise ops and views, down to materialized values) from the carried
    value ``a`` it replaces, read only at the element being computed (no view of ``a`` under it), and from no
    other carried value the loop changes; nothing but the yield reads it. Computed after the body's other yields
    are copied, element by element into ``a``'s slot (each element of ``a`` read just before it is
    overwritten), it replaces a pass that stored it and a copy back: layer norm + GEMM's running column sum
    of ``w`` (``[rows, cols]``, ``s + colsum(w_chunk)``) made both each chunk."""
    defs = {r.name: o for o in body.ops for r in t.results(o)}
    unchanged = {a.name for a, y in zip(body.args, body.yields) if a.name == y.name}   # never overwritten
    args = {a.name for a in body.args} - unchanged
    yielded = [y.name for y in body.yields]
    read_elsewhere = {v.name for o in t.walk_ops(body.ops) for v in t.operands(o)}
    read_elsewhere.update(v.name for o in t.walk_ops(body.ops) if isinstance(o, t.For) for v in o.body.yields)
    found: set[str] = set()
    for a, y in zip(body.args, body.yields):
        op = defs.get(y.name)
        if (y.name == a.name or not isinstance(op, ELEMENTWISE) or y.shape != a.shape or yielded.count(y.name) != 1
                or y.name in read_elsewhere):
            continue
        seen: set[int] = set()
        todo: list[t.Op] = [op]
        ok = True
        while todo and ok:
            o = todo.pop()
            if id(o) in seen:
                continue
            seen.add(id(o))
            for v in t.operands(o):
                if v.name in args:
                    ok = v.name == a.name and not isinstance(o, VIEWS)
                    if not ok:
                        break
                elif isinstance(defs.get(v.name), ELEMENTWISE + VIEWS):
                    todo.append(defs[v.name])
        if ok:
            found.add(y.name)
    return found


def _shape_of(op: t.Op, name: str) -> tuple[int, ...]:
    if isinstance(op, t.For):
        for v in op.results + op.body.args + (op.body.iv,):
            if v.name == name:
                return v.shape
    for r in t.results(op):
        if r.name == name:
            return r.shape
    return ()
