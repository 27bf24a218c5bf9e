"""``tanh``, ``expm1``, ``log1p`` and ``erf`` of a 16-bit float are computed in f32 (schedule/exprs.py, `NARROW_FAST`:
a short series near 0, else one ``exp2`` or ``log``), not by the f64 series that f32 results get
(codegen/wide_math.py).

The rule's promise, as for the narrow ``exp``: the narrow result is numpy's or its neighbour (one ulp of the
narrow type), over every value of the type, special values exact (±0, ±1 at ±inf, NaN). Checked exhaustively
on the CPU backend and on the SIMT simulator (its PTX assembled); the Tile IR has no f64 ``tanh`` for narrow
results and keeps it for f32.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import run_backend

import redfuser as rf
from redfuser.ir.semantics import UnaryOp
from redfuser.ir.tile import nodes as t
from redfuser.schedule import options_for, schedule_program

NARROW = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


def tanh(x):
    return rf.tanh(x)


def expm1(x):
    return rf.expm1(x)


def log1p(x):
    return rf.log1p(x)


def erf(x):
    return rf.erf(x)


def _erf_reference(x: np.ndarray) -> np.ndarray:
    """``rf.erf`` on an ndarray (numpy has none): math.erf in float64, rounded to `x`'s dtype."""
    return rf.erf(x)


FAST = {"tanh": (tanh, np.tanh, UnaryOp.TANH), "expm1": (expm1, np.expm1, UnaryOp.EXPM1),
        "log1p": (log1p, np.log1p, UnaryOp.LOG1P), "erf": (erf, _erf_reference, UnaryOp.ERF)}


def softcap(x):
    """Gemma 2's logit soft-capping, with its input in a narrow type: the fast path inside a larger body."""
    return 30.0 * rf.tanh(x / 30.0)


def every_value(dtype) -> np.ndarray:
    """All 2**16 bit patterns of a 16-bit float type, as a [256, 256] array."""
    return np.arange(1 << 16, dtype=np.uint16).view(dtype).reshape(256, 256)


def ordered(a: np.ndarray) -> np.ndarray:
    """The 16-bit patterns of `a` mapped to integers in the order of their values (-0.0 and 0.0 one apart)."""
    bits = a.view(np.uint16).astype(np.int64)
    return np.where(bits & 0x8000, 0x8000 - (bits & 0x7FFF) - 1, 0x8000 + bits)


def unary_ops(tile_program) -> list[UnaryOp]:
    return [op.op for kernel in tile_program.kernels for op in t.walk_ops(kernel.body) if isinstance(op, t.Unary)]


@pytest.mark.parametrize("fn", sorted(FAST))
@pytest.mark.parametrize("name", ["f16", "bf16", "f32"])
def test_narrow_results_skip_the_wide_series_and_f32_keeps_it(name, fn):
    body, _, op = FAST[fn]
    x = np.ones((4, 8), dtype=NARROW.get(name, np.float32))
    program = rf.kernel(body, backend="interpret").lower(x).program
    for target in ("cpu", "gpu"):
        ops = unary_ops(schedule_program(program, options_for(target)))
        assert (op in ops) == (name == "f32"), ops


@pytest.mark.parametrize("fn", sorted(FAST))
@pytest.mark.parametrize("backend", ["cpu", "simulate"])
@pytest.mark.parametrize("name", sorted(NARROW))
def test_narrow_fast_paths_are_within_one_narrow_ulp_over_every_value(name, backend, fn):
    body, reference, _ = FAST[fn]
    x = every_value(NARROW[name])
    with np.errstate(all="ignore"):
        expected = reference(x)
    if backend == "simulate":
        (actual,), _ = run_backend(backend, body, x)
    else:
        actual = rf.kernel(body, backend=backend)(x)
    assert actual.dtype == expected.dtype
    wide_e, wide_a = expected.astype(np.float32), actual.astype(np.float32)
    nan = np.isnan(wide_e)
    assert np.array_equal(np.isnan(wide_a), nan)
    exact = ~nan & ((wide_e == 0) | (np.abs(wide_e) == 1) | np.isinf(wide_e) | np.isinf(x.astype(np.float32)))
    assert np.array_equal(actual[exact].view(np.uint16), expected[exact].view(np.uint16))   # -0.0 stays -0.0
    distance = np.abs(ordered(actual[~nan]) - ordered(expected[~nan]))
    assert distance.max() <= 1, x[~nan][np.argmax(distance)]


@pytest.mark.parametrize("name", sorted(NARROW))
def test_soft_capping_in_a_narrow_type_follows_numpy(name):
    x = (np.random.default_rng(3).standard_normal((16, 300)) * 40).astype(NARROW[name])
    got = rf.kernel(softcap, backend="cpu")(x)
    want = softcap(x)
    assert got.dtype == want.dtype
    # three roundings to the narrow type (x / 30, tanh, 30 * t): the tolerance rule counts them
    rf.testing.assert_close(got, want, want.dtype, 1, roundings=3)
