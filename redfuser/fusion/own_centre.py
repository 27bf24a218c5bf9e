"""A sum centred on a running mean the compiler keeps itself: every polynomial in ``u - k Y`` gets a stable form.

`centred.py` keeps a sum centred when the earlier result it subtracts is a running max, min or mean of the
very values it is subtracted from. When the earlier result ``Y`` is anything else (a dot product's mean, a
max of other data), the expansion ``sum u^2 - 2 Y sum u + N Y^2`` still cancels wherever ``u`` is close to
``k Y``. The compiler then adds a centre of its own: the running mean ``c`` of ``u`` (a running sum and an
exact running count, like a user's mean), and writes

    u - k Y = (u - c) + (c - k Y) = w + delta

``w`` is centred and moved with ``c`` by the shift law (`shift_law.py`), exactly as for a user's mean.
``delta`` is an atom of its own for the algebra (`delta` below: a value after the loop, one subtraction
of final values ``c_final - k Y``), so the normal form holds powers of ``delta`` and never ``c^2``,
``c Y`` and ``Y^2`` apart: ``sum (u - k Y)^K = sum_j C(K, j) delta^(K - j) sum w^j``, and nothing cancels
beyond what the reference's own ``u - k Y`` does.

Which ``u`` and ``k``: the body is read as a polynomial in ``u`` whose root is ``k Y``. Candidates come
from the normal form (the terms of the two highest powers of ``Y`` give ``u / k``; the coefficients of
``x^p R`` and ``x^(p-1) Y R`` give ``k`` for ``u = x``), and a candidate is kept only where the change of
variables leaves no term without ``w`` or ``delta``: that is, where ``u = k Y`` makes the body 0, so no
large part of the result is a difference of expanded sums.

The centre's sum and count skip non-finite values of ``u`` (the centre stays finite, so an infinite
element gives an infinite ``w`` of the reference's sign). A power's sum that is infinite or NaN is carried
unmoved when the centre moves (`keep_infinite`), and after the loop the lower powers are dropped where the
highest one is not finite (``inf - inf`` there is no value the reference has).
"""
from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import TYPE_CHECKING, Callable

from ..ir import (Axis, Binary, BinaryOp, Buffer, BufferType, Cast, Compute, Const, Expr, Load, OnlineState, ReduceOp,
                  Select, Unary, UnaryOp, format_expr, map_expr)
from ..ir.loop.expr import walk
from ..ir.types import bool_, float32, float64
from . import algebra as A
from .build import linear_expr
from .centred import Centre, _families, cancelling_pairs, centre_sum, change_variables
from .numeric_check import check
from .separability import Accumulator, Decomposition, FusionContext, Refusal, decompose
from .shift_law import centre_now
from .taylor import taylor_sum

if TYPE_CHECKING:
    from .loop_builder import LoopBuilder
    from .member import Member


