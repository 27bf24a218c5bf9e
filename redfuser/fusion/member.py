"""A uniform view of the reductions a cascade can hold: `Reduce` (sum/max/min) and `TopK`."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Axis, Buffer, Expr, Reduce, ReduceOp, SourceLoc, TopK


@dataclass(frozen=True)
class Member:
    """One reduction of a cascade, whatever its kind.

    `axes` index its (values) buffer; `state_axes` are the axes its running state
    is kept per (the same, except that a top-k's rank axis is not among them).
    `order_op` is the monoid whose factorization rules apply (top-k keeps an
    order, so it follows max's: positive factors and added constants commute).
    """

    stmt: Reduce | TopK
    out: Buffer
    axes: tuple[Axis, ...]
    state_axes: tuple[Axis, ...]
    reduce_axis: Axis
    value: Expr
    loc: SourceLoc
    order_op: ReduceOp
    indices: Buffer | None = None
    rank: int = -1

    @property
    def name(self) -> str:
        return self.out.name

    @property
    def is_topk(self) -> bool:
        return self.indices is not None

    @property
    def kind(self) -> str:
        return f"top {self.out.shape[self.rank]}" if self.is_topk else self.order_op.value


def as_member(s: object) -> Member | None:
    """`s` as a cascade member, or None when it cannot be one (not a single-axis reduction)."""
    if isinstance(s, Reduce) and len(s.reduce_axes) == 1:
        return Member(s, s.out, s.axes, s.axes, s.reduce_axes[0], s.value, s.loc, s.op)
    if isinstance(s, TopK):
        return Member(s, s.values, s.axes, s.parallel, s.reduce_axis, s.value, s.loc, ReduceOp.MAX,
                      indices=s.indices, rank=s.rank)
    return None
