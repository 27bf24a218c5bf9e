"""When a top-k can join the one-pass loop: its running list must rank exactly as the reference does.

A top-k's result is an order, not a number, so the tolerance rule does not apply to its indices: they must
be the reference's exactly, ties (to the lower index) and NaN (last) included. The reference ranks the
values ``p_k = F(x_k, ȳ)`` it computes per element with the final earlier results ``ȳ``.

- ``F`` reads no earlier result (``H = 1``): the running list holds the reference's own values, computed
  by the same operations, so it ranks as the reference does. It joins the pass.
- ``F = G(x)·H(ȳ)`` or ``G(x) + H(ȳ)`` with ``H`` reading earlier results: in exact arithmetic ``p`` is
  a strictly increasing function of ``G`` and a list ranked by ``G`` (or by ``G·H`` rescaled chunk by
  chunk, as the loop would) is the reference's list. In floating point it is not: each step that mixes
  ``x`` with ``ȳ`` rounds (``x - m``, ``exp``, ``/ l``, a cast to a narrower float), so distinct ``x``
  give equal ``p``, which the reference orders by index while a list ordered by ``x`` orders them by
  ``x``. Which ``x`` collapse depends on the final ``ȳ``, unknown until the loop ends, and the collapsed
  band can reach elements the list no longer holds. A list of values rescaled chunk by chunk is worse:
  equal values first seen under different running maxima differ by an ulp. So such a top-k does not
  join the pass: it runs after the loop on the final earlier results, as the reference ranks (the
  earlier results themselves stay fused). A NaN or infinite earlier result then gives the reference's
  NaN row (indices ``0..k-1``) by the same arithmetic, with no guard to get wrong.
"""
from __future__ import annotations

from ..ir import Expr, Load, format_expr, walk
from .member import Member
from .separability import Decomposition


def earlier_reads(value: Expr, earlier: frozenset[str]) -> list[str]:
    """Names of the earlier results `value` reads, in order of first appearance."""
    names: list[str] = []
    for n in walk(value):
        if isinstance(n, Load) and n.buffer.name in earlier and n.buffer.name not in names:
            names.append(n.buffer.name)
    return names


def list_order_refusal(member: Member, value: Expr, dec: Decomposition, earlier: frozenset[str]) -> str | None:
    """Why `member` (a top-k) cannot rank its running list as the reference does; None when it can.

    `value` is the top-k's body over the loop index, `dec` its factorization, `earlier` the buffers
    holding the cascade's earlier results (see the module docstring for the rule).
    """
    if dec.kind == "independent":
        return None
    names = ", ".join(f"`{n}`" for n in earlier_reads(value, earlier)) or "earlier results"
    return (f"`{member.name}` ranks {format_expr(value)}, which the reference rounds to {member.out.dtype} per "
            f"element with the final {names}: distinct elements can round to equal values, ordered by index, and "
            "which ones tie is known only after the loop; the top-k runs after the loop, ranking as the "
            "reference does")
