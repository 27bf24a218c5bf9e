"""Vectorizable f32 ``exp``, ``exp2``, ``log`` and ``log2`` written in LLVM IR.

LLVM vectorizes a call to ``llvm.exp.f32`` only with a vector math library,
so the f32 functions are polynomials in plain IR (``fma``, integer
ops on the bits), emitted once per module as internal ``alwaysinline``
functions; after inlining the loop vectorizer sees straight-line code.

- ``exp``: ``x = n*ln2 + r`` (Cody-Waite, two-part ln2), ``e^r`` by a degree-7
  Taylor polynomial (``|r| <= ln2/2``: truncation < 1e-8 relative), then
  ``* 2^n`` in two steps so results down to the subnormals are right. ``x`` is
  first limited to [-104, 89], where ``n`` stays in [-150, 128]: the same
  formula then gives 0 below -103.98 and ``inf`` above 88.72 by itself (no
  fix-up selects: they were a quarter of the function). The limit keeps NaN
  (an ordered compare and a select: one ``vmaxps``), and ``n`` is read from the
  bits of ``x*log2(e) + 1.5*2^23`` rather than converted with ``fptosi``, which
  is poison on NaN; a NaN ``x`` makes ``r`` and the result NaN.
- ``log``: ``x = 2^e * m`` with ``m`` in [sqrt(1/2), sqrt(2)), ``log(m) =
  2 atanh(f/(2+f))`` by its odd series to s^9 (|s| <= 0.172); subnormals are
  scaled up first; ``log(0) = -inf``, ``log(x<0) = NaN``, ``log(inf) = inf``.
  ``log2 = e + log(m) * log2(e)``, exact on powers of two.

Measured against numpy on random and special inputs (tests): exp within 2 ulp; exp2, log, log2 within 3 ulp.
f64 uses LLVM's intrinsics (libm calls), which are exact but scalar.

``tanh``, ``expm1``, ``log1p``, ``erf``, ``sin`` and ``cos`` in f32 are `codegen/wide_math.py`'s (shared with
the GPU: evaluated in f64, at most 1 ulp), wrapped here as ``rf.<name>f`` functions; in f64 they are the C
library's (`libm_f64`).
"""
from __future__ import annotations

import math

import llvmlite.ir as ir

from .. import wide_math
from ..llvm_utils import F32, F64, I1, I32, declare_intrinsic

_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_LOG2E = 1.4426950408889634


def _function(module: ir.Module, name: str) -> tuple[ir.Function, ir.IRBuilder | None]:
    existing = module.globals.get(name)
    if existing is not None:
        return existing, None  # type: ignore[return-value]
    fn = ir.Function(module, ir.FunctionType(F32, [F32]), name=name)
    fn.linkage = "internal"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def _c(x: float) -> ir.Constant:
    return ir.Constant(F32, x)


def _i(x: int) -> ir.Constant:
    return ir.Constant(I32, x)


def _exp_poly(b: ir.IRBuilder, r: ir.Value) -> ir.Value:
    fma = declare_intrinsic(b.module, "llvm.fma.f32", F32, [F32, F32, F32])
    p = _c(1 / 5040)
    for coef in (1 / 720, 1 / 120, 1 / 24, 1 / 6, 1 / 2, 1.0, 1.0):
        p = b.call(fma, [p, r, _c(coef)])
    return p


def _scale(b: ir.IRBuilder, p: ir.Value, n: ir.Value) -> ir.Value:
    """``p * 2^n`` for integer n in [-151, 129], in two steps whose factors are normal floats: the first
    product is exact, so the result is rounded once, subnormals included."""
    n1 = b.ashr(n, _i(1))
    n2 = b.sub(n, n1)
    s1 = b.bitcast(b.shl(b.add(n1, _i(127)), _i(23)), F32)
    s2 = b.bitcast(b.shl(b.add(n2, _i(127)), _i(23)), F32)
    return b.fmul(b.fmul(p, s1), s2)


