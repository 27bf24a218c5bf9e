"""`explain`: what the fusion engine found and did, in plain words."""
from __future__ import annotations

from dataclasses import replace

from ..ir import Const, Expr, Load, ReduceOp, Unary, UnaryOp, format_expr, format_stmt, map_expr
from .group import CascadeGroup
from .narrowing import moved_rounding_line, rounding_factor
from . import algebra as A
from .build import sum_expr
from .separability import Accumulator, Decomposition, Refusal, rescale_exponent


def _before(e: Expr) -> Expr:
    """`e` with each earlier result shown at its previous value (``m`` as ``m_before``)."""
    return map_expr(e, lambda n: Load(replace(n.buffer, name=f"{n.buffer.name}_before"), n.indices)
                    if isinstance(n, Load) else None)


def _reduced_part(acc: Accumulator) -> Expr:
    """`acc.G` without the powers of running maxima it divides by online (`separability._split`: the loop's term
    reads them, and H holds them too): for ``sum(x * (127 / a))`` G is ``x``, not ``x / a``, so that G·H is the
    body (a helper found ``x / a`` printed beside ``H = 1 / a``)."""
    scales = {a: p for a, p in acc.powers.factors if isinstance(a, Load) and a in acc.quantized}
    if not scales:
        return acc.G
    pos = lambda e: False  # noqa: E731
    parts = tuple(A.Product(t.coeff, A.Monomial.of({a: p - scales.get(a, 0) for a, p in t.mono.factors
                                                    if p != scales.get(a, 0)}), t.exponent)
                  for t in A.normalize(acc.G, pos, pos))
    return sum_expr(parts, acc.G.dtype)


def _decomposition_lines(name: str, dec: Decomposition | Refusal, group: CascadeGroup) -> list[str]:
    if isinstance(dec, Refusal):
        return [f"  {name}: NOT fused. {dec.reason}"]
    pad = " " * (len(name) + 4)
    if dec.kind == "independent":
        acc = dec.accumulators[0]
        return [f"  {name}: {acc.op.value} over {group.axis.name} of {format_expr(acc.term)}",
                f"{pad}reads no earlier result: it joins the pass as is"]
    lines = [f"  {name}: {dec.kind}" + (" (max/min distributes over +: max(G + H) = max(G) + H)"
                                        if dec.kind == "additive" else "")]
    for c in dec.conditions:
        lines.append(f"{pad}where({format_expr(c)}, G1·H, G2·H) = where({format_expr(c)}, G1, G2)·H: the condition "
                     "reads only the reduced values, not an earlier result, so H comes out of the where")
    for g_atom, online_atom in dec.rounded:
        lines.append(pad + moved_rounding_line(g_atom, online_atom, rounding_factor(dec, online_atom)))
    if dec.stable:
        lines.append(f"{pad}{dec.stable.words}: each power of the centred values keeps its own sum, moved with the "
                     "centre by the binomial shift law, so no expanded terms cancel")
    for n, (acc, factor) in enumerate(zip(dec.accumulators, dec.factors)):
        tag = f"term {n + 1}: " if len(dec.accumulators) > 1 else ""
        lines.append(f"{pad}{tag}G(x) = {format_expr(_reduced_part(acc))}")
        lines.append(f"{pad}{' ' * len(tag)}H(y) = {format_expr(acc.H)}")
        for q in acc.quantized:
            if isinstance(q, Load):      # (a division by a running max, applied online: separability._split)
                lines.append(f"{pad}{' ' * len(tag)}scaled online: the term divides by the running "
                             f"{format_expr(q)} known so far, and each chunk rescales the sum by its ratio to "
                             "the new one (so no power of the reduced values under- or overflows unscaled)")
                continue
            lines.append(f"{pad}{' ' * len(tag)}quantized with the running values: {format_expr(q)} rounds inside "
                         "the loop with the scale known so far (exact algebra, the rounding taken as the identity; "
                         "both programs within one quantization bound: docs/fusion.md, \"Quantization inside a "
                         "cascade\")")
        state = next((st for st in group.states if st.acc.name == group.state_of.get((name, n))), None)
        if state is not None:
            rescale = f", rescaled per chunk by {format_expr(state.rescale)}" if state.rescale is not None else ""
            if state.op is ReduceOp.PROD and state.carry is not None:
                rescale = (", carried per chunk by the product law: each factor already multiplied in moves with H, "
                           f"so the running product is rescaled by H(y_now)/H(y_before) = "
                           f"{format_expr(Unary(UnaryOp.EXP, rescale_exponent(acc.online, _before, acc.G.dtype), acc.G.dtype))}"
                           " raised to the count of those factors")
            lines.append(f"{pad}{' ' * len(tag)}state {state.acc.name}: accumulates {format_expr(acc.term)}{rescale}")
        if isinstance(factor, Const) and factor.value == 0.0:
            lines.append(f"{pad}{' ' * len(tag)}carried only to move the higher powers with the centre")
        elif factor is not None:
            lines.append(f"{pad}{' ' * len(tag)}deferred: {format_expr(factor)} applied once after the loop")
    if dec.written is not None:
        lines.append(f"{pad}after the loop: the body as written, the accumulator in place of G "
                     f"(its own association: nothing cancels that the reference's does not)")
    elif dec.addend is not None:
        lines.append(f"{pad}added once after the loop: {format_expr(dec.addend)}")
    return lines


