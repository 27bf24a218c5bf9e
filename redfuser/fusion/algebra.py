"""A small algebra on Loop IR expressions: sums of products with exponentials.

Every scalar expression is brought to the normal form

    F = sum_j  c_j * prod_a  atom_a ** p_ja * exp( sum_b  d_jb * monomial_b )

where atoms are the sub-expressions the algebra does not look into (loads,
``abs``, ``maximum``, ``where``, logs of things not known positive...). The
rules are the textbook identities, applied only where they are exact:

- ``exp(a + b) = exp(a) * exp(b)``; ``exp2(a) = exp(ln 2 * a)``;
- division is a power of -1; ``sqrt``/``rsqrt`` are powers of +-1/2 (of a base known >= 0);
- products distribute over sums (this is what exposes a *sum of separable terms*);
- ``log`` of a product of positive factors is the sum of their logs, ``log(exp(a)) = a``.

`Atom` identity is structural, so ``s - m`` written twice is one atom.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

from ..ir import Binary, BinaryOp, Cast, Const, DType, Expr, Select, Unary, UnaryOp
from ..ir.loop.expr import walk
from ..ir.types import bfloat16, float8_e4m3fn, float16, float32, float64

Power = Fraction
LN2 = math.log(2.0)

_CANCELLED: contextvars.ContextVar[set | None] = contextvars.ContextVar("redfuser_cancelled", default=None)


@contextlib.contextmanager
def noting_cancellations() -> Iterator[set]:
    """A set that collects, while the block runs, every atom the algebra cancels: powers of opposite signs
    that meet (``x / x``, ``x * x / x``), like terms that cancel to nothing (``x - x``, ``exp(x - x)``) and
    terms multiplied by zero (``x * 0.0``). Each identity holds for real numbers only: where the atom is 0,
    ±inf or NaN floating point gives NaN (``0/0``, ``inf - inf``, ``inf * 0``), the normal form does not.
    (Like terms that merge into one that is left, ``-2xy + xy``, are an expansion's: "sum of separable
    terms" in docs/fusion.md, whose limit with infinities is documented apart.)"""
    seen: set = set()
    token = _CANCELLED.set(seen)
    try:
        yield seen
    finally:
        _CANCELLED.reset(token)


def _note(atoms: Iterable[Expr]) -> None:
    seen = _CANCELLED.get()
    if seen is not None:
        seen.update(atoms)


@dataclass(frozen=True)
class Monomial:
    """A product of atoms with rational powers, e.g. ``m`` or ``x**2 / l`` (sorted, canonical)."""

    factors: tuple[tuple[Expr, Power], ...] = ()

    @staticmethod
    def of(powers: dict[Expr, Power]) -> "Monomial":
        items = [(a, p) for a, p in powers.items() if p != 0]
        return Monomial(tuple(sorted(items, key=lambda ap: repr(ap[0]))))

    def as_dict(self) -> dict[Expr, Power]:
        return dict(self.factors)

    def __mul__(self, other: "Monomial") -> "Monomial":
        d = self.as_dict()
        for a, p in other.factors:
            if d.get(a, Power(0)) * p < 0:
                _note([a])
            d[a] = d.get(a, Power(0)) + p
        return Monomial.of(d)

    def power(self, k: Power) -> "Monomial":
        return Monomial.of({a: p * k for a, p in self.factors})


@dataclass(frozen=True)
class Linear:
    """``sum_b d_b * monomial_b + constant``: the argument of an exponential."""

    terms: tuple[tuple[Monomial, float], ...] = ()
    constant: float = 0.0

    @staticmethod
    def of(terms: dict[Monomial, float], constant: float = 0.0) -> "Linear":
        items = [(m, c) for m, c in terms.items() if c != 0]
        return Linear(tuple(sorted(items, key=lambda mc: repr(mc[0]))), constant)

    def __add__(self, other: "Linear") -> "Linear":
        d = dict(self.terms)
        for m, c in other.terms:
            if d.get(m, 0.0) + c == 0 and c != 0:
                _note(a for a, _ in m.factors)
            d[m] = d.get(m, 0.0) + c
        return Linear.of(d, self.constant + other.constant)

    def scale(self, k: float) -> "Linear":
        if k == 0:
            _note(a for m, _ in self.terms for a, _ in m.factors)
        return Linear.of({m: c * k for m, c in self.terms}, self.constant * k)

    @property
    def is_zero(self) -> bool:
        return not self.terms and self.constant == 0.0


@dataclass(frozen=True)
class Product:
    """``coeff * monomial * exp(exponent)``."""

    coeff: float = 1.0
    mono: Monomial = field(default_factory=Monomial)
    exponent: Linear = field(default_factory=Linear)

    def __mul__(self, other: "Product") -> "Product":
        return Product(self.coeff * other.coeff, self.mono * other.mono, self.exponent + other.exponent)

    def key(self) -> tuple:
        return (self.mono, self.exponent)


Sum = tuple[Product, ...]
"""A sum of products (the normal form). The empty sum is zero."""


def _combine(terms: list[Product]) -> Sum:
    """Merge like products (same monomial and exponent) and drop zeros; deterministic order."""
    merged: dict[tuple, Product] = {}
    order: list[tuple] = []
    for t in terms:
        k = t.key()
        if k in merged:
            if merged[k].coeff + t.coeff == 0 and t.coeff != 0:
                _note(free_atoms((t,)))
            merged[k] = Product(merged[k].coeff + t.coeff, t.mono, t.exponent)
        else:
            merged[k] = t
            order.append(k)
    return tuple(merged[k] for k in order if merged[k].coeff != 0)


def const(c: float) -> Sum:
    return (Product(c),) if c != 0 else ()


def atom(e: Expr) -> Sum:
    return (Product(1.0, Monomial.of({e: Power(1)})),)


def add(a: Sum, b: Sum) -> Sum:
    return _combine(list(a) + list(b))


def mul(a: Sum, b: Sum) -> Sum:
    if not a or not b:   # a product with zero
        _note(free_atoms(a + b))
    return _combine([x * y for x in a for y in b])


def scale(a: Sum, k: float) -> Sum:
    if k == 0:
        _note(free_atoms(a))
    return _combine([Product(t.coeff * k, t.mono, t.exponent) for t in a])


def as_linear(s: Sum) -> Linear | None:
    """`s` as a linear form over monomials without exponentials (None if some term has an exp)."""
    terms: dict[Monomial, float] = {}
    constant = 0.0
    for t in s:
        if not t.exponent.is_zero:
            return None
        if not t.mono.factors:
            constant += t.coeff
        else:
            terms[t.mono] = terms.get(t.mono, 0.0) + t.coeff
    return Linear.of(terms, constant)


def split_exponent(exponent: Linear, kind: Callable[[Expr], str]) -> tuple[Linear, Linear] | Monomial:
    """An exponent as its part reading only the reduced values or constants (with the constant term) and
    its part reading earlier results, by `kind` (``x``, ``y``, ``c`` or ``mixed`` per atom); or the first
    monomial that multiplies both, which does not split into ``exp(x)·exp(y)``."""
    x_terms: dict = {}
    y_terms: dict = {}
    for mono, c in exponent.terms:
        kinds = {kind(a) for a, _ in mono.factors}
        if "mixed" in kinds or {"x", "y"} <= kinds:
            return mono
        (y_terms if "y" in kinds else x_terms)[mono] = c
    return Linear.of(x_terms, exponent.constant), Linear.of(y_terms)


def exp_of(s: Sum) -> Sum:
    """``exp(s)`` in normal form: exponentials of linear arguments merge into one exp."""
    lin = as_linear(s)
    if lin is None:
        return None  # exp of something that itself has exps: the caller keeps it as an atom
    # The constant stays inside the exponential: exp(x - 1000) must not become 0 * exp(x).
    return (Product(1.0, Monomial(), lin),)


def power_of(s: Sum, k: Power, nonneg: Callable[[Expr], bool]) -> Sum | None:
    """``s ** k`` when `s` is a single product whose factors are >= 0 (or `k` is an integer)."""
    if len(s) == 1:
        t = s[0]
        integral = k.denominator == 1
        if integral or (t.coeff > 0 and all(nonneg(a) for a, _ in t.mono.factors)):
            if t.coeff == 0 or (t.coeff < 0 and not integral):
                return None
            try:
                coeff = t.coeff ** float(k)
            except OverflowError:   # (Python's float power raises past 1.8e308: left a power as written)
                return None
            return (Product(coeff, t.mono.power(k), t.exponent.scale(float(k))),)
    if k.denominator == 1 and 0 < k.numerator <= 4:  # small positive integer powers distribute
        out = const(1.0)
        for _ in range(k.numerator):
            out = mul(out, s)
        return out
    return None


def log_of(s: Sum, positive: Callable[[Expr], bool]) -> Sum | None:
    """``log(s)`` when `s` is a single product of positive factors: the sum of their logs."""
    if len(s) != 1:
        return None
    t = s[0]
    if t.coeff <= 0 or not all(positive(a) for a, _ in t.mono.factors):
        return None
    out: list[Product] = [Product(math.log(t.coeff))] if t.coeff != 1 else []
    for a, p in t.mono.factors:
        out.append(Product(float(p), Monomial.of({Unary(UnaryOp.LOG, a, a.dtype): Power(1)})))
    for m, c in t.exponent.terms:
        out.append(Product(c, m))
    if t.exponent.constant:
        out.append(Product(t.exponent.constant))
    return _combine(out)


def normalize(e: Expr, positive: Callable[[Expr], bool], nonneg: Callable[[Expr], bool],
              whole: Callable[[Expr], bool] | None = None, term_whole: Callable[[Expr], bool] | None = None,
              rounded_whole: Callable[[Expr], bool] | None = None) -> Sum:
    """`e` in normal form. Sub-expressions no rule applies to become atoms (kept whole), and so does a factor
    or base of a product or power that `whole` selects (`separability.FusionContext.normal_form`: a sum that
    reads the reduced values only, whose expansion would separate nothing and only cancel), a term that
    `term_whole` selects of a sum that is such a factor or base (``1/x`` in ``(1/x - mean)**2``: one atom, so
    that the expansion is in it and in ``mean`` only, and a running centre can be found for it), and a
    widening cast of a 16-bit value computed in its type (`rounds_computed_value`) that `rounded_whole`
    selects (the engine's: one that does not mix the reduced values with earlier results, which needs
    taking apart to factor)."""
    if _finite_const(e):
        return const(float(e.value))
    if isinstance(e, Cast) and is_widening(e):
        if rounded_whole is not None and rounds_computed_value(e) and rounded_whole(e):
            return atom(e)
        if e.dtype == e.x.dtype and e.dtype.is_float and isinstance(e.x, Unary | Binary | Select):
            # an explicit rounding point (`ir.loop.rewrite.rounded`, `own_centre.rounded_exponents`): no algebra
            # sees through it
            return atom(e)
        return normalize(e.x, positive, nonneg, whole, term_whole, rounded_whole)  # exact: transparent

    def operand(x: Expr, multiplied: bool) -> Sum:
        if multiplied and whole is not None and whole(x):
            return atom(x)
        if multiplied and isinstance(x, Binary) and x.op in (BinaryOp.ADD, BinaryOp.SUB):
            return normalize_terms(x, positive, nonneg, whole, term_whole, rounded_whole)
        return normalize(x, positive, nonneg, whole, term_whole, rounded_whole)

    if isinstance(e, Binary):
        op = e.op
        if op in (BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.DIV):
            products = op in (BinaryOp.MUL, BinaryOp.DIV)
            a = operand(e.a, products)
            b = operand(e.b, products)
            if op is BinaryOp.ADD:
                return add(a, b)
            if op is BinaryOp.SUB:
                return add(a, scale(b, -1.0))
            if op is BinaryOp.MUL:
                return mul(a, b)
            inv = power_of(b, Power(-1), nonneg) if len(b) == 1 else None
            return mul(a, inv) if inv is not None else mul(a, atom_power(e.b, -1))
        if op is BinaryOp.POW and isinstance(e.b, Const) and math.isfinite(float(e.b.value)):
            k = Power(float(e.b.value)).limit_denominator(64)
            if float(k) == float(e.b.value):
                p = power_of(operand(e.a, True), k, nonneg)
                if p is not None:
                    return p
    if isinstance(e, Unary):
        inner = normalize(e.x, positive, nonneg, whole, term_whole, rounded_whole) if e.op is not UnaryOp.NOT else None
        if e.op is UnaryOp.NEG:
            return scale(inner, -1.0)
        if e.op in (UnaryOp.EXP, UnaryOp.EXP2):
            arg = inner if e.op is UnaryOp.EXP else scale(inner, LN2)
            out = exp_of(arg)
            if out is not None:
                return out
        if e.op in (UnaryOp.LOG, UnaryOp.LOG2):
            out = log_of(inner, positive)
            if out is not None:
                return out if e.op is UnaryOp.LOG else scale(out, 1.0 / LN2)
        if e.op in (UnaryOp.SQRT, UnaryOp.RSQRT):
            out = power_of(inner, Power(1, 2) if e.op is UnaryOp.SQRT else Power(-1, 2), nonneg)
            if out is not None and len(inner) == 1:
                return out
    return atom(e)


def normalize_terms(x: Expr, positive: Callable[[Expr], bool], nonneg: Callable[[Expr], bool],
                    whole: Callable[[Expr], bool] | None = None,
                    term_whole: Callable[[Expr], bool] | None = None,
                    rounded_whole: Callable[[Expr], bool] | None = None) -> Sum:
    """`x` in normal form as a sum whose terms a product multiplies: each term that `term_whole` selects,
    or a constant multiple of one (``x / y * 2``, ``-(x / y)``), is one atom (times its constant), so that
    ``(x / y * 2 - mean)**2`` expands in the atom ``x / y`` and ``mean`` alone, as ``(x / y - mean)**2``
    does (split into ``x**2 y**-2``, its cancelling pair went unseen and ``y**-2`` underflowed)."""
    if whole is not None and whole(x):
        return atom(x)   # (a part that `whole` keeps as a factor stays whole as a term: ``(b - c)`` in ``(x - m) - (b - c)``)
    if isinstance(x, Binary) and x.op in (BinaryOp.ADD, BinaryOp.SUB):
        a = normalize_terms(x.a, positive, nonneg, whole, term_whole, rounded_whole)
        b = normalize_terms(x.b, positive, nonneg, whole, term_whole, rounded_whole)
        return add(a, b) if x.op is BinaryOp.ADD else add(a, scale(b, -1.0))
    if term_whole is not None:
        k, core = _constant_multiple(x)
        if math.isfinite(k) and term_whole(core):
            return scale(atom(core), k)
    return normalize(x, positive, nonneg, whole, term_whole, rounded_whole)


def _constant_multiple(e: Expr) -> tuple[float, Expr]:
    """``(k, core)`` with ``e = k * core``, peeling negations and products and quotients by finite constants."""
    k = 1.0
    while True:
        if isinstance(e, Unary) and e.op is UnaryOp.NEG:
            k, e = -k, e.x
        elif isinstance(e, Binary) and e.op is BinaryOp.MUL and _finite_const(e.b):
            k, e = k * float(e.b.value), e.a
        elif isinstance(e, Binary) and e.op is BinaryOp.MUL and _finite_const(e.a):
            k, e = k * float(e.a.value), e.b
        elif isinstance(e, Binary) and e.op is BinaryOp.DIV and _finite_const(e.b) and float(e.b.value) != 0.0:
            k, e = k / float(e.b.value), e.a
        else:
            return k, e


def _finite_const(e: Expr) -> bool:
    return isinstance(e, Const) and not isinstance(e.value, bool) and math.isfinite(e.value)


def is_widening(e: Cast) -> bool:
    """True for a float-to-float cast that loses nothing (every value of the source is exact in the target)."""
    src, dst = e.x.dtype, e.dtype
    return src in _WIDER and dst in _WIDER and (_WIDER[dst] > _WIDER[src] or src == dst) and not (
        {src, dst} == {bfloat16, float16})


# Float types by precision: each holds every value of a lower rank (bf16 and f16 share a rank and hold
# each other's values only in part).
_WIDER = {float8_e4m3fn: 1, bfloat16: 2, float16: 2, float32: 3, float64: 4}
FLOAT_RANK = _WIDER


def rounds_computed_value(e: Cast) -> bool:
    """True for a cast out of a storage-only type (f16, bf16, e4m3) of a value computed in it: numpy rounds that
    value to its type, and the kernels, computing in f32, round it at the cast (`ir.loop.rewrite.decided`).
    Seen through, ``f32(b * 300.7)`` became ``300.7 * f32(b)`` in a softmax's sum (bf16 ``b = 1``: 300.7 where
    the max read numpy's 300), and rows summed to 0.5 (found by a helper): `normalize`'s `rounded_whole`."""
    return e.x.dtype.storage_only and e.x.dtype != e.dtype and isinstance(e.x, Unary | Binary | Select)


def is_narrowing(e: Expr) -> bool:
    """True for a float-to-float cast that rounds (a quantization, e.g. to float8_e4m3fn)."""
    return isinstance(e, Cast) and e.dtype.is_float and e.x.dtype.is_float and not is_widening(e)


def atom_power(e: Expr, k: int) -> Sum:
    return (Product(1.0, Monomial.of({e: Power(k)})),)


def free_atoms(s: Sum) -> set[Expr]:
    """Every atom appearing in `s` (in monomials and exponents)."""
    out: set[Expr] = set()
    for t in s:
        out.update(a for a, _ in t.mono.factors)
        for m, _ in t.exponent.terms:
            out.update(a for a, _ in m.factors)
    return out


def reads(e: Expr, predicate: Callable[[Expr], bool]) -> bool:
    """True when some node of `e` satisfies `predicate`."""
    return any(predicate(n) for n in walk(e))


__all__ = ["Monomial", "Linear", "Product", "Sum", "normalize", "normalize_terms", "free_atoms", "DType"]
