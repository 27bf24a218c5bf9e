"""The fuzzer's three properties, checked on one `Cascade`, and its tolerance rule.

(a) Soundness: every returned result of the kernel (the fused program, run by the
    interpreter in chunks of `Cascade.chunk`) equals the reference (the body on
    numpy arrays): NaN at the same places, the same infinities, and finite values
    within the tolerance below.
(b) Completeness on the grammar: every reduction labelled separable whose earlier
    results are all expected fused is fused (in its group's ``fused_members``),
    when at least two of its group are; and nothing labelled non-separable is.
(c) Every refusal has a non-empty reason naming the reduction (engine name).

Tolerance rule. Each result gets a per-element bound ``E`` on how far a correct
evaluation in the kernel's dtype (unit roundoff ``u = eps(dtype)``) can be from
the exact value, from a float64 evaluation of the grammar's tree:

- every body element carries a running error bound (`cascade_nodes.ERROR_RULES`:
  ``u`` per rounding, amplified by each op's condition, plus the bounds ``E`` of
  the earlier results and of ``s`` that it reads); the bound of an element is
  the larger of the body's and the sum of its expanded terms' (the fused
  program evaluates the terms, the reference the body);
- a ``sum`` adds ``u * depth * sum_k sum_j |term_jk|``: the float64 sum of the
  magnitudes of the terms the body expands into, so cancellation between
  separable terms is allowed for exactly as far as the terms are large
  (``matmul`` likewise with ``|v|``); ``depth = 1 + log2 N + sqrt(ceil(N / chunk))``
  covers the reference's pairwise tree and the fused loop's sequential chunk
  updates with their rescales; ``max``/``min`` take the largest element bound
  plus ``u * depth * max_k sum_j |term_jk|`` (nothing for the bare data: exact);
- an earlier result ``y`` read by the body moves the whole reduction at once (one
  value per row), so its bound is carried by re-reducing the body in float64 with
  ``y +- E_y``: the effects on the elements add up with their signs (the
  derivative of ``sum (x - mean)^2`` in the mean is 0), and a ``where`` that
  flips is seen as the jump it is;
- ``s = q @ k.mT`` gets ``u * D * (|q| @ |k|.mT)``.

The reference is the body on the cascade's numpy arrays, except for bfloat16: numpy
(ml_dtypes) adds bf16 values one at a time in bf16, so a long sum stagnates (2039
squares of unit normals add up to 9472 instead of 27114) and its error is not
``u * depth`` but up to ``u * N``; a threshold taken from it (``x > r1 / 4096``)
then selects other elements than any correct evaluation would. bf16 cascades are
judged against `tolerance.wide_reference` (the body in float64, each result rounded
once to bf16), the reference `tolerance` prescribes for bf16 reductions; `E`
already measures the distance from that exact evaluation (fuzz seed 1, example 49087).

A finite element passes when ``|kernel - reference| <= C * E`` with
`redfuser.testing.tolerance.C` (both sides' errors and the first-order model);
`assert_close` checks shapes, dtypes, NaN and infinities, and a global bound
(``scale = C * max E / rtol``) first. Elements whose bound is lost (``inf``:
a division by a value within its own error) are only checked for NaN/inf.
"""
from __future__ import annotations

import math
import traceback
import warnings
from dataclasses import dataclass, field, replace

import numpy as np

import redfuser as rf
from redfuser.fusion.separability import Refusal
from redfuser.ir import Reduce

from .cascade_nodes import Leaf, evaluate, evaluate_with_error
from .cascade_templates import MATMUL, SUM
from .cascades import Cascade
from .tolerance import C, assert_close, eps, tolerance, wide_reference

KINDS = ("soundness", "completeness", "unexpected fusion", "reason", "crash")


@dataclass(frozen=True)
class Failure:
    """One property violated: which, for which reduction (grammar name), and how."""

    kind: str
    reduction: str
    message: str
    worst: tuple[tuple[int, ...], float] | None = None  # soundness: (index, allowed |error|)
    scale: float | None = None     # soundness: `compare`'s scale for `assert_close` (`tolerance_scale`)


@dataclass
class Verdict:
    """What the engine did with a cascade, and every property that failed."""

    cascade: Cascade
    engine_names: dict[str, str] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)   # fused | refused | blocked | unpaired | ungrouped
    failures: list[Failure] = field(default_factory=list)


def depth(n: int, chunk: int) -> float:
    """The error-growth factor of a reduction over `n` elements run in chunks of `chunk`."""
    return 1.0 + math.log2(max(n, 1)) + math.sqrt(math.ceil(n / max(chunk, 1)))


def _reduce(op: str, body: np.ndarray, v: np.ndarray | None) -> np.ndarray:
    if op == MATMUL:
        return body @ v
    return {"sum": np.sum, "max": np.max, "min": np.min}[op](body, axis=-1, keepdims=True)


