"""f32 ``tanh``, ``expm1``, ``log1p``, ``erf``, ``sin`` and ``cos`` (and, for the GPU, ``log``), evaluated in
f64, in plain LLVM IR.

One definition serves the CPU and the GPU code generators: each function is straight-line code (``fma``,
``rint``, integer ops on the bits, ``select``, one f64 division at most, loads from a constant table) that
`emit` writes with whichever builder it is given (`llvmlite.ir` for the host, the GPU's `TextBuilder`), so
what the accuracy test measures on the CPU is, instruction for instruction, what a GPU runs (in a kernel that
issues wgmma the one division is `correctly_rounded.quotient_f64` instead, which the test measures too).

Why f64: the argument is widened (exactly), the function is evaluated to about 1e-16 relative error by
series whose truncation is far below that, and the result is rounded to f32 once. So the f32 result is
the correctly rounded value except where the exact value lies within about 1e-16 relative of a rounding
boundary between two f32 numbers: **at most 1 ulp** from the exact value on the whole f32 range, which is
the bound `tests/test_wide_math.py` checks against numpy's float64 functions (it measures 0.5 ulp plus a
few 1e-9 ulp). The cost is f64 arithmetic (half-rate vectors on the CPU; on data-centre GPUs f64 runs at
half the f32 rate, on consumer parts far slower): these functions are meant for epilogues and soft-caps,
not inner products.

- ``expm1``: ``x = k ln2 + r`` (two-part ``ln2``, exact products for ``|k| <= 2**20``), ``|r| <= ln2/2``,
  ``expm1(r)`` by its Taylor series to ``r**13`` (truncation below 1e-18 relative), then
  ``2**k expm1(r) + (2**k - 1)`` in one ``fma``. Below -40 it is -1 (the f32 result), above 89 ``inf``.
- ``tanh(x) = e / (e + 2)`` with ``e = expm1(2|x|)`` and the sign of ``x`` (no cancellation at small ``x``);
  ``|x| >= 10`` gives +-1 (the f32 rounding of tanh there).
- ``log1p``: ``u = 1 + x`` is exact in f64 for ``|x| >= 2**-28``; ``log u = e ln2 + 2 atanh(f / (2 + f))``
  with ``u = 2**e (1 + f)``, ``1 + f`` in ``[sqrt(1/2), sqrt(2))`` and the odd series to ``s**23``. Below
  ``2**-28``: ``x - x*x/2``.
- ``erf``: the odd Taylor series at 0 for ``|x| < 0.5``; on ``[0.5, 4)`` the Taylor series of degree 22
  about the centre of each half-unit interval (coefficients from Hermite polynomials, in `_ERF_TABLE`);
  ``|x| >= 4`` gives +-1 (``erfc(4)`` is 1.5e-8, below half an f32 ulp of 1).
- ``sin``/``cos``: the argument reduction ``x = (4j + q) pi/2 + r`` is exact on the whole f32 range
  (Payne-Hanek in f64): ``|x| = m 2**e`` with the 24-bit integer ``m``, and `_TWO_OVER_PI_TABLE` holds
  ``(2**e 2/pi) mod 4`` for every ``e`` in 26-bit pieces; each product ``m * piece`` is exact in f64, so
  the quadrant and the reduced argument come out with about 2**-53 relative error even where ``x`` is
  within 2**-30 of a multiple of pi/2. Then the Taylor series of sin and cos on ``|r| <= pi/4``.

Special values are numpy's: NaN stays NaN, ``sin``/``cos`` of +-inf are NaN, ``tanh``/``erf`` of +-inf are
+-1, ``expm1(-inf) = -1``, ``log1p(-1) = -inf`` and ``log1p(x < -1) = NaN``; every odd function keeps the
sign of a zero.
"""
from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Callable

import llvmlite.ir as ir

from .llvm_utils import F32, F64, I1, I32, I64, PTR, call_intrinsic

