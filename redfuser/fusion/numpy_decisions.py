"""Pass `decide_on_numpy_extrema`: a decision reads a 16-bit max or min of computed values as numpy's max.

A fused loop carries a running max of f16/bf16 values in f32 and computes its terms in f32 too, rounding
once (`OnlineState.carried_dtype`): the arithmetic after the loop (``exp(y - m)``) must read that very max,
so that ``y - max(y)`` is exactly 0 at the max. A *decision* after the loop (``y == max(y)``, ``floor(y -
m)``) is evaluated as numpy evaluates it instead, rounding after every operation (`ir.loop.rewrite.decided`),
and where ``y`` takes two or more steps (``tanh(x) * 30``, ``(x * 0.3) * 7``) the once-rounded max need not
be any element's numpy value: f16 ``tanh(3.2148) * 30`` is 29.90625 rounded once and 29.890625 rounded as
numpy rounds it, so ``y == max(y)`` marked no element in 20-30% of rows (found by a helper).

This pass gives each such max or min a twin state that runs over the terms as numpy computes them
(`ir.loop.rewrite.numpy_values`: rounded after every operation), and points the decisions after the loop at
the twin; arithmetic keeps reading the f32 max. A max of values computed in one step needs no twin:
rounding is monotone, so the rounded max is the max of the rounded values.

Guarantees: arithmetic reads are unchanged; each decision operand (a comparison's, a rounding's, a cast's,
a compared select branch) of a later statement that reads such a max reads the twin, whose value is
numpy's max of the same values; a loop gains one state per max or min so read.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Buffer, Cast, Expr, FusedLoop, Load, OnlineState, Program, ReduceOp, map_expr, walk, written
from ..ir.loop.rewrite import map_decision_operands, numpy_values, state_exprs


def decide_on_numpy_extrema(p: Program) -> Program:
    """`p` with the decisions after each fused loop reading numpy-valued twins of its multi-step 16-bit maxima
    and minima (see the module docstring)."""
    body = list(p.body)
    taken = {b.name for b in p.inputs + p.outputs} | {b.name for s in body for b in written(s)}
    taken |= {st.prev.name for s in body if isinstance(s, FusedLoop) for st in s.states
              if isinstance(st, OnlineState)}
    for i, s in enumerate(body):
        if not isinstance(s, FusedLoop):
            continue
        held = frozenset(l.out.name for l in s.locals if l.out.dtype.storage_only)
        candidates = {st.acc.name: st for st in s.states if _multi_step_extremum(st, held)}
        decided = {n for later in body[i + 1:] for e in _exprs(later) for n in _decision_reads(e, candidates)}
        if not decided:
            continue
        twins: dict[str, Buffer] = {}
        for st in s.states:
            if st.acc.name in decided:
                name = _fresh(f"{st.acc.name}_numpy", taken)
                twins[st.acc.name] = Buffer(name, st.acc.type)
                prev = Buffer(_fresh(f"{name}_prev", taken), st.prev.type)
                s = replace(s, states=s.states + (replace(st, acc=twins[st.acc.name], prev=prev,
                                                            term=numpy_values(st.term, held)),))
        body[i] = s
        for j in range(i + 1, len(body)):
            body[j] = _map_stmt(body[j], lambda e: _read_twins(e, twins))
    return replace(p, body=tuple(body))


def _multi_step_extremum(st, held: frozenset[str]) -> bool:
    """A 16-bit running max or min (no rescale, no carry) whose term numpy rounds somewhere below its root."""
    if not (isinstance(st, OnlineState) and st.op in (ReduceOp.MAX, ReduceOp.MIN) and st.acc.dtype.storage_only
            and st.rescale is None and st.carry is None):
        return False
    term = numpy_values(st.term, held)
    inner = term.x if isinstance(term, Cast) else term
    return any(isinstance(n, Cast) and n.dtype.storage_only for n in walk(inner))   # (a rounding point)


def _exprs(s) -> list[Expr]:
    if isinstance(s, FusedLoop):
        return [l.value for l in s.locals] + [e for st in s.states for e in state_exprs(st)]
    return [s.value]


def _map_stmt(s, fn):
    if isinstance(s, FusedLoop):
        return replace(s, locals=tuple(replace(l, value=fn(l.value)) for l in s.locals),
                       states=tuple(_map_state(st, fn) for st in s.states))
    return replace(s, value=fn(s.value))


def _map_state(st, fn):
    st = replace(st, term=fn(st.term), rescale=None if st.rescale is None else fn(st.rescale))
    if isinstance(st, OnlineState) and st.carry is not None:
        st = replace(st, carry=fn(st.carry))
    return st


def _decision_reads(e: Expr, names) -> set[str]:
    """The maxima among `names` that a decision operand of `e` reads (a 16-bit operand: `decided` rounds only
    those; a comparison with an infinity, the NaN guard, and a select's branch that is one of them, as in
    ``where(m == -inf, 0, m)``, are arithmetic)."""
    found: set[str] = set()

    def note(v: Expr) -> Expr:
        if not v.dtype.storage_only:
            return map_decision_operands(v, note, frozenset(names), but_infinities=True)
        found.update(n.buffer.name for n in walk(v) if isinstance(n, Load) and n.buffer.name in names)
        return v
    map_decision_operands(e, note, frozenset(names), but_infinities=True)
    return found


def _read_twins(e: Expr, twins: dict[str, Buffer]) -> Expr:
    def twin(v: Expr) -> Expr:
        if not v.dtype.storage_only:
            return map_decision_operands(v, twin, frozenset(twins), but_infinities=True)
        return map_expr(v, lambda n: replace(n, buffer=twins[n.buffer.name])
                        if isinstance(n, Load) and n.buffer.name in twins else None)
    return map_decision_operands(e, twin, frozenset(twins), but_infinities=True)


def _fresh(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}{k}", k + 1
    taken.add(out)
    return out


__all__ = ["decide_on_numpy_extrema"]