def _clamp(b: ir.IRBuilder, x: ir.Value, lo: float, hi: float) -> ir.Value:
    """``x`` limited to [lo, hi], NaN kept: ``x < lo ? lo : x`` is x86's ``maxps(lo, x)`` exactly (it returns
    its second operand when either is NaN), so each end is one instruction (``llvm.maxnum`` drops NaN)."""
    x = b.select(b.fcmp_ordered("<", x, _c(lo)), _c(lo), x)
    return b.select(b.fcmp_ordered(">", x, _c(hi)), _c(hi), x)


_ROUND_MAGIC = 1.5 * 2.0 ** 23  # v + this rounds v (|v| < 2**22) to an integer held in the low mantissa bits


def _round(b: ir.IRBuilder, t: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``(n, n as i32)`` from ``t = v + _ROUND_MAGIC``: the nearest integer to ``v`` (ties to even, the
    default rounding), as a float and read from ``t``'s bits (defined for every ``t``, NaN included)."""
    n = b.fsub(t, _c(_ROUND_MAGIC))
    ni = b.sub(b.bitcast(t, I32), b.bitcast(_c(_ROUND_MAGIC), I32))
    return n, ni


def _reduced(b: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``(e**r, n as i32)`` with ``x = n ln2 + r`` (Cody-Waite, two-part ln2; `x` already limited)."""
    fma = declare_intrinsic(b.module, "llvm.fma.f32", F32, [F32, F32, F32])
    n, ni = _round(b, b.call(fma, [x, _c(_LOG2E), _c(_ROUND_MAGIC)]))
    r = b.call(fma, [n, _c(-_LN2_HI), x])
    r = b.call(fma, [n, _c(-_LN2_LO), r])
    return _exp_poly(b, r), ni


def expf(module: ir.Module) -> ir.Function:
    """``rf.expf``: f32 e**x (see the module docstring)."""
    fn, b = _function(module, "rf.expf")
    if b is None:
        return fn
    xc = _clamp(b, fn.args[0], -104.0, 89.0)  # n in [-150, 128]: 0 and inf come out of _scale (module docstring)
    p, ni = _reduced(b, xc)
    b.ret(_scale(b, p, ni))
    return fn


def expf_nonpositive(module: ir.Module) -> ir.Function:
    """``rf.expf_nonpos``: f32 e**x for x at most 0 (or NaN), `expf`'s accuracy with five instructions fewer.

    The scheduler uses it only where it has proven the argument at most 0 (a value minus its maximum:
    `redfuser/schedule/shifted_exp.py`). Then only the lower limit is needed (-104: ``n`` in [-150, 0]),
    and ``2**n`` is one scale factor and one constant: ``(p * 2**(n + 64)) * 2**-64``, where ``2**(n + 64)``
    is a normal float for every such ``n`` and the first product is exact (a normal result), so the result
    is rounded once, subnormals included, as `expf`'s two-step scale does. A positive argument is computed
    right up to x = 44 (``n + 64`` < 128) and is inf past it."""
    fn, b = _function(module, "rf.expf_nonpos")
    if b is None:
        return fn
    x = fn.args[0]
    xc = b.select(b.fcmp_ordered("<", x, _c(-104.0)), _c(-104.0), x)   # NaN kept (see `_clamp`)
    p, ni = _reduced(b, xc)
    scale = b.bitcast(b.shl(b.add(ni, _i(64 + 127)), _i(23)), F32)
    b.ret(b.fmul(b.fmul(p, scale), _c(2.0 ** -64)))
    return fn


def exp2f(module: ir.Module) -> ir.Function:
    """``rf.exp2f``: f32 2**x."""
    fn, b = _function(module, "rf.exp2f")
    if b is None:
        return fn
    x = fn.args[0]
    xc = _clamp(b, x, -151.0, 129.0)  # n in [-151, 129]: 0 and inf come out of _scale as in expf
    n, ni = _round(b, b.fadd(xc, _c(_ROUND_MAGIC)))
    r = b.fmul(b.fsub(xc, n), _c(math.log(2.0)))
    b.ret(_scale(b, _exp_poly(b, r), ni))
    return fn


def _log_parts(b: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``(e, log(m))`` with ``x = 2^e * m`` (e as f32), for finite x > 0."""
    tiny = b.fcmp_ordered("<", x, _c(2.0 ** -126))
    xs = b.select(tiny, b.fmul(x, _c(2.0 ** 23)), x)
    bits = b.bitcast(xs, I32)
    e = b.sub(b.lshr(bits, _i(23)), b.select(tiny, _i(127 + 23), _i(127)))
    m = b.bitcast(b.or_(b.and_(bits, _i(0x7FFFFF)), _i(0x3F800000)), F32)
    big = b.fcmp_ordered(">", m, _c(math.sqrt(2.0)))
    m = b.select(big, b.fmul(m, _c(0.5)), m)
    e = b.select(big, b.add(e, _i(1)), e)
    f = b.fsub(m, _c(1.0))
    s = b.fdiv(f, b.fadd(f, _c(2.0)))
    z = b.fmul(s, s)
    fma = declare_intrinsic(b.module, "llvm.fma.f32", F32, [F32, F32, F32])
    q = _c(2 / 9)
    for coef in (2 / 7, 2 / 5, 2 / 3):
        q = b.call(fma, [q, z, _c(coef)])
    lm = b.call(fma, [b.fmul(s, z), q, b.fmul(s, _c(2.0))])
    return b.sitofp(e, F32), lm


def _finish_log(b: ir.IRBuilder, x: ir.Value, res: ir.Value) -> None:
    res = b.select(b.fcmp_ordered("==", x, _c(math.inf)), x, res)
    res = b.select(b.fcmp_ordered("==", x, _c(0.0)), _c(-math.inf), res)
    bad: ir.Value = b.or_(b.fcmp_unordered("uno", x, x), b.fcmp_ordered("<", x, _c(0.0)))
    assert bad.type == I1
    b.ret(b.select(bad, _c(math.nan), res))


def logf(module: ir.Module) -> ir.Function:
    """``rf.logf``: f32 natural logarithm."""
    fn, b = _function(module, "rf.logf")
    if b is None:
        return fn
    x = fn.args[0]
    e, lm = _log_parts(b, x)
    fma = declare_intrinsic(module, "llvm.fma.f32", F32, [F32, F32, F32])
    res = b.call(fma, [e, _c(_LN2_HI), b.call(fma, [e, _c(_LN2_LO), lm])])
    _finish_log(b, x, res)
    return fn


def log2f(module: ir.Module) -> ir.Function:
    """``rf.log2f``: f32 base-2 logarithm (exact on powers of two)."""
    fn, b = _function(module, "rf.log2f")
    if b is None:
        return fn
    x = fn.args[0]
    e, lm = _log_parts(b, x)
    fma = declare_intrinsic(module, "llvm.fma.f32", F32, [F32, F32, F32])
    _finish_log(b, x, b.call(fma, [lm, _c(_LOG2E), e]))
    return fn


F32_FUNCTIONS = {"exp": expf, "exp_nonpos": expf_nonpositive, "exp2": exp2f, "log": logf, "log2": log2f}


def wide_f32(module: ir.Module, name: str) -> ir.Function:
    """``rf.<name>f``: f32 `name` (one of `wide_math.FUNCTIONS`), evaluated in f64 by `codegen/wide_math.py`."""
    fn, b = _function(module, f"rf.{name}f")
    if b is not None:
        # The fence keeps the f64 -> f32 rounding a step of its own: without it x86's code generator merges
        # it with a following f32 -> f16 store into one f64 -> f16 rounding, a call of __truncdfhf2, which
        # the JIT cannot resolve (codegen/llvm_dtypes/target.py)
        fence = declare_intrinsic(module, "llvm.arithmetic.fence.f32", F32, [F32])
        b.ret(wide_math.emit(b, name, fn.args[0]))
    return fn


def libm_f64(module: ir.Module, name: str) -> ir.Function:
    """The C library's f64 `name` (``tanh``, ``erf``...): f64 values of these functions are numpy's own."""
    existing = module.globals.get(name)
    if existing is not None:
        return existing  # type: ignore[return-value]
    return ir.Function(module, ir.FunctionType(F64, [F64]), name=name)
