"""The fuzzer's oracle: a program's numpy results for one call, and how far a correct kernel may be from them.

The reference is the body run on the call's own arguments (numpy arrays, views,
masked arrays, static scalars): each node's rule applied to numpy values, which
is what ``Program.body`` does outside a kernel. Beside it, per value, the oracle
keeps what judging needs (`Value`):

- ``exact``: every backend must compute it bit for bit (see `program_rules`;
  for floats equal as numbers, so ``0.0 == -0.0``);
- ``err``: a per-element first-order bound on how far a correct evaluation can
  be from the reference (`program_bounds`: 0 for exact values; each inexact
  step's rounding, carried through later steps; float sums and products over
  the magnitude of the terms an algebraic expansion can make). A kernel passes
  where ``|kernel - reference| <= C err`` (`tolerance.C`); ``inf``: no finite
  bound, only the class is judged;
- ``unsure``: elements whose class (finite, NaN, +inf, -inf) the model cannot
  tell, where nothing is judged:
  (1) *storage precision*: a second evaluation computes every f16/bf16 value in
      f32 (an ``astype`` to a narrow type rounds, then widens), as compiled
      kernels do; where its value, rounded to the reference's dtype, is in
      another class than the reference's (``x * x`` overflows f16 at 300 in
      numpy, not in f32), the element is unsure;
  (2) an inexact operand that may be zero (``|value| <= C e``) multiplied by an
      infinity (also inside the inner sum of ``@``), used as a divisor, divided by zero (``0/0`` is NaN, a rounded
      ``1e-9/0`` is inf), or under ``log``/``sqrt``; a zero whose sign is not
      determined (``maximum(-0.0, 0.0)``) used as a divisor;
  (3) on the GPU backends (``simulate``, ``cuda``), which compute ``exp`` and
      ``log`` of f64 values in f32 (docs/gpu-backend.md, "Numerics"), a result
      beyond f32's range (`program_bounds.f32_math`, which also widens the
      bound to f32's rounding of the argument and the result);
  (4) a float sum or ``@`` whose expanded terms are infinite or overflow its
      dtype (`program_bounds.expansion_hazard`, a documented limit of fused
      sums of separable terms);
  (5) any element computed from an unsure one;
  (6) a reduction the engine may fuse with an earlier one over an axis of the
      same length, where the earlier result it factors out is infinite, NaN or a
      zero divisor (`program_limits.precondition_hazard`: the fusion theorem's
      precondition, a documented limit, docs/fusion.md "Limits").

Rules (4) and (6) are known limits of the fusion engine: `Value` keeps their
elements apart (``expansion``, ``limit``; spread as in (5)), and the judge
counts them in the campaign summary, so a reader sees how often they applied.

Where a discontinuous op (`Rule.discontinuous`) gets an inexact operand, its
result is unsure everywhere: the grammar does not draw that, the shrinker can.
Top-k indices are the exception: routing ranks inexact probabilities, and the
indices are judged exactly on every row whose ranking no correct kernel can
change (`program_ranking`: values separated by more than their bounds, or tied
structurally, as the float64 ``shadow`` of the program shows).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from . import program_bounds as bounds
from .program import Program
from .program_limits import precondition_hazard
from .program_ranking import robust_rows
from .program_rules import RULES, at_output
from .tolerance import C

NARROW = {np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn)}
SUPPORTED = NARROW | {np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64, np.bool_)}
"""The dtypes a RedFuser kernel computes in; numpy reaching another one (``bool ** 2`` is int8) is refused."""
F32 = np.dtype(np.float32)
FLOAT_NAMES = frozenset({"float64", "float32", "float16", "bfloat16", "float8_e4m3fn"})


def is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt in NARROW


def unit_roundoff(dt: np.dtype) -> float:
    return float(ml_dtypes.finfo(dt).eps) if is_float(dt) else 0.0


@dataclass
class Value:
    """One value of a call: reference, storage-precision twin, exactness, error bound, unsure elements."""

    ref: object
    wide: object
    exact: bool
    err: np.ndarray
    unsure: np.ndarray
    zsign: bool = False     # exact, but the sign of a zero may differ (maximum(-0.0, 0.0))
    mag: np.ndarray | None = None   # magnitude of the terms an expansion can make (program_bounds.magnitude)
    expanded: bool = False          # ... and whether the value is a sum of such terms
    extremum: bool = False          # computed elementwise from a max/min reduction (a running one when fused)
    expansion: np.ndarray | None = None  # unsure by rule (4), or computed from such elements (a subset of unsure)
    limit: np.ndarray | None = None      # ... by rule (6)
    shadow: object = None           # the float64 shadow (`program_ranking`): no narrowing rounding; None: unknown

    def __post_init__(self) -> None:
        if self.mag is None:
            self.mag = np.abs(_f64(self.ref))
        shape = np.shape(self.unsure)
        self.expansion = np.zeros(shape, bool) if self.expansion is None else self.expansion
        self.limit = np.zeros(shape, bool) if self.limit is None else self.limit

    @property
    def dtype(self) -> np.dtype:
        return np.asarray(self.ref).dtype


@dataclass
class Reference:
    """What numpy computes for one call and how it is judged; `error` when numpy refuses the program."""

    outputs: tuple[Value, ...] = ()
    error: BaseException | None = None
    masked: bool = False          # a MaskedArray argument
    mask_matters: bool = False    # ... whose mask changes numpy's result
    unsupported: str = ""         # a dtype numpy computes on the way that RedFuser has not (int8...): a user error


def _class(x: np.ndarray) -> np.ndarray:
    """0 finite, 1 NaN, 2 +inf, 3 -inf (per element)."""
    f = np.asarray(x).astype(np.float64) if is_float(np.asarray(x).dtype) else np.zeros(np.shape(x))
    return np.select([np.isnan(f), f == np.inf, f == -np.inf], [1, 2, 3], 0)


def _f64(x: object) -> np.ndarray:
    a = np.ma.getdata(np.asarray(x)) if isinstance(x, np.ma.MaskedArray) else np.asarray(x)
    return a.astype(np.float64)


def _widen(x: object) -> object:
    a = np.asarray(np.ma.getdata(x) if isinstance(x, np.ma.MaskedArray) else x)
    return a.astype(F32) if a.dtype in NARROW else a


def _argument(value: object) -> Value:
    if not isinstance(value, np.ndarray):  # a static scalar
        return Value(value, value, True, np.zeros(()), np.zeros((), bool), shadow=value)
    shape = np.shape(value)
    plain = np.asarray(np.ma.getdata(value))
    shadow = plain.astype(np.float64) if is_float(plain.dtype) else plain
    return Value(value, _widen(value), True, np.zeros(shape), np.zeros(shape, bool), shadow=shadow)


def _shadow(node, rule, ins: list[Value]) -> object:
    """The step in float64 on the operands' shadows, a narrowing or f32 cast left out (None: not computable)."""
    if any(v.shadow is None for v in ins):
        return None
    args = [v.shadow for v in ins]
    if node.op == "astype" and node.params[0] in FLOAT_NAMES and is_float(np.asarray(args[0]).dtype):
        return args[0]
    try:
        return rule.apply(args, node.params)
    except Exception:  # numpy will not combine the shadows (an f64 operand where an int is needed)
        return None


