"""The fusion fuzzer's grammar: random cascaded reduction programs with their ground truth.

A `Cascade` is a chain of 2-6 reductions over the last axis of ``x`` (``[rows, N]``
or ``[batch, rows, N]``), or of ``s = q @ k.mT`` (a GEMM producer), mixing
``sum``, ``max``, ``min`` and a final ``p @ v``. Each later body reads earlier
results (``keepdims=True``) through a template of `cascade_templates`, which
labels it separable or not by construction. With a mask, the data is
``xm = where(mask, x, -inf)`` for ``max`` and the ``exp`` families. The data
(`DataSpec`) is drawn from a seed: normal, wide, offset (300 +- 1: cancellation),
large (+-1e3), masks with a fully masked row and a row whose first chunk is
masked, NaN and +-inf at a few places.

The grammar is written against `Draw`, so the same code backs the hypothesis
strategy `cascades()` (shrinks toward small, unmasked, float32 programs) and
the campaign's seeded `RandomDraw`. A cascade is data: it runs through
`Cascade.function` (``redfuser`` ops; a kernel body on tracers, the reference on
arrays) and prints through `Cascade.source` / `DataSpec.source` for reproducers.

Well-conditioned by construction (so a mismatch is the engine's, not the
program's): ``exp`` arguments are bounded above by a running max of the same
data; a result used as a divisor or inside ``log`` is a sum/max of exponentials
(>= its largest term, never 0); a result read linearly (``x * Y``) is never
+-inf; bodies that need p = exp(x - M) / L not to underflow (entropy) only get
narrow data; ``+-inf`` inputs only reach templates that stay equal under them;
float16 gets bounded bodies only. A result that is a constant (``max(x - max x)
= 0``), or is computed from one, only feeds separable templates (it would
collapse ``x * P`` or ``abs(x - G)`` into something separable). Over a reduced
axis of length 1 every body is separable, so only soundness and reasons are
checked there.
"""
from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import numpy as np
from hypothesis import strategies as st

import redfuser as rf

from .cascade_data import DataSpec
from .cascade_nodes import OPS, Leaf, Node, Num, Op, evaluate, leaves, source
from .cascade_templates import (
    EXTREMA,
    INDEPENDENT,
    MATMUL,
    MAX,
    MIN,
    NON_SEPARABLE,
    SEPARABLE,
    SUM,
    SUMS,
    Template,
)

T = TypeVar("T")
SIDES = (1, 2, 3, 5, 7, 8, 13, 16, 31, 64, 97, 128, 251, 256, 509, 1024, 2039, 4096)
"""Reduced-axis lengths: 1, primes (ragged chunks), powers of two, large."""
MAX_ELEMENTS = 32768
PROFILES = {"normal": (1.0, 0.0), "wide": (4.0, 0.0), "offset": (1.0, 300.0), "large": (1000.0, 0.0)}
"""Data profile -> (standard deviation, offset) of the reduced data."""
REDUCERS: dict[str, Callable] = {SUM: rf.sum, MAX: rf.max, MIN: rf.min}


class Draw(Protocol):
    """Where the grammar's choices come from (hypothesis or a seeded RNG)."""

    def integer(self, lo: int, hi: int) -> int: ...
    def pick(self, options: Sequence[T]) -> T: ...
    def chance(self, percent: int) -> bool: ...