FUNCTIONS = ("tanh", "expm1", "log1p", "erf", "sin", "cos")
"""The functions both code generators take from `emit`, by their numpy names (`ir.semantics.WIDE_MATH`)."""

GPU_FUNCTIONS = ("log",)
"""The functions only the GPU's takes from `emit`: its hardware ``lg2.approx`` has an absolute error of about
2**-22 near 1 (``log(1.00001)`` up to 3.6% off; found by a helper), where the CPU's ``log`` is its own."""

ULP_BOUND = 1.0
"""The documented error bound of every function here, in f32 ulps of the exact value (module docstring)."""


# -- constants, computed once from exact arithmetic -----------------------------------------------------

def _pi_scaled(bits: int) -> int:
    """``floor(pi * 2**bits)`` (Machin's formula in integers, with guard bits)."""
    guard = bits + 64
    one = 1 << guard

    def atan_inv(n: int) -> int:
        total, term, k, sign = 0, one // n, 1, 1
        while term:
            total += sign * (term // k)
            term //= n * n
            k += 2
            sign = -sign
        return total

    return (16 * atan_inv(5) - 4 * atan_inv(239)) >> 64


_PIECE = 26          # bits per table piece: a 24-bit m times a piece is exact in f64 (50 bits)
_E_MIN, _E_MAX = -24, 104   # exponents of |x| = m * 2**e for f32 |x| >= pi/4 (m in [2**23, 2**24))


@lru_cache(maxsize=None)
def _two_over_pi_table() -> tuple[float, ...]:
    """Four 26-bit pieces of ``(2**e * 2/pi) mod 4`` for each ``e`` in [_E_MIN, _E_MAX]: the first holds
    the bits 2**1 .. 2**-24, the next 2**-25 .. 2**-50, and so on (their sum is ``(2**e 2/pi) mod 4``
    truncated to a multiple of 2**-102)."""
    frac = 4 * _PIECE - 2                                   # the pieces' resolution: 2**-102
    scale = _E_MAX + frac + 64                              # 2/pi to 2**-scale
    two_over_pi = (1 << (2 * scale + 1)) // _pi_scaled(scale)   # floor(2/pi * 2**scale), to within 1
    table: list[float] = []
    for e in range(_E_MIN, _E_MAX + 1):
        window = (two_over_pi >> (scale - frac - e)) % (4 << frac)   # (2**e 2/pi) mod 4, in units of 2**-frac
        for i in range(4):
            shift = (3 - i) * _PIECE
            table.append(math.ldexp((window >> shift) & ((1 << _PIECE) - 1), shift - frac))
    return tuple(table)


_ERF_WIDTH = 0.5
_ERF_PIECES = 7           # [0.5, 1), [1, 1.5), ..., [3.5, 4)
_ERF_DEGREE = 22


@lru_cache(maxsize=None)
def _erf_table() -> tuple[float, ...]:
    """Taylor coefficients of erf about each centre ``c = 0.75, 1.25, ..., 3.75`` (degree 22, ``|h| <= 1/4``).

    ``erf^(k)(c) = 2/sqrt(pi) (-1)**(k-1) H_{k-1}(c) exp(-c*c)`` with the physicists' Hermite polynomials
    ``H``, evaluated exactly in rationals (``c`` is a quarter-integer) and scaled once in floats."""
    table: list[float] = []
    for piece in range(_ERF_PIECES):
        c = Fraction(3, 4) + piece * Fraction(1, 2)
        scale = 2 / math.sqrt(math.pi) * math.exp(-float(c * c))
        h_prev, h = Fraction(0), Fraction(1)          # H_{-1} (unused) and H_0
        coefs = [math.erf(float(c))]
        for k in range(1, _ERF_DEGREE + 1):          # coefficient of h**k: erf^(k)(c) / k!
            n = k - 1                                 # uses H_n
            coefs.append(float((-1) ** n * h / math.factorial(k)) * scale)
            h_prev, h = h, 2 * c * h - 2 * n * h_prev   # H_{n+1} = 2c H_n - 2n H_{n-1}
        table.extend(coefs)
    return tuple(table)


_LN2_HI = float.fromhex("0x1.62e42fee00000p-1")   # ln 2 to 32 bits: k * _LN2_HI exact for |k| < 2**20
_LN2_LO = math.log(2.0) - _LN2_HI
_PIO2_HI = math.pi / 2
_PIO2_LO = 6.123233995736766e-17                  # pi/2 - _PIO2_HI


# -- emission helpers (any builder with llvmlite's interface) ------------------------------------------

def _d(x: float) -> ir.Constant:
    return ir.Constant(F64, x)


def _fma(b, x, y, z):
    return call_intrinsic(b, "llvm.fma.f64", F64, [x, y, z])


def _horner(b, x, coefs) -> ir.Value:
    """``sum(coefs[i] * x**i)`` by Horner's rule with fused multiply-adds."""
    acc = _d(coefs[-1])
    for c in reversed(coefs[:-1]):
        acc = _fma(b, acc, x, _d(c))
    return acc


def _nan_kept(b, x, r):
    """`r`, or `x` itself where `x` is NaN (each function's NaN in gives the same NaN out)."""
    return b.select(b.fcmp_unordered("uno", x, x), x, r)


def _nan_to_zero(b, x, otherwise):
    """0.0 where `x` is NaN, else `otherwise` (an argument safe for the integer conversions that follow)."""
    return b.select(b.fcmp_unordered("uno", x, x), _d(0.0), otherwise)


def _select_ordered(b, cond_op: str, x, limit: float, then):
    """``then if x <cond_op> limit else x`` (ordered compare: NaN keeps ``x``)."""
    return b.select(b.fcmp_ordered(cond_op, x, _d(limit)), then, x)


def _pow2(b, k) -> ir.Value:
    """``2**k`` as f64 for an integral f64 ``k`` in [-1022, 1023] (built in the exponent bits)."""
    bits = b.shl(b.add(b.fptosi(k, I64), ir.Constant(I64, 1023)), ir.Constant(I64, 52))
    return b.bitcast(bits, F64)


def _expm1_wide(b, x) -> ir.Value:
    """``expm1`` of an f64 value in [-40, 90] (NaN kept by the caller's selects)."""
    k = call_intrinsic(b, "llvm.rint.f64", F64, [b.fmul(x, _d(1 / math.log(2.0)))])
    r = _fma(b, k, _d(-_LN2_HI), x)
    r = _fma(b, k, _d(-_LN2_LO), r)
    p = b.fmul(r, _horner(b, r, [1.0 / math.factorial(n + 1) for n in range(13)]))   # r + r^2/2 + ... + r^13/13!
    t = _pow2(b, k)
    return _fma(b, p, t, b.fsub(t, _d(1.0)))


def _expm1(b, x32) -> ir.Value:
    x = b.fpext(x32, F64)
    clamped = _select_ordered(b, "<", x, -40.0, _d(-40.0))
    clamped = _select_ordered(b, ">", clamped, 90.0, _d(90.0))
    clamped = _nan_to_zero(b, x, clamped)     # NaN: no poison from fptosi
    r = _expm1_wide(b, clamped)
    r = b.select(b.fcmp_ordered("==", x, _d(0.0)), x, r)                      # keeps -0.0
    return _nan_kept(b, x, r)


def _tanh(b, x32, divide) -> ir.Value:
    x = b.fpext(x32, F64)
    a = call_intrinsic(b, "llvm.fabs.f64", F64, [x])
    a = _nan_to_zero(b, a, _select_ordered(b, ">", a, 10.0, _d(10.0)))
    e = _expm1_wide(b, b.fmul(a, _d(2.0)))
    t = divide(b, e, b.fadd(e, _d(2.0)))                       # e + 2 in [2, 5e8]
    t = b.select(b.fcmp_ordered("==", a, _d(0.0)), a, t)
    r = call_intrinsic(b, "llvm.copysign.f64", F64, [t, x])
    return _nan_kept(b, x, r)


def _log_wide(b, u, divide) -> ir.Value:
    """``log`` of a normal positive finite f64 ``u``."""
    bits = b.bitcast(u, I64)
    e = b.sub(b.lshr(bits, ir.Constant(I64, 52)), ir.Constant(I64, 1023))
    m = b.bitcast(b.or_(b.and_(bits, ir.Constant(I64, (1 << 52) - 1)), ir.Constant(I64, 1023 << 52)), F64)
    big = b.fcmp_ordered(">", m, _d(math.sqrt(2.0)))
    m = b.select(big, b.fmul(m, _d(0.5)), m)
    e = b.select(big, b.add(e, ir.Constant(I64, 1)), e)
    f = b.fsub(m, _d(1.0))
    s = divide(b, f, b.fadd(f, _d(2.0)))                       # f + 2 in [1.7, 2.5]
    z = b.fmul(s, s)
    series = _horner(b, z, [2.0 / (2 * n + 1) for n in range(12)])              # 2 atanh(s) / s to s^22
    ef = b.sitofp(e, F64)
    return _fma(b, ef, _d(math.log(2.0)), b.fmul(s, series))


def _log_f64(b, u, divide) -> ir.Value:
    """``log`` of an f64 `u` with its special values: ``log(0) = -inf``, below 0 NaN, ``log(inf) = inf`` (a NaN
    comes out of the comparisons as 1's log; each caller keeps its NaN with `_nan_kept`)."""
    safe = b.select(b.fcmp_ordered(">", u, _d(0.0)), u, _d(1.0))
    safe = _select_ordered(b, ">", safe, 1e300, _d(1.0))                     # inf: patched below
    r = _log_wide(b, safe, divide)
    r = b.select(b.fcmp_ordered("==", u, _d(0.0)), _d(-math.inf), r)
    r = b.select(b.fcmp_ordered("<", u, _d(0.0)), _d(math.nan), r)
    return b.select(b.fcmp_ordered("==", u, _d(math.inf)), u, r)


def _log(b, x32, divide) -> ir.Value:
    """``log`` of an f32, through its exact widening (an f32 subnormal is a normal f64); NaN kept."""
    x = b.fpext(x32, F64)
    return _nan_kept(b, x, _log_f64(b, x, divide))


def _log1p(b, x32, divide) -> ir.Value:
    """``log1p`` of an f32: the log of ``1 + x`` (exact in f64 for ``|x| >= 2**-28``; -1 gives 0, so -inf),
    below ``2**-28`` ``x - x*x/2``; NaN kept."""
    x = b.fpext(x32, F64)
    r = _log_f64(b, b.fadd(x, _d(1.0)), divide)
    small = b.fsub(x, b.fmul(b.fmul(x, x), _d(0.5)))
    a = call_intrinsic(b, "llvm.fabs.f64", F64, [x])
    r = b.select(b.fcmp_ordered("<", a, _d(2.0 ** -28)), small, r)
    return _nan_kept(b, x, r)


def _table(b, name: str, values: tuple[float, ...], space: int):
    """The internal constant f64 array `name` holding `values` (declared once per module)."""
    module = b.module
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    array = ir.ArrayType(F64, len(values))
    init = ir.Constant(array, [ir.Constant(F64, v) for v in values])
    if isinstance(module, ir.Module):
        var = ir.GlobalVariable(module, array, name, addrspace=space)
        var.global_constant = True
        var.type = ir.PointerType(addrspace=space)     # opaque pointer, as the builders' GEPs expect
    else:
        var = module.add_global_variable(array, name, addrspace=space)
    var.linkage = "internal"
    var.initializer = init
    var.align = 8
    return var


def _load(b, table, index, space: int):
    ptr = b.gep(table, [index], source_etype=F64)
    return b.load(ptr, typ=F64)


def _erf(b, x32, space: int) -> ir.Value:
    x = b.fpext(x32, F64)
    a = call_intrinsic(b, "llvm.fabs.f64", F64, [x])
    a = _nan_to_zero(b, a, _select_ordered(b, ">", a, 4.0, _d(4.0)))
    z = b.fmul(a, a)
    # |x| < 0.5: erf(x) = 2/sqrt(pi) sum (-1)^n x^(2n+1) / (n! (2n+1)), to n = 13 (below 1e-19 relative)
    near0 = b.fmul(a, _horner(b, z, [2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1))
                                     for n in range(14)]))
    # 0.5 <= |x| < 4: Taylor about the centre of the half-unit interval
    piece = b.fptosi(call_intrinsic(b, "llvm.floor.f64", F64, [b.fmul(a, _d(1 / _ERF_WIDTH))]), I32)
    piece = b.sub(piece, ir.Constant(I32, 1))
    inside = b.and_(b.icmp_signed(">=", piece, ir.Constant(I32, 0)),
                    b.icmp_signed("<", piece, ir.Constant(I32, _ERF_PIECES)))
    piece = b.select(inside, piece, ir.Constant(I32, 0))
    h = b.fsub(a, b.fadd(b.fmul(b.sitofp(piece, F64), _d(_ERF_WIDTH)), _d(0.75)))
    table = _table(b, "rf.erf_taylor", _erf_table(), space)
    base = b.mul(piece, ir.Constant(I32, _ERF_DEGREE + 1))
    acc = _load(b, table, b.add(base, ir.Constant(I32, _ERF_DEGREE)), space)
    for k in range(_ERF_DEGREE - 1, -1, -1):
        acc = _fma(b, acc, h, _load(b, table, b.add(base, ir.Constant(I32, k)), space))
    r = b.select(b.fcmp_ordered("<", a, _d(0.5)), near0, acc)
    r = b.select(b.fcmp_ordered(">=", a, _d(4.0)), _d(1.0), r)
    r = b.select(b.fcmp_ordered("==", a, _d(0.0)), a, r)
    r = call_intrinsic(b, "llvm.copysign.f64", F64, [r, x])
    return _nan_kept(b, x, r)