def error_bounds(c: Cascade, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-element error bound ``E`` of every reduction's result (see the module docstring)."""
    u = eps(c.dtype)
    env = {k: (a if a.dtype == np.bool_ else a.astype(np.float64), np.float64(0.0)) for k, a in arrays.items()}
    bounds: dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        if c.gemm:
            q, k = env["q"][0], env["k"][0]
            s = q @ k.mT
            es = u * c.gemm.d * (np.abs(q) @ np.abs(k).mT)
            env["s"] = (s * c.gemm.scale, es * c.gemm.scale + u * np.abs(s * c.gemm.scale))
        if c.masked:
            data, err = env[c.data_name]
            env[c.d_name] = (np.where(env["mask"][0], data, -np.inf), np.where(env["mask"][0], err, 0.0))
        grow = depth(c.n, c.chunk)
        v_in = env["v"][0] if "v" in env else None
        for r in c.reductions:
            # Rounding inside this reduction, with the earlier results taken as exact ...
            v, e = evaluate_with_error(r.body, env, u)
            terms = [evaluate_with_error(t, env, u) for t in r.terms]
            mag = np.broadcast_to(sum(np.where(np.isfinite(tv), np.abs(tv), 0.0) for tv, _ in terms), v.shape)
            e = np.broadcast_to(np.maximum(e, sum(te for _, te in terms)), v.shape)
            value = _reduce(r.op, v, v_in)
            if r.op == MATMUL:
                bound = e @ np.abs(v_in) + u * grow * (mag @ np.abs(v_in))
            elif r.op == SUM:
                bound = np.sum(e, axis=-1, keepdims=True) + u * grow * np.sum(mag, axis=-1, keepdims=True)
            else:  # max and min of the bare data are exact; otherwise the fused form adds and rescales
                exact = 0.0 if isinstance(r.body, Leaf) else u * grow
                bound = np.max(np.where(np.isfinite(v), e, 0.0), axis=-1, keepdims=True) + \
                    exact * np.max(mag, axis=-1, keepdims=True)
            # ... plus each earlier result's error, carried through the whole reduction at once (one value per
            # row: its effects on the elements add up with their signs, e.g. d/dmu sum (x - mu)^2 = 0).
            values = {k: val for k, (val, _) in env.items()}
            for j in r.reads:
                moved = 0.0
                for sign in (1.0, -1.0):
                    nudged = _reduce(r.op, evaluate(r.body, {**values, j: values[j] + sign * bounds[j]}), v_in)
                    moved = np.maximum(moved, np.abs(nudged - value))
                bound = bound + np.where(np.isfinite(value), np.where(np.isnan(moved), np.inf, moved), 0.0)
            bounds[r.name] = np.where(np.isnan(bound), np.inf, bound)
            env[r.name] = (value, np.float64(0.0))
    return bounds


def compare(actual: np.ndarray, expected: np.ndarray, bound: np.ndarray, c: Cascade) -> Failure | None:
    """None when `actual` passes the tolerance rule against `expected`; else the failure (reduction unset)."""
    allowed = C * np.broadcast_to(bound, expected.shape)
    scale = _scale(allowed, c)
    try:
        assert_close(actual, expected, c.dtype, c.n, scale=scale)
    except AssertionError as err:
        return Failure("soundness", "", str(err), _worst(actual, expected, allowed))
    worst = _worst(actual, expected, allowed)
    if worst is None:
        return None
    idx, limit = worst
    return Failure("soundness", "", f"|kernel - reference| at {idx} is {abs(float(actual[idx]) - float(expected[idx])):.3g}, "
                   f"allowed {limit:.3g} (kernel {float(actual[idx])!r}, reference {float(expected[idx])!r})", worst)


def _scale(allowed: np.ndarray, c: Cascade) -> float:
    """The magnitude `assert_close` is given so that its global bound is the largest per-element one."""
    known = np.isfinite(allowed)
    rtol, _ = tolerance(c.dtype, c.n)
    return float(np.max(allowed[known])) / rtol if known.any() else 0.0


def tolerance_scale(c: Cascade, name: str) -> float:
    """The scale `compare` gives `assert_close` for result `name` of `c` on its own data (no kernel run): a
    reproducer of a wrong value asserts the whole result with it."""
    with np.errstate(all="ignore"):
        return _scale(C * np.asarray(error_bounds(replace(c, chunk=1), c.data.build())[name]), c)


def _worst(actual: np.ndarray, expected: np.ndarray, allowed: np.ndarray) -> tuple[tuple[int, ...], float] | None:
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    with np.errstate(all="ignore"):
        bad = (np.isnan(a) != np.isnan(e)) | (np.isinf(e) & (a != e)) | (np.isinf(a) & (a != e) & ~np.isnan(e))
        over = np.where(np.isfinite(e) & np.isfinite(a) & np.isfinite(allowed), np.abs(a - e) - allowed, -np.inf)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        return idx, float(allowed[idx])
    if over.size and float(over.max()) > 0:
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(over)), over.shape))
        return idx, float(allowed[idx])
    return None


def sequential_sums(c: Cascade) -> bool:
    """Whether numpy sums `c`'s dtype one term at a time in that dtype (bf16: ml_dtypes' ``add.reduce``)."""
    return c.dtype == np.dtype(rf.bfloat16)


