"""The oracle's error bounds: how far a correct kernel's value may be from numpy's, per element.

`error` gives the bound of an inexact value from its operands' values and
bounds (first order, as in `cascade_check`): each step adds its own rounding,
``4 u |out|`` (``u`` the unit roundoff of the lowest-precision dtype involved:
numpy rounds an f16 step to f16, a kernel keeps f32; a libm function is a few
ulps) plus one subnormal step of that dtype (`underflow_step`: where numpy's
f16 step underflows to 0 or a subnormal, the kernel's f32 value does not), and carries its operands' bounds through its condition (``mul``:
``|b| e_a + |a| e_b``; ``div``: ``(e_a + |out| e_b) / (|b| - e_b)``; ``exp``:
``|out| (exp(e_a) - 1)``...). A cast to f16, bf16 or e4m3 of a value computed
from a max or min reduction is not exact but within one ulp and one subnormal
step of the target (over ``C``): the fusion engine may round it with a running
absmax (docs/fusion.md "Quantization"); any other cast of an exact value is exact.

A float ``sum`` or ``@`` adds ``u (1 + log2 n + sqrt n)`` times the sum of its
terms' *magnitudes* (`magnitude`): the size of the terms an algebraic expansion
of the body can produce. The fusion engine expands a sum of separable terms
(``sum((x - mu)**2)`` becomes ``sum(x**2) - 2 mu sum(x) + n mu**2``,
docs/fusion.md "layer-norm statistics"), which is exact in real arithmetic and
rounds relative to ``(|x| + |mu|)**2``, not to ``(x - mu)**2``. Magnitudes follow
absolute arithmetic through the polynomial ops (``|a| + |b|`` for ``a - b``,
``|a| |b|`` for ``a * b``, division by a value as a factor) and restart at
``|value|`` after any other op, which the engine evaluates whole. The depth
covers any summation order, down to a sequential loop of one-element chunks.

`expansion_hazard` marks the documented limit of such expansions (docs/fusion.md,
"Limits of exactness with infinities"): where an expanded body's terms are
infinite or overflow the result's dtype, the expanded sums can be ``inf - inf``
where numpy's body is finite or infinite.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from .program_rules import RULES, at_output
from .tolerance import C

POLYNOMIAL = frozenset({"add", "sub", "mul", "neg", "square", "add_c", "rsub_c", "mul_c", "rmul_c", "div_c",
                        "div", "div_safe"})
"""Ops the fusion algebra expands through (`magnitude` follows them; every other op restarts)."""


F32_MATH = frozenset({"exp", "exp_safe", "exp2", "exp2_safe", "log", "log_safe", "log2_safe", "tanh", "sin", "cos", "erf",
                      "expm1_safe", "log1p_safe", "logaddexp"})
"""Ops the GPU backends compute in f32 on f64 values (docs/gpu-backend.md, "Numerics")."""


def f32_math(node, ins: list, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For an op of `F32_MATH` on f64 values computed in f32: (the extra error bound, the elements whose value or
    operand is beyond f32's range, whose class f32 can change). The argument rounds to f32 (relative ``eps32``): ``exp`` moves by
    ``|out| |x| eps32`` (``ln 2`` times that for ``exp2``), ``log`` by ``eps32`` (over ``ln 2`` for ``log2``);
    the result rounds to f32 (a few ulps, and a subnormal step)."""
    f = ml_dtypes.finfo(np.float32)
    out = np.abs(_f64(r))
    x = np.abs(_f64(ins[0].ref))
    with np.errstate(all="ignore"):
        if node.op in _ARGUMENT_SENSITIVITY:   # |f'(x)| |x|: what rounding the argument to f32 moves f by
            arg = _ARGUMENT_SENSITIVITY[node.op](x, out) * float(f.eps)
        elif node.op.startswith("exp"):
            arg = out * np.minimum(x, 4.0 if node.op.endswith("_safe") else np.inf) * float(f.eps)
        else:
            arg = np.full(out.shape, float(f.eps) / (math.log(2.0) if node.op.startswith("log2") else 1.0))
        extra = arg + 4 * float(f.eps) * out + float(f.tiny)
        # beyond f32's range: the result, or an operand, which rounds to inf in f32 (cos(1e55) is NaN there)
        beyond = np.isfinite(out) & (out > float(f.max) / 2)
        for v in ins:
            w = np.abs(_f64(v.ref))
            beyond = beyond | np.broadcast_to(np.isfinite(w) & (w > float(f.max) / 2), out.shape)
    return np.where(np.isnan(extra), np.inf, extra), np.broadcast_to(beyond, out.shape)