def _sincos_reduce(b, x32, space: int):
    """``(q, r)``: ``|x| = (4j + q) pi/2 + r`` with the integer quadrant ``q`` (i32, 0..3) and ``|r| <= pi/4``
    (f64); exact reduction on the whole f32 range (module docstring). NaN and inf give garbage (patched)."""
    bits = b.and_(b.bitcast(x32, I32), ir.Constant(I32, 0x7FFFFFFF))
    a = b.fpext(b.bitcast(bits, F32), F64)
    biased = b.lshr(bits, ir.Constant(I32, 23))
    m = b.sitofp(b.or_(b.and_(bits, ir.Constant(I32, 0x7FFFFF)), ir.Constant(I32, 0x800000)), F64)
    index = b.sub(biased, ir.Constant(I32, 127 + 23 + _E_MIN))
    big = b.icmp_signed(">=", index, ir.Constant(I32, 0))
    index = b.select(b.and_(big, b.icmp_signed("<=", index, ir.Constant(I32, _E_MAX - _E_MIN))),
                     index, ir.Constant(I32, 0))
    table = _table(b, "rf.two_over_pi", _two_over_pi_table(), space)
    base = b.mul(index, ir.Constant(I32, 4))
    t = [_load(b, table, b.add(base, ir.Constant(I32, i)), space) for i in range(4)]
    p0 = b.fmul(m, t[0])                                                   # exact: < 2**26, multiple of 2**-24
    a0 = b.fsub(p0, b.fmul(call_intrinsic(b, "llvm.floor.f64", F64, [b.fmul(p0, _d(0.25))]), _d(4.0)))
    s = b.fadd(a0, b.fmul(m, t[1]))                                        # exact: 53 bits from 2**2 to 2**-50
    k = call_intrinsic(b, "llvm.rint.f64", F64, [s])
    f = b.fsub(s, k)
    f = b.fadd(b.fadd(f, b.fmul(m, t[2])), b.fmul(m, t[3]))
    r_big = _fma(b, f, _d(_PIO2_HI), b.fmul(f, _d(_PIO2_LO)))
    q_big = b.and_(b.fptosi(k, I32), ir.Constant(I32, 3))
    small = b.fcmp_ordered("<=", a, _d(math.pi / 4))
    r = b.select(small, a, r_big)
    q = b.select(small, ir.Constant(I32, 0), q_big)
    return q, r