GPU_BACKENDS = frozenset({"simulate", "cuda"})
"""Backends that compute ``exp``/``log`` of f64 values in f32 (docs/gpu-backend.md, "Numerics")."""


def evaluate(program: Program, args: list[object], gpu: bool = False) -> tuple[dict[str, Value], list[object]]:
    """Every value of `program` on `args` (raises what numpy raises), and the body's outputs; `gpu`: bounds for
    a backend of `GPU_BACKENDS`."""
    env: dict[str, Value] = {n: _argument(a) for n, a in zip(program.params, args)}
    producers = {o: node for node in program.nodes for o in node.outs}
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for node in program.nodes:
            _step(node, env, gpu, producers)
    return env, [env[o].ref for o in program.outputs]


def reference(program: Program, call: int, backend: str = "cpu") -> Reference:
    """The judged reference of call number `call` on `backend` (see the module docstring)."""
    args = program.arguments(call)
    gpu = backend in GPU_BACKENDS
    masked = any(isinstance(a, np.ma.MaskedArray) for a in args)
    try:
        env, _ = evaluate(program, args, gpu)
    except Exception as err:  # numpy refuses the program: the kernel must refuse it too
        return Reference(error=err, masked=masked)
    outputs = tuple(env[o] for o in program.outputs)
    unsupported = ", ".join(sorted({str(v.dtype) for v in env.values() if v.dtype not in SUPPORTED}))
    outside = _outside_the_subset(program, env)
    if outside:
        unsupported = ", ".join(filter(None, [unsupported, ", ".join(outside)]))
    if not masked:
        return Reference(outputs, unsupported=unsupported)
    plain = [np.ma.getdata(a) if isinstance(a, np.ma.MaskedArray) else a for a in args]
    try:
        penv, _ = evaluate(program, plain, gpu)
    except Exception as err:
        return Reference(error=err, masked=True, mask_matters=True)
    matters = any(np.ma.is_masked(v.ref) or not _same(np.ma.getdata(v.ref), penv[o].ref)
                  for o, v in zip(program.outputs, outputs))
    return Reference(tuple(penv[o] for o in program.outputs), masked=True, mask_matters=matters,
                     unsupported=unsupported)