_ARGUMENT_SENSITIVITY = {
    "tanh": lambda x, out: x, "sin": lambda x, out: x, "cos": lambda x, out: x,
    "erf": lambda x, out: 1.13 * x, "expm1_safe": lambda x, out: (out + 1.0) * np.minimum(x, 4.0),
    "log1p_safe": lambda x, out: np.ones_like(out),
    "logaddexp": lambda x, out: np.abs(out) + 1.0,
}
"""``|f'(x)| |x|`` bounds of the smooth functions (``tanh sin cos`` have ``|f'| <= 1``, erf's is below 1.13,
``expm1'`` is ``out + 1``, ``log1p(|x|)``'s times ``|x|`` is below 1; logaddexp's argument sensitivity is
bounded by the larger argument, within ``|out| + 1`` of the result)."""


def _f64(x: object) -> np.ndarray:
    a = np.ma.getdata(x) if isinstance(x, np.ma.MaskedArray) else x
    return np.asarray(a).astype(np.float64)


def magnitude(node, ins: list, r: np.ndarray) -> tuple[np.ndarray, bool]:
    """(magnitude of the terms an expansion of this value can produce, whether it is a sum of such terms)."""
    op = node.op
    out = np.abs(_f64(r))
    rule = RULES[op]
    if rule.kind == "view":
        return np.asarray(rule.apply([ins[0].mag], node.params), np.float64), ins[0].expanded
    if op == "astype" and np.dtype(r.dtype).itemsize >= ins[0].dtype.itemsize and r.dtype.kind == "f":
        return np.broadcast_to(ins[0].mag, r.shape), ins[0].expanded  # a widening cast: transparent
    if op not in POLYNOMIAL or not all(np.asarray(v.ref).dtype.kind in "fVbiu" for v in ins):
        return out, False
    m = [v.mag for v in ins]
    c = abs(float(node.params[0])) if node.params else 1.0

    def excess(v) -> np.ndarray:    # what an expansion inside `v` adds beyond |v|
        return np.maximum(v.mag - np.abs(_f64(v.ref)), 0.0)

    with np.errstate(all="ignore"):
        # a sum or difference is formed before what multiplies it: the expansion keeps it (a centred sum),
        # so it adds only what its operands' own expansions do (``(x - mu)**2`` rounds relative to itself)
        mag = {"add": lambda: out + excess(ins[0]) + excess(ins[1]),
               "sub": lambda: out + excess(ins[0]) + excess(ins[1]), "mul": lambda: m[0] * m[1],
               "neg": lambda: m[0], "square": lambda: m[0] ** 2, "add_c": lambda: m[0] + c,
               "rsub_c": lambda: m[0] + c, "mul_c": lambda: m[0] * c, "rmul_c": lambda: m[0] * c,
               "div_c": lambda: m[0] / c, "div": lambda: m[0] / np.abs(_f64(ins[1].ref)),
               "div_safe": lambda: m[0] / (np.abs(_f64(ins[1].ref)) + 1.0)}[op]()
    expanded = op in ("add", "sub", "add_c", "rsub_c") or any(v.expanded for v in ins)
    mag = np.where(np.isnan(mag), np.inf, mag)
    return np.broadcast_to(np.maximum(mag, np.where(np.isnan(out), 0.0, out)), r.shape), expanded


