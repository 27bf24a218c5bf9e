"""numpy's integer ``//`` and ``%`` in LLVM IR (host and NVPTX alike, scalars or vectors).

numpy floors the quotient (``-7 // 2 == -4``) and gives the remainder the divisor's sign
(``-7 % 2 == 1``); a zero divisor gives 0 for both (with a warning numpy prints), and
``INT_MIN // -1`` wraps to ``INT_MIN`` (``% -1`` is 0). LLVM's ``sdiv``/``srem`` truncate, and a zero
divisor or ``INT_MIN / -1`` is undefined behaviour (a trap on x86), so both are divided by 1 instead
and the result chosen by a select.
"""
from __future__ import annotations

import llvmlite.ir as ir

from .llvm_utils import splat


def _parts(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """(floored quotient, floored remainder) for divisors other than 0 and -1, and the two masks."""
    t = x.type
    zero, one, minus_one = splat(t, 0), splat(t, 1), splat(t, -1)
    by_zero = b.icmp_signed("==", y, zero)
    by_minus_one = b.icmp_signed("==", y, minus_one)
    safe = b.select(b.or_(by_zero, by_minus_one), one, y)
    q, r = b.sdiv(x, safe), b.srem(x, safe)
    # truncation rounded toward 0: where the remainder's sign differs from the divisor's, step down
    adjust = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, safe), zero))
    q = b.select(adjust, b.sub(q, one), q)
    r = b.select(adjust, b.add(r, safe), r)
    return q, r, by_zero, by_minus_one


def floor_divide(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """``x // y`` of signed integers as numpy computes it (module docstring)."""
    q, _, by_zero, by_minus_one = _parts(b, x, y)
    zero = splat(x.type, 0)
    q = b.select(by_minus_one, b.sub(zero, x), q)     # wraps at INT_MIN, as numpy's does
    return b.select(by_zero, zero, q)


def remainder(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """``x % y`` of signed integers as numpy computes it (module docstring)."""
    _, r, by_zero, by_minus_one = _parts(b, x, y)
    zero = splat(x.type, 0)
    return b.select(b.or_(by_zero, by_minus_one), zero, r)
