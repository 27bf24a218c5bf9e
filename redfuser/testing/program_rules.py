"""The ops a fuzzed program is made of: one rule per op, run by `Program.body`, printed by `Node.source`.

A rule says how to run the op (``apply(args, params)`` over the ``redfuser``
namespace, so the same rule traces inside a kernel and computes numpy's result
on arrays), how to print it, what kind of op it is (for the oracle's masks,
`program_oracle`), and how exact it is:

- ``exact``: bit-exact on every backend when its operands are (views, ``neg``,
  ``abs``, ``where``, ``maximum``/``minimum``, ``clip``, ``max``/``min``, comparisons,
  logic, casts, top-k, ``arange``, the roundings ``floor ceil trunc rint round``,
  ``sign``, ``isnan isinf isfinite``);
- ``arith``: ``+ - * /``: correctly rounded in the result dtype on both sides,
  so exact when the result is f32, f64, an integer or bool; f16/bf16/e4m3
  results are computed in f32 by a kernel and rounded on store, by numpy at
  every step, so they are not;
- ``inexact``: libm functions (a kernel's ``exp`` is its own polynomial) and
  float ``sum``/``@`` (another summation order); an integer or bool sum is exact.

``discontinuous`` rules (comparisons, casts to int/bool, top-k indices, roundings,
``sign``, the classifications) jump
where their operand crosses a point, so the grammar feeds them exact operands
only; the oracle judges nothing of their result where it does not. (A division,
``log`` and ``sqrt`` jump only at 0: the oracle handles those per element.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

import redfuser as rf

INT_LIMIT = float(1 << 20)
"""``to_int`` casts floats below this magnitude and 0 elsewhere: a float -> int cast of NaN, an infinity or
an out-of-range value is undefined in numpy (and saturates in compiled kernels: a documented divergence)."""


def literal(v: object) -> str:
    """Python source for a constant or static scalar (``rf.inf``, ``float("nan")``, ``np.float32(2.0)``)."""
    if isinstance(v, np.generic):
        inner = literal(v.item()) if not isinstance(v, np.bool_) else repr(bool(v))
        name = "bool_" if isinstance(v, np.bool_) else type(v).__name__
        return f"np.{name}({inner})"
    if isinstance(v, float):
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return "rf.inf" if v > 0 else "-rf.inf"
        return repr(v)
    if isinstance(v, str):  # a dtype name
        return f"rf.{v}"
    return repr(v)


def key_text(key: tuple) -> str:
    """An index key as source: ``None``, ``...``, a slice (``:``, ``1:-2:3``, ``::-1``) or an int per entry."""
    def one(k: object) -> str:
        if k is None:
            return "None"
        if k is Ellipsis:
            return "..."
        if isinstance(k, slice):
            text = f"{'' if k.start is None else k.start}:{'' if k.stop is None else k.stop}"
            return text + ("" if k.step is None else f":{k.step}")
        return str(k)
    return ", ".join(one(k) for k in key) if key else "()"


@dataclass(frozen=True)
class Rule:
    """How one op runs and prints, and what the oracle needs to know about it."""

    apply: Callable[[list, tuple], object]
    template: str       # "{a} + {b}"; {a} {b} {c}: operands, {p0} {p1}...: params as literals, {key}: an index
    kind: str           # elementwise | reduce | matmul | topk | view | join | gather | arange
    exactness: str      # exact | arith | inexact | intsum
    discontinuous: bool = False
    outputs: int = 1


def _sum(a, p):
    return rf.sum(a[0], axis=p[0], keepdims=p[1])


def _guarded_int(x):
    return rf.where(rf.abs(x) < INT_LIMIT, x, 0).astype(rf.int32)


E, R = "elementwise", "reduce"
RULES: dict[str, Rule] = {
    # -- unary --
    "neg": Rule(lambda a, p: -a[0], "-{a}", E, "exact"),
    "abs": Rule(lambda a, p: rf.abs(a[0]), "rf.abs({a})", E, "exact"),
    "not": Rule(lambda a, p: ~a[0], "~{a}", E, "exact"),
    "exp": Rule(lambda a, p: rf.exp(a[0]), "rf.exp({a})", E, "inexact"),
    "exp_safe": Rule(lambda a, p: rf.exp(rf.minimum(a[0], 4.0)), "rf.exp(rf.minimum({a}, 4.0))", E, "inexact"),
    "exp2": Rule(lambda a, p: rf.exp2(a[0]), "rf.exp2({a})", E, "inexact"),
    "exp2_safe": Rule(lambda a, p: rf.exp2(rf.minimum(a[0], 4.0)), "rf.exp2(rf.minimum({a}, 4.0))", E, "inexact"),
    "log": Rule(lambda a, p: rf.log(a[0]), "rf.log({a})", E, "inexact"),
    "log_safe": Rule(lambda a, p: rf.log(rf.abs(a[0]) + 1.0), "rf.log(rf.abs({a}) + 1.0)", E, "inexact"),
    "log2_safe": Rule(lambda a, p: rf.log2(rf.abs(a[0]) + 1.0), "rf.log2(rf.abs({a}) + 1.0)", E, "inexact"),
    "sqrt": Rule(lambda a, p: rf.sqrt(a[0]), "rf.sqrt({a})", E, "inexact"),
    "sqrt_safe": Rule(lambda a, p: rf.sqrt(rf.abs(a[0]) + 1.0), "rf.sqrt(rf.abs({a}) + 1.0)", E, "inexact"),
    "rsqrt_safe": Rule(lambda a, p: rf.rsqrt(rf.abs(a[0]) + 1.0), "rf.rsqrt(rf.abs({a}) + 1.0)", E, "inexact"),
    "tanh": Rule(lambda a, p: rf.tanh(a[0]), "rf.tanh({a})", E, "inexact"),
    "sin": Rule(lambda a, p: rf.sin(a[0]), "rf.sin({a})", E, "inexact"),
    "cos": Rule(lambda a, p: rf.cos(a[0]), "rf.cos({a})", E, "inexact"),
    "erf": Rule(lambda a, p: rf.erf(a[0]), "rf.erf({a})", E, "inexact"),
    "expm1_safe": Rule(lambda a, p: rf.expm1(rf.minimum(a[0], 4.0)), "rf.expm1(rf.minimum({a}, 4.0))", E, "inexact"),
    "log1p_safe": Rule(lambda a, p: rf.log1p(rf.abs(a[0])), "rf.log1p(rf.abs({a}))", E, "inexact"),
    "square": Rule(lambda a, p: a[0] ** 2, "{a} ** 2", E, "arith"),
    "recip": Rule(lambda a, p: 1.0 / a[0], "1.0 / {a}", E, "arith"),
    "astype": Rule(lambda a, p: a[0].astype(getattr(rf, p[0])), "{a}.astype({p0})", E, "exact"),
    "to_int": Rule(lambda a, p: _guarded_int(a[0]), "rf.where(rf.abs({a}) < %r, {a}, 0).astype(rf.int32)" % INT_LIMIT,
                   E, "exact", discontinuous=True),
    "floor": Rule(lambda a, p: rf.floor(a[0]), "rf.floor({a})", E, "exact", discontinuous=True),
    "ceil": Rule(lambda a, p: rf.ceil(a[0]), "rf.ceil({a})", E, "exact", discontinuous=True),
    "trunc": Rule(lambda a, p: rf.trunc(a[0]), "rf.trunc({a})", E, "exact", discontinuous=True),
    "rint": Rule(lambda a, p: rf.rint(a[0]), "rf.rint({a})", E, "exact", discontinuous=True),
    "round": Rule(lambda a, p: rf.round(a[0]), "rf.round({a})", E, "exact", discontinuous=True),
    "sign": Rule(lambda a, p: rf.sign(a[0]), "rf.sign({a})", E, "exact", discontinuous=True),
    "isnan": Rule(lambda a, p: rf.isnan(a[0]), "rf.isnan({a})", E, "exact", discontinuous=True),
    "isinf": Rule(lambda a, p: rf.isinf(a[0]), "rf.isinf({a})", E, "exact", discontinuous=True),
    "isfinite": Rule(lambda a, p: rf.isfinite(a[0]), "rf.isfinite({a})", E, "exact", discontinuous=True),
    # -- with a constant --
    "clip_c": Rule(lambda a, p: rf.clip(a[0], p[0], p[1]), "rf.clip({a}, {p0}, {p1})", E, "exact"),
    "add_c": Rule(lambda a, p: a[0] + p[0], "{a} + {p0}", E, "arith"),
    "rsub_c": Rule(lambda a, p: p[0] - a[0], "{p0} - {a}", E, "arith"),
    "mul_c": Rule(lambda a, p: a[0] * p[0], "{a} * {p0}", E, "arith"),
    "rmul_c": Rule(lambda a, p: p[0] * a[0], "{p0} * {a}", E, "arith"),
    "div_c": Rule(lambda a, p: a[0] / p[0], "{a} / {p0}", E, "arith"),
    "floordiv_c": Rule(lambda a, p: a[0] // p[0], "{a} // {p0}", E, "exact"),    # integers only (the grammar)
    "mod_c": Rule(lambda a, p: a[0] % p[0], "{a} % {p0}", E, "exact"),
    "gt_c": Rule(lambda a, p: a[0] > p[0], "{a} > {p0}", E, "exact", discontinuous=True),
    "le_c": Rule(lambda a, p: a[0] <= p[0], "{a} <= {p0}", E, "exact", discontinuous=True),
    "eq_c": Rule(lambda a, p: a[0] == p[0], "{a} == {p0}", E, "exact", discontinuous=True),
    "where_c": Rule(lambda a, p: rf.where(a[0], a[1], p[0]), "rf.where({a}, {b}, {p0})", E, "exact"),
    # -- binary --
    "add": Rule(lambda a, p: a[0] + a[1], "{a} + {b}", E, "arith"),
    "sub": Rule(lambda a, p: a[0] - a[1], "{a} - {b}", E, "arith"),
    "mul": Rule(lambda a, p: a[0] * a[1], "{a} * {b}", E, "arith"),
    "div": Rule(lambda a, p: a[0] / a[1], "{a} / {b}", E, "arith"),
    "div_safe": Rule(lambda a, p: a[0] / (rf.abs(a[1]) + 1.0), "{a} / (rf.abs({b}) + 1.0)", E, "arith"),
    "maximum": Rule(lambda a, p: rf.maximum(a[0], a[1]), "rf.maximum({a}, {b})", E, "exact"),
    "minimum": Rule(lambda a, p: rf.minimum(a[0], a[1]), "rf.minimum({a}, {b})", E, "exact"),
    "lt": Rule(lambda a, p: a[0] < a[1], "{a} < {b}", E, "exact", discontinuous=True),
    "le": Rule(lambda a, p: a[0] <= a[1], "{a} <= {b}", E, "exact", discontinuous=True),
    "gt": Rule(lambda a, p: a[0] > a[1], "{a} > {b}", E, "exact", discontinuous=True),
    "ge": Rule(lambda a, p: a[0] >= a[1], "{a} >= {b}", E, "exact", discontinuous=True),
    "eq": Rule(lambda a, p: a[0] == a[1], "{a} == {b}", E, "exact", discontinuous=True),
    "ne": Rule(lambda a, p: a[0] != a[1], "{a} != {b}", E, "exact", discontinuous=True),
    "and": Rule(lambda a, p: a[0] & a[1], "{a} & {b}", E, "exact"),
    "or": Rule(lambda a, p: a[0] | a[1], "{a} | {b}", E, "exact"),
    "where": Rule(lambda a, p: rf.where(a[0], a[1], a[2]), "rf.where({a}, {b}, {c})", E, "exact"),
    "logaddexp": Rule(lambda a, p: rf.logaddexp(a[0], a[1]), "rf.logaddexp({a}, {b})", E, "inexact"),
    # -- reductions: params (axis, keepdims) --
    "sum": Rule(_sum, "rf.sum({a}, axis={p0}, keepdims={p1})", R, "intsum"),
    "sum_method": Rule(lambda a, p: a[0].sum(axis=p[0], keepdims=p[1]), "{a}.sum(axis={p0}, keepdims={p1})", R,
                       "intsum"),
    "max": Rule(lambda a, p: rf.max(a[0], axis=p[0], keepdims=p[1]), "rf.max({a}, axis={p0}, keepdims={p1})", R,
                "exact"),
    "min": Rule(lambda a, p: rf.min(a[0], axis=p[0], keepdims=p[1]), "rf.min({a}, axis={p0}, keepdims={p1})", R,
                "exact"),
    "prod": Rule(lambda a, p: rf.prod(a[0], axis=p[0], keepdims=p[1]), "rf.prod({a}, axis={p0}, keepdims={p1})",
                 R, "intsum"),
    # -- statistics: params (axis, keepdims, ddof) --
    "mean": Rule(lambda a, p: rf.mean(a[0], axis=p[0], keepdims=p[1]), "rf.mean({a}, axis={p0}, keepdims={p1})",
                 R, "inexact"),
    "var": Rule(lambda a, p: rf.var(a[0], axis=p[0], keepdims=p[1], ddof=p[2]),
                "rf.var({a}, axis={p0}, keepdims={p1}, ddof={p2})", R, "inexact"),
    "std": Rule(lambda a, p: rf.std(a[0], axis=p[0], keepdims=p[1], ddof=p[2]),
                "rf.std({a}, axis={p0}, keepdims={p1}, ddof={p2})", R, "inexact"),
    "matmul": Rule(lambda a, p: a[0] @ a[1], "{a} @ {b}", "matmul", "intsum"),
    # -- top-k along the last axis: params (k,) --
    "topk": Rule(lambda a, p: rf.topk(a[0], p[0]), "rf.topk({a}, {p0})", "topk", "exact", discontinuous=True,
                 outputs=2),
    "topk_values": Rule(lambda a, p: rf.topk(a[0], p[0])[0], "rf.topk({a}, {p0})[0]", "topk", "exact"),
    "topk_indices": Rule(lambda a, p: rf.topk(a[0], p[0])[1], "rf.topk({a}, {p0})[1]", "topk", "exact",
                         discontinuous=True),
    "take_along_axis": Rule(lambda a, p: rf.take_along_axis(a[0], a[1], axis=-1),
                            "rf.take_along_axis({a}, {b}, axis=-1)", "gather", "exact"),
    # -- views --
    "swapaxes": Rule(lambda a, p: rf.swapaxes(a[0], p[0], p[1]), "rf.swapaxes({a}, {p0}, {p1})", "view", "exact"),
    "transpose": Rule(lambda a, p: rf.transpose(a[0], p[0]), "rf.transpose({a}, {p0})", "view", "exact"),
    "T": Rule(lambda a, p: a[0].T, "{a}.T", "view", "exact"),
    "mT": Rule(lambda a, p: a[0].mT, "{a}.mT", "view", "exact"),
    "index": Rule(lambda a, p: a[0][p[0]], "{a}[{key}]", "view", "exact"),
    "reshape": Rule(lambda a, p: a[0].reshape(p[0]), "{a}.reshape({p0})", "view", "exact"),
    # -- joins of a value with a slice of itself along one axis: params (axis, key of the slice) --
    "concatenate": Rule(lambda a, p: rf.concatenate((a[0], a[0][p[1]]), axis=p[0]),
                        "rf.concatenate(({a}, {a}[{key}]), axis={p0})", "view", "exact"),
    "concatenate2": Rule(lambda a, p: rf.concatenate((a[0], a[1]), axis=p[0]),
                         "rf.concatenate(({a}, {b}), axis={p0})", "join", "exact"),
    "stack": Rule(lambda a, p: rf.stack((a[0], a[0][p[1]]), axis=p[0]),
                  "rf.stack(({a}, {a}[{key}]), axis={p0})", "view", "exact"),
    # -- index builders: rf.arange over one of a value's dims --
    "arange": Rule(lambda a, p: rf.arange(a[0].shape[p[0]]), "rf.arange({a}.shape[{p0}])", "arange", "exact"),
}


def at_output(node, arrays: list[np.ndarray], operands: list, shape: tuple[int, ...],
              combine: Callable = np.logical_or) -> np.ndarray:
    """Per-element arrays of an elementwise, view, join or gather op's operands (their bounds, their unsure
    elements) carried to the output elements they reach, `combine`d where several reach one: broadcast for an
    elementwise op; the op itself, run on the arrays, for a view, a join (each output element comes from one
    operand) and a gather's data (read at the gather's own indices, whose own array reaches its output element
    as an elementwise operand's does). `operands` are the operands' values."""
    rule = RULES[node.op]
    full = [np.broadcast_to(a, np.shape(v)) for a, v in zip(arrays, operands)]
    if rule.kind == "view":
        return np.asarray(rule.apply([full[0]], node.params))
    if rule.kind == "join":
        return np.asarray(rule.apply(full, node.params))
    if rule.kind == "gather":
        data = np.asarray(rule.apply([full[0], np.asarray(operands[1]).astype(np.int64)], node.params))
        return np.broadcast_to(combine(data, np.broadcast_to(full[1], shape)), shape)
    return np.broadcast_to(combine.reduce([np.broadcast_to(a, shape) for a in arrays]), shape)


def used_outputs(op: str) -> int:
    """How many values the op binds (top-k binds values and indices)."""
    return RULES[op].outputs