STATISTICS = frozenset({"mean", "var", "std"})
"""numpy's statistics: the fusion engine accumulates them as sums (``var``/``std`` centred on a running mean,
docs/fusion.md), so they round like sums of their terms' magnitudes."""


def _statistic_parts(node, ins: list) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(x in f64, its mean along the axis (kept dims), the count n, the divisor n - ddof) of a statistic."""
    x = _f64(ins[0].ref)
    axis = node.params[0]
    n = x.size // max(np.sum(np.zeros(x.shape), axis=axis).size, 1) if x.size else 0
    ddof = node.params[2] if node.op != "mean" else 0
    with np.errstate(all="ignore"):
        mu = np.mean(x, axis=axis, keepdims=True) if x.size else np.zeros(())
    return x, mu, float(n), float(n - ddof)


def _statistic_error(node, ins: list, out: np.ndarray, u: float) -> np.ndarray:
    """The bound of a mean, var or std: its terms' rounding (``u (1 + log2 n + sqrt n)`` times their
    magnitudes, ``|x|`` for a mean, ``(|x| + |mean|)**2`` for a variance, which is what an expanded or a
    centred-on-the-running-mean accumulation rounds relative to) and its operand's bound carried through
    (``mean(e)``; ``2 sum |x - mean| e / (n - ddof)`` for a variance); a std is the square root of that."""
    x, mu, n, div = _statistic_parts(node, ins)
    axis, keep = node.params[0], node.params[1]
    e = np.broadcast_to(ins[0].err, x.shape)
    mag = np.broadcast_to(ins[0].mag, x.shape)
    with np.errstate(all="ignore"):
        if node.op == "mean":
            return (u * _depth(int(n)) * np.sum(mag, axis=axis, keepdims=keep)
                    + np.sum(e, axis=axis, keepdims=keep)) / n
        terms = (mag + np.abs(mu)) ** 2
        ev = (4 * u * _depth(int(n)) * np.sum(terms, axis=axis, keepdims=keep)
              + np.sum(2 * np.abs(x - mu) * e + e * e, axis=axis, keepdims=keep)) / div
        if node.op == "var":
            return ev
        return np.minimum(np.sqrt(ev), ev / np.maximum(2 * out, 1e-300))


def _product_error(node, ins: list, out: np.ndarray, u: float) -> np.ndarray:
    """A float ``prod``: ``n`` roundings relative to the result (any order), and the operands' relative bounds
    added up: ``|out| (u n + sum_k e_k / |x_k|)``."""
    x = np.abs(_f64(ins[0].ref))
    axis, keep = node.params[0], node.params[1]
    n = x.size // max(np.sum(np.zeros(x.shape), axis=axis).size, 1) if x.size else 0
    e = np.broadcast_to(ins[0].err, x.shape)
    with np.errstate(all="ignore"):
        rel = np.sum(np.where(e > 0, e / x, 0.0), axis=axis, keepdims=keep)
    return out * (u * (n + 1) + rel)


def _product_hazard(node, ins: list, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Rows of a float ``prod`` whose partial products may leave `dtype`'s range in some order (or numpy's, which
    multiplies 16-bit values in their own type): then whether it is inf, 0 or NaN (``inf * 0``) depends on the
    order. Judged only where the sum of the factors' binary exponents' magnitudes stays inside the range."""
    x = np.abs(_f64(ins[0].ref))
    f = ml_dtypes.finfo(dtype)
    src = ins[0].dtype if np.dtype(ins[0].dtype).kind == "f" else dtype
    g = ml_dtypes.finfo(src) if np.dtype(src).kind in "fV" else f
    room = min(math.log2(float(f.max)), -math.log2(float(f.smallest_normal)),
               math.log2(float(g.max)), -math.log2(float(g.smallest_normal))) - 2
    axis, keep = node.params[0], node.params[1]
    with np.errstate(all="ignore"):
        span = np.sum(np.where((x > 0) & np.isfinite(x), np.abs(np.log2(x)), 0.0), axis=axis, keepdims=keep)
        special = np.any(~np.isfinite(x) | (x == 0), axis=axis, keepdims=keep)
    return np.broadcast_to(~(span < room) | special, shape)