class RandomDraw:
    """Choices from a seeded `random.Random` (reproducible from the seed alone)."""

    def __init__(self, seed: str | int) -> None:
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def pick(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def chance(self, percent: int) -> bool:
        return self.rng.randrange(100) < percent


class HypothesisDraw:
    """Choices from hypothesis; each shrinks toward its first option / ``False``."""

    def __init__(self, draw: Callable) -> None:
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def pick(self, options: Sequence[T]) -> T:
        return self.draw(st.sampled_from(list(options)))

    def chance(self, percent: int) -> bool:
        return self.draw(st.integers(0, 99)) >= 100 - percent


@dataclass(frozen=True)
class Reduction:
    """``name = op over the axis of body`` and what is known about its result."""

    name: str
    op: str
    template: Template
    body: Node
    terms: tuple[Node, ...]
    reads: tuple[str, ...]
    family: str
    separable: bool
    positive: bool = False
    safe: bool = True                  # never +-inf on finite inputs (NaN allowed)
    bounded: bool = False
    upper: frozenset[str] = frozenset()  # data it bounds from above ("d", "x")
    lower: frozenset[str] = frozenset()
    extremum: bool = False
    constant: bool = False             # the same value on every input (max(x - max x) = 0)
    degenerate: bool = False           # constant, or computed from a constant

    def source(self) -> str:
        b = source(self.body)
        if self.op == MATMUL:
            call_like = not isinstance(self.body, Op) or OPS[self.body.op].precedence == 9
            return f"{self.name} = {b} @ v" if call_like else f"{self.name} = ({b}) @ v"
        return f"{self.name} = rf.{self.op}({b}, axis=-1, keepdims=True)"


@dataclass(frozen=True)
class Gemm:
    """``s = (q @ k.mT) * scale``: the contracted length and the value width."""

    d: int
    dv: int
    scale: float = 1.0


@dataclass(frozen=True)
class Cascade:
    """One random program: inputs, lets, the chain of reductions and what it returns."""

    data: DataSpec
    n: int
    chunk: int
    gemm: Gemm | None
    masked: bool
    reductions: tuple[Reduction, ...]
    returns: tuple[str, ...]

    @property
    def data_name(self) -> str:
        return "s" if self.gemm else "x"

    @property
    def d_name(self) -> str:
        return f"{self.data_name}m" if self.masked else self.data_name

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.data.shapes)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(getattr(rf, self.data.dtype))

    def lets(self) -> list[str]:
        out = []
        if self.gemm:
            out.append("s = q @ k.mT" if self.gemm.scale == 1.0 else f"s = (q @ k.mT) * {self.gemm.scale!r}")
        if self.masked:
            out.append(f"{self.d_name} = rf.where(mask, {self.data_name}, -rf.inf)")
        return out

    def run_lets(self, env: dict) -> None:
        """Add the lets to `env` (works on tracers, dtype arrays and float64 arrays)."""
        if self.gemm:
            env["s"] = env["q"] @ env["k"].mT
            if self.gemm.scale != 1.0:
                env["s"] = env["s"] * self.gemm.scale
        if self.masked:
            env[self.d_name] = rf.where(env["mask"], env[self.data_name], -rf.inf)

    def source(self, name: str = "cascade") -> str:
        """The kernel body as Python source."""
        lines = [f"def {name}({', '.join(self.inputs)}):"] + [f"    {l}" for l in self.lets()]
        lines += [f"    {r.source()}" for r in self.reductions]
        lines.append(f"    return {', '.join(self.returns)}")
        return "\n".join(lines)

    @property
    def function(self) -> Callable:
        """The kernel body: positional arrays in `inputs` order; returns `returns` (a tuple when several)."""
        names, reductions, returns = self.inputs, self.reductions, self.returns

        def cascade(*args):
            env = dict(zip(names, args))
            self.run_lets(env)
            for r in reductions:
                body = evaluate(r.body, env)
                env[r.name] = body @ env["v"] if r.op == MATMUL else REDUCERS[r.op](body, axis=-1, keepdims=True)
            return env[returns[0]] if len(returns) == 1 else tuple(env[n] for n in returns)

        cascade.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
        return cascade

    def describe(self) -> str:
        """One line: dtype, shapes, data and the chain by family."""
        shapes = ", ".join(f"{n}{list(s)}" for n, s in self.data.shapes)
        extras = [self.data.profile] + (["masked"] if self.masked else []) + (["specials"] if self.data.specials else [])
        chain = "; ".join(f"{r.name}={r.op}[{r.family}]" for r in self.reductions)
        return f"{self.data.dtype} {shapes} ({', '.join(extras)}), chunk {self.chunk}: {chain}"