def stabilize(dec: Decomposition, value: Expr, ctx: FusionContext, states: tuple[OnlineState, ...],
              running: Callable[[Expr], Expr], axis: Axis, name: str,
              delta: Load) -> tuple[Decomposition, str | None]:
    """For an expanded sum `dec` of `value`: its shift-stable form around a running statistic of the
    reduced values where one exists, else around a running mean of its own (`delta` the after-the-loop
    value ``c - k Y`` the factors read) where the body is a polynomial in ``u - k Y``, else in Taylor form
    around that mean (`taylor.py`) where it is a polynomial in one reduced value; else `dec` itself with,
    where the expansion multiplied out a difference of reduced values and an earlier result, why no stable
    form applies (the caller refuses it). Only the additive terms of the body that multiply out such a
    difference are centred; the others are summed as usual (``(x - Y)^2 + exp(d - M)``)."""
    value = rounded_differences(value, ctx)
    stable = centre_sum(value, ctx, states, running, axis.name, axis.extent, name)
    if stable is not None:
        return stable, None
    pair = written_pair(value, ctx)
    if pair is None:
        return dec, None   # (x / Y + c: the reference rounds x / Y before adding, as the expansion does)
    written = [p for p in cancelling_pairs(value, ctx) if _plain_difference(value, p)]
    tops = list(dict.fromkeys(x for x, _ in written))
    if len(tops) > 1:
        # a running centre keeps one reduced value's differences small: the covariance ``(x_a - m_a) (x_b -
        # m_b)`` centred on column a's mean still multiplied out ``x_b - m_b`` (30-300x numpy's error at an
        # offset of 1e4; found by a helper), and ``(x_j - m) (x_{n-1-j} - m)`` likewise
        return dec, (f"it multiplies out differences of {len(tops)} reduced values ("
                     f"{', '.join(f'{format_expr(x)} - {format_expr(y)}' for x, y in written)}), and a running "
                     "centre keeps one of them small")
    centred, rest = split_by_pair(value, ctx)
    if rest is None:
        whole = _own_or_taylor(value, ctx, pair, axis, name, delta)
        return (whole, None) if isinstance(whole, Decomposition) else (dec, _unstable(pair, whole))
    pair = written_pair(centred, ctx) or pair
    part = (centre_sum(centred, ctx, states, running, axis.name, axis.extent, name)
            or _own_or_taylor(centred, ctx, pair, axis, name, delta))
    if isinstance(part, str):
        return dec, _unstable(pair, part)
    others = decompose(rest, ReduceOp.SUM, ctx, name)
    if isinstance(others, Refusal):
        return dec, _unstable(pair, f"the other terms are not separable ({others.reason})")
    failure = check(rest, others, ctx)
    if failure is not None or written_pair(rest, ctx) is not None:
        return dec, _unstable(pair, f"the other terms {format_expr(rest)} have no stable form of their own")
    return Decomposition("shift-stable sum", part.accumulators + others.accumulators,
                         part.factors + others.factors, others.addend, expanded=others.expanded,
                         conditions=others.conditions, rounded=others.rounded, stable=part.stable), None


def rounded_exponents(value: Expr, ctx: FusionContext) -> Expr:
    """`value` with `rounded_differences` applied inside each ``exp`` and ``exp2`` argument, in every float type:
    a value computed from the reduced values alone is rounded as numpy rounds it before it meets an earlier
    result there. An exponential turns its argument's rounding into a relative error of ``|argument|`` ulps,
    and the algebra folded constants across it: ``v = x * log2(e); exp2(v - max(v))`` became ``exp(x - ln2 m)``,
    whose term at the max is not ``exp2(0) = 1`` but ``exp(x - ln2 f32(x log2 e))``: 3.00012 for numpy's 3 with
    logits near 2000 (fuzz seed 118, example 1122). Rounded, ``v`` is one atom, and ``v - m`` is 0 at the max."""
    def visit(n: Expr) -> Expr | None:
        if isinstance(n, Unary) and n.op in (UnaryOp.EXP, UnaryOp.EXP2):
            x = rounded_differences(n.x, ctx, every_float=True)
            return replace(n, x=x) if x is not n.x else None
        return None
    return map_expr(value, visit)


def rounded_differences(value: Expr, ctx: FusionContext, every_float: bool = False) -> Expr:
    """`value` with each 16-bit value it computes from the reduced values alone and then adds to or subtracts
    from an earlier result (f16 ``y = x * 1.3`` in ``(y - mean(y))**2``) rounded to its type as numpy rounds it
    before that step (an explicit cast, which the kernels keep as a rounding point).

    The algebra would take ``y`` apart (``1.3 (x - mean / 1.3)``) and centre the sum on ``x``, the product
    then never rounded: on a constant row numpy's ``y - mean`` is exactly 0 and the fused sum was ``n`` times
    the square of ``y``'s rounding error (0.05 for an f16 row of 64; found by a helper, hunt_gaps/01).
    Rounded, ``y`` is one atom, centred on its own running mean. With `every_float`, f32 and f64 values too
    (`rounded_exponents`)."""
    def narrow(d) -> bool:
        return d.storage_only or (every_float and d.is_float)

    def operand(o: Expr, other: Expr) -> Expr:
        if (narrow(o.dtype) and isinstance(o, Unary | Binary | Select) and ctx.kind(o) == "x"
                and ctx.kind(other) == "y"):
            return Cast(o, o.dtype)
        return o

    def visit(n: Expr) -> Expr | None:
        if isinstance(n, Binary) and n.op in (BinaryOp.ADD, BinaryOp.SUB) and narrow(n.dtype):
            a, b = operand(n.a, n.b), operand(n.b, n.a)
            if a is not n.a or b is not n.b:
                return replace(n, a=a, b=b)
        return None
    return map_expr(value, visit)


