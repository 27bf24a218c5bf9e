"""Pass `share_common_nests`: two nests computing the same values become one.

Guarantees: same program values; no two non-output nests with equal loops,
reduction and value remain (the later one's readers read the earlier buffer).
Within one expression, equal sub-expressions are one node already (structural
equality); evaluators memoize on it, so ``exp(s - m)`` feeding both ``l`` and the
output accumulator is computed once.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Buffer, Compute, Expr, Load, Program, Reduce, map_expr


def _key(s: Compute | Reduce) -> tuple:
    if isinstance(s, Reduce):
        return ("reduce", s.out.type, s.axes, s.reduce_axes, s.op, s.value)
    return ("compute", s.out.type, s.axes, s.value)


def share_common_nests(p: Program) -> Program:
    """Merge duplicate nests (not outputs) into the first of them."""
    outputs = {b.name for b in p.outputs}
    seen: dict[tuple, Buffer] = {}
    alias: dict[str, Buffer] = {}

    def fix(n: Expr) -> Expr | None:
        if isinstance(n, Load) and n.buffer.name in alias:
            return Load(alias[n.buffer.name], n.indices)
        return None

    body = []
    for s in p.body:
        if not isinstance(s, Compute | Reduce):
            body.append(replace(s, value=map_expr(s.value, fix)) if hasattr(s, "value") else s)
            continue
        s = replace(s, value=map_expr(s.value, fix))
        k = _key(s)
        if k in seen and s.out.name not in outputs:
            alias[s.out.name] = seen[k]
            continue
        seen.setdefault(k, s.out)
        body.append(s)
    return replace(p, body=tuple(body))