def _same(a: object, b: object) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(np.array_equal(a, b, equal_nan=is_float(a.dtype)))


# ---------------------------------------------------------------------------------------------
# one step
# ---------------------------------------------------------------------------------------------
def _step(node, env: dict[str, Value], gpu: bool = False, producers: dict | None = None) -> None:
    rule = RULES[node.op]
    ins = [env[a] for a in node.args]
    ref = rule.apply([v.ref for v in ins], node.params)
    limit = precondition_hazard(node, env, producers, ref if rule.outputs == 1 else ref[0]) if producers else None
    try:
        wide = rule.apply([v.wide for v in ins], node.params)
    except Exception:  # f32 twins numpy will not combine: no storage-precision information
        wide = ref
    refs = ref if rule.outputs > 1 else (ref,)
    wides = wide if rule.outputs > 1 else (wide,)
    shadow = _shadow(node, rule, ins)
    shadows = shadow if rule.outputs > 1 and shadow is not None else (shadow,) * rule.outputs
    for n, (out, r, w, sh) in enumerate(zip(node.outs, refs, wides, shadows)):
        if node.op == "astype" and np.dtype(r.dtype) in NARROW:
            w = np.asarray(w).astype(F32)  # rounded to the narrow type, then computed on in f32
        w = _widen(w)
        env[out] = _value(node, rule, ins, r, w, indices=(n == 1), gpu=gpu, limit=limit)
        env[out].shadow = sh if sh is None or np.shape(sh) == np.shape(r) else None