def explain_group(n: int, g: CascadeGroup) -> str:
    """One cascade in words: its members, each factorization (or refusal), the loop's state."""
    head = (f"cascade {n}: {', '.join(g.reductions)} over an axis of {g.axis.extent} elements "
            f"(the loop index is called {g.axis.name})")
    verdict = ("  fused: " + ", ".join(g.fused_members) + f" in one pass" if g.fused
               else "  not fused")
    lines = [head, verdict + (f" — {g.reason}" if g.reason else "")]
    for local in g.locals:
        lines.append(f"  computed per chunk inside the loop: {local}")
    for name in g.reductions:
        lines += _decomposition_lines(name, g.decompositions[name], g)
    if g.fused:
        lines.append("  loop-carried state: " + ", ".join(st.acc.name for st in g.states))
        for e in g.epilogue:
            lines.append(f"  after the loop: {format_stmt(e)}")
    for note in g.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def fusion_summary(g: CascadeGroup) -> list[str]:
    """One line per verdict for `g`: the members that joined the one-pass loop, then each member left out of it
    with the reason explain gives (a group's `reductions` include refused members, so listing them under one
    ``fused=True`` claimed a pass that the fused program does not run)."""
    if not g.fused:
        return [f"{', '.join(g.reductions)}: fused=False" + (f" — {g.reason}" if g.reason else "")]
    lines = [f"{', '.join(g.fused_members)}: fused=True"]
    for name in g.reductions:
        if name in g.fused_members:
            continue
        dec = g.decompositions.get(name)
        reason = dec.reason if isinstance(dec, Refusal) else g.reason
        lines.append(f"{name}: fused=False" + (f" — {reason}" if reason else ""))
    return lines


def explain(name: str, groups: list[CascadeGroup], fused_ir: object | None, fusion_on: bool = True) -> str:
    """The whole report for one kernel specialization (`fusion_on`: False where the kernel's ``fuse=False``
    kept the fusion engine from running, so that no cascade was looked for)."""
    if not fusion_on:
        text = (f"kernel {name}: fusion is off (fuse=False), so cascades were not looked for: every reduction "
                f"runs as traced, one loop nest per op; explain with fuse=True (the default) to see them.")
    elif not groups:
        text = f"kernel {name}: no cascade of reductions over a shared axis was found; nothing to fuse."
    else:
        text = f"kernel {name}: {len(groups)} cascade(s)\n\n" + "\n\n".join(
            explain_group(n + 1, g) for n, g in enumerate(groups))
    if fused_ir is not None:
        text += f"\n\nfused Loop IR:\n{fused_ir}"
    return text
