"""Oracle rule (6): a reduction the fusion engine may fuse whose earlier results break the theorem's precondition.

The fusion theorem (docs/fusion.md; ARCHITECTURE.md section 4) computes a
reduction ``op over k of F(x_k, y)``, where ``y`` are earlier reductions over an
axis of the same length, as ``(op over k of G(x_k)) (x) H(y)``. That is exact
only where ``H(y)`` is invertible: finite for ``(max, +)`` and ``(min, +)``,
finite and non-zero for ``(+, x)``. The engine checks the factoring
symbolically, not the values at run time, so a row whose earlier result is
infinite, NaN or a zero divisor can be fused to another value than numpy's:
``sum(x / max(b))`` with the max 0 is ``(sum x) * inf``. These are documented
limits (docs/fusion.md, "Limits"), so their elements are unsure. A top-k that
reads an earlier result never joins the pass (`redfuser.fusion.topk_order`: it
ranks after the loop with the final results, as numpy does), so it has no
precondition and is always judged.

`precondition_hazard` marks, for one ``sum``/``max``/``min``/``@`` over a
single axis of length ``n`` (the reductions `redfuser.fusion.member.as_member`
takes: one reduced axis), the elements of its result whose reduced operand
reads a *hazardous* value:

- the *y part*: walking the operand's elementwise ops and views back from the
  reduced axis, the values that do not vary along it (their dimension there is
  missing or 1, after broadcasting and views) and are computed from an earlier
  single-axis reduction of length ``n`` (max, min, sum, ``@``, top-k values or
  indices) read that way. Those are what the engine factors into ``H``; a value
  that varies along the axis is ``G`` (``x`` part), and an earlier result read
  along the axis is not an earlier result of the cascade
  (`redfuser.fusion.cascade`). Over an axis of length 1 (which kernels read at
  index 0) every value counts, but only inside an exponential: there the fused
  ``G (x) H`` of the single term is ``F`` itself, computed with the same
  operations, except for the running max an online exponent reads through the
  engine's guards (``exp(t - max(s))`` with ``s = -inf``);
- a y-part element is hazardous where it is ``±inf`` or NaN, or where it is zero
  and reaches the operand as a divisor (an inexact divisor that may be zero is
  rule (2)'s, whose unsure elements spread to the reduction anyway):
  through ``/`` and ``1.0 / a``, and from there through the ops that keep it a
  factor (``*``, ``-a``, ``abs``, ``** 2``, a constant factor, a cast). The
  values below a comparison, ``& | ~`` or a guarded int cast are not y parts of
  their own: the op's result is finite whatever they are (it is one itself, a
  hazard only as a zero divisor).

Hazards spread to the operand like unsure elements (elementwise, views), and
the reduction's elements whose slice holds one are marked (a top-k: the whole
row; ``@``: the products that read one). Two cases are exact by the engine's
design and stay judged (a sum, ``@``, max or min; a top-k, which ranks, only over
one element):

- ``exp(x - max(x))`` over the reduced axis (softmax, attention): the online
  exponent whose x part is bounded by its own running max is exact whatever
  the max is, ``±inf`` and NaN included (docs/fusion.md, "Limits of exactness
  with infinities"; the engine's guards in `redfuser.fusion.loop_builder`);
- a result that numpy computes as NaN where every hazard of its slice is a NaN:
  a NaN earlier result makes every term NaN, so numpy's value, and the fused
  ``(op G) (x) NaN``, are NaN.

Everything else is judged as before.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .program_rules import RULES, at_output

REDUCTIONS = frozenset({"sum", "sum_method", "max", "min", "matmul", "topk", "topk_values", "topk_indices", "mean",
                        "var", "std", "prod"})
"""Ops that can be a member of a cascade (single-axis reductions, `@` over its contracted axis, top-k)."""
FACTORS = frozenset({"mul", "neg", "abs", "square", "mul_c", "rmul_c", "div_c", "astype"})
"""Ops through which a divisor's operands stay factors of it (``a / (m * w)`` divides by ``m``)."""
FINITE = frozenset({"gt_c", "le_c", "eq_c", "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "not", "to_int"})
"""Ops whose result is finite whatever their operands: the walk does not go below them."""
EXPONENTIALS = frozenset({"exp", "exp_safe", "exp2", "exp2_safe"})
"""Ops that make an online exponent of the engine (``exp(x - max(x))`` is exempt, see the module docstring)."""


def _ref(v) -> np.ndarray:
    r = v.ref
    return np.asarray(np.ma.getdata(r) if isinstance(r, np.ma.MaskedArray) else r)


def _dims(axis: object, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, tuple) else (axis,)
    return tuple(a % ndim for a in axes) if ndim else ()


def reduced(node, env: dict) -> tuple[int, list[tuple[str, int]]] | None:
    """(the length of the single axis `node` reduces, [(operand, its dimension along that axis)]), or None
    where `node` is no single-axis reduction."""
    op, args = node.op, node.args
    shapes = [_ref(env[a]).shape for a in args]
    if op == "matmul":
        a, b = shapes
        if not a or not b:
            return None
        return a[-1], [(args[0], len(a) - 1), (args[1], len(b) - 2 if len(b) > 1 else 0)]
    if op.startswith("topk"):
        return (shapes[0][-1], [(args[0], len(shapes[0]) - 1)]) if shapes[0] else None
    if op in REDUCTIONS:
        dims = _dims(node.params[0], len(shapes[0]))
        return (shapes[0][dims[0]], [(args[0], dims[0])]) if len(dims) == 1 else None
    return None


def precondition_hazard(node, env: dict, producers: dict, result: object) -> np.ndarray | None:
    """Elements of `node`'s `result` (a reduction's, numpy's value) that rule (6) marks unsure, or None."""
    axis = reduced(node, env)
    if axis is None or node.op.startswith("topk"):  # a top-k reading earlier results ranks after the loop
        return None
    n, operands = axis
    value = not node.op.startswith("topk") or n == 1   # a top-k ranks, except over one element
    walk = _Walk(n, env, producers, value)
    for name, dim in operands:
        walk.visit(name, dim, False)
    if not walk.found:
        return None
    nan, other = (_spread(node, env, operands, [walk.mask(name)[k] for name, _ in operands]) for k in (0, 1))
    if value:  # a NaN earlier result makes numpy's value NaN, and the fused one (see the module docstring)
        nan = nan & ~np.isnan(np.asarray(np.ma.getdata(result)).astype(np.float64))
    hazard = nan | other
    return hazard if hazard.any() else None


def _spread(node, env: dict, operands: list[tuple[str, int]], masks: list[np.ndarray]) -> np.ndarray:
    """The result elements whose reduced slice of the operands holds an element of `masks`."""
    shapes = [_ref(env[x]).shape for x, _ in operands]
    if node.op == "matmul":
        a, b = (np.broadcast_to(m, s).astype(np.float64) for m, s in zip(masks, shapes))
        return (np.matmul(a, np.ones(b.shape)) + np.matmul(np.ones(a.shape), b)) > 0
    full = np.broadcast_to(masks[0], shapes[0])
    if node.op.startswith("topk"):
        return np.any(full, axis=-1, keepdims=True)
    return np.asarray(np.any(full, axis=node.params[0], keepdims=node.params[1]))


class _Walk:
    """The y part of one reduction's operand (`visit`) and its hazardous elements spread forward (`mask`)."""

    def __init__(self, n: int, env: dict, producers: dict, value: bool) -> None:
        self.n, self.env, self.producers, self.value = n, env, producers, value
        self.found: dict[str, bool] = {}      # y-part value -> reached as a divisor
        self.seen: dict[tuple, bool] = {}
        self.masks: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def visit(self, name: str, dim: int | None, divisor: bool, record: bool = True, exponent: bool = False) -> bool:
        """Whether `name`, read with the reduced axis at `dim` (None: it does not vary along it), depends on an
        earlier result of the cascade; records the y-part values on the way (not below a `FINITE` op; over an
        axis of length 1, only inside an exponential)."""
        key = (name, dim, divisor, record, exponent)
        if key not in self.seen:
            self.seen[key] = self._visit(name, dim, divisor, record, exponent)
        return self.seen[key]

    def _visit(self, name: str, dim: int | None, divisor: bool, record: bool, exponent: bool) -> bool:
        node = self.producers.get(name)
        if node is None or RULES[node.op].kind == "arange":  # an argument (data or a constant), an index
            return False
        rule = RULES[node.op]
        out = _ref(self.env[name]).shape
        free = dim is None or self.n == 1   # over a length-1 axis every read is free of it (index 0)
        if node.op in REDUCTIONS:
            axis = reduced(node, self.env)
            depends = free and axis is not None and axis[0] == self.n
        elif self.value and dim is not None and node.op in EXPONENTIALS and self._softmax(node.args[0], dim):
            x, inner = self._softmax(node.args[0], dim)  # exp(x - max(x)): exact whatever the running max
            depends = self.n > 1 and self.visit(x, inner, False, record, True)  # over one element: x - x
        else:
            below, inside = record and node.op not in FINITE, exponent or node.op in EXPONENTIALS
            depends = False
            for pos, arg in enumerate(node.args):
                inner = _operand_dim(node, rule, out, _ref(self.env[arg]).shape, dim, self.n)
                depends = self.visit(arg, inner, below and _divides(node.op, pos, divisor), below, inside) or depends
        if depends and free and record and (self.n > 1 or exponent):
            self.found[name] = self.found.get(name, False) or divisor
        return depends

    def _softmax(self, name: str, dim: int) -> tuple[str, int] | None:
        """(x, its dimension along the axis) where `name` is ``x - rf.max(x, axis, keepdims=True)`` over that
        axis, else None."""
        sub = self.producers.get(name)
        if sub is None or sub.op != "sub":
            return None
        x, m = sub.args
        top = self.producers.get(m)
        out = _ref(self.env[name]).shape
        inner = _operand_dim(sub, RULES["sub"], out, _ref(self.env[x]).shape, dim, self.n)
        if top is None or top.op != "max" or top.args[0] != x or inner is None or not top.params[1]:
            return None
        along = reduced(top, self.env)
        return (x, inner) if along is not None and along[1][0][1] == inner else None

    def mask(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Hazardous elements of `name`, its own and any its operands spread to it: (NaN, the others)."""
        if name not in self.masks:
            self.masks[name] = self._mask(name)
        return self.masks[name]

    def _mask(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        v = self.env[name]
        r = _ref(v)
        nan = other = np.zeros(r.shape, bool)
        if name in self.found:
            with np.errstate(all="ignore"):
                f = r.astype(np.float64)
            nan, other = np.isnan(f), np.isinf(f) | (self.found[name] & (f == 0))
        node = self.producers.get(name)
        if node is None or node.op in REDUCTIONS or node.op in FINITE or RULES[node.op].kind == "arange":
            return nan, other   # a FINITE op's own elements only (its operands' do not reach its value)
        rule = RULES[node.op]
        ins = [self.mask(a) for a in node.args]
        if rule.kind in ("view", "join", "gather"):
            operands = [_ref(self.env[a]) for a in node.args]
            return tuple(own | at_output(node, [m[k] for m in ins], operands, r.shape)
                         for k, own in enumerate((nan, other)))
        return tuple(np.logical_or.reduce([np.broadcast_to(m[k], r.shape) for m in ins] + [own])
                     for k, own in enumerate((nan, other)))


def _divides(op: str, pos: int, divisor: bool) -> bool:
    """Whether operand `pos` of `op` reaches the reduced operand as a divisor (`divisor`: the op's result does)."""
    if op == "recip" or (op == "div" and pos == 1):
        return True
    if not divisor:
        return False
    if op in ("where", "where_c"):  # the selected values, not the condition
        return pos > 0
    if op in ("div", "div_safe"):   # a divisor's numerator (div_safe's |b| + 1 is never 0)
        return pos == 0
    return op in FACTORS


def _operand_dim(node, rule, out: tuple[int, ...], shape: tuple[int, ...], dim: int | None, n: int) -> int | None:
    """The operand's dimension that output dimension `dim` (of length `n`) reads (None: the operand does not vary
    along it; where `n` is 1, None only where the operand has no such dimension)."""
    if dim is None:
        return None
    if rule.kind == "view":
        return _view_dim(lambda a: rule.apply([a], node.params), shape, dim)
    inner = dim - (len(out) - len(shape))
    return inner if inner >= 0 and (shape[inner] != 1 or n == 1) else None


def _view_dim(view: Callable[[np.ndarray], object], shape: tuple[int, ...], dim: int) -> int | None:
    """Which operand dimension a view's output dimension `dim` comes from: the one whose coordinate varies
    along it (None: a new or length-1 dimension)."""
    for i, length in enumerate(shape):
        if length < 2:
            continue
        coord = np.broadcast_to(np.arange(length).reshape([-1 if j == i else 1 for j in range(len(shape))]), shape)
        seen = np.asarray(view(coord))
        if seen.ndim > dim and seen.shape[dim] > 1 and np.any(np.diff(seen, axis=dim) != 0):
            return i
    return None