def _value(node, rule, ins: list[Value], ref: object, wide: object, indices: bool, gpu: bool = False,
           limit: np.ndarray | None = None) -> Value:
    r = np.asarray(np.ma.getdata(ref) if isinstance(ref, np.ma.MaskedArray) else ref)
    dt, shape = r.dtype, r.shape
    all_exact = all(v.exact for v in ins)
    refs = [v.ref for v in ins]
    if rule.kind == "arange":  # reads only its operand's shape
        return Value(ref, wide, True, np.zeros(shape), np.zeros(shape, bool))
    extremum = (rule.kind == "reduce" and node.op in ("max", "min")) or (
        rule.kind in ("elementwise", "view", "join", "gather") and any(v.extremum for v in ins))
    lossy = _lossy_cast(node, ins, dt)
    grid = _grid_rounding(node, ins, dt)
    kind = rule.exactness
    exact = all_exact and (kind == "exact" or (kind == "arith" and dt not in NARROW)
                           or (kind == "intsum" and not is_float(dt))) and not lossy and not grid
    if node.op == "div_safe" and ins[1].dtype in NARROW:
        exact = False   # its |b| + 1 is a step in b's narrow type: numpy rounds it there, a kernel does not
    expansion = _propagate(node, rule, [v.expansion for v in ins], shape, refs) | \
        bounds.expansion_hazard(node, ins, shape, dt)
    limit = _propagate(node, rule, [v.limit for v in ins], shape, refs) | (
        np.broadcast_to(limit, shape) if limit is not None else False)
    unsure = _propagate(node, rule, [v.unsure for v in ins], shape, refs) | expansion | limit
    u = max([unit_roundoff(dt)] + [unit_roundoff(v.dtype) for v in ins])
    eta = max([bounds.underflow_step(dt)] + [bounds.underflow_step(v.dtype) for v in ins])
    err = np.zeros(shape) if exact else bounds.error(node, ins, r, u, lossy, eta)
    if grid:    # one grid step: the kernel's value, rescaled, is within 1/2 of the operand, numpy's too
        err = err + 1.0
    if gpu and dt == np.float64 and node.op in bounds.F32_MATH:  # computed in f32 on the GPU backends
        extra, out_of_range = bounds.f32_math(node, ins, r)
        err, unsure = err + extra, unsure | out_of_range
    with np.errstate(all="ignore"):
        mag, expanded = bounds.magnitude(node, ins, r)
    if rule.kind == "topk" and not all_exact:
        if indices or node.op == "topk_indices":  # judged only where no correct kernel can reorder them
            unsure = ~np.broadcast_to(robust_rows(_f64(ins[0].ref), ins[0].err, ins[0].shadow, r), shape)
    elif rule.discontinuous and not all_exact:
        unsure = np.ones(shape, bool)
    unsure = unsure | _new_unsure(node, ins, r)
    if is_float(dt):  # storage precision: f32 twin in another class than numpy's step-by-step rounding
        with np.errstate(all="ignore"):
            twin = np.asarray(wide).astype(dt)
        if np.shape(twin) == shape:
            unsure = unsure | (_class(twin) != _class(r))
            if dt in NARROW:
                # a kernel keeps a 16-bit step in f32 where it does not store it: 65504 * 2 is inf for numpy
                # but finite there, and so is everything computed from it (x / (|v| + 1) is 0 for numpy,
                # 3e-5 in the kernel), whatever the class of the rounded twin
                unsure = unsure | (_class(wide) != _class(r))
        err = np.where(np.isfinite(_f64(r)), err, 0.0)
    zsign = exact and is_float(dt) and (node.op in ("maximum", "minimum", "max", "min", "clip_c")
                                        or any(v.zsign for v in ins))
    return Value(ref, wide, exact, np.broadcast_to(np.asarray(err, np.float64), shape),
                 np.broadcast_to(unsure, shape), zsign, mag, expanded, extremum,
                 np.broadcast_to(expansion, shape), np.broadcast_to(limit, shape))


def _outside_the_subset(program: Program, env: dict) -> list[str]:
    """Steps numpy computes that RedFuser refuses by design (documented user errors), reached when a later
    call's static scalar changes an operand's dtype (``False``, then ``0``; ``2``, then ``2.0``): ``~``, ``&``
    and ``|`` of integers (numpy's bitwise ops; RedFuser's are logical, on bools), ``//`` and ``%`` of floats
    (RedFuser's are the integer ones), and ``sum``/``mean``/``var``/``std`` of e4m3 values, which numpy
    accumulates in e4m3 (the conformance table's note)."""
    found = set()
    for n in program.nodes:
        dtypes = [env[a].dtype for a in n.args]
        if n.op == "not" and dtypes[0] != np.bool_:
            found.add(f"~ of {dtypes[0]} (bitwise not)")
        elif n.op in ("and", "or") and any(dt != np.bool_ for dt in dtypes):
            found.add(f"{'&' if n.op == 'and' else '|'} of {dtypes[0]} and {dtypes[1]} (bitwise)")
        elif n.op in ("floordiv_c", "mod_c") and dtypes[0].kind == "f":
            found.add(f"{'//' if n.op == 'floordiv_c' else '%'} of {dtypes[0]} (floats)")
        elif n.op in ("sum", "sum_method", "mean", "var", "std") and dtypes[0] == np.dtype(ml_dtypes.float8_e4m3fn):
            found.add(f"{n.op} of float8_e4m3fn (numpy accumulates it in e4m3)")
    return sorted(found)