def _own_or_taylor(value: Expr, ctx: FusionContext, pair: tuple[Expr, Expr], axis: Axis, name: str,
                   delta: Load) -> Decomposition | str:
    """`value`'s sum centred on a running mean of the compiler's own: on one root, else in Taylor form."""
    # (a stored ``Y`` may be a weighted mean too: ``mu = sum(q * x)`` with normalized weights ``q``, then
    # ``sum(q * (x - mu)**2)`` gave -16 for numpy's 0.29; found by a helper. A first power cancels nothing
    # more than the reference's own sum: ``(x - max z) @ w`` keeps its own centre.)
    weighted = _weighted(value, pair[0], ctx) or _exponential(value)
    if weighted and (not isinstance(pair[1], Load) or _degree(value, pair[0], ctx) >= 2):
        # ``Σ w (x - S / W)**2``: the compiler's own centre is the plain running mean of ``x``, far from the
        # weighted mean ``S / W`` where the weights are skewed, and the weighted sums around it cancel (weights
        # -2 and 65504: -2.00098 for numpy's -2.00006; fuzz seed 81, example 605, as the Taylor form's below)
        return f"its own centre would be the plain running mean of {format_expr(pair[0])}, and the weighted " \
               f"sums around it cancel where the weights put {format_expr(pair[1])} far from it"
    own = own_centre_sum(value, ctx, pair, axis, name, delta)
    if isinstance(own, Decomposition):
        return own
    if not isinstance(pair[1], Load) or weighted:
        # ``Y`` a weighted mean ``S / W`` (one earlier value of two results): the Taylor form centres its
        # weighted sums on the plain running mean of the reduced values, far from ``Y`` where the weights
        # are concentrated (softmax weights of logits spread by 1e3: 0.16 off for numpy's 0.09; fuzz seed 75,
        # example 937), so such a sum is a second pass, as written
        return f"the compiler could not centre the sum on a running mean of its own ({own}), and the Taylor " \
               f"form's centre is no weighted mean like {format_expr(pair[1])}"
    taylor = taylor_sum(value, ctx, pair, axis, name, delta)
    if isinstance(taylor, Decomposition):
        return taylor
    return f"the compiler could not centre the sum on a running mean of its own ({own}), and no Taylor form " \
           f"around one applies ({taylor})"


def _weighted(value: Expr, u: Expr, ctx: FusionContext) -> bool:
    """Whether `value` reads reduced values other than those `u` reads (a weight beside ``(u - Y)**2``)."""
    own = {n for n in walk(u) if isinstance(n, Load)}
    return any(isinstance(n, Load) and n not in own and ctx.kind(n) == "x" for n in walk(value))


def _plain_difference(value: Expr, pair: tuple[Expr, Expr]) -> bool:
    """Whether the body subtracts (or adds) the earlier result ``Y`` of `pair` from its reduced value ``X``
    itself: a ``+`` or ``-`` whose one side reads only ``X`` and the other only ``Y`` (``x - sum / n``; not
    ``(x - Y) w + x Z``, whose sides read both, which `forms_difference` also counts)."""
    x, y = pair

    def only(e: Expr, atom: Expr) -> bool:     # (every load of `e` is one of `atom`'s)
        loads = {n for n in walk(e) if isinstance(n, Load)}
        return bool(loads) and loads <= {n for n in walk(atom) if isinstance(n, Load)}

    for n in walk(value):
        if isinstance(n, Binary) and n.op in (BinaryOp.ADD, BinaryOp.SUB):
            if (only(n.a, x) and only(n.b, y)) or (only(n.a, y) and only(n.b, x)):
                return True
    return False