# --------------------------------------------------------------------------------------------
# drawing
# --------------------------------------------------------------------------------------------
ROLES: dict[str, Callable[[Reduction], bool]] = {
    "M": lambda r: "d" in r.upper,
    "Mx": lambda r: "x" in r.upper,
    "Mn": lambda r: "x" in r.lower,
    "L": lambda r: r.positive and r.op != MIN,  # a min of exponentials can underflow to 0
    "Y": lambda r: r.safe,
    "G": lambda r: r.safe and not r.extremum,
    "P": lambda r: r.safe and not r.extremum and not r.positive,
}


COLLAPSES: dict[tuple[str, str], tuple[str, str]] = {
    ("d - M", MAX): (MAX, "d"), ("x - Y", MAX): (MAX, "x"), ("2 (x - Y)", MAX): (MAX, "x"),
    ("x - Y", MIN): (MIN, "x"), ("2 (x - Y)", MIN): (MIN, "x"),
    ("exp(d - M)", MAX): (MAX, "d"), ("exp(2(d - M))", MAX): (MAX, "d"), ("exp(Mn - x)", MAX): (MIN, "x"),
}
"""(family, reduction op) -> (extremum, data): the result is a constant when the first slot holds that extremum
of that data (``max(x - max x) = 0``, ``max(exp(d - max d)) = 1``, ``max(exp(min x - x)) = 1``)."""