def _statistic_hazard(node, ins: list, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Elements of a statistic whose row holds a non-finite value or whose terms overflow `dtype`: the engine's
    sums (centred on a running mean) meet inf - inf or an overflow elsewhere than numpy's formula does."""
    x, mu, n, div = _statistic_parts(node, ins)
    top = float(ml_dtypes.finfo(dtype).max) / 4
    axis, keep = node.params[0], node.params[1]
    with np.errstate(all="ignore"):
        mag = np.abs(x) if node.op == "mean" else (np.abs(x) + np.abs(mu)) ** 2
        bad = ~np.isfinite(x) | ~(np.sum(mag, axis=axis, keepdims=True) < top)
        out = np.any(bad, axis=axis, keepdims=keep) | (div <= 0)
        if node.op == "std":   # the square root of a variance that may round to <= 0 (rule 2's sqrt): an
            # expanded variance (not centred: 1/x) of a constant row is -1e-9 as well as numpy's 0
            u = max(float(ml_dtypes.finfo(dt).eps) for dt in (np.dtype(dtype), np.dtype(ins[0].dtype))
                    if dt.kind in "fV") if np.dtype(ins[0].dtype).kind in "fV" else float(ml_dtypes.finfo(dtype).eps)
            var = np.sum((x - mu) ** 2, axis=axis, keepdims=keep) / div
            variance = type(node)(node.outs, "var", node.args, node.params)
            out = out | ~(var > C * _statistic_error(variance, ins, np.abs(var), u))
        return np.broadcast_to(out, shape)


def expansion_hazard(node, ins: list, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Elements of a float sum or ``@`` whose expanded terms are infinite or overflow `dtype`."""
    if node.op in STATISTICS and dtype.kind in "fV":
        return _statistic_hazard(node, ins, shape, dtype)
    if node.op == "prod" and dtype.kind in "fV":
        return _product_hazard(node, ins, shape, dtype)
    if node.op not in ("sum", "sum_method", "matmul") or dtype.kind not in "fV":
        return np.zeros(shape, bool)
    top = float(ml_dtypes.finfo(dtype).max)
    if node.op == "matmul":  # the products of an expanded operand's terms with the other one's elements
        if not (ins[0].expanded or ins[1].expanded):
            return np.zeros(shape, bool)
        a, b = (np.broadcast_to(v.mag, np.shape(v.ref)) for v in ins)
        with np.errstate(all="ignore"):
            return np.broadcast_to(~(np.matmul(a, b) < top), shape)
    bad = [np.asarray(v.expanded & ~(np.asarray(v.mag) < top)) for v in ins]
    if not any(b.any() for b in bad):
        return np.zeros(shape, bool)
    return np.asarray(np.any(np.broadcast_to(bad[0], np.shape(ins[0].ref)), axis=node.params[0],
                             keepdims=node.params[1]))


def error(node, ins: list, r: np.ndarray, u: float, lossy: bool, eta: float = 0.0) -> np.ndarray:
    """The error bound of an inexact result (see the module docstring); `eta` is the absolute part of a rounding
    (`underflow_step`)."""
    out = np.abs(_f64(r))
    a = [(_f64(v.ref), v.err) for v in ins]
    with np.errstate(all="ignore"):
        e = ERRORS.get(node.op, _worst)(node, a, out) if ins else np.zeros(r.shape)
        if node.op == "prod":
            return np.where(np.isnan(e := _product_error(node, ins, out, u)), np.inf, e + eta)
        if node.op in STATISTICS:
            return np.where(np.isnan(e := _statistic_error(node, ins, out, u)), np.inf, e + 4 * u * out + eta)
        if node.op in ("sum", "sum_method", "matmul"):
            rounding = _accumulation(node, ins, u)
        elif lossy:  # one ulp and one subnormal step of the target, after the factor C
            f = ml_dtypes.finfo(r.dtype)
            rounding = (float(f.eps) * out + float(f.smallest_subnormal)) / C
        else:
            rounding = 4 * u * out + eta
        total = np.asarray(e, np.float64) + rounding + _inner(node, a, out, u)
        return np.where(np.isnan(total), np.inf, total)


def underflow_step(dt: np.dtype) -> float:
    """The absolute error a rounding to `dt` can add beside its relative ``u |out|``: one subnormal step, where a
    result underflows (numpy's f16 ``exp2(-39.6)`` is 0; a kernel computing it in f32 keeps 1.2e-12). 0 for
    integers and bools."""
    return 0.0 if dt.kind in "biu" else float(ml_dtypes.finfo(dt).smallest_subnormal)


def _inner(node, a, out: np.ndarray, u: float) -> np.ndarray | float:
    """The rounding of ``|x| + 1`` inside the guarded rules (``log(|x| + 1)``...), carried through their function:
    in f16 or bf16, numpy rounds it to that type before the function, a kernel does not."""
    if node.op == "logaddexp":   # max(a, b) + log1p(exp(-|a - b|)): its two parts round before they cancel
        return 4 * u * (np.maximum(np.abs(a[0][0]), np.abs(a[1][0])) + 1.0)
    if node.op not in ("log_safe", "log2_safe", "sqrt_safe", "rsqrt_safe", "div_safe"):
        return 0.0      # (exp(minimum(x, 4)), expm1(...) and log1p(|x|) round nothing before their function)
    x = a[-1][0]
    y = np.abs(x) + 1.0
    return {"log_safe": lambda: np.full(out.shape, 2 * u),
            "log2_safe": lambda: np.full(out.shape, 2 * u / math.log(2.0)), "sqrt_safe": lambda: u * np.sqrt(y), "rsqrt_safe": lambda: u / np.sqrt(y),
            "div_safe": lambda: 2 * u * out}[node.op]()


def _depth(n: int) -> float:
    return 1.0 + math.log2(max(n, 1)) + math.sqrt(max(n, 1))


def _accumulation(node, ins: list, u: float) -> np.ndarray:
    mags = [np.broadcast_to(v.mag, np.shape(v.ref)) for v in ins]
    if node.op == "matmul":
        n = mags[0].shape[-1]
        return u * _depth(n) * np.matmul(mags[0], mags[1])
    x = mags[0]
    axis, keep = node.params[0], node.params[1]
    n = x.size // max(np.sum(np.zeros(x.shape), axis=axis).size, 1) if x.size else 0
    return u * _depth(n) * np.sum(np.where(np.isnan(x), 0.0, x), axis=axis, keepdims=keep)


def _worst(node, a, out) -> np.ndarray:
    """Exact ops on inexact operands (views, selections, casts): at most the largest operand bound moved."""
    rule = RULES[node.op]
    errs = [e for _, e in a]
    if rule.kind == "view":
        return np.asarray(rule.apply([errs[0]], node.params))
    if rule.kind == "reduce":
        return np.max(errs[0], axis=node.params[0], keepdims=node.params[1]) if errs[0].size else \
            np.zeros(out.shape)
    if rule.kind == "topk":
        return np.broadcast_to(np.max(errs[0], axis=-1, keepdims=True), out.shape)
    if node.op in ("where", "where_c"):
        return np.maximum.reduce([np.broadcast_to(e, out.shape) for e in errs[1:]]) if len(errs) > 1 else 0.0
    if rule.kind in ("join", "gather"):
        return at_output(node, errs, [x for x, _ in a], out.shape, np.maximum)
    return np.maximum.reduce([np.broadcast_to(e, out.shape) for e in errs]) if errs else np.zeros(out.shape)


def _mul(node, a, out):
    (x, ex), (y, ey) = a
    return np.abs(y) * ex + np.abs(x) * ey + ex * ey


def _div(node, a, out):
    (x, ex), (y, ey) = a
    if node.op == "div_safe":
        y = np.abs(y) + 1.0
    room = np.abs(y) - ey
    return np.where(room > 0, (ex + out * ey) / np.where(room > 0, room, 1.0), np.inf)


def _sum2(node, a, out):
    return a[0][1] + a[1][1]


def _first(node, a, out):
    return a[0][1]


def _recip(node, a, out):
    (y, ey), = a
    room = np.abs(y) - ey
    return np.where(room > 0, out * ey / np.where(room > 0, room, 1.0), np.inf)


def _sqrt(node, a, out):
    (x, ex), = a
    if node.op == "sqrt":
        return np.minimum(np.sqrt(ex), ex / np.maximum(2 * np.sqrt(np.abs(x)), 1e-300))
    return ex / 2


def _log(node, a, out):
    (x, ex), = a
    base = np.abs(x) + 1.0 if node.op.endswith("_safe") else np.abs(x)
    room = base - ex
    scale = 1.0 / math.log(2.0) if node.op.startswith("log2") else 1.0
    return np.where(room > 0, scale * np.log1p(ex / np.where(room > 0, room, 1.0)), np.inf)


ERRORS = {
    "add": _sum2, "sub": _sum2, "mul": _mul, "div": _div, "div_safe": _div, "recip": _recip,
    "add_c": _first, "rsub_c": _first, "neg": _first, "abs": _first, "clip_c": _first,
    "mul_c": lambda n, a, o: a[0][1] * abs(float(n.params[0])),
    "rmul_c": lambda n, a, o: a[0][1] * abs(float(n.params[0])),
    "div_c": lambda n, a, o: a[0][1] / abs(float(n.params[0])),
    "square": lambda n, a, o: 2 * np.abs(a[0][0]) * a[0][1] + a[0][1] ** 2,
    "exp": lambda n, a, o: o * np.expm1(a[0][1]), "exp_safe": lambda n, a, o: o * np.expm1(a[0][1]),
    "exp2_safe": lambda n, a, o: o * np.expm1(math.log(2.0) * a[0][1]),
    "exp2": lambda n, a, o: o * np.expm1(math.log(2.0) * a[0][1]),
    "log": _log, "log_safe": _log, "log2_safe": _log, "sqrt": _sqrt, "sqrt_safe": _sqrt,
    "rsqrt_safe": lambda n, a, o: a[0][1] / 2,
    "tanh": lambda n, a, o: a[0][1],                                         # |tanh'| <= 1
    "sin": lambda n, a, o: np.minimum(a[0][1], 2.0), "cos": lambda n, a, o: np.minimum(a[0][1], 2.0),
    "erf": lambda n, a, o: np.minimum(1.13 * a[0][1], 2.0),                  # |erf'| <= 2/sqrt(pi)
    "expm1_safe": lambda n, a, o: (o + 1.0) * np.expm1(a[0][1]),              # expm1' = expm1 + 1
    "log1p_safe": lambda n, a, o: np.log1p(a[0][1]),                          # log1p(|x|): 1 + |x| >= 1
    "logaddexp": lambda n, a, o: np.maximum(a[0][1], a[1][1]),               # gradient: weights summing to 1
    "sum": lambda n, a, o: np.sum(a[0][1], axis=n.params[0], keepdims=n.params[1]),
    "sum_method": lambda n, a, o: np.sum(a[0][1], axis=n.params[0], keepdims=n.params[1]),
    "matmul": lambda n, a, o: np.matmul(a[0][1], np.abs(a[1][0])) + np.matmul(np.abs(a[0][0]), a[1][1]),
}