def _exponential(value: Expr) -> bool:
    """Whether `value` reads an exponential (a softmax weight beside the powers)."""
    return any(isinstance(n, Unary) and n.op is UnaryOp.EXP for n in walk(value))


def _degree(value: Expr, u: Expr, ctx: FusionContext) -> int:
    """The highest power of `u` in `value`'s normal form."""
    return max((int(p) for t in ctx.normal_form(value) for a, p in t.mono.factors if a == u), default=0)


def _unstable(pair: tuple[Expr, Expr], why: str) -> str:
    x, y = (format_expr(e) for e in pair)
    return f"it multiplies out {x} ± {y}; {y} is not a running max, min or mean of {x}, and {why}"


def split_by_pair(value: Expr, ctx: FusionContext) -> tuple[Expr, Expr | None]:
    """`value` as (the sum of its additive terms that each multiply out a difference of a reduced value and
    an earlier result, the sum of the others), or (`value`, None) where it has no such split: no term does
    on its own (the difference is spread over several terms), or every term does."""
    parts = _additive_parts(value, ctx)
    cancels = [written_pair(p, ctx) is not None for p in parts]
    centred = [p for p, c in zip(parts, cancels) if c]
    rest = [p for p, c in zip(parts, cancels) if not c]
    if not centred or not rest:
        return value, None
    return _sum(centred), _sum(rest)


def written_pair(value: Expr, ctx: FusionContext) -> tuple[Expr, Expr] | None:
    """The first cancelling pair (`cancelling_pairs`) whose difference the body forms as written, or None."""
    return next((p for p in cancelling_pairs(value, ctx) if forms_difference(value, p)), None)


def forms_difference(value: Expr, pair: tuple[Expr, Expr]) -> bool:
    """True where the body, as written, adds or subtracts a side reading the reduced ``X`` (not ``Y``) and a
    side reading the earlier result ``Y`` (not ``X``): the reference forms ``X - k Y`` before anything
    multiplies it, so it keeps the small difference that the expanded ``sum X R - k Y sum R`` loses. Where
    the body combines them only after a product (``x / Y + c``, ``x Y - Y^2``) the reference rounds the
    large products itself, and the expansion loses nothing more."""
    x, y = pair
    for n in walk(value):
        if isinstance(n, Binary) and n.op in (BinaryOp.ADD, BinaryOp.SUB):
            a_x, a_y = A.reads(n.a, lambda e: e == x), A.reads(n.a, lambda e: e == y)
            b_x, b_y = A.reads(n.b, lambda e: e == x), A.reads(n.b, lambda e: e == y)
            if (a_x and not a_y and b_y and not b_x) or (b_x and not b_y and a_y and not a_x):
                return True
    return False


_MAX_PARTS = 16
"""Distributing products over sums stops at this many additive terms (the body is then taken whole)."""


def _additive_parts(e: Expr, ctx: FusionContext) -> list[Expr]:
    """`e` as a sum of terms, products and widening casts distributed over sums (``(a + b) * v`` gives ``a v``
    and ``b v``, ``f32(a + b)`` gives ``f32(a)`` and ``f32(b)``), but
    never into a sum that itself adds a side of reduced values only to a side of earlier results only
    (``x - Y`` stays one factor: it is what a centre keeps small)."""
    if isinstance(e, Binary) and e.op in (BinaryOp.ADD, BinaryOp.SUB) and not _difference_node(e, ctx):
        b = _additive_parts(e.b, ctx)
        if e.op is BinaryOp.SUB:
            b = [Unary(UnaryOp.NEG, p, p.dtype) for p in b]
        parts = _additive_parts(e.a, ctx) + b
    elif isinstance(e, Unary) and e.op is UnaryOp.NEG:
        parts = [Unary(UnaryOp.NEG, p, p.dtype) for p in _additive_parts(e.x, ctx)]
    elif isinstance(e, Binary) and e.op is BinaryOp.MUL:
        parts = [Binary(BinaryOp.MUL, a, b, e.dtype) for a in _additive_parts(e.a, ctx)
                 for b in _additive_parts(e.b, ctx)]
    elif isinstance(e, Binary) and e.op is BinaryOp.DIV:
        parts = [Binary(BinaryOp.DIV, a, e.b, e.dtype) for a in _additive_parts(e.a, ctx)]
    elif isinstance(e, Cast) and A.is_widening(e):
        # ``f32(a + b)`` of 16-bit values: each part widened alone. The expansion sums the parts in f32
        # anyway (it never rounds their sum to 16 bits), so the split changes nothing it computes.
        parts = [Cast(p, e.dtype) for p in _additive_parts(e.x, ctx)]
    else:
        return [e]
    return parts if len(parts) <= _MAX_PARTS else [e]