class _ChainBuilder:
    """Draws the reductions of one cascade, keeping track of what each earlier result can fill."""

    def __init__(self, draw: Draw, c: dict) -> None:
        self.draw, self.c = draw, c
        self.done: list[Reduction] = []
        self.d, self.x, self.w = Leaf(c["d_name"]), Leaf(c["data_name"]), Leaf("w")

    def fillers(self, role: str, separable: bool = True) -> list[Reduction]:
        # A constant result (max(x - max x) = 0), or one computed from it, can collapse what reads it (x * 0,
        # |x - 0|, sum(exp(...) + x * 0) > 0 after all): only separable templates, whose label cannot change, take it.
        ok = [r for r in self.done if r.op != MATMUL and ROLES[role](r)
              and not (r.degenerate and (not separable or role == "P"))]
        return [r for r in ok if r.bounded] if self.c["dtype"] == "float16" else ok

    def eligible(self, t: Template, op: str) -> bool:
        if op not in t.ops or (t.narrow and self.c["profile"] not in ("normal", "wide")):
            return False
        if self.c["dtype"] == "float16" and not t.bounded:
            return False
        if not t.separable:  # one result in two slots can collapse the body: (x - r)(x + r) = x^2 - r^2
            return len({r.name for role in t.slots for r in self.fillers(role, False)}) >= len(t.slots) and \
                all(self.fillers(role, False) for role in t.slots)
        return all(self.fillers(role) for role in t.slots)

    def fill(self, role: str, taken: set[str], separable: bool) -> tuple[Node, str]:
        options = [r for r in self.fillers(role, separable) if r.name not in taken] or self.fillers(role, separable)
        r = self.draw.pick(options)
        if role in ("Y", "G", "P") and r.op == SUM and self.draw.chance(40):
            return Leaf(r.name) / Num(float(self.c["n"])), r.name  # a mean
        return Leaf(r.name), r.name

    def make(self, t: Template, op: str) -> tuple[Node, tuple[Node, ...], tuple[str, ...], bool, bool]:
        """Body, terms, the results it reads, whether its max/min is a constant (see `COLLAPSES`), and whether
        two slots hold the same value (`Template.distinct`)."""
        filled: dict[int, tuple[Node, str]] = {}
        for k in sorted(range(len(t.slots)), key=lambda k: len(self.fillers(t.slots[k]))):  # scarcest role first
            filled[k] = self.fill(t.slots[k], {name for _, name in filled.values()}
                                  if not t.separable or t.distinct else set(), t.separable)
        slots = [filled[k] for k in range(len(t.slots))]
        body, terms = t.build(self.d, self.x, self.w, tuple(n for n, _ in slots))
        constant = False
        if (t.family, op) in COLLAPSES and isinstance(slots[0][0], Leaf):
            extremum, data = COLLAPSES[t.family, op]
            filler = next(r for r in self.done if r.name == slots[0][1])
            constant = filler.op == extremum and data in (filler.upper if extremum == MAX else filler.lower)
        repeated = len({source(n) for n, _ in slots}) < len(slots)
        return body, terms, tuple(dict.fromkeys(r for _, r in slots)), constant, repeated

    def add(self, name: str) -> None:
        first = not self.done
        ops = (MAX, SUM, MAX, MIN) if first else (SUM, MAX, SUM, MIN)
        if self.c["last"] and not first and self.draw.chance(45 if self.c["gemm"] else 15):
            ops = (MATMUL,)
        op = self.draw.pick(ops)
        pools = [INDEPENDENT] if first else ([SEPARABLE, NON_SEPARABLE, INDEPENDENT] if not self.draw.chance(30)
                                             else [NON_SEPARABLE, SEPARABLE, INDEPENDENT])
        for pool in pools:
            options = [t for t in pool if self.eligible(t, op) for _ in range(t.weight)]
            if options:
                break
        t = self.draw.pick(options)
        body, terms, reads, constant, repeated = self.make(t, op)
        family, separable, flags = t.family, t.separable, t
        if t.distinct and repeated:
            separable = False      # one result in both slots cancels: the engine computes it as written
        if pool is SEPARABLE and op in SUMS and self.draw.chance(20):
            second = [u for u in SEPARABLE if u is not t and u.slots and not u.expands and self.eligible(u, op)]
            if second:
                u = self.draw.pick(second)
                b2, t2, r2, _, _ = self.make(u, op)
                body, terms, reads = body + b2, terms + t2, tuple(dict.fromkeys(reads + r2))
                family = "sum of two separable terms"
                flags = replace(t, positive=t.positive and u.positive, bounded=t.bounded and u.bounded,
                                d_linear=t.d_linear or u.d_linear, inf_ok=False, expands=True, bare="")
        if any((r.op, source(r.body)) == (op, source(body)) for r in self.done):
            return  # the engine would share the two (CSE); a duplicate adds nothing
        bare = flags.bare if op in EXTREMA else ""
        upper = frozenset()
        if op == MAX and bare == "d":
            upper = frozenset({"d"} if self.c["masked"] else {"d", "x"})
        elif op == MAX and bare == "x":
            upper = frozenset({"x"} if self.c["masked"] else {"d", "x"})
        self.done.append(Reduction(
            name, op, flags, body, terms, reads, family, separable,
            positive=flags.positive and op != MATMUL, safe=not (self.c["masked"] and flags.d_linear),
            bounded=flags.bounded, upper=upper, lower=frozenset({"x"}) if op == MIN and bare == "x" else frozenset(),
            extremum=bool(bare), constant=constant,
            degenerate=constant or any(r.degenerate for r in self.done if r.name in reads)))


