"""Expressions of the cascade grammar: a tiny tree that runs, prints as Python, and bounds its own error.

A `Node` is a `Leaf` (an input, a let such as the masked data, or an earlier
reduction's result), a `Num` or an `Op` from the rule table `OPS`. The same
tree is

- run with ``redfuser`` ops (`evaluate`): on tracers inside a kernel, on numpy
  arrays as the reference, and on float64 arrays for the tolerance;
- printed as Python source (`source`) with exactly the tree's association, so a
  reproducer computes bit for bit what the fuzzer ran;
- evaluated in float64 together with a running bound on its rounding error
  (`evaluate_with_error`, see `redfuser.testing.fuzz` for the tolerance rule).
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import redfuser as rf


class _Arith:
    """Operator sugar so templates read like the programs they build (``exp(d - M) / L``)."""

    __slots__ = ()

    def __add__(self, other: object) -> Op:
        return Op("add", (self, _node(other)))

    def __sub__(self, other: object) -> Op:
        return Op("sub", (self, _node(other)))

    def __mul__(self, other: object) -> Op:
        return Op("mul", (self, _node(other)))

    def __truediv__(self, other: object) -> Op:
        return Op("div", (self, _node(other)))

    def __neg__(self) -> Op:
        return Op("neg", (self,))


@dataclass(frozen=True, slots=True)
class Leaf(_Arith):
    """A named array: an input (``x``, ``w``), a let (``xm``) or an earlier result (``r1``)."""

    name: str


@dataclass(frozen=True, slots=True)
class Num(_Arith):
    """A Python float constant (a weak scalar: it keeps the array's dtype)."""

    value: float


@dataclass(frozen=True, slots=True)
class Op(_Arith):
    """``OPS[op]`` applied to `args`."""

    op: str
    args: tuple[Node, ...]


Node = Leaf | Num | Op


def _node(v: object) -> Node:
    return v if isinstance(v, Leaf | Num | Op) else Num(float(v))


@dataclass(frozen=True)
class OpRule:
    """How one op runs, prints (``{0}``, ``{1}``... are the operands) and binds (Python precedence)."""

    apply: Callable
    template: str
    precedence: int  # 9: a call, never parenthesized; 0: a comparison


OPS: dict[str, OpRule] = {
    "add": OpRule(operator.add, "{0} + {1}", 1),
    "sub": OpRule(operator.sub, "{0} - {1}", 1),
    "mul": OpRule(operator.mul, "{0} * {1}", 2),
    "div": OpRule(operator.truediv, "{0} / {1}", 2),
    "neg": OpRule(operator.neg, "-{0}", 3),
    "square": OpRule(lambda a: a ** 2, "{0} ** 2", 4),
    "gt": OpRule(operator.gt, "{0} > {1}", 0),
    "exp": OpRule(rf.exp, "rf.exp({0})", 9),
    "exp2": OpRule(rf.exp2, "rf.exp2({0})", 9),
    "log": OpRule(rf.log, "rf.log({0})", 9),
    "abs": OpRule(rf.abs, "rf.abs({0})", 9),
    "sqrt": OpRule(rf.sqrt, "rf.sqrt({0})", 9),
    "maximum": OpRule(rf.maximum, "rf.maximum({0}, {1})", 9),
    "where": OpRule(rf.where, "rf.where({0}, {1}, {2})", 9),
}


def call(op: str, *args: object) -> Op:
    """``op(*args)`` as a node (``call("exp", d - M)``)."""
    return Op(op, tuple(_node(a) for a in args))


def evaluate(n: Node, env: dict) -> object:
    """`n` with ``redfuser`` ops over `env` (tracers or numpy arrays)."""
    if isinstance(n, Leaf):
        return env[n.name]
    if isinstance(n, Num):
        return n.value
    return OPS[n.op].apply(*(evaluate(a, env) for a in n.args))


def _precedence(n: Node) -> int:
    if isinstance(n, Op):
        return OPS[n.op].precedence
    if isinstance(n, Num) and (n.value < 0 or math.copysign(1.0, n.value) < 0):
        return 3  # prints with a unary minus
    return 9


def source(n: Node, parent: int = 0, right: bool = False) -> str:
    """`n` as Python source; operands are parenthesized so the text parses back to this very tree."""
    p = _precedence(n)
    if isinstance(n, Leaf):
        return n.name
    if isinstance(n, Num):
        text = "-rf.inf" if n.value == -math.inf else "rf.inf" if n.value == math.inf else repr(float(n.value))
    elif p == 9:
        text = OPS[n.op].template.format(*(source(a) for a in n.args))
    else:
        inner = 5 if n.op == "square" else p  # the base of ** binds tighter than unary minus
        text = OPS[n.op].template.format(*(source(a, inner, right=k > 0) for k, a in enumerate(n.args)))
    needs = p < parent or (p == parent and right) or (p == 3 and parent == 3)
    return f"({text})" if needs else text


def leaves(n: Node) -> set[str]:
    """Names of every leaf `n` reads."""
    if isinstance(n, Leaf):
        return {n.name}
    if isinstance(n, Op):
        return set().union(*(leaves(a) for a in n.args))
    return set()


# --------------------------------------------------------------------------------------------
# float64 evaluation with a running error bound (absolute, per element)
# --------------------------------------------------------------------------------------------
Bounded = tuple[np.ndarray, np.ndarray]
"""A float64 value and a bound on |value computed in the kernel's dtype - value|."""


def _inexact(u: float) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    return lambda v, e: e + u * np.abs(v)


def _err_div(a: Bounded, b: Bounded, v: np.ndarray) -> np.ndarray:
    room = np.abs(b[0]) - b[1]
    return np.where(room > 0, (a[1] + np.abs(v) * b[1]) / np.where(room > 0, room, 1.0), np.inf)


def _err_log(a: Bounded) -> np.ndarray:
    room = np.abs(a[0]) - a[1]
    return np.where(room > 0, a[1] / np.where(room > 0, room, 1.0), np.inf)


def _err_where(v: np.ndarray, c: Bounded, a: Bounded, b: Bounded) -> np.ndarray:
    chosen = np.where(c[0], a[1], b[1])
    flip = np.abs(a[0] - b[0]) + np.maximum(a[1], b[1])  # the condition may come out the other way
    return np.where(c[1] > 0, np.maximum(chosen, flip), chosen)


# op -> error of the result from the operands' (value, error) and the exact result `v`,
# before the result's own rounding (added for every op but the exact ones below).
ERROR_RULES: dict[str, Callable[..., np.ndarray]] = {
    "add": lambda v, a, b: a[1] + b[1],
    "sub": lambda v, a, b: a[1] + b[1],
    "mul": lambda v, a, b: np.abs(b[0]) * a[1] + np.abs(a[0]) * b[1] + a[1] * b[1],
    "div": lambda v, a, b: _err_div(a, b, v),
    "neg": lambda v, a: a[1],
    "abs": lambda v, a: a[1],
    "square": lambda v, a: 2 * np.abs(a[0]) * a[1] + a[1] ** 2,
    "exp": lambda v, a: np.abs(v) * np.expm1(a[1]),
    "exp2": lambda v, a: np.abs(v) * np.expm1(math.log(2.0) * a[1]),
    "log": lambda v, a: _err_log(a),
    "sqrt": lambda v, a: np.sqrt(np.abs(a[0])) - np.sqrt(np.maximum(np.abs(a[0]) - a[1], 0.0)),
    "maximum": lambda v, a, b: np.maximum(a[1], b[1]),
    "gt": lambda v, a, b: (np.abs(a[0] - b[0]) <= a[1] + b[1]).astype(np.float64),  # 1: may flip
    "where": _err_where,
}
EXACT_OPS = frozenset({"neg", "abs", "maximum", "gt", "where"})


def evaluate_with_error(n: Node, env: dict[str, Bounded], u: float) -> Bounded:
    """`n` in float64 and a bound on the error of computing it with unit roundoff `u` (see `ERROR_RULES`).

    Where the value is not finite the bound is 0 (NaN and infinities are compared
    exactly instead); where the bound itself is lost it is ``inf`` (no value check).
    """
    if isinstance(n, Leaf):
        return env[n.name]
    if isinstance(n, Num):
        return np.float64(n.value), np.float64(0.0)
    args = [evaluate_with_error(a, env, u) for a in n.args]
    with np.errstate(all="ignore"):
        v = np.asarray(OPS[n.op].apply(*(a[0] for a in args)))
        e = np.asarray(ERROR_RULES[n.op](v, *args), dtype=np.float64)
        if n.op not in EXACT_OPS:
            e = _inexact(u)(np.where(np.isfinite(v), v, 0.0), e)
        if n.op != "gt":
            e = np.where(np.isfinite(v), np.where(np.isnan(e), np.inf, e), 0.0)
    return v, e


def rename(n: Node, old: str, new: str) -> Node:
    """`n` with every leaf `old` read as `new`."""
    if isinstance(n, Leaf):
        return Leaf(new) if n.name == old else n
    if isinstance(n, Op):
        return Op(n.op, tuple(rename(a, old, new) for a in n.args))
    return n