def _difference_node(e: Binary, ctx: FusionContext) -> bool:
    kinds_a = {ctx.kind(n) for n in walk(e.a) if isinstance(n, Load)}
    kinds_b = {ctx.kind(n) for n in walk(e.b) if isinstance(n, Load)}
    return bool(("x" in kinds_a and "y" not in kinds_a and "y" in kinds_b and "x" not in kinds_b)
                or ("x" in kinds_b and "y" not in kinds_b and "y" in kinds_a and "x" not in kinds_a))


def _sum(parts: list[Expr]) -> Expr:
    out = parts[0]
    for p in parts[1:]:
        out = Binary(BinaryOp.ADD, out, p, out.dtype)
    return out


def _scaled(earlier: Expr, kappa: float, value: Expr) -> Expr:
    """``kappa · Y`` as the body writes it where it divides ``Y`` by the constant ``1 / kappa`` (a mean ``S / N``:
    the reference rounds that quotient, not ``S`` times a rounded ``1 / N``: in bf16 ``0.333 · 3`` is 1.002,
    and a row equal to its mean had a variance of 1e-5 for numpy's 0), else as a product."""
    d = value.dtype
    if kappa == 1.0:
        return earlier
    for n in walk(value):
        if (isinstance(n, Binary) and n.op is BinaryOp.DIV and n.a == earlier and isinstance(n.b, Const)
                and not isinstance(n.b.value, bool) and n.b.value != 0
                and abs(kappa * float(n.b.value) - 1.0) < 1e-12):
            return Binary(BinaryOp.DIV, earlier, Const(float(n.b.value), d), d)
    return Binary(BinaryOp.MUL, Const(kappa, d), earlier, d)


def own_centre_sum(value: Expr, ctx: FusionContext, pair: tuple[Expr, Expr], axis: Axis, name: str,
                   delta: Load) -> Decomposition | str:
    """`value`'s sum centred on the running mean of some ``u`` the compiler keeps itself, or why not: the body
    is no polynomial in ``u - k Y`` for any candidate ``u`` and earlier result ``Y``, or it has roots at
    several (``(x - Y)·(x + L)``: which factor is small depends on the data, and one centre keeps only one
    of them free of cancellation)."""
    d = value.dtype
    normal = ctx.normal_form(value)
    x, y = pair
    inner = replace(ctx, states=ctx.states | {delta.buffer.name})
    marker = Load(Buffer(f"__centre_own_{name}", BufferType(d, (axis.extent,))), (axis,))
    found: list[tuple[Centre, Decomposition]] = []
    others = sorted((a for a in A.free_atoms(normal) if ctx.kind(a) == "y" and a != y), key=repr)
    for earlier in [y, *others]:
        for u, kappa in _candidates(normal, ctx, x, earlier):
            ky = _scaled(earlier, kappa, value)
            c = Binary(BinaryOp.ADD, delta, ky, d)
            placeholder = Load(Buffer(f"__own_sum_{name}", delta.buffer.type), delta.indices)
            centre = Centre(ReduceOp.SUM, "", earlier, placeholder, c, u, marker, own=ky, delta=delta)
            moved = change_variables(normal, centre, ctx)
            if moved is None or not _vanishes_at_root(moved, marker, delta):
                continue
            dec = _families(moved, centre, inner, name, d)
            if dec is not None:
                found.append((centre, dec))
                break   # one root per earlier result (u = x and u / k = 300 x are the same root)
    if len(found) == 1:
        return found[0][1]
    if found:
        roots = " and ".join(sorted(f"{format_expr(c.u)} = {format_expr(c.own)}" for c, _ in found))
        return f"the body is 0 at {roots}, and one centre keeps only one of these differences uncancelled"
    return f"the sum is no polynomial of degree at most 8 in {format_expr(x)} - k·{format_expr(y)} alone"