def draw_cascade(draw: Draw, max_axis: int = 4096) -> Cascade:
    """One random cascade (see the module docstring)."""
    n = draw.pick([s for s in SIDES if s <= max_axis])
    dtype = draw.pick(("float32",) * 6 + ("bfloat16",) + (("float16",) if n <= 256 else ()))
    lead = (draw.pick((2, 3)),) if draw.chance(30) else ()
    rows = draw.pick((1, 2, 3, 5, 16))
    while math.prod(lead) * rows * n > MAX_ELEMENTS and (rows > 1 or lead):
        lead, rows = (lead, 1) if rows > 1 else ((), rows)
    gemm = Gemm(draw.pick((1, 3, 4, 8, 16)), draw.pick((1, 2, 5, 8)), draw.pick((1.0, 0.125))) if draw.chance(25) else None
    masked = draw.chance(30)
    profiles = {"float16": ("normal",), "bfloat16": ("normal", "wide")}.get(
        dtype, ("normal", "wide", "large") if gemm else ("normal", "wide", "offset", "large"))
    profile = draw.pick(profiles)
    chunk = draw.integer(1, 7) if n <= 512 else draw.pick((13, 61, 127, 509))
    c = {"n": n, "dtype": dtype, "profile": profile, "gemm": gemm, "masked": masked, "last": False,
         "lead_rows": lead + (rows,), "data_name": "s" if gemm else "x",
         "d_name": ("s" if gemm else "x") + ("m" if masked else "")}
    builder = _ChainBuilder(draw, c)
    count = draw.integer(2, 6)
    for i in range(count):
        c["last"] = i == count - 1
        builder.add(f"r{i}")
    for t, op in ((INDEPENDENT[2], SUM), (INDEPENDENT[0], MAX), (INDEPENDENT[0], MIN)):
        if len(builder.done) >= 2:
            break
        body, terms = t.build(builder.d, builder.x, builder.w, ())
        if all((r.op, source(r.body)) != (op, source(body)) for r in builder.done):
            builder.done.append(Reduction(f"r{count}", op, t, body, terms, (), t.family, True, bounded=True))
    reductions = tuple(builder.done)
    returns = tuple(r.name for r in reductions[:-1] if draw.chance(60)) + (reductions[-1].name,)
    return Cascade(_draw_data(draw, c, reductions, chunk), n, chunk, gemm, masked, reductions, returns)


def _draw_data(draw: Draw, c: dict, reductions: tuple[Reduction, ...], chunk: int) -> DataSpec:
    n, gemm = c["n"], c["gemm"]
    std, off = PROFILES[c["profile"]]
    lead_rows = c["lead_rows"]
    uses_w = any("w" in leaves(r.body) for r in reductions)
    shapes: list[tuple[str, tuple[int, ...]]] = []
    scale: list[tuple[str, float, float]] = []
    if gemm:
        shapes += [("q", lead_rows + (gemm.d,)), ("k", lead_rows[:-1] + (n, gemm.d))]
        scale.append(("q", std / (math.sqrt(gemm.d) * gemm.scale), 0.0))
    else:
        shapes.append(("x", lead_rows + (n,)))
        scale.append(("x", std, off))
    if uses_w:
        shapes.append(("w", lead_rows + (n,)))
    if any(r.op == MATMUL for r in reductions):
        shapes.append(("v", lead_rows[:-1] + (n, gemm.dv if gemm else draw.pick((1, 2, 5, 8)))))
    keep, full_row, first = 1.0, False, 0
    if c["masked"]:
        shapes.append(("mask", lead_rows + (n,)))
        keep = draw.pick((0.7, 0.3, 0.95))
        full_row = draw.chance(40)
        first = min(chunk, n) if draw.chance(40) else 0
    specials: list[tuple[str, int, float]] = []
    data_input = shapes[0]
    if draw.chance(10):
        specials.append((data_input[0], draw.integer(0, math.prod(data_input[1]) - 1), math.nan))
    if all(r.template.inf_ok for r in reductions) and draw.chance(15):
        specials.append((data_input[0], draw.integer(0, math.prod(data_input[1]) - 1), draw.pick((math.inf, -math.inf))))
    return DataSpec(draw.integer(0, 2**31 - 1), c["dtype"], c["profile"], tuple(shapes), tuple(scale), keep,
                    full_row, first, tuple(specials))


def cascades(max_axis: int = 4096) -> st.SearchStrategy[Cascade]:
    """Hypothesis strategy of random cascades with reduced axes up to `max_axis`."""
    return st.composite(lambda draw: draw_cascade(HypothesisDraw(draw), max_axis))()
