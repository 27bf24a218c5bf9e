"""``exp`` of a 16-bit float is computed as ``exp2(x * log2 e)`` in f32 (schedule/exprs.py, `_exp_as_exp2`).

The rule's promise: the narrow result is the correctly rounded exponential or its neighbour (at most one
ulp of the narrow type from numpy's), over every value of the type, special values included. Checked
exhaustively on the CPU backend and on the SIMT simulator; the structure (``exp2`` in the Tile IR for
f16/bf16, the range-reduced ``exp`` for f32) and the PTX (no range reduction) are checked too.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from redfuser.ir.tile import nodes as t
from redfuser.ir.semantics import UnaryOp

import redfuser as rf
from redfuser.schedule import options_for, schedule_program

NARROW = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


def exp(x):
    return rf.exp(x)


def every_value(dtype) -> np.ndarray:
    """All 2**16 bit patterns of a 16-bit float type, as a [256, 256] array."""
    return np.arange(1 << 16, dtype=np.uint16).view(dtype).reshape(256, 256)


def narrow_ulps(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Distance in units in the last place of the narrow type, for finite non-negative results."""
    a = actual.astype(np.float32).view(np.uint32) if actual.dtype != np.float16 else actual.view(np.uint16)
    e = expected.astype(np.float32).view(np.uint32) if expected.dtype != np.float16 else expected.view(np.uint16)
    shift = 16 if actual.dtype != np.float16 else 0   # bf16 is the top half of an f32
    return np.abs((a >> shift).astype(np.int64) - (e >> shift).astype(np.int64))


def unary_ops(tile_program) -> list[UnaryOp]:
    return [op.op for kernel in tile_program.kernels for op in t.walk_ops(kernel.body) if isinstance(op, t.Unary)]


@pytest.mark.parametrize("name,expected", [("f16", [UnaryOp.EXP2_FTZ]), ("bf16", [UnaryOp.EXP2]),
                                           ("f32", [UnaryOp.EXP])])
def test_narrow_exp_is_scheduled_as_exp2(name, expected):
    x = np.ones((4, 8), dtype=NARROW.get(name, np.float32))
    program = rf.kernel(exp, backend="interpret").lower(x).program
    for target in ("cpu", "gpu"):
        assert unary_ops(schedule_program(program, options_for(target))) == expected


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
@pytest.mark.parametrize("name", sorted(NARROW))
def test_narrow_exp_is_within_one_narrow_ulp_over_every_value(name, backend):
    x = every_value(NARROW[name])
    with np.errstate(all="ignore"):
        expected = np.exp(x)
    actual = rf.kernel(exp, backend=backend)(x)
    assert actual.dtype == expected.dtype
    nan = np.isnan(expected.astype(np.float32))
    assert np.array_equal(np.isnan(actual.astype(np.float32)), nan)
    same_class = ~nan & (np.isinf(expected.astype(np.float32)) | (expected == 0))
    assert np.array_equal(actual[same_class].astype(np.float32), expected[same_class].astype(np.float32))
    distance = narrow_ulps(actual[~nan], expected[~nan])
    assert distance.max() <= 1, x[~nan][np.argmax(distance)]


def test_narrow_exp_has_no_range_reduction_in_the_ptx():
    x = np.ones((64, 64), np.float16)
    ptx = str(rf.kernel(exp, backend="cuda", sm="sm_90").lower(x).stages["ptx"])
    assert "ex2.approx" in ptx
    assert "cvt.rni" not in ptx        # the f32 exp's rounding of x log2 e to a whole exponent
    wide = str(rf.kernel(exp, backend="cuda", sm="sm_90").lower(x.astype(np.float32)).stages["ptx"])
    assert "cvt.rni" in wide


def test_an_f16_exp_flushes_f32_subnormals_in_one_instruction_and_a_bf16_one_keeps_them():
    """f16 rounds everything below 2**-25 to 0, so its exp is ``ex2.approx.ftz`` (one SASS instruction);
    bf16 holds values down to 2**-133, so its exp is ``ex2.approx.f32`` (ptxas adds a range check and two
    multiplies to keep subnormal results). Over every value, both stay within one narrow ulp (above)."""
    x = np.ones((64, 64), np.float16)
    ptx = str(rf.kernel(exp, backend="cuda", sm="sm_90").lower(x).stages["ptx"])
    assert "ex2.approx.ftz.f32" in ptx and "ex2.approx.f32" not in ptx
    ptx = str(rf.kernel(exp, backend="cuda", sm="sm_90").lower(x.astype(ml_dtypes.bfloat16)).stages["ptx"])
    assert "ex2.approx.f32" in ptx and "ex2.approx.ftz" not in ptx
    tiny = np.array([-126.0, -127.0, -149.0, -1.0, np.nan, -np.inf], np.float32)
    from redfuser.ir.semantics import UNARY_FUNCS
    flushed = UNARY_FUNCS[UnaryOp.EXP2_FTZ](tiny)
    assert flushed.dtype == np.float32
    np.testing.assert_array_equal(flushed, [2.0**-126, 0.0, 0.0, 0.5, np.nan, 0.0])