def _grid_rounding(node, ins: list[Value], dt: np.dtype) -> bool:
    """``rint``/``round`` of a float computed from a max or min reduction: the fusion engine may round it with a
    running absmax (int8 quantization, `fusion/grid_quantization.py`), which after the accumulator's rescale
    is within one grid step of numpy's value, not equal to it."""
    return node.op in ("rint", "round") and bool(ins) and ins[0].extremum and is_float(dt)


def _lossy_cast(node, ins: list[Value], dt: np.dtype) -> bool:
    """A cast that rounds to f16, bf16 or e4m3 a value computed from a max or min reduction. The fusion engine
    may evaluate it with a running extremum (per-row absmax quantization, docs/fusion.md "Quantization"), so it
    is within an ulp, not exact. Any other cast must round as numpy does."""
    if node.op != "astype" or dt not in NARROW or not ins[0].extremum:
        return False
    src = ins[0].dtype
    return src != dt and src != np.bool_ and src != np.dtype(ml_dtypes.float8_e4m3fn)


def _propagate(node, rule, masks: list[np.ndarray], shape: tuple[int, ...], operands: list) -> np.ndarray:
    """Elements inheriting `masks` (the operands' unsure elements, or a rule's) from any element feeding them;
    `operands`: the operands' values."""
    if not any(m.any() for m in masks):
        return np.zeros(shape, bool)
    if rule.kind in ("elementwise", "view", "join", "gather"):
        return at_output(node, masks, operands, shape)
    if rule.kind == "arange":
        return np.zeros(shape, bool)
    if rule.kind == "reduce":
        return np.asarray(np.any(masks[0], axis=node.params[0], keepdims=node.params[1]))
    if rule.kind == "matmul":
        a, b = (m.astype(np.float64) for m in masks)
        return (np.matmul(a, np.ones(masks[1].shape)) + np.matmul(np.ones(masks[0].shape), b)) > 0
    row = np.any(masks[0], axis=-1, keepdims=True)  # top-k: any element of the row
    return np.broadcast_to(row, shape)


def _may_be_zero(v: Value) -> np.ndarray:
    """Elements of an operand whose sign or zeroness a correct kernel may change."""
    r = _f64(v.ref)
    if v.exact:
        return (r == 0) & v.zsign
    with np.errstate(invalid="ignore"):
        return np.isfinite(r) & (np.abs(r) <= C * v.err)


def _new_unsure(node, ins: list[Value], r: np.ndarray) -> np.ndarray:
    op = node.op
    if op not in ("mul", "matmul", "div", "recip", "log", "sqrt") or not ins:
        return np.zeros(r.shape, bool)
    with np.errstate(all="ignore"):
        if op == "matmul":  # a product of the inner sum: an uncertain zero times an infinity
            za, zb = (_may_be_zero(v).astype(np.float64) for v in ins)
            ia, ib = (np.isinf(_f64(v.ref)).astype(np.float64) for v in ins)
            out = (np.matmul(za, ib) + np.matmul(ia, zb)) > 0
        elif op == "mul" and len(ins) == 2:
            a, b = ins
            inf_a, inf_b = np.isinf(_f64(a.ref)), np.isinf(_f64(b.ref))
            out = (_may_be_zero(a) & inf_b) | (_may_be_zero(b) & inf_a)
        elif op == "div":   # an uncertain divisor's zero; or 0/0 (NaN) against a rounded numerator over 0 (+-inf)
            out = _may_be_zero(ins[1]) if not ins[1].exact or ins[1].zsign else np.zeros((), bool)
            out = out | (_may_be_zero(ins[0]) & (_f64(ins[1].ref) == 0))
        elif op in ("recip", "log", "sqrt"):
            out = _may_be_zero(ins[0]) if not ins[0].exact or ins[0].zsign else np.zeros((), bool)
    return np.broadcast_to(out, r.shape)