def _sin_cos_poly(b, r):
    z = b.fmul(r, r)
    sin_r = b.fmul(r, _horner(b, z, [(-1) ** n / math.factorial(2 * n + 1) for n in range(10)]))
    cos_r = _horner(b, z, [(-1) ** n / math.factorial(2 * n) for n in range(10)])
    return sin_r, cos_r


def _sin_or_cos(b, x32, space: int, cosine: bool) -> ir.Value:
    q, r = _sincos_reduce(b, x32, space)
    sin_r, cos_r = _sin_cos_poly(b, r)
    if cosine:                                                  # cos(q pi/2 + r): cos, -sin, -cos, sin
        q = b.add(q, ir.Constant(I32, 1))                       # cos(y) = sin(y + pi/2)
        q = b.and_(q, ir.Constant(I32, 3))
    odd = b.icmp_signed("!=", b.and_(q, ir.Constant(I32, 1)), ir.Constant(I32, 0))
    value = b.select(odd, cos_r, sin_r)
    negate = b.icmp_signed("!=", b.and_(q, ir.Constant(I32, 2)), ir.Constant(I32, 0))
    value = b.select(negate, b.fneg(value), value)
    x = b.fpext(x32, F64)
    if not cosine:                                              # sin is odd: the sign of x (and of -0.0)
        value = b.select(b.fcmp_ordered("<", x, _d(0.0)), b.fneg(value), value)
        value = b.select(b.fcmp_ordered("==", x, _d(0.0)), x, value)
    finite = b.fcmp_ordered("<", call_intrinsic(b, "llvm.fabs.f64", F64, [x]), _d(math.inf))
    return b.select(finite, value, _d(math.nan))


