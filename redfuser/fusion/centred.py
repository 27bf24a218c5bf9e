"""Shift-stable sums: a polynomial in ``u - c`` kept centred on the running statistic ``c`` of ``u``.

Expanding ``sum_k (x_k - mu)^2`` into ``sum x^2 - 2 mu sum x + N mu^2`` is exact algebra, but in
floating point the three sums cancel: rows of N(300, 1) lose every digit. The same happens to
``sum exp(x - m) * (x - m)`` (entropy) expanded into ``sum exp(x - m) * x - m * sum exp(x - m)``.

When the centre ``c`` is a *running statistic* of the very values ``u`` it is subtracted from,
the sum can instead be kept centred while the loop runs. Write ``w = u - c``; the change of
variables ``u -> w + c`` (`centre_sum`) turns the body into a polynomial in ``w`` that no longer
reads ``c``: ``sum_i G_i(x) * exp(alpha * w) * w^i * H_i(y)``. Each family (same G, alpha and
online part of H) keeps the accumulators ``T_i = sum G * exp(alpha * w_run) * w_run^i`` of every
power up to the highest, with ``w_run = u - c_run`` for the centre as it stands after the chunk:

- ``c`` a running max or min ``m`` of ``u``: ``c_run`` is the running ``m`` itself;
- ``c`` the mean ``S / N`` of ``u`` (``S`` a running sum of ``u``): ``c_run = S_run / n_run`` with
  ``n_run`` the exact count of elements seen (a sum of 1 carried beside it).

When the centre moves from ``a`` to ``b`` (``d = a - b``), ``w_b = w_a + d``, so

    T_k(b) = exp(alpha * d) * sum_{j <= k} C(k, j) * d^(k - j) * T_j(a)       (the shift law)

which is `OnlineState.carry`; two partial states merge by the same shift to the merged centre,
then ``+`` (for the variance: the parallel-variance merge of Chan et al.). Every term is computed
from ``u - c_run`` element by element, as the reference computes ``u - c``: nothing cancels.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

from ..ir import (Axis, Binary, BinaryOp, Buffer, BufferType, Const, DType, Expr, Length, Load, OnlineState, ReduceOp,
                  map_expr)
from . import algebra as A
from .build import product_expr, sum_expr
from .separability import Accumulator, Decomposition, FusionContext, Refusal, _split
from .substitute import value_at

_MAX_DEGREE = 8
"""The highest power of ``u - c`` kept centred (one accumulator per power up to it)."""

_RESIDUE = 1e-12
"""A coefficient the change of variables leaves at this size relative to the magnitudes it was summed from
(`_Tracked.magnitude`) is rounding residue of 0 (``1/a * a - 1``: a few ulps of its parts)."""


class _Tracked(float):
    """A coefficient that remembers the sum of the magnitudes it was computed from, so that rounding residue is
    told from a genuine small coefficient by its size relative to its parts, not to 1: ``(x - k Y)^2`` centred
    with ``k = 2e-7`` keeps a genuine ``k^2 Y^2`` (4e-14) that an absolute cut-off at 1e-12 dropped (the fused
    sum was -5e10 for numpy's 850, and a mean over 2^20 elements, ``k = 2^-20``, -1e14 for 1e6)."""

    magnitude: float

    def __new__(cls, value: float, magnitude: float | None = None) -> "_Tracked":
        t = super().__new__(cls, value)
        t.magnitude = abs(float(value)) if magnitude is None else magnitude
        return t

    def __add__(self, other: float) -> "_Tracked":
        return _Tracked(float(self) + float(other), self.magnitude + _magnitude(other))

    __radd__ = __add__

    def __sub__(self, other: float) -> "_Tracked":
        return _Tracked(float(self) - float(other), self.magnitude + _magnitude(other))

    def __rsub__(self, other: float) -> "_Tracked":
        return _Tracked(float(other) - float(self), self.magnitude + _magnitude(other))

    def __mul__(self, other: float) -> "_Tracked":
        return _Tracked(float(self) * float(other), self.magnitude * _magnitude(other))

    __rmul__ = __mul__

    def __truediv__(self, other: float) -> "_Tracked":
        return _Tracked(float(self) / float(other), self.magnitude / abs(float(other)))

    def __rtruediv__(self, other: float) -> "_Tracked":
        return _Tracked(float(other) / float(self), _magnitude(other) / abs(float(self)))

    def __neg__(self) -> "_Tracked":
        return _Tracked(-float(self), self.magnitude)


def _magnitude(c: float) -> float:
    return c.magnitude if isinstance(c, _Tracked) else abs(float(c))


def _is_residue(c: float) -> bool:
    return abs(float(c)) <= _RESIDUE * _magnitude(c)


def _tracked_linear(lin: A.Linear) -> A.Linear:
    return A.Linear(tuple((m, _Tracked(c)) for m, c in lin.terms), _Tracked(lin.constant))


def _tracked(s: A.Sum) -> A.Sum:
    """`s` with every coefficient (of its products and of their exponents) a `_Tracked` one."""
    return tuple(A.Product(_Tracked(t.coeff), t.mono, _tracked_linear(t.exponent)) for t in s)


@dataclass(frozen=True)
class Centre:
    """A running statistic ``c`` of reduced values ``u`` that a body subtracts from them.

    `op` is MAX or MIN (``c`` a running extremum: `state` is its state) or SUM (``c`` the mean
    ``S / N``: `state` is the running sum ``S``'s state). `atom` is the earlier result the body
    reads (``m``, or ``S`` or ``mu`` for ``mu = S / N``); `c` the centre as the body writes it, in final
    values; `u` the values it is the statistic of, at the body's indices. `marker` stands for
    ``u - c`` inside the algebra (an atom read along the loop axis).
    """

    op: ReduceOp
    state: str
    atom: Expr          # (a Load, or ``S / length`` of a mean over a symbolic axis: `_over_the_axis_length`)
    source: Load        # the state itself at the body's indices (the running max, or the running sum S)
    c: Expr
    u: Expr
    marker: Load
    own: Expr | None = None      # the compiler's own running mean (fusion/own_centre.py): k Y, with c = delta + k Y
    delta: Load | None = None    # there: the after-the-loop value c_final - k Y the factors read
    taylor: bool = False         # fusion/taylor.py: own = 0, so delta is the final mean c itself

    @property
    def words(self) -> str:
        """Which form was chosen, for `explain`."""
        from ..ir import format_expr

        if self.taylor:
            u = format_expr(self.u)
            return (f"in Taylor form around its own running mean of {u} (shift-stable): sum p({u}) = "
                    f"sum_j p^(j)(mean) / j! * sum ({u} - mean)^j, each p^(j)(mean) computed as the body is "
                    "written, the mean kept as running sum / exact running count of the finite values")
        if self.own is not None:
            u, ky = format_expr(self.u), format_expr(self.own)
            return (f"centred on its own running mean of {u} (shift-stable): ({u} - {ky}) = ({u} - mean) + "
                    f"(mean - {ky}), the mean kept as running sum / exact running count of the finite values")
        if self.op is ReduceOp.SUM:
            return (f"centred on the running mean (shift-stable): {format_expr(self.c)} is kept as running sum / "
                    "exact running count while the loop runs")
        what = "max" if self.op is ReduceOp.MAX else "min"
        return f"centred on the running {what} {format_expr(self.atom)} (shift-stable)"


@dataclass(frozen=True)
class Shift:
    """How a shift-stable accumulator moves with its centre: ``T_degree`` of a family whose lower powers
    are the decomposition's accumulators `lower` (degrees 0..degree-1, in order); `alpha` is the
    coefficient of ``w`` in the family's exponential; `term` is the accumulated term with
    `centre.marker` standing for ``u - c_run``."""

    centre: Centre
    degree: int
    alpha: float
    lower: tuple[int, ...]
    term: Expr
    online_rest: A.Linear = A.Linear()   # the rest of H's online part (rescaled as usual on top of the shift)


def find_centres(normal: A.Sum, ctx: FusionContext, states: tuple[OnlineState, ...],
                 running: Callable[[Expr], Expr], loop_axis: str, extent: int) -> list[Centre]:
    """The earlier results in `normal` that are a running max, min or mean of some reduced values."""
    by_name = {st.acc.name: st for st in states}
    pos = lambda e: False  # noqa: E731
    out: list[Centre] = []
    for atom in sorted(A.free_atoms(normal), key=repr):
        if ctx.kind(atom) != "y":
            continue
        read = _over_the_axis_length(atom, extent)
        if read is None and not isinstance(atom, Load):
            continue
        r = A.normalize(running(atom if read is None else read), pos, pos)
        if len(r) != 1 or not r[0].exponent.is_zero or len(r[0].mono.factors) != 1:
            continue
        (state_load, p), kappa = r[0].mono.factors[0], r[0].coeff
        st = by_name.get(state_load.buffer.name) if isinstance(state_load, Load) else None
        if p != 1 or st is None or st.rescale is not None or st.carry is not None:
            continue
        if st.op is ReduceOp.SUM and st.acc.dtype.storage_only:
            # a 16-bit sum is held in f32 while the loop runs and read rounded by a later kernel (a split's, an
            # epilogue's of its own): centred on the running f32 mean, an f16 variance was centred elsewhere than
            # the mean the output subtracts, and a constant row of 768 normalized to 3.29 for numpy's 0 (found by
            # a helper, hunt_norms/01). Its own centre, moved after the loop onto the mean as the output reads it
            # (`own_centre.py`), is one
            continue
        if st.op is ReduceOp.SUM:
            # (``kappa * extent``: for ``S / length`` the count is the axis's, whatever the length)
            scale = kappa * extent if read is None else kappa
            if scale == 0:   # an empty axis (x[3:-21] of a short one): no mean to centre on
                continue
            c: Expr = Binary(BinaryOp.MUL, atom, Const(1.0 / scale, atom.dtype), atom.dtype)
        elif kappa == 1.0 and read is None:
            c = atom
        else:
            continue
        u = value_at(st.axes, st.term, state_load.indices)
        lin = A.as_linear(ctx.terms_form(u))
        # (values of kind c are the same at every k: an axis of length 1 reads x[i, 0])
        if lin is None or not lin.terms or any(ctx.kind(a) not in ("x", "c") for m, _ in lin.terms
                                               for a, _ in m.factors):
            continue
        marker = Load(Buffer(f"__centre_{st.acc.name}", BufferType(atom.dtype, (extent,))), (Axis(loop_axis, extent),))
        out.append(Centre(st.op, st.acc.name, atom, state_load, c, u, marker))
    return out


def _over_the_axis_length(atom: Expr, extent: int) -> Expr | None:
    """``S`` where `atom` is ``S / length`` with the fused axis's own `Length` (a mean over a symbolic axis,
    `redfuser.ops.statistics`; ``S`` a sum's load, widened to f32 for a 16-bit one): the mean the exact kernel
    reads as ``S / 10007.0``, which the normal form takes apart (a Length stays in its atom). None
    otherwise."""
    if (isinstance(atom, Binary) and atom.op is BinaryOp.DIV and isinstance(atom.b, Length)
            and atom.b.count == extent):
        return atom.a
    return None


def _clean(s: A.Sum) -> A.Sum:
    """`s` (of `_Tracked` coefficients) without the rounding residue a change of variables leaves (``1/a * a -
    1``), its coefficients plain floats again."""
    out = []
    for t in s:
        if _is_residue(t.coeff):
            continue
        exp = A.Linear.of({m: float(c) for m, c in t.exponent.terms if not _is_residue(c)},
                          0.0 if _is_residue(t.exponent.constant) else float(t.exponent.constant))
        out.append(A.Product(float(t.coeff), t.mono, exp))
    return A.add(tuple(out), ())


def change_variables(normal: A.Sum, centre: Centre, ctx: FusionContext, exponents: bool = True) -> A.Sum | None:
    """`normal` (`ctx.normal_form`) with ``u`` written as ``w + c`` (`centre.marker` for ``w``), or None where
    ``u`` does not enter it polynomially (a negative or fractional power, inside a non-linear exponent).
    ``u`` is read as the normal form reads a multiplied sum (``x / y * 2`` is twice the atom ``x / y``).
    Without `exponents`, ``u`` inside an exponential stays as it is (a weight the centre does not move:
    taylor.py)."""
    u = A.as_linear(ctx.terms_form(centre.u))
    if u is None:   # a value kept whole in the body (`FusionContext.reduced_only_term`: exp(x), 1/x) is one atom
        u = A.as_linear(A.atom(centre.u))
    c = A.as_linear(ctx.terms_form(centre.c))   # (an earlier ``S / W`` one atom, as the body's terms read it)
    if c is not None:
        u, c, normal = _tracked_linear(u), _tracked_linear(c), _tracked(normal)
    pivot = next(((m.factors[0][0], k) for m, k in u.terms if len(m.factors) == 1 and m.factors[0][1] == 1), None)
    if pivot is None or c is None:
        return None
    x, a = pivot
    rest = A.Linear.of({m: k for m, k in u.terms if m != A.Monomial.of({x: Fraction(1)})}, u.constant)
    # x = (w + c - rest) / a
    w = A.Linear.of({A.Monomial.of({centre.marker: Fraction(1)}): 1.0})
    x_lin = (w + c + rest.scale(-1.0)).scale(1.0 / a)
    x_sum = A.add(tuple(A.Product(k, m) for m, k in x_lin.terms), A.const(x_lin.constant))
    out: list[A.Product] = []
    for t in normal:
        powers = t.mono.as_dict()
        p = powers.pop(x, Fraction(0))
        if p < 0 or p.denominator != 1 or p > _MAX_DEGREE:
            return None
        k = 0.0
        terms = {}
        for m, coef in t.exponent.terms:
            if x in m.as_dict() and exponents:
                if m.factors != ((x, Fraction(1)),):
                    return None
                k += coef
            else:
                terms[m] = coef
        part: A.Sum = (A.Product(t.coeff, A.Monomial.of(powers), A.Linear.of(terms, t.exponent.constant)
                                 + x_lin.scale(k)),)
        for _ in range(int(p)):
            part = A.mul(part, x_sum)
        out.extend(part)
    return _clean(A.add(tuple(out), ()))


def centre_sum(value: Expr, ctx: FusionContext, states: tuple[OnlineState, ...], running: Callable[[Expr], Expr],
               loop_axis: str, extent: int, name: str) -> Decomposition | None:
    """`value`'s sum as a shift-stable decomposition around a running statistic among `states` (earlier
    results read through `running`), or None where none applies: the body does not read the centre
    only through ``u - c``, or something else (a quantization, a where) stands in the way."""
    d = value.dtype
    normal = ctx.normal_form(value)
    centres = find_centres(normal, ctx, states, running, loop_axis, extent)
    for centre in centres:
        moved = change_variables(normal, centre, ctx)
        if moved is None:
            continue
        atoms = A.free_atoms(moved)
        if centre.marker not in atoms or centre.atom in atoms:
            continue
        others = {c.atom for c in centres if c.atom != centre.atom}
        if any(y in others for _, y in _pairs_in(moved, ctx)):
            # a difference from another running statistic is still multiplied out: the covariance ``(x_a -
            # m_a) (x_b - m_b)`` centred on column a's running mean left ``x_b w - m_b w``, which cancels where
            # the data sits far from 0 (30-300x numpy's error at an offset of 1e4; found by a helper)
            continue
        dec = _families(moved, centre, ctx, name, d)
        if dec is not None:
            return dec
    return None


def cancelling_pairs(value: Expr, ctx: FusionContext) -> list[tuple[Expr, Expr]]:
    """A reduced value ``X`` and an earlier result ``Y`` whose difference ``X - k Y`` the expansion multiplied
    out: two terms of the normal form with the same exponential whose monomials differ exactly by the
    ratio ``X / Y`` (``x^2`` beside ``x * m`` for ``(x - m)^2``; ``exp(x - m) * x`` beside
    ``exp(x - m) * m``). Their sums cancel wherever ``X`` is close to ``k Y``. Every such pair, in the order
    found (``(x - y) w`` gives ``(x, y)`` and also ``(w, y)``: `own_centre.forms_difference` tells which one
    the body wrote)."""
    return _pairs_in(ctx.normal_form(value), ctx)


def _pairs_in(normal: A.Sum, ctx: FusionContext) -> list[tuple[Expr, Expr]]:
    """`cancelling_pairs` of a normal form."""
    monos: dict[A.Linear, set[A.Monomial]] = {}
    out: list[tuple[Expr, Expr]] = []
    for t in normal:
        monos.setdefault(t.exponent, set()).add(t.mono)
    for group in monos.values():
        for m in group:
            for x, p in m.factors:
                if p < 1 or ctx.kind(x) != "x":
                    continue
                for other in group:
                    ratio = (m * other.power(Fraction(-1))).factors
                    if len(ratio) == 2 and {q for _, q in ratio} == {Fraction(1), Fraction(-1)}:
                        (a, pa), (b, pb) = ratio
                        top, bottom = (a, b) if pa > 0 else (b, a)
                        if top == x and ctx.kind(bottom) == "y" and (x, bottom) not in out:
                            out.append((x, bottom))
    return out


def _families(moved: A.Sum, centre: Centre, ctx: FusionContext, name: str, d: DType) -> Decomposition | None:
    w = centre.marker
    w_mono = A.Monomial.of({w: Fraction(1)})
    fams: dict[tuple, dict[int, list[A.Product]]] = {}
    for t in moved:
        s = _split(t, ctx, name)
        if isinstance(s, Refusal) or s.powers.factors or s.quantized or s.selects:
            return None
        g = s.g.as_dict()
        degree = g.pop(w, Fraction(0))
        alpha = dict(s.x_lin.terms).get(w_mono, 0.0)
        if degree < 0 or degree.denominator != 1 or any(w in m.as_dict() and m != w_mono for m, _ in s.x_lin.terms):
            return None
        if alpha and centre.op is ReduceOp.SUM:
            return None   # exp(alpha (x - mean)): the mean's rescale is not an exponential of a running state
        x_rest = A.Linear.of({m: k for m, k in s.x_lin.terms if m != w_mono}, s.x_lin.constant)
        key = (A.Monomial.of(g), x_rest, alpha, s.y_lin)
        fams.setdefault(key, {}).setdefault(int(degree), []).append(A.Product(s.coeff, s.deferred))
    if not any(deg for fam in fams.values() for deg in fam):
        return None
    c_lin = A.as_linear(A.normalize(centre.c, lambda e: False, lambda e: False))
    accs: list[Accumulator] = []
    factors: list[Expr | None] = []
    for (g, x_rest, alpha, y_lin), fam in fams.items():
        lower: list[int] = []
        for degree in range(max(fam) + 1):
            # the exponent with w written out: exp(alpha (u - c) + ...), the very term an unshifted sum keeps
            online = y_lin + (c_lin.scale(-alpha) if alpha else A.Linear())
            u_lin = A.as_linear(A.normalize(centre.u, lambda e: False, lambda e: False))
            weight = x_rest + (u_lin.scale(alpha) if alpha else A.Linear())   # the exponent's part in G
            exponent = weight + online
            shifted = product_expr(A.Product(1.0, g * A.Monomial.of({w: Fraction(degree)}), exponent), d)
            u_minus_c = Binary(BinaryOp.SUB, centre.u, centre.c, d)
            term = map_expr(shifted, lambda n: u_minus_c if n == w else None)
            # G keeps alpha·u, so that G·H is the term the state accumulates (without it, the entropy's G
            # printed 1.0 for a state summing exp(x - m))
            G = product_expr(A.Product(1.0, g * A.Monomial.of({w: Fraction(degree)}), weight), d)
            G = map_expr(G, lambda n: u_minus_c if n == w else None)
            H = product_expr(A.Product(1.0, A.Monomial(), online), d)
            shift = Shift(centre, degree, alpha, tuple(lower), shifted, y_lin)
            accs.append(Accumulator(ReduceOp.SUM, term, online, G, H, shift=shift))
            weights = fam.get(degree, [])
            factors.append(_factor(weights, d) if weights else Const(0.0, d))
            lower.append(len(accs) - 1)
    return Decomposition("shift-stable sum", tuple(accs), tuple(factors), stable=centre)


def _factor(weights: list[A.Product], d: DType) -> Expr | None:
    s = A.add(tuple(weights), ())
    if len(s) == 1 and s[0].coeff == 1.0 and not s[0].mono.factors:
        return None
    return sum_expr(s, d) if s else Const(0.0, d)


__all__ = ["Centre", "Shift", "find_centres", "change_variables", "centre_sum", "cancelling_pairs"]