def reference(c: Cascade, args: list[np.ndarray]) -> object:
    """What the kernel's results are judged against (module docstring): the body, or its float64 twin."""
    return wide_reference(c.function, *args) if sequential_sums(c) else c.function(*args)


def live(c: Cascade) -> set[str]:
    """The reductions the returned results depend on (the engine drops the others)."""
    out = set(c.returns)
    for r in reversed(c.reductions):
        if r.name in out:
            out |= set(r.reads)
    return out


def expected_fused(c: Cascade) -> dict[str, bool]:
    """The grammar's ground truth: which live reductions one pass must compute."""
    exp: dict[str, bool] = {}
    alive = live(c)
    for r in c.reductions:
        exp[r.name] = r.name in alive and r.separable and all(exp.get(j, False) for j in r.reads)
    if sum(exp.values()) < 2:
        exp = {k: False for k in exp}
    return exp


def check(c: Cascade, soundness: bool = True) -> Verdict:
    """Lower and (with `soundness`) run `c`; record the engine's decisions and every failed property."""
    verdict = Verdict(c)
    arrays = c.data.build()
    args = [arrays[n] for n in c.inputs]
    kernel = rf.kernel(c.function, backend="interpret", interpret_chunk=c.chunk)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            lowered = kernel.lower(*args)
        except Exception as err:  # the property is "does not crash": report whatever was raised
            verdict.failures.append(Failure("crash", "", _crash("lower", err)))
            return verdict
        _classify(verdict, lowered)
        if soundness:
            try:
                got = kernel(*args)
            except Exception as err:
                verdict.failures.append(Failure("crash", "", _crash("run", err)))
                return verdict
            want = reference(c, args)
            got, want = (got, want) if len(c.returns) > 1 else ((got,), (want,))
            bounds = error_bounds(c, arrays)
            for name, a, e in zip(c.returns, got, want):
                f = compare(np.asarray(a), np.asarray(e), bounds[name], c)
                if f is not None:
                    verdict.failures.append(Failure("soundness", name, f"`{name}`: {f.message}", f.worst))
    return verdict


def _crash(stage: str, err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{stage} raised {type(err).__name__}: {err}{where}"


def _classify(verdict: Verdict, lowered) -> None:
    c = verdict.cascade
    reduces = [s.out.name for s in lowered.stages["traced"].body if isinstance(s, Reduce)]
    mine = (["s"] if c.gemm else []) + [r.name for r in c.reductions]
    if len(reduces) != len(mine):
        verdict.failures.append(Failure("crash", "", f"the traced program has {len(reduces)} reductions, the grammar "
                                        f"built {len(mine)}: {reduces} vs {mine}"))
        return
    verdict.engine_names = names = dict(zip(mine, reduces))
    group_of = {n: g for g in lowered.groups for n in g.reductions}
    fused = {r.name: names[r.name] in getattr(group_of.get(names[r.name]), "fused_members", ()) for r in c.reductions}
    expected, alive = expected_fused(c), live(c)
    missed: list[Failure] = []
    for r in c.reductions:
        en, g = names[r.name], group_of.get(names[r.name])
        if r.name not in alive:
            verdict.status[r.name] = "dead"
            continue
        decision = g.decompositions.get(en) if g is not None else None
        reason = decision.reason if isinstance(decision, Refusal) else None
        if fused[r.name]:
            verdict.status[r.name] = "fused"
        elif g is None:
            verdict.status[r.name] = "ungrouped"
        elif any(verdict.status.get(j) in ("refused", "blocked", "ungrouped") for j in r.reads):
            verdict.status[r.name] = "blocked"  # an earlier result it reads was left out first
        else:
            verdict.status[r.name] = "refused" if reason is not None else "unpaired"
        if g is not None and decision is not None and reason is not None and (not reason.strip() or f"`{en}`" not in reason):
            verdict.failures.append(Failure("reason", r.name, f"the refusal of `{r.name}` (engine name `{en}`) does "
                                            f"not name it: {reason!r}"))
        if g is not None and not g.fused and not (g.reason or "").strip():
            verdict.failures.append(Failure("reason", r.name, f"the group of `{r.name}` was not fused and gives no reason"))
        if c.n == 1:
            continue  # one element: the tracer indexes it as a constant, every body is separable and grouping is moot
        if expected[r.name] and not fused[r.name]:
            why = reason or (g.reason if g is not None else "it is in no cascade group")
            missed.append(Failure("completeness", r.name, f"`{r.name}` ({r.op} of {r.family}) is separable by "
                                  f"construction but was not fused (engine name `{en}`): {why}"))
        if fused[r.name] and not r.separable:
            verdict.failures.append(Failure("unexpected fusion", r.name, f"`{r.name}` ({r.op} of {r.family}) is not "
                                            f"separable by construction but was fused (engine name `{en}`)"))
    # A reduction left out only because another one was (blocked, unpaired) is a consequence, not a second bug.
    primary = [f for f in missed if verdict.status[f.reduction] in ("refused", "ungrouped")]
    verdict.failures += primary or missed