def _fdiv(b, x, y):
    return b.fdiv(x, y)


def emit(b, name: str, x: ir.Value, *, table_space: int = 0, divide: Callable = _fdiv) -> ir.Value:
    """`name` (one of `FUNCTIONS` or `GPU_FUNCTIONS`) of the f32 scalar `x`, as an f32; `table_space` is the address space of
    the constant tables ``erf``, ``sin`` and ``cos`` read (0 on the CPU, 1, global, on NVPTX). `divide`
    ``(b, x, y)`` makes the one f64 quotient of ``tanh``, ``log1p`` and ``log`` (its divisor is in [1.7, 5e8]): ``fdiv``,
    or in a GPU kernel that must not call a subroutine `correctly_rounded.quotient_f64` (within an f64 ulp,
    which the 1-ulp bound of the f32 result absorbs; `tests/test_wide_math.py` measures both)."""
    makers: dict[str, Callable] = {
        "tanh": lambda: _tanh(b, x, divide), "expm1": lambda: _expm1(b, x), "log1p": lambda: _log1p(b, x, divide),
        "erf": lambda: _erf(b, x, table_space), "sin": lambda: _sin_or_cos(b, x, table_space, False),
        "cos": lambda: _sin_or_cos(b, x, table_space, True), "log": lambda: _log(b, x, divide),
    }
    return b.fptrunc(makers[name](), F32)


__all__ = ["FUNCTIONS", "GPU_FUNCTIONS", "ULP_BOUND", "emit"]