def _vanishes_at_root(moved: A.Sum, w: Load, delta: Load) -> bool:
    """True when every term reads ``w`` or ``delta``: the body is 0 where ``u = k Y``, so no part of the sum
    is a difference of large expanded sums."""
    return bool(moved) and all({w, delta} & set(t.mono.as_dict()) for t in moved)


def _candidates(normal: A.Sum, ctx: FusionContext, x: Expr, y: Expr) -> list[tuple[Expr, float]]:
    """``(u, k)`` pairs to try: ``u = x`` (the user's own values) with each ``k`` the coefficients of ``x^p R``
    and ``x^(p-1) y R`` allow (``k = -c_o / (q c_p)`` for ``q <= p``), then ``u / k`` read off the two highest
    powers of `y` (a linear form of several reduced values, ``(x + v - Y)^2``)."""
    d = x.dtype
    out: list[tuple[Expr, float]] = []
    terms = {(t.mono, t.exponent): t.coeff for t in normal}
    kappas: list[float] = []
    for t in normal:
        p = t.mono.as_dict().get(x, Fraction(0))
        if p < 1 or p.denominator != 1:
            continue
        partner = t.mono * A.Monomial.of({x: Fraction(-1), y: Fraction(1)})
        c_o = terms.get((partner, t.exponent))
        if c_o is None:
            continue
        for q in range(1, int(p) + 1):
            k = -c_o / (q * t.coeff)
            if k != 0 and all(abs(k - seen) > 1e-12 * abs(k) for seen in kappas):
                kappas.append(k)
    out.extend((x, k) for k in kappas)
    derived = _root_from_top_powers(normal, ctx, y)
    if derived is not None:
        out.append((derived, 1.0))
    return [(u, k) for u, k in out if u.dtype == d]


def _root_from_top_powers(normal: A.Sum, ctx: FusionContext, y: Expr) -> Expr | None:
    """``u / k`` for a body ``s (u - k y)^K R + (lower powers of y)``: the one term of ``y^K`` gives ``s k^K R``,
    those of ``y^(K-1) R`` give ``-K s k^(K-1) u R``; None where the body has no such shape."""
    powers = [(t, t.mono.as_dict().get(y, Fraction(0))) for t in normal]
    top_power = max(p for _, p in powers)
    top = [t for t, p in powers if p == top_power]
    if top_power < 1 or top_power.denominator != 1 or len(top) != 1:
        return None
    (t_top,) = top
    rest = t_top.mono * A.Monomial.of({y: -top_power})
    linear: dict[A.Monomial, float] = {}
    constant = 0.0
    for t, p in powers:
        if p != top_power - 1 or t.exponent != t_top.exponent:
            continue
        q = t.mono * A.Monomial.of({y: Fraction(1) - top_power}) * rest.power(Fraction(-1))
        scale = -t.coeff / (float(top_power) * t_top.coeff)
        if not q.factors:
            constant += scale
        elif len(q.factors) == 1 and q.factors[0][1] == 1 and ctx.kind(q.factors[0][0]) == "x":
            linear[q] = linear.get(q, 0.0) + scale
        else:
            return None
    if not linear:
        return None
    return linear_expr(A.Linear.of(linear, constant), y.dtype)


