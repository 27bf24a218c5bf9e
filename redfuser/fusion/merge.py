"""The merge rule: combining two partial states of a fused loop over disjoint chunks.

ARCHITECTURE.md section 4: two partial states over chunk sets A and B merge by
rescaling each to the merged earlier results and combining with the monoid.
For each state, in cascade order (earlier states are merged first)::

    scaled_X = acc_X where acc_X == identity, else acc_X * r_X   (r_X: the state's rescale
                                                                with prev := acc_X, current := merged)
    merged   = scaled_A (+) scaled_B

A shift-stable sum (`OnlineState.carry`) has ``scaled_X = carry_X`` instead (prev := acc_X,
current := merged): each side moved to the merged centre by the binomial law, then added
(for a variance this is the parallel-variance merge of Chan et al.).

Split reductions (many programs each reduce a slice of the axis, then a combine
step) and tree reductions across threads and warps call this rule; it is derived
from each cascade's own rescale expressions, never hard-coded for attention.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import Buffer, Expr, FusedLoop, Load, OnlineState, TopKState, map_expr
from ..ir import topk as topk_semantics
from ..ir.loop.interpreter import Env, combine, evaluate, rescale_list, rescale_partial


@dataclass(frozen=True)
class MergeStep:
    """How one state's two partials (`a`, `b`) combine; `scale_a`/`scale_b` read a-, b- and merged buffers."""

    state: OnlineState | TopKState
    a: Buffer
    b: Buffer
    scale_a: Expr | None
    scale_b: Expr | None
    carry_a: Expr | None = None    # a shift-stable sum: side a moved to the merged centre (replaces scale_a)
    carry_b: Expr | None = None


def partial_buffer(st: OnlineState, side: str) -> Buffer:
    """The buffer holding side `side` ("a" or "b") of a state's partial."""
    return Buffer(f"{st.acc.name}_{side}", st.acc.type)


def merge_rule(loop: FusedLoop) -> tuple[MergeStep, ...]:
    """The merge of two partial states of `loop`, one step per state in cascade order."""
    steps = []
    for st in loop.states:
        sides: dict[str, Expr | None] = {}
        carries: dict[str, Expr | None] = {}
        for side in ("a", "b"):
            prev_to_side = {s.prev.name: partial_buffer(s, side) for s in loop.states if isinstance(s, OnlineState)}
            to_side = lambda e, m=prev_to_side: None if e is None else map_expr(  # noqa: E731
                e, lambda n: Load(m[n.buffer.name], n.indices) if isinstance(n, Load) and n.buffer.name in m else None)
            sides[side] = to_side(st.rescale)
            carries[side] = to_side(st.carry) if isinstance(st, OnlineState) else None
        steps.append(MergeStep(st, partial_buffer(st, "a"), partial_buffer(st, "b"), sides["a"], sides["b"],
                               carries["a"], carries["b"]))
    return tuple(steps)


def merge_partials(loop: FusedLoop, a: dict[str, np.ndarray], b: dict[str, np.ndarray],
                   env: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Merge two partial states (state name -> array) of `loop` with numpy, by `merge_rule`.

    A running top-k's partials are its values and indices (`state.indices.name` in `a` and `b`).
    """
    scope = Env(env or {})
    merged: dict[str, np.ndarray] = {}
    for step in merge_rule(loop):
        st = step.state
        if isinstance(st, TopKState):
            merged.update(_merge_topk(step, a, b, scope))
            continue
        scope[step.a.name], scope[step.b.name] = a[st.acc.name], b[st.acc.name]
        with np.errstate(all="ignore"):
            parts = [np.broadcast_to(evaluate(carry, scope, st.axes), part.shape) if carry is not None else
                     rescale_partial(st.op, part, None if scale is None else evaluate(scale, scope, st.axes))
                     for part, scale, carry in ((a[st.acc.name], step.scale_a, step.carry_a),
                                                (b[st.acc.name], step.scale_b, step.carry_b))]
            value = combine(st.op, parts[0], parts[1])
        merged[st.acc.name] = scope[st.acc.name] = np.asarray(value, dtype=st.acc.dtype.numpy)
    return merged


def _merge_topk(step: MergeStep, a: dict[str, np.ndarray], b: dict[str, np.ndarray], scope: Env) -> dict:
    """Two running top-k lists: rescale each side's values (empty slots stay empty), keep the best k."""
    st = step.state
    sides = []
    with np.errstate(all="ignore"):
        for part, scale in ((a, step.scale_a), (b, step.scale_b)):
            values = np.moveaxis(part[st.acc.name], st.rank, -1)
            indices = np.moveaxis(part[st.indices.name], st.rank, -1)
            values = rescale_list(values, indices, None if scale is None else evaluate(scale, scope, st.axes))
            sides.append((values, indices))
    values, indices = topk_semantics.merge(*sides[0], *sides[1])
    return {st.acc.name: np.moveaxis(values, -1, st.rank), st.indices.name: np.moveaxis(indices, -1, st.rank)}
