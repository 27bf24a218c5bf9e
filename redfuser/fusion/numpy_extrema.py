"""Pass `compute_extrema_as_numpy`: a 16-bit max or min, and the values that meet it, computed as numpy does.

A fused loop computes f16/bf16 values in f32 and rounds once where it stores (`OnlineState.carried_dtype`);
numpy rounds after every operation. Where a max ``m`` of values ``y`` the program computes (``x * 0.75``,
``tanh(x) * 30``, ``a - b``, ``x - mean(x)``, an f16 ``q @ k.T``) meets ``y`` again, the two roundings part:

- a decision after the loop compared numpy's ``y`` with the once-rounded max: ``y == max(y)`` marked no
  element in 20-30% of rows;
- a max read from memory by a later kernel is rounded, and ``exp(y - m)`` computed with the f32 ``y`` is
  ``exp`` of half an ulp of ``y`` at the max: a bf16 softmax of ``x * 0.75`` at 3e38 was NaN, an f16 softmax's
  sum beside a reduction over the other axis 0.94 for a row whose max term alone is 1, and a second pass's
  ``sum(exp(y - max(y)))`` of ``y = x - mean(x)`` 0.95-1.29 for numpy's 1 (found by helpers);
- and which max a kernel read depended on how the schedule split the program into kernels, so one softmax
  gave other probabilities beside a one-hot than alone.

This pass makes both sides numpy's, whatever the schedule: each such max or min runs over its terms rounded
as numpy rounds them (`ir.loop.rewrite.numpy_values`), so its value is numpy's max, in f32 or stored; a max
finished after the loop by the additive law (``max(x - mu) = max(x) - mu``, rounded once to its type) is
numpy's already, as rounding is monotone; and wherever a value equal to the term ``y`` meets either (the loop's
other states, the epilogue, every later statement) it is computed as numpy computes it
(`ir.loop.rewrite.beside_numpy_extrema`), so ``y - max(y)`` is exactly 0 at the max, as in numpy. The
reductions themselves still accumulate in f32.

Guarantees: values unchanged in exact arithmetic; the rounding points added are numpy's own; only 16-bit
maxima and minima without a rescale or carry (a quantization's scale, a shift law) and the values equal to
their terms in the expressions that read them are touched.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import Binary, BinaryOp, Cast, Compute, Expr, FusedLoop, Load, Program, Stmt
from ..ir.loop.rewrite import beside_numpy_extrema, numpy_valued_extrema, numpy_values


def compute_extrema_as_numpy(p: Program) -> Program:
    """`p` with its fused loops' 16-bit maxima and minima, and the values that meet them, computed as numpy
    computes them (see the module docstring)."""
    body = list(p.body)
    for i, s in enumerate(body):
        if not isinstance(s, FusedLoop):
            continue
        own = numpy_valued_extrema(s)
        if not own:
            continue
        terms = {st.acc.name: st.term for st in s.states if st.acc.name in own}
        terms.update(_finished_additively(body[i + 1:], terms))
        body = beside_numpy_extrema(body, i, terms)     # (matched against the terms as written)
        loop = body[i]
        held = frozenset(l.out.name for l in loop.locals if l.out.dtype.storage_only)
        body[i] = replace(loop, states=tuple(replace(st, term=numpy_values(st.term, held))
                                             if st.acc.name in own else st for st in loop.states))
    return replace(p, body=tuple(body))


def _finished_additively(later: list[Stmt], terms: dict[str, Expr]) -> dict[str, Expr]:
    """The 16-bit maxima and minima finished after the loop by the additive law, ``m = acc + h`` or ``acc - h``
    rounded once to their type (``max(x - mu)`` is ``max(x) - mu``), each with the term ``y`` it is the max of
    (``x - mu``): numpy's max of ``y``, as rounding is monotone."""
    out: dict[str, Expr] = {}
    for s in later:
        if not (isinstance(s, Compute) and s.out.dtype.storage_only):
            continue
        v = s.value.x if isinstance(s.value, Cast) and s.value.dtype == s.out.dtype else s.value
        if (isinstance(v, Binary) and v.op in (BinaryOp.ADD, BinaryOp.SUB) and v.dtype == s.out.dtype
                and isinstance(v.a, Load) and v.a.buffer.name in terms):
            out[s.out.name] = Binary(v.op, terms[v.a.buffer.name], v.b, v.dtype)
    return out


__all__ = ["compute_extrema_as_numpy"]