def resolve(b: "LoopBuilder", member: "Member", centre: Centre) -> tuple[Centre, Load]:
    """`centre` reading the loop's own running sum of ``u`` and the exact count beside it (both skip
    non-finite values of ``u``), created in `b` where they are not there yet."""
    t = count_type(member.out.type)
    d = t.dtype
    u = centre.u if centre.u.dtype == d else Cast(centre.u, d)   # bf16 values of an f32 sum: summed in f32
    finite = Binary(BinaryOp.LT, Unary(UnaryOp.ABS, u, d), Const(float("inf"), d), bool_)
    one, zero = Const(1.0, d), Const(0.0, d)
    states = []
    for what, term in (("sum", Select(finite, u, zero, d)), ("count", Select(finite, one, zero, d))):
        states.append(b.state_for(member, Accumulator(ReduceOp.SUM, term, A.Linear(), term, one),
                                  Buffer(f"{member.name}_centre_{what}", t)))
    total, count = (Load(s, member.state_axes) for s in states)
    return replace(centre, source=total), count


def count_type(result: BufferType) -> BufferType:
    """The type of a running mean's count (and of the compiler's own mean's sum) beside a result of type
    `result`: f32 where the result is a 16-bit float, whose integers are exact only to 2048 (f16) or 256
    (bf16); the result's own type otherwise."""
    if result.dtype in (float32, float64):
        return result
    return replace(result, dtype=float32)


def keep_infinite(carry: Expr, prev: Load, rescale: Expr | None) -> Expr:
    """The shift law's `carry` of a power whose previous sum `prev` may be infinite or NaN: such a sum holds
    an infinite element, which a finite move of the (finite) centre leaves as it is, so it is carried
    unmoved (the law's ``C(k, j) d^(k - j) T_j`` would add infinite lower powers of either sign: NaN)."""
    d = prev.dtype
    unmoved = prev if rescale is None else Binary(BinaryOp.MUL, rescale, prev, d)
    finite = Binary(BinaryOp.LT, Unary(UnaryOp.ABS, prev, d), Const(float("inf"), d), bool_)
    return Select(finite, carry, unmoved, d)


def own_centre_of(dec: Decomposition) -> Centre | None:
    """The compiler's own centre a decomposition is kept on, if any."""
    return next((a.shift.centre for a in dec.accumulators if a.shift is not None and a.shift.centre.own is not None),
                None)


def finish(b: "LoopBuilder", member: "Member", dec: Decomposition, accs: list) -> list:
    """After `member`'s states exist: the epilogue value ``delta = c_final - k Y`` (one subtraction of final
    values, before the member's own value reads it), and the accumulators as the member's value reads
    them, the lower powers of a family dropped where its highest power is not finite."""
    centre, count = resolve(b, member, own_centre_of(dec))
    d = member.out.dtype
    delta = centre.delta
    value = centre_now(centre, count)
    if not centre.taylor:
        value = Binary(BinaryOp.SUB, value, centre.own, d)
    b.epilogue.append(Compute(delta.buffer, member.axes, value, loc=member.loc))
    b.epilogue_values[delta.buffer.name] = (member.axes, b.running(value))
    b.names.add(delta.buffer.name)
    top: dict[int, int] = {}
    for n, acc in enumerate(dec.accumulators):
        if acc.shift is not None:
            for j in acc.shift.lower:
                if j not in top or dec.accumulators[top[j]].shift.degree < acc.shift.degree:
                    top[j] = n
    out = []
    for n, buf in enumerate(accs):
        load = Load(buf, member.axes) if isinstance(buf, Buffer) else buf
        if n in top and dec.accumulators[n].shift.degree > 0:
            high = accs[top[n]]
            high = Load(high, member.axes) if isinstance(high, Buffer) else high
            finite = Binary(BinaryOp.LT, Unary(UnaryOp.ABS, high, d), Const(float("inf"), d), bool_)
            load = Select(finite, load, Const(0.0, d), d)
        out.append(load)
    return out


__all__ = ["stabilize", "split_by_pair", "written_pair", "forms_difference", "own_centre_sum", "resolve", "count_type",
           "keep_infinite", "own_centre_of", "finish"]
