"""The body templates of the cascade grammar, each labelled separable or not by construction.

A template builds the body ``F(x, y)`` of one reduction from the data and a few
earlier results, filled into *slots* by role:

    M    an earlier result known >= the (masked) data d: ``max(d)`` or ``max(x)``
    Mx   an earlier ``max(x)`` of the unmasked data (finite)
    Mn   an earlier ``min(x)`` (finite)
    L    an earlier result known > 0 (a sum/max/min of exponentials)
    Y    any earlier result that is never +-inf on finite inputs
    G    like Y, but not an extremum of the data (so abs/maximum/where do not collapse)
    P    like G, and not known > 0 (its sign is unknown)

The label is the theorem's definition read off the template, independent of the
engine: ``+`` bodies that are a (sum of) ``G(x)·H(y)``, ``max``/``min`` bodies
``G(x) + H(y)`` or ``G(x)·H(y)`` with ``H > 0``. `terms` lists the products the
body expands into (their magnitudes bound the cancellation the fused form may
suffer). Flags say where a template is well-conditioned:

    positive   the body is > 0 (so its reduction fills an L slot)
    expands    the algebra splits it into several terms that may cancel
    bounded    its magnitude stays O(data): safe in float16
    narrow     needs data of small spread (``exp(x - M)`` must not underflow to 0)
    d_linear   reads the masked data outside ``exp`` (its result is -inf on masked rows)
    inf_ok     stays equal to the reference when inputs hold +-inf
    distinct   one result in two of its slots cancels in exact arithmetic (``(x - r)(x + r)`` is
               ``x^2 - r^2``: ``x·r - r·x``), which the engine refuses to fuse (fusion/separability.py: exact
               only for finite ``r``), so the slots take two results where there are, and a body with one
               result in both is not separable
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .cascade_nodes import Leaf, Node, Num, call

SUM, MAX, MIN, MATMUL = "sum", "max", "min", "matmul"
SUMS = (SUM, MATMUL)
EXTREMA = (MAX, MIN)


@dataclass(frozen=True)
class Template:
    """One family of reduction bodies (see the module docstring for the fields' meaning)."""

    family: str
    ops: tuple[str, ...]
    separable: bool
    slots: tuple[str, ...]
    make: Callable[..., Node | tuple[Node, tuple[Node, ...]]]  # (d, x, w, *slots) -> body [, terms]
    positive: bool = False
    expands: bool = False
    bounded: bool = False
    narrow: bool = False
    d_linear: bool = False
    inf_ok: bool = False
    bare: str = ""  # "d" / "x": the body is the bare data (its max/min is an extremum)
    weight: int = 1  # how often it is drawn relative to the others (softmax-like families are the point)
    distinct: bool = False

    def build(self, d: Leaf, x: Leaf, w: Leaf, slots: tuple[Node, ...]) -> tuple[Node, tuple[Node, ...]]:
        """The body and its terms for these leaves and slot values."""
        out = self.make(d, x, w, *slots)
        return out if isinstance(out, tuple) else (out, (out,))


def exp(a: Node) -> Node:
    return call("exp", a)


def log(a: Node) -> Node:
    return call("log", a)


def _entropy(d, x, w, M, L):
    p = exp(x - M) / L
    return -(p * log(p)), (x * p, M * p, log(L) * p)


def _square_dev(d, x, w, Y):
    return call("square", x - Y), (x * x, x * Y * 2.0, Y * Y)


def _square_centred_p(d, x, w, M, L):
    p = exp(d - M) / L
    return call("square", p - 0.125), (p * p, p * 0.25, Num(0.015625))


def _product_of_sums(d, x, w, Y, L):
    return (x - Y) * (x + L), (x * x, x * L, Y * x, Y * L)


# Bodies reading no earlier result: always fusable (they join the cascade by their inputs).
INDEPENDENT: tuple[Template, ...] = (
    Template("x", (SUM, MIN, MAX, MATMUL), True, (), lambda d, x, w: x, bounded=True, inf_ok=True, bare="x",
             weight=2),
    Template("d", (MAX,), True, (), lambda d, x, w: d, bounded=True, inf_ok=True, d_linear=True, bare="d",
             weight=3),
    Template("x * w", (SUM, MAX, MIN), True, (), lambda d, x, w: x * w, bounded=True, inf_ok=True),
)

SEPARABLE: tuple[Template, ...] = (
    Template("exp(d - M)", (SUM, MAX, MIN, MATMUL), True, ("M",), lambda d, x, w, M: exp(d - M),
             positive=True, bounded=True, inf_ok=True, weight=4),
    Template("exp(d - M) / L", (SUM, MAX, MIN, MATMUL), True, ("M", "L"), lambda d, x, w, M, L: exp(d - M) / L,
             positive=True, bounded=True, inf_ok=True, weight=4),
    Template("exp(2(d - M))", (SUM, MAX), True, ("M",), lambda d, x, w, M: exp((d - M) * 2.0),
             positive=True, bounded=True, weight=2),
    Template("exp2(d - M)", (SUM, MIN), True, ("M",), lambda d, x, w, M: call("exp2", d - M),
             positive=True, bounded=True),
    Template("exp(d - M) * w", (SUM, MATMUL), True, ("M",), lambda d, x, w, M: exp(d - M) * w, bounded=True,
             weight=2),
    Template("exp(d - M) * x / L", (SUM, MATMUL), True, ("M", "L"), lambda d, x, w, M, L: exp(d - M) * x / L,
             bounded=True, weight=2),
    Template("exp(Mn - x)", (SUM, MAX, MIN), True, ("Mn",), lambda d, x, w, Mn: exp(Mn - x), positive=True,
             bounded=True),
    Template("x * Y", (SUM, MATMUL), True, ("Y",), lambda d, x, w, Y: x * Y),
    Template("x * L", (SUM, MAX, MIN), True, ("L",), lambda d, x, w, L: x * L, inf_ok=True, weight=2),
    Template("x / L", (SUM, MAX, MIN), True, ("L",), lambda d, x, w, L: x / L),
    Template("x * sqrt(L)", (SUM, MAX), True, ("L",), lambda d, x, w, L: x * call("sqrt", L)),
    Template("(x - Y) * w", (SUM, MATMUL), True, ("Y",), lambda d, x, w, Y: ((x - Y) * w, (x * w, Y * w)),
             expands=True),
    Template("x - M - log(L)", (SUM,), True, ("Mx", "L"),
             lambda d, x, w, M, L: (x - M - log(L), (x, M, log(L))), expands=True, weight=2),
    Template("-(p log p), p = exp(x - M) / L", (SUM,), True, ("Mx", "L"), _entropy, expands=True, narrow=True,
             weight=2),
    Template("(x - Y)^2", (SUM,), True, ("Y",), _square_dev, expands=True, weight=2),
    Template("(x - Y) * (x + L)", (SUM,), True, ("Y", "L"), _product_of_sums, expands=True, distinct=True),
    Template("d - M", (MAX,), True, ("M",), lambda d, x, w, M: (d - M, (d, M)), d_linear=True, bounded=True,
             weight=2),
    Template("x - Y", (MIN, MAX), True, ("Y",), lambda d, x, w, Y: (x - Y, (x, Y))),
    Template("2 (x - Y)", (MAX, MIN), True, ("Y",), lambda d, x, w, Y: ((x - Y) * 2.0, (x * 2.0, Y * 2.0))),
    Template("d - M - log(L)", (MAX,), True, ("M", "L"),
             lambda d, x, w, M, L: (d - M - log(L), (d, M, log(L))), d_linear=True),
    # A bare constant term is G·H with G and H both 1 (issue 20: it crashed the numeric check).
    Template("exp(d - M) + c", (SUM, MATMUL), True, ("M",),
             lambda d, x, w, M: (exp(d - M) + 0.25, (exp(d - M), Num(0.25))), positive=True, bounded=True,
             expands=True),
    Template("exp(d - M) / L - c", (SUM, MATMUL), True, ("M", "L"),
             lambda d, x, w, M, L: (exp(d - M) / L - 0.125, (exp(d - M) / L, Num(0.125))), bounded=True,
             expands=True),
    Template("(exp(d - M) / L - c)^2", (SUM,), True, ("M", "L"), _square_centred_p, bounded=True, expands=True),
    Template("x / L + c", (SUM,), True, ("L",), lambda d, x, w, L: (x / L + 0.25, (x / L, Num(0.25))),
             expands=True),
    # Conditions on the reduced values only: where(c(x), G1(x)·H(y), G2(x)·H(y)) = where(c(x), G1, G2)·H(y).
    Template("where(x > 0, exp(d - M), 0)", (SUM, MATMUL), True, ("M",),
             lambda d, x, w, M: call("where", call("gt", x, 0.0), exp(d - M), 0.0), bounded=True, weight=2),
    Template("where(x > 0, exp(d - M) * w, -exp(d - M))", (SUM, MATMUL), True, ("M",),
             lambda d, x, w, M: call("where", call("gt", x, 0.0), exp(d - M) * w, -exp(d - M)), bounded=True),
    Template("where(x > 0, exp(d - M), 2 exp(d - M))", (SUM, MAX, MIN, MATMUL), True, ("M",),
             lambda d, x, w, M: call("where", call("gt", x, 0.0), exp(d - M), exp(d - M) * 2.0), positive=True,
             bounded=True),
)

NON_SEPARABLE: tuple[Template, ...] = (
    Template("abs(x - G)", (SUM, MAX, MIN, MATMUL), False, ("G",), lambda d, x, w, G: call("abs", x - G)),
    Template("maximum(x, G)", (SUM, MATMUL), False, ("G",), lambda d, x, w, G: call("maximum", x, G)),
    Template("where(x > G, x, 0)", (SUM, MAX), False, ("G",),
             lambda d, x, w, G: call("where", call("gt", x, G), x, 0.0)),
    Template("exp(x * Mx / 64)", (SUM, MAX, MIN), False, ("Mx",), lambda d, x, w, M: exp(x * M * 0.015625),
             positive=True, narrow=True),
    Template("log(abs(x) + L)", (SUM, MIN), False, ("L",), lambda d, x, w, L: log(call("abs", x) + L)),
    Template("sqrt(x * x + L)", (SUM, MAX), False, ("L",), lambda d, x, w, L: call("sqrt", x * x + L),
             positive=True),
    Template("(x - Y) * (x + L)", (MAX, MIN), False, ("Y", "L"), _product_of_sums),
    Template("x * P", (MAX, MIN), False, ("P",), lambda d, x, w, P: x * P),
    Template("exp(d - M) * maximum(x, G)", (SUM,), False, ("M", "G"),
             lambda d, x, w, M, G: exp(d - M) * call("maximum", x, G), bounded=True),
    Template("where(x > G, exp(d - M), 0)", (SUM, MATMUL), False, ("M", "G"),
             lambda d, x, w, M, G: call("where", call("gt", x, G), exp(d - M), 0.0), bounded=True),
)

ALL_TEMPLATES: tuple[Template, ...] = INDEPENDENT + SEPARABLE + NON_SEPARABLE
