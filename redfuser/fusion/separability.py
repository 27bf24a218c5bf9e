"""Deciding, constructively, whether a reduction's body factors as ``G(x) (x) H(y)``.

`decompose` brings the body ``F`` to the algebra's normal form, sorts every
atom into *x* (reads the reduced axis), *y* (reads an earlier result of the
cascade) or *c* (neither), and reads off the fusion theorem's pieces:

- ``+`` reductions: ``F = sum_j G_j(x) * H_j(y)``. Exponentials of *y* stay
  *online* (merged with the x-part inside one ``exp``, rescaled per chunk by
  ``exp(e(y_new) - e(y_old))``); every other *y* factor (``1/l``, ``m``,
  ``log l``) is *deferred*: applied once to the accumulator after the loop.
  Terms with equal online exponent and deferred factor share an accumulator.
- ``max``/``min``: ``F = G(x) * H(y)`` with the deferred part of ``H`` shown > 0
  (online ``exp`` factors are always > 0), or ``F = G(x) + H(y)``.
- ``prod``: ``F = G(x) * exp(L(y))``, H wholly online, carried by the product law
  (`product_law.py`: the rescale raised to the count of elements already multiplied in).

A narrowing cast of a separable term, ``cast(G(x)·H(y))``, joins with its rounding moved (H's online
part evaluated inside it at its running value, the rest after the loop) where `narrowing.py` shows the
rounded value bounded. Anything else is refused with the atom that mixes x and y and why.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

import ml_dtypes

from ..ir import (Binary, BinaryOp, Cast, Const, DType, Expr, IndexValue, Load, ReduceOp, Select, Unary,
                  UnaryOp, format_expr, map_expr, reads_axis)
from ..ir.types import bool_, float32
from ..ir.loop.expr import walk
from . import algebra as A
from .build import linear_expr, monomial_expr, product_expr, sum_expr
from .grid_quantization import absmax_scaled, grid_quantization
from .narrowing import Extremum, attains_one, distribute_cast, exp_bound, g_bound, rescale_dtype, split_narrowing
from .positivity import is_nonnegative, is_positive

if TYPE_CHECKING:
    from .centred import Centre, Shift


@dataclass(frozen=True)
class FusionContext:
    """What is known when a reduction of the cascade is decomposed."""

    loop_axis: str
    states: frozenset[str]          # buffers holding earlier results of the cascade (y)
    positive: frozenset[str]        # buffers known > 0
    locals: frozenset[str] = frozenset()  # per-chunk producers (read along the loop axis: x)
    maxima: frozenset[str] = frozenset()  # running-max states (a quantization may scale by them online)
    extrema: tuple[Extremum, ...] = ()    # earlier running max/min members and their bodies (narrowing casts)
    at_least_one: frozenset[str] = frozenset()   # running sums of exp(e - max e): at least 1 (`attains_one`)

    def kind(self, e: Expr) -> str:
        """``x``, ``y``, ``c`` or ``mixed`` for one atom."""
        x = y = False
        for n in walk(e):
            if isinstance(n, Load):
                if n.buffer.name in self.states:
                    y = True
                if n.buffer.name in self.locals or any(reads_axis(i, self.loop_axis) for i in n.indices):
                    x = True
            elif isinstance(n, IndexValue) and n.axis.name == self.loop_axis:
                x = True
        return "mixed" if x and y else "x" if x else "y" if y else "c"

    def unmixed(self, e: Expr) -> bool:
        """A value that does not read both the reduced values and an earlier result: a widening cast of such a
        computed 16-bit value stays one atom (`algebra.rounds_computed_value`); a mixed one is taken apart,
        its rounding ignored, as the factorization needs (``f32((x - r0) w + x r0)``, bf16)."""
        return self.kind(e) != "mixed"

    def reduced_only_sum(self, e: Expr) -> bool:
        """A sum or difference that reads the reduced values and no earlier result (``x - v0/2``, with a
        per-chunk ``v0``): kept whole as a factor, since expanding ``(x - c)**2`` into ``x**2 - 2cx + c**2``
        separates nothing and cancels (every x near 300: a variance of it became NaN)."""
        return isinstance(e, Binary) and e.op in (BinaryOp.ADD, BinaryOp.SUB) and self.kind(e) == "x"

    def reduced_only_term(self, e: Expr) -> bool:
        """A term of a multiplied sum that is computed from the reduced values alone, or from earlier results
        alone, and is not itself an atom or a constant multiple of one (``1/x``, ``exp(x)``, ``x*w``; ``S/W``):
        kept whole, so that ``(1/x - mean)**2`` expands into powers of one atom ``1/x``, which a running
        centre can hold (a variance of ``1/x`` on a constant row was -1e-9, its std NaN, for numpy's 0), and
        ``(x - S/W)**2`` into powers of ``x`` and one earlier value ``S/W``, whose cancelling pair the
        compiler then sees and centres (a weighted mean, a mean over a count that is itself a sum: expanded
        into three sums, a variance near 1e4 came out as -1536 for numpy's 84)."""
        kind = self.kind(e)
        if not isinstance(e, (Unary, Binary)) or kind not in ("x", "y"):
            return False
        if kind == "y" and not A.free_atoms(A.normalize(e, lambda a: False, lambda a: False)):
            return False    # (``S / S`` is 1 to the algebra: kept whole it would hide what cancels out of the body)
        if isinstance(e, Unary) and e.op is UnaryOp.NEG:
            return False
        if isinstance(e, Binary) and e.op in (BinaryOp.MUL, BinaryOp.DIV):
            consts = sum(isinstance(o, Const) for o in (e.a, e.b))
            return consts == 0 or (e.op is BinaryOp.DIV and isinstance(e.a, Const))
        return True

    def normal_form(self, e: Expr, signs: bool = True) -> "A.Sum":
        """`e` in the algebra's normal form as every part of the engine takes a reduction's body: with the
        positivity known here (`signs`; without it, for comparing two forms), `reduced_only_sum`s whole, and
        the `reduced_only_term`s of a multiplied sum whole."""
        if not signs:
            return A.normalize(e, lambda a: False, lambda a: False, self.reduced_only_sum, self.reduced_only_term,
                               self.unmixed)
        return A.normalize(e, lambda a: is_positive(a, self.positive), lambda a: is_nonnegative(a, self.positive),
                           self.reduced_only_sum, self.reduced_only_term, self.unmixed)

    def terms_form(self, e: Expr) -> "A.Sum":
        """`e` read as `normal_form` reads a multiplied sum (`algebra.normalize_terms`: a constant multiple of
        a `reduced_only_term` is that atom times the constant), without positivity: the reduced values a
        centre is the running mean of, matched against the atoms of a body's normal form."""
        never = lambda a: False  # noqa: E731
        return A.normalize_terms(e, never, never, self.reduced_only_sum, self.reduced_only_term, self.unmixed)


@dataclass(frozen=True)
class Accumulator:
    """One loop-carried sum/max/min: ``op over k of term``, rescaled per chunk by
    ``exp(online(y_new) - online(y_old)) * powers(y_new) / powers(y_old)``."""

    op: ReduceOp
    term: Expr
    online: A.Linear          # exponent of the online factor of H (zero: none)
    G: Expr
    H: Expr
    powers: A.Monomial = A.Monomial()      # running maxima scaling the term online (a quantization, a division)
    quantized: tuple[Expr, ...] = ()       # atoms of `term` that read `powers` as scales (read scale-safely, as
    #                                        1 while unset): quantization casts, and a running max the term divides by
    live: Expr | None = None               # true where an element's term is not the 0 branch of a where(c(x), ...)
    shift: "Shift | None" = None           # a shift-stable sum's place in its family (fusion/centred.py)


@dataclass(frozen=True)
class Decomposition:
    """How one reduction is computed in the fused loop.

    Final value: ``sum_j factors[j] * acc_j + addend`` (a factor of None is 1), or, where `written` is set,
    `written` with the one accumulator in place of its ``G``.
    """

    kind: str                                # independent | separable | sum of separable terms | additive
                                             # | shift-stable sum
    accumulators: tuple[Accumulator, ...]
    factors: tuple[Expr | None, ...]
    addend: Expr | None = None
    written: Expr | None = None              # an additive max/min's final value as the body computes it, with
                                             # the accumulator in place of G (`_one_atom`)
    expanded: bool = False                   # distributing created several terms (may cancel numerically)
    conditions: tuple[Expr, ...] = ()        # conditions of wheres taken apart as where(c(x), G1, G2)·H(y)
    rounded: tuple[tuple[Expr, Expr], ...] = ()  # narrowing casts: (G's cast, the cast the loop evaluates)
    stable: "Centre | None" = None           # a shift-stable sum: the centre it is kept on (its `words`, printed
                                             # from the IR, so a shape class's name its symbols)


@dataclass(frozen=True)
class Refusal:
    """Why a reduction cannot join the one-pass loop, in words a user understands."""

    reason: str
    term: Expr | None = None


@dataclass(frozen=True)
class _Split:
    coeff: float
    g: A.Monomial
    x_lin: A.Linear
    y_lin: A.Linear
    deferred: A.Monomial
    powers: A.Monomial = A.Monomial()
    quantized: tuple[Expr, ...] = ()
    selects: tuple[tuple[Expr, Expr], ...] = ()   # x-conditioned wheres: (G atom in `g`, its form with H online)
    inner: A.Linear = A.Linear()                  # the part of `y_lin` evaluated inside those wheres
    live: Expr | None = None                      # true where none of them takes a 0 branch (None: always)
    rounded: tuple[tuple[Expr, Expr], ...] = ()   # narrowing casts: (G atom in `g`, its form with H online)


def _split(t: A.Product, ctx: FusionContext, name: str) -> _Split | Refusal:
    g: dict = {}
    deferred: dict = {}
    powers = A.Monomial()
    quantized: list[Expr] = []
    selects: list[tuple[Expr, Expr]] = []
    rounded: list[tuple[Expr, Expr]] = []
    inner = A.Linear()
    live: Expr | None = None
    for atom, p in t.mono.factors:
        kind = ctx.kind(atom)
        q = _quantization(atom, ctx) if kind == "mixed" else None   # a cast scaled by running maxima (FP8)
        if kind == "mixed" and q is None and A.is_narrowing(atom):
            atom = distribute_cast(atom, ctx) or atom   # cast(where(c(x), a, b)·h) = where(c, cast(a·h), cast(b·h))
        if kind == "mixed" and isinstance(atom, Select) and ctx.kind(atom.cond) in ("x", "c"):
            w = _x_select(atom, p, ctx, name)
            if isinstance(w, Refusal):
                return w
            g_atom, online_atom, branch_online, select_live, branch_rounded = w
            g[g_atom] = g.get(g_atom, A.Power(0)) + p
            selects.append((g_atom, online_atom))
            rounded.extend(branch_rounded)
            inner = inner + branch_online.scale(float(p))
            live = _both(BinaryOp.AND, live, select_live)
            continue
        if kind == "mixed" and q is None and A.is_narrowing(atom):
            n = split_narrowing(atom, p, ctx, name)
            if isinstance(n, str):
                return Refusal(n, atom)
            if dict(rounded).get(n.g_atom, n.online_atom) != n.online_atom:
                return Refusal(f"in `{name}`, two casts round the same G(x) with different earlier results "
                               f"({format_expr(atom)}); not fused", atom)
            g[n.g_atom] = g.get(n.g_atom, A.Power(0)) + p
            rounded.append((n.g_atom, n.online_atom))
            inner = inner + n.online
            for a, q in n.deferred.factors:
                deferred[a] = deferred.get(a, A.Power(0)) + q
            continue
        if kind == "mixed":
            if q is None:
                return Refusal(_mixed_reason(atom, name), atom)
            others = [a for a, _ in t.mono.factors if a is not atom and ctx.kind(a) == "x"]
            if p != 1 or not others:
                # the running scale quantizes each chunk on a grid at least as fine, which a GEMM's result
                # meets within the quantization bound (docs/fusion.md); the quantized values' own statistics
                # (``sum(q)``, ``mean(q)``, ``sum(q * q)``) are sums of integers numpy computes exactly, and
                # with the running scale they left the grid (130151.5 for numpy's 130100; found by a helper)
                return Refusal(f"in `{name}`, {format_expr(atom)} is quantized with a scale known only after "
                               "the pass, and its values are reduced themselves, not contracted with another "
                               "operand (a GEMM): numpy's integers need the final scale, so a second pass", atom)
            powers = powers * q.power(p)
            quantized.append(atom)
            kind = "x"
        if kind == "y" and p < 0 and isinstance(atom, Load) and atom.buffer.name in ctx.maxima:
            # a division by a running max (``(x / a)**2`` with ``a = max(abs(x))``: a safe norm) is applied
            # online, each chunk rescaled by ``(a_prev / a)**-p`` as a quantization's scale is: deferred to
            # after the loop, ``sum x**2`` under- or overflows where every ``(x / a)**2`` is at most 1
            powers = powers * A.Monomial.of({atom: p})
            quantized.append(atom)
            g[atom] = g.get(atom, A.Power(0)) + p
            continue
        target = deferred if kind == "y" else g
        target[atom] = target.get(atom, A.Power(0)) + p
    parts = A.split_exponent(t.exponent, ctx.kind)
    if isinstance(parts, A.Monomial):
        offender = monomial_expr(parts, parts.factors[0][0].dtype)
        return Refusal(f"in `{name}`, exp({format_expr(offender)}) multiplies the reduced values with an earlier "
                       "result inside an exponential, which does not split into exp(x)·exp(y)", offender)
    x_lin, y_lin = parts
    return _Split(t.coeff, A.Monomial.of(g), x_lin, y_lin + inner, A.Monomial.of(deferred), powers, tuple(quantized), tuple(selects),
                  inner, live, tuple(rounded))


def _both(op: BinaryOp, a: Expr | None, b: Expr | None) -> Expr | None:
    """``a op b`` for conditions where None means "always": AND keeps the other, OR gives None."""
    if op is BinaryOp.OR and (a is None or b is None):
        return None
    if a is None or b is None:
        return a if b is None else b
    return Binary(op, a, b, bool_)


def _x_select(atom: Select, p: A.Power, ctx: FusionContext,
              name: str) -> tuple[Expr, Expr, A.Linear, Expr | None, tuple] | Refusal:
    """For ``where(c(x), G1(x)·H(y), G2(x)·H(y))``, which is ``where(c(x), G1(x), G2(x))·H(y)`` exactly
    (a 0 branch goes with any H): the G atom ``where(c, G1, G2)``, the same where with H kept inside each
    branch (what the loop evaluates: ``where(c, exp(s - m), 0)``, never ``exp(s)`` alone), H's exponent,
    and where the where takes a branch that is not 0 (None: both are not), and the narrowing casts its
    branches round (each evaluated with H's online part, as `_split` decides).

    H must be online (exponentials of running results): a factor applied after the loop, such as
    ``1/l``, would also multiply the elements the where set to 0, and the reference keeps those 0
    even where the factor is infinite. Refused too when the branches' H differ or the where is
    raised to a non-integer power."""
    d = atom.dtype
    branches = []
    keys = set()
    for b in (atom.a, atom.b):
        splits = []
        for t in ctx.normal_form(b):
            s = _split(t, ctx, name)
            if isinstance(s, Refusal):
                return s
            if s.powers.factors or s.selects:
                return Refusal(_mixed_reason(atom, name), atom)
            splits.append(s)
            keys.add((s.y_lin, s.deferred))
        branches.append(splits)
    if p.denominator != 1 or len(keys) > 1:
        why = ("its branches scale the reduced values by different earlier results" if len(keys) > 1
               else "it is raised to a non-integer power")
        return Refusal(f"in `{name}`, the term {format_expr(atom)} has a condition on the reduced values only, but "
                       f"{why}, so it does not factor into where(c(x), G1(x), G2(x))·H(y)", atom)
    y_lin, deferred = keys.pop() if keys else (A.Linear(), A.Monomial())
    if deferred.factors:
        return Refusal(f"in `{name}`, the term {format_expr(atom)} has a condition on the reduced values only, but "
                       f"its branch scales by {format_expr(monomial_expr(deferred, d))}, which is applied after the "
                       "loop and would turn the where's 0 into 0·inf = NaN where it is infinite; write that factor "
                       "outside the where", atom)

    def branch(splits: list[_Split], online: bool) -> Expr:
        parts = tuple(_term_product(s) if online else _g_product(s, False) for s in splits)
        return _cast_like(sum_expr(parts, d), d)

    g_atom = Select(atom.cond, branch(branches[0], False), branch(branches[1], False), d)
    online_atom = Select(atom.cond, branch(branches[0], True), branch(branches[1], True), d)
    zero = [not splits for splits in branches]
    live = (None if not any(zero) else Const(False, bool_) if all(zero)
            else atom.cond if zero[1] else Unary(UnaryOp.NOT, atom.cond, bool_))
    return g_atom, online_atom, y_lin, live, tuple(r for splits in branches for s in splits for r in s.rounded)


def _cast_like(e: Expr, d: DType) -> Expr:
    return e if e.dtype == d else Cast(e, d)


def _quantization(atom: Expr, ctx: FusionContext) -> A.Monomial | None:
    """For ``cast(G(x) * M(y))`` with M a product of running maxima (e.g. ``(x * 448 / a).astype(f8)``):
    M, which then scales the accumulator online (the cast rounds, so M cannot be taken out of it). An
    integer-grid rounding ``clip(rint(c·x / a), -c, c)`` with ``a = max |x|`` is the same (`grid_quantization`).

    The algebra treats the cast as exact to decide separability; the loop evaluates the cast with
    the running maxima, as a quantizing kernel must.
    """
    if not A.is_narrowing(atom):
        return grid_quantization(atom, ctx)      # clip(rint(c·x / max|x|)): int8 quantization, the same rule
    # Only ``c·B / a`` with ``a`` the running max of ``|B|`` and ``|c|`` within the target's range: each chunk's
    # values then stay within ``|c|`` at the running scale, on a finer grid. A signed max (``max(x)``) or a max
    # of another value let an early small ``a_t`` push values past e4m3's 464, NaN where numpy's body is finite
    # (found by a helper, hunt_quant/03); `grid_quantization` asks the same of int8.
    scaled = absmax_scaled(atom.x, ctx)
    if scaled is None or scaled[0].buffer.name not in ctx.maxima:
        return None
    a, c = scaled
    if c > float(ml_dtypes.finfo(atom.dtype.numpy).max):
        return None
    return A.Monomial.of({a: A.Power(-1)})


def _mixed_reason(atom: Expr, name: str) -> str:
    from ..ir import Binary, Select, Unary

    what = "this operation"
    if isinstance(atom, Unary):
        what = f"{atom.op.value}()"
    elif isinstance(atom, Binary):
        what = f"{atom.op.value}()" if not atom.op.is_infix else f"'{atom.op.value}'"
    elif isinstance(atom, Select):
        what = "where()"
    return (f"in `{name}`, the term {format_expr(atom)} mixes the reduced values with an earlier result of the "
            f"cascade inside {what}, which does not factor into G(x)·H(y): it needs the final earlier result, "
            "so a second pass")


def _constants_outside_range(normal: "A.Sum", d: DType) -> str:
    """The first coefficient of `normal` (of a product, or of a monomial in its exponent) that the fused loop,
    computing in `d` (f32 for the 16- and 8-bit floats), cannot hold as a normal number ("" when none)."""
    finfo = ml_dtypes.finfo(float32.numpy if d.storage_only else d.numpy)
    for t in normal:
        for c in (t.coeff, *(c for _, c in t.exponent.terms)):
            if c != 0 and not float(finfo.smallest_normal) <= abs(c) <= float(finfo.max):
                return f"{c:g}"
    return ""


def decompose(value: Expr, op: ReduceOp, ctx: FusionContext, name: str) -> Decomposition | Refusal:
    """`value`'s factorization for monoid `op` (see the module docstring), or why there is none."""
    d = value.dtype
    earlier = _earlier_results(walk(value), ctx)
    if not earlier:
        return Decomposition("independent", (Accumulator(op, value, A.Linear(), value, Const(1.0, d)),), (None,))
    if d.is_bool:
        kind = {ReduceOp.MAX: "any", ReduceOp.MIN: "all"}.get(op, op.value)
        return Refusal(f"`{name}` is {kind}() of bools that read an earlier result: whether an element passes "
                       "depends on that result's final value, and a running bool has no rescale law to move it "
                       "when the earlier result changes, so it is computed in a second pass")
    if not d.is_float:
        return Refusal(f"`{name}` reduces {d} values that read an earlier result; the one-pass rescaling "
                       "(multiplying by H(y_old)/H(y_new)) has no exact integer form, so it is computed in a "
                       "second pass")
    with A.noting_cancellations() as lost:
        normal = ctx.normal_form(value)
    if not normal:
        return Refusal(f"`{name}`'s body simplifies to 0 in exact arithmetic, yet reads earlier results; it is "
                       "kept unfused so that its floating-point value (NaN where an input is infinite) is the "
                       "reference's")
    cancelled = earlier - _earlier_results((n for a in A.free_atoms(normal) for n in walk(a)), ctx)
    if cancelled:
        # x/x = 1, x - x = 0 and 0·x = 0 are exact only for finite x (and a non-zero divisor); the earlier result
        # would be gone from the fused form, and where it is 0, ±inf or NaN the reference's body is NaN
        # (fuzz: seed 45, example 667, `v0 / v0` with the bool matmul v0 = False gave 1 for numpy's NaN)
        names = ", ".join(f"`{c}`" for c in sorted(cancelled))
        return Refusal(f"in `{name}`, the earlier result {names} cancels out of the body in exact arithmetic "
                       "(x/x = 1, x - x = 0), which floating point does not do where it is 0, ±inf or NaN (0/0 and "
                       "inf - inf are NaN); it is computed in a second pass as written")
    outside = _constants_outside_range(normal, d)
    if outside:
        # ((x - mu) * 1e20)**2 is 1e40·(x - mu)**2 to the algebra, and 1e40 is inf in f32, where every term numpy
        # computes is finite (a moment in other units): the constant the fused form multiplies by must be one
        return Refusal(f"in `{name}`, the constant {outside} that the algebra gathers out of the body is outside "
                       f"{d}'s normal range, though the body's own steps are not; it is computed in a second pass "
                       "as written")
    varying = sorted({format_expr(a) for a in lost if ctx.kind(a) != "c"})
    if varying:
        # the same for what is left of a value in the fused form (x·x/x = x) and for the reduced values: where
        # x is 0 or ±inf, `sum(x / x * exp(x - m))` is NaN for numpy and was a finite sum fused
        return Refusal(f"in `{name}`, {', '.join(f'`{v}`' for v in varying)} cancels in the algebra's normal form "
                       "(x/x = 1, x - x = 0, 0·x = 0), exact only where it is finite and non-zero (0/0, inf - inf "
                       "and 0·inf are NaN); it is computed in a second pass as written")
    if len(normal) > 1 and not any(ctx.kind(a) in ("x", "mixed") for a in A.free_atoms(normal)):
        # F(c, y) is the same for every element: sum = n·F, max = F. Expanded into several accumulated terms
        # (as (c - mean)**2 is) it only cancels, to a negative variance where numpy's is 0 (fuzz: seed 1, examples
        # 734, 2004, 2136 at 17e4aa1, a std of a constant or one-element row gave NaN); computed as written
        # after the pass it is the reference's own value
        return Refusal(f"`{name}`'s body reads no reduced value that varies along the axis, only constants of "
                       "the reduction and earlier results: its terms would only cancel if expanded, so it is "
                       "computed after the pass as written")
    splits = []
    for t in normal:
        s = _split(t, ctx, name)
        if isinstance(s, Refusal):
            return s
        splits.append(s)
    for sp in splits:
        why = _deferred_division_range(sp, d, name)
        if why is not None:
            return why
    if op is not ReduceOp.SUM and any(sp.live is not None for sp in splits):
        atom = next(a for sp in splits for a, _ in sp.selects)
        return Refusal(f"in `{name}`, {op.value} over the axis of {format_expr(atom)}: the where's 0 branch would be rescaled "
                       "with the running result (0·NaN once it is NaN), which the reference never does; only sums "
                       "take such a where apart", atom)
    out = (_sum_terms(splits, d) if op is ReduceOp.SUM else _product(splits, d, name) if op is ReduceOp.PROD
           else _max_min(splits, op, d, ctx, name, value))
    conditions = tuple(dict.fromkeys(a.cond for s in splits for a, _ in s.selects))
    rounded = tuple(dict.fromkeys(r for s in splits for r in s.rounded))
    if isinstance(out, Decomposition) and (conditions or rounded):
        out = replace(out, conditions=conditions, rounded=rounded)
    if isinstance(out, Decomposition) and splits and not (conditions or rounded) and (
            op is ReduceOp.SUM or (out.kind == "separable" and op in (ReduceOp.MAX, ReduceOp.MIN))):
        out = _term_as_written(value, out, splits, ctx)
    return out


def unbounded_exponential(value: Expr, ctx: FusionContext, name: str) -> Refusal | None:
    """Why the fused loop's exponential of `value` could overflow where the reference's does not, else None.

    The loop evaluates ``exp(x + y)`` at y's running values. A running max below its final value (or a
    min above its final one, a running sum or mean anywhere) can make the exponent larger than the
    reference's: ``exp(y - max x)`` with a large ``y`` before the max of ``x`` is inf in the loop, and the
    rescale ``exp(m_prev - m)`` makes NaN of the reference's finite sum. Such an exponent must be bounded by
    1 in the loop (`exp_bound`: ``x - max x``, a softmax's); else the reduction is a second pass."""
    d = value.dtype
    for t in ctx.normal_form(value):
        sp = _split(t, ctx, name)
        if isinstance(sp, Refusal):
            return None
        outer = sp.y_lin + sp.inner.scale(-1.0)     # (the wheres' and casts' own exponents are checked there)
        why = None if outer.is_zero else exp_bound(sp.x_lin, outer, ctx, overflow_only=True)
        if why is not None:
            shown = format_expr(linear_expr(sp.x_lin + outer, d))
            return Refusal(f"in `{name}`, exp({shown}): {why} where the reference's exponential is finite (a "
                           "running max is below its final value), so it is computed in a second pass")
    return None


def sums_at_least_one(value: Expr, ctx: FusionContext) -> bool:
    """Whether a sum of `value` is at least 1 at every chunk of the loop: `value` is ``exp(e - max e)``
    (`attains_one`; a softmax's denominator), 1 at the element holding the running max, which the running
    sum holds from the chunk that sets it on. A later ``exp(... - log S)`` is then bounded (`exp_bound`)."""
    normal = ctx.normal_form(value)
    if len(normal) != 1 or normal[0].coeff != 1 or normal[0].mono.factors:
        return False
    parts = A.split_exponent(normal[0].exponent, ctx.kind)
    return not isinstance(parts, A.Monomial) and attains_one(parts[0], parts[1], ctx)


def _deferred_division_range(sp: _Split, d: DType, name: str) -> Refusal | None:
    """Why deferring a division by a power (>= 2) of an earlier result leaves G outside `d`'s range, else None.

    The reference divides before it raises to the power: ``(w / S)**2`` is in range wherever ``w / S`` is,
    but the deferred form sums ``w**2``, which overflows where ``|w| > 1.8e19`` and underflows where
    ``|w| < 1e-19`` in f32 (an effective sample size ``1 / Σ (w / Σw)**2`` of weights near 1e-25 or 1e19 was
    NaN for numpy's 4). A running max is divided by online instead (`_split`); a sum may pass through 0,
    so such a reduction is a second pass where G's range (from its atoms' types, `narrowing`) can leave
    `d`'s."""
    if not any(q <= -2 for _, q in sp.deferred.factors) or not any(q >= 2 for _, q in sp.g.factors):
        return None
    # G within the square root of the range: its magnitudes then fit, and so do their reciprocals' (where the
    # small ones would underflow); decompose has refused non-float sums before
    if g_bound(1.0, sp.g) ** 2 <= float(ml_dtypes.finfo(d.numpy).max):
        return None
    shown = format_expr(monomial_expr(sp.deferred, d))
    return Refusal(f"in `{name}`, the division by {shown} would be deferred to after the loop, but the reference "
                   f"divides first, and {format_expr(monomial_expr(sp.g, d))} alone can leave {d}'s range (over- "
                   "or underflow) where the quotient's power does not; so it is computed in a second pass")


def _earlier_results(nodes, ctx: FusionContext) -> set[str]:
    """The earlier results of the cascade (buffers in `ctx.states`) that `nodes` load."""
    return {n.buffer.name for n in nodes if isinstance(n, Load) and n.buffer.name in ctx.states}


def _term_as_written(value: Expr, dec: Decomposition, splits: list[_Split], ctx: FusionContext) -> Decomposition:
    """A sum kept as one accumulator accumulates the body as the user wrote it, its deferred factor set to 1,
    rather than the normal form's expansion: ``exp(x - m) * (x - 300)^2`` expanded into
    ``exp(x - m) x^2 - 600 exp(x - m) x + 90000 exp(x - m)`` cancels in every element where ``x`` is near
    300; written as it is, nothing cancels that the reference's own ``x - 300`` does not. (The normal form has
    one deferred monomial for all its terms here, so setting its atoms to 1 leaves exactly the accumulated
    term; the randomized identity check confirms it, else the expansion is kept.) A sum of one term takes the
    body as written where the normal form's term rounds differently (`numeric_check.rounds_differently`):
    ``exp2(x log2(e) - m)`` read as ``exp(x - 0.693 m)`` skipped numpy's rounding of ``x log2(e)``, which the
    softmax's numerator kept, and rows near -1000 summed to 1 + 2.4e-5. A separable max or min likewise
    (``max(exp2(x log2(e) - m))`` was 1.00006 for numpy's 1: fuzz seed 80, example 342)."""
    if len(dec.accumulators) != 1:
        return dec
    (acc,) = dec.accumulators
    quantizes = any(not isinstance(q, Load) for q in acc.quantized)   # (a Load: a running max's scale, online)
    if quantizes or acc.live is not None or any(sp.selects for sp in splits):
        return dec
    deferred = {a for a, _ in splits[0].deferred.factors}
    term = _without_unit_factors(map_expr(value, lambda n: Const(1.0, n.dtype) if n in deferred else None))
    candidate = replace(dec, accumulators=(replace(acc, term=term),), expanded=False)
    from .numeric_check import check, rounds_differently   # (numeric_check imports this module)

    if len(splits) == 1 and not rounds_differently(acc.term, term):
        return dec      # (the normal form's term: the same values, and the same text as other sums' terms)
    return candidate if check(value, candidate, ctx) is None else dec


def _without_unit_factors(e: Expr) -> Expr:
    """`e` without its products and quotients by the constant 1 (a deferred ``l`` set to 1 in ``p / l * v``:
    ``x * 1`` and ``x / 1`` are ``x`` exactly, and the term then reads as the contraction it is)."""
    def fold(n: Expr) -> Expr | None:
        if isinstance(n, Binary) and n.op in (BinaryOp.MUL, BinaryOp.DIV):
            a, b = _without_unit_factors(n.a), _without_unit_factors(n.b)
            if _is_one(b) and a.dtype == n.dtype:
                return a
            if n.op is BinaryOp.MUL and _is_one(a) and b.dtype == n.dtype:
                return b
            return replace(n, a=a, b=b)
        return None
    return map_expr(e, fold)


def _is_one(e: Expr) -> bool:
    return isinstance(e, Const) and not isinstance(e.value, bool) and e.value == 1.0


def _acc(op: ReduceOp, term: Expr, s: _Split, g: Expr, d: DType) -> Accumulator:
    return Accumulator(op, term, s.y_lin, g, _h_expr(s, d), s.powers, s.quantized, s.live)


def _g_product(s: _Split, with_online: bool) -> A.Product:
    return A.Product(s.coeff, s.g, s.x_lin + s.y_lin if with_online else s.x_lin)


def _term_product(s: _Split) -> A.Product:
    """What the loop accumulates for `s`: G with the online part of H, inside each x-conditioned where."""
    if not s.selects and not s.rounded:
        return _g_product(s, True)
    online = dict(s.selects) | dict(s.rounded)
    mono = A.Monomial(tuple((online.get(a, a), p) for a, p in s.g.factors))
    return A.Product(s.coeff, mono, s.x_lin + s.y_lin + s.inner.scale(-1.0))


def _h_expr(s: _Split, d: DType) -> Expr:
    return product_expr(A.Product(1.0, s.deferred * s.powers, s.y_lin), rescale_dtype(s.y_lin, s.powers, d))


def _sum_terms(splits: list[_Split], d: DType) -> Decomposition:
    groups: dict[tuple, list[_Split]] = {}
    for s in splits:
        groups.setdefault((s.y_lin, s.powers, s.deferred), []).append(s)
    accs, factors = [], []
    for (y_lin, powers, deferred), members in groups.items():
        coeff = 1.0
        if len(members) == 1:  # a lone term's constant joins its deferred factor: the term can then be shared
            coeff = members[0].coeff
            members = [replace(members[0], coeff=1.0)]
        term = sum_expr(tuple(_term_product(s) for s in members), d)
        g = sum_expr(tuple(_g_product(s, False) for s in members), d)
        quantized = tuple(q for m in members for q in m.quantized)
        live = members[0].live
        for m in members[1:]:
            live = _both(BinaryOp.OR, live, m.live)
        accs.append(Accumulator(ReduceOp.SUM, term, y_lin, g, _h_expr(members[0], d), powers, quantized, live))
        factors.append(monomial_expr(deferred, d, coeff) if (deferred.factors or coeff != 1.0) else None)
    kind = "separable" if len(accs) == 1 else "sum of separable terms"
    return Decomposition(kind, tuple(accs), tuple(factors), expanded=len(splits) > 1)


def _never_negative_max(atom: Expr, ctx: FusionContext) -> bool:
    """True where `atom` reads an earlier running max of the cascade whose body is never negative (``max(abs(x))``):
    its running value never crosses 0, though it may be 0."""
    return isinstance(atom, Load) and any(
        e.name == atom.buffer.name and e.op is ReduceOp.MAX and is_nonnegative(e.body, ctx.positive)
        for e in ctx.extrema)


def _max_min(splits: list[_Split], op: ReduceOp, d: DType, ctx: FusionContext, name: str,
             value: Expr) -> Decomposition | Refusal:
    if len(splits) == 1:
        s = splits[0]
        if s.deferred.factors and not all(is_positive(a, ctx.positive) for a, _ in s.deferred.factors):
            h = monomial_expr(s.deferred, d)
            return Refusal(f"in `{name}`, {op.value} over the axis of G·H needs H > 0, and {format_expr(h)} cannot be shown "
                           "positive (a negative factor would turn max into min)", h)
        unsigned = [a for a, _ in s.powers.factors if not is_nonnegative(a, ctx.positive)]
        if unsigned:
            # (the running value is rescaled by H(y_new) / H(y_old): ``m_prev / m`` of ``min(x / max x)`` is
            # negative where the running max crosses 0, and the running min became a running max)
            h = monomial_expr(s.powers, d)
            at_zero = [a for a in unsigned if _never_negative_max(a, ctx)]
            if len(at_zero) == len(unsigned):
                # (a running max of |x| never crosses 0, but it is 0 until a nonzero element is seen)
                zero = " or ".join(format_expr(a) for a in at_zero)
                return Refusal(f"in `{name}`, {op.value} over the axis of G·H with H = {format_expr(h)} read at the "
                               f"running value: {zero} is a running max of values never negative, but it is 0 "
                               "while every element seen so far is 0, so H(y) > 0 cannot be shown: H is then "
                               "undefined (a division by 0) and so is its rescale H(y_new)/H(y_old); so a second "
                               "pass", h)
            return Refusal(f"in `{name}`, {op.value} over the axis of G·H with H = {format_expr(h)} read at the running "
                           "value: its rescale H(y_new)/H(y_old) may be negative (a running max that crosses 0), "
                           "which would turn the running max into a min; so a second pass", h)
        acc = _acc(op, product_expr(_term_product(s), d), s, product_expr(_g_product(s, False), d), d)
        factor = monomial_expr(s.deferred, d) if s.deferred.factors else None
        return Decomposition("separable", (acc,), (factor,))
    x_part, y_part = [], []
    for s in splits:
        if not s.g.factors and s.x_lin.is_zero:
            # no reduced value: H's, a bare constant too (``max(x - m + 2)`` is ``(max x - m) + 2``, whose
            # ``max x - m`` is exactly 0 at the maximum; in G it gave ``(max x + 2) - m``, 2 - 2**-23: fuzz
            # seed 1, example 68642 at fbc0792)
            y_part.append(A.Product(s.coeff, s.deferred, s.y_lin))
        elif s.y_lin.is_zero and not s.deferred.factors:
            x_part.append(_g_product(s, False))
        else:
            t = product_expr(A.Product(s.coeff, s.g * s.deferred, s.x_lin + s.y_lin), d)
            return Refusal(f"in `{name}`, {op.value} distributes over '+' only for G(x) + H(y); the term "
                           f"{format_expr(t)} is a product of both", t)
    g = sum_expr(tuple(x_part), d)
    h = sum_expr(tuple(y_part), d)
    # as written only where G's atom is in the body as it is written: ``0.5 + f32(x - v)`` has ``f32(x)`` only
    # in the normal form (fuzz: seed 1, example 24819 at 50b4a5f, a load of x left after the loop)
    one = _one_atom(x_part)
    if one is not None and one[0].dtype == d and any(n == one[0] for n in walk(value)):
        atom, coeff = one
        # ``min((x - m) * 0.05)`` is the body at ``x``'s min: the accumulator keeps that extreme of the atom (the
        # other one where the coefficient is negative) and the body is evaluated there as numpy evaluates it
        # at that element (``0.05 min(x) - 0.05 m`` was an ulp off: fuzz seed 75, example 1 at 6678477)
        acc_op = op if coeff > 0 else (ReduceOp.MIN if op is ReduceOp.MAX else ReduceOp.MAX)
        return Decomposition("additive", (Accumulator(acc_op, atom, A.Linear(), atom, h),),
                             (None if coeff == 1.0 else Const(coeff, d),), addend=h, written=value)
    return Decomposition("additive", (Accumulator(op, g, A.Linear(), g, h),), (None,), addend=h)


def _product(splits: list[_Split], d: DType, name: str) -> Decomposition | Refusal:
    """``prod over k of G(x)·exp(L(y))``: the exponential of the earlier results stays online and the running
    product is carried by the product law (`product_law.py`): when y moves, each of the ``count`` factors
    already multiplied in changes by ``exp(L(y_new) - L(y_old))``. Any other factor of y is refused."""
    if len(splits) > 1:
        t = sum_expr(tuple(A.Product(s.coeff, s.g * s.deferred, s.x_lin + s.y_lin) for s in splits), d)
        return Refusal(f"`{name}` is a product over the axis of a sum of terms, {format_expr(t)}: a product of sums does "
                       "not factor into prod G(x) · prod H(y); so a second pass", t)
    s = splits[0]
    other = s.deferred * s.powers
    if other.factors or s.rounded:
        h = monomial_expr(other, d) if other.factors else next(iter(dict(s.rounded)))
        return Refusal(f"in `{name}`, a product over the axis of G(x)·H(y) with H = {format_expr(h)}, not an exponential "
                       "of earlier results: carrying it would raise the ratio H(y_now)/H(y_before) to the count "
                       "of elements already multiplied in, one rounding amplified by that count, and a running "
                       "H of 0 has no ratio; so a second pass", h)
    if s.g.factors:
        # each factor multiplied in is read with the running y (``exp(0.05 (x - m_t))`` at the running max):
        # larger than the reference's, and a G(x) that is not bounded makes the running product overflow where
        # the reference's does not: prod((x² + 1)·exp(0.05 (x - m))) over a row whose max comes late was NaN
        # (inf times the carry's exp(t·...) = 0) for numpy's 2.5e-26. A pure exponential's factors are at most 1.
        g = monomial_expr(s.g, d)
        return Refusal(f"in `{name}`, a product over the axis of G(x)·exp(L(y)) with G = {format_expr(g)}: its factors, "
                       "read with the running earlier results, are larger than the reference's, and the running "
                       "product may overflow where the reference's does not; so a second pass", g)
    return Decomposition("separable", (_acc(ReduceOp.PROD, product_expr(_term_product(s), d), s,
                                            product_expr(_g_product(s, False), d), d),), (None,))


def _one_atom(x_part: list[A.Product]) -> tuple[Expr, float] | None:
    """An additive max/min's G as ``(atom, c)`` where it is ``c`` times a single atom (``c`` finite, not 0), so
    that its final value can be the body as written with the accumulator in place of the atom
    (`Decomposition.written`; the accumulator keeps the atom's max or min, the other where ``c < 0``).

    An additive max/min, ``max over k of (G(x) + H(y))``, finished as the body is written with
    ``max over k of G`` in place of G, rather than as ``acc + H``: the body's own association then
    cancels what the reference's does. ``max(x - m - l)`` with ``m = max x`` is ``(acc - m) - l``, exactly
    ``-l`` as numpy's ``(x - m) - l`` is at the maximum, where ``acc + (-m - l)`` rounds ``l`` away
    against a large ``m`` (fuzz seed 7, example 203: ``-m - l`` is ``-1e8`` in f32, the result 0 for
    numpy's -1). Valid where G is a single atom times a constant (the body is then monotone in it: its max
    over k is the body at the atom's max, or its min for a negative constant)."""
    if len(x_part) != 1:
        return None
    (p,) = x_part
    if p.exponent.is_zero and len(p.mono.factors) == 1 and p.mono.factors[0][1] == 1 and p.coeff != 0 \
            and math.isfinite(p.coeff):
        return p.mono.factors[0][0], p.coeff
    return None


def rescale_exponent(online: A.Linear, to_prev: Callable[[Expr], Expr], d: DType,
                     to_new: Callable[[Expr], Expr] = lambda e: e) -> Expr | None:
    """``online(y_new) - online(y_old)``, the exponent of the online exponential's change (None when there is
    none): ``m_prev - m`` for ``exp(x - m)``. Each term is written as the difference of its two readings, so
    two nearby maxima subtract exactly."""
    from ..ir import Binary, BinaryOp

    diff: Expr | None = None
    for mono, c in online.terms:
        raw = monomial_expr(mono, d)
        new, old = to_new(raw), to_prev(raw)
        first, second = (old, new) if c < 0 else (new, old)
        part: Expr = Binary(BinaryOp.SUB, first, second, d)
        if abs(c) != 1.0:
            part = Binary(BinaryOp.MUL, Const(abs(c), d), part, d)
        diff = part if diff is None else Binary(BinaryOp.ADD, diff, part, d)
    return diff


def rescale_expr(online: A.Linear, to_prev: Callable[[Expr], Expr], d: DType,
                 to_new: Callable[[Expr], Expr] = lambda e: e, powers: A.Monomial = A.Monomial(),
                 to_new_power: Callable[[Expr], Expr] = lambda e: e) -> Expr | None:
    """``H(y_new) / H(y_old)`` for the online part of H, as one expression (None when there is none):
    ``exp(m_prev - m)`` for an exponential, ``a_prev / a`` for a quantization scaled by ``1 / a``.

    `to_prev` turns current values into the previous chunk's; `to_new`/`to_new_power` may rewrite
    the current side (reading a running max that is still at its identity safely).
    """
    from ..ir import Binary, BinaryOp, Unary, UnaryOp

    diff = rescale_exponent(online, to_prev, d, to_new)
    out: Expr | None = None if diff is None else Unary(UnaryOp.EXP, diff, d)
    for atom, p in powers.factors:
        # both sides guarded alike: a running max that sat at 0 scaled its terms by 1 (the guard), not 1/0, so
        # they move by guard(old) / guard(new); by old / new they were multiplied by 0 and lost
        new, old = to_new_power(atom), to_prev(to_new_power(atom))
        ratio: Expr = Binary(BinaryOp.DIV, old, new, d) if p < 0 else Binary(BinaryOp.DIV, new, old, d)
        if abs(p) != 1:
            ratio = Binary(BinaryOp.POW, ratio, Const(float(abs(p)), d), d)
        out = ratio if out is None else Binary(BinaryOp.MUL, out, ratio, d)
    return out


__all__ = ["FusionContext", "Accumulator", "Decomposition", "Refusal", "decompose", "sums_at_least_one",
           "unbounded_exponential", "rescale_expr", "rescale_exponent",
           "linear_expr"]
