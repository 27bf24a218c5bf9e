"""The compiled CPU backend: every workload runs natively and equals its numpy reference (random programs,
attention and masked rows on every backend: `test_end_to_end.py`);
exp/log are accurate to a few ulp with numpy's special values; LLVM modules verify and vectorize."""
from __future__ import annotations

import re
from dataclasses import replace
from functools import partial

import ml_dtypes
import numpy as np
import pytest
from helpers import QUANTIZATION_BOUNDS, run_backend, within_quantization_bound
from hypothesis import given, note

import redfuser as rf
from redfuser.codegen import native
from redfuser.testing import assert_close
from redfuser.testing.strategies import programs
from redfuser.testing.tolerance import wide_reference
from redfuser.workloads import WORKLOADS, attention, log_softmax, softmax

CPU_WORKLOADS = list(WORKLOADS)


run_cpu = partial(run_backend, "cpu")
"""(compiled outputs, reference outputs), checking the inputs come back untouched."""


@pytest.mark.parametrize("name", CPU_WORKLOADS)
@pytest.mark.parametrize("fuse", [True, False])
def test_workloads(name, fuse):
    w = WORKLOADS[name]
    args = w.make_inputs(np.random.default_rng(7))
    actual, expected = run_cpu(w.fn, *args, fuse=fuse)
    if name in QUANTIZATION_BOUNDS:  # quantizing with the running absmax: within the quantization error
        assert within_quantization_bound(name, actual[0], *args)
        return
    for a, e in zip(actual, expected):
        assert_close(a, e, e.dtype, args[0].shape[-1])


@given(programs(max_steps=3, max_size=128, allow_zero=True))
def test_random_programs_with_empty_dimensions(program):
    note(repr(program))
    actual, expected = run_cpu(program.body, *program.inputs)
    for a, e in zip(actual, expected):
        assert_close(a, np.asarray(e), program.dtype, program.reduction_length, repr(program), scale=program.scale,
                     any_nonfinite=True)


def test_f16_is_a_storage_type_so_random_programs_that_overflow_it_midway_are_not_drawn():
    # Found by the fuzz profile: numpy rounds x**4 = 65536 to inf in f16 and inf - inf is NaN; a compiled kernel
    # computes in f32 and stores 0. That is the documented numerics (docs/cpu-backend.md), so the generator keeps
    # such programs out, and this one is what it must recognize.
    from redfuser.testing.random_program import RandomProgram, Step
    from redfuser.testing.strategies import _same_nonfinite, _storage_outputs

    program = RandomProgram(("x0",), (np.array([16.0, 0.822], np.float16),),
                            (Step("v0", "mul", "x0", "x0"), Step("v1", "mul", "v0", "v0"),
                             Step("v2", "sub", "v1", "v1")),
                            ("v2",), np.dtype(np.float16), 1, 256.0)
    with np.errstate(all="ignore"):
        reference = program.body(*program.inputs)
    compiled = run_cpu(program.body, *program.inputs)[0][0]
    storage = _storage_outputs(program)
    assert np.isnan(reference[0]) and compiled[0] == 0 and storage[0][0] == 0
    assert not _same_nonfinite([reference], storage)
    x = np.array([4.0, 0.822], np.float16)                       # no overflow midway: kept
    assert _same_nonfinite([program.body(x)], _storage_outputs(replace(program, inputs=(x,))))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_low_precision_inputs_compute_in_f32(dtype):
    # Against the body evaluated in float64 and rounded once (numpy's own bf16 sums add in bf16): one
    # rounding each side (redfuser.testing.tolerance); the attention's scale 1/4 is exact in f16.
    roundings = 1 if dtype is ml_dtypes.bfloat16 else 2
    x = (np.random.default_rng(1).standard_normal((9, 70)) * 3).astype(dtype)
    for fn in (softmax, log_softmax):
        actual, _ = run_cpu(fn, x)
        assert_close(actual[0], wide_reference(fn, x), dtype, 70, roundings=roundings)
    q = np.random.default_rng(2).standard_normal((1, 2, 19, 16)).astype(dtype)
    actual, expected = run_cpu(attention, q, q, q)
    # the output's dtype: numpy's bf16 matmul gives f32, so bf16 attention is an f32 result
    assert_close(actual[0], wide_reference(attention, q, q, q), expected[0].dtype, 19, roundings=roundings)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.int32, np.bool_])
def test_casts_round_like_numpy(dtype):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(3000) * 300, rng.standard_normal(3000) * 1e-3,
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 470, 2.0**-9, 3e38, -2.0**-10]]).astype(np.float32)
    if dtype is np.int32:
        x = x[np.abs(x) < 2**31]  # numpy's NaN/inf/out-of-range -> int conversion is undefined behaviour in C

    def cast(a):
        return a.astype(dtype)

    actual, expected = run_cpu(cast, x)
    a, e = actual[0], expected[0]
    assert a.dtype == e.dtype
    assert np.array_equal(a.view(np.uint8), e.view(np.uint8)), np.flatnonzero(a.view(np.uint8) != e.view(np.uint8))[:5]
    back, ref = run_cpu(lambda a: a.astype(np.float32), e)
    assert np.array_equal(back[0], ref[0], equal_nan=True)


def ulps(actual: np.ndarray, expected: np.ndarray) -> float:
    ok = np.isfinite(expected) & (expected != 0)
    return float((np.abs(actual[ok].astype(np.float64) - expected[ok]) / np.spacing(np.abs(expected[ok]))).max())


@pytest.mark.parametrize("fn,low,high,limit", [(rf.exp, -110, 95, 2), (rf.exp2, -160, 135, 3),
                                               (rf.log, 0, 50, 3), (rf.log2, 0, 50, 3)])
def test_exp_and_log_are_accurate_with_numpys_special_values(fn, low, high, limit):
    rng = np.random.default_rng(4)
    if fn in (rf.log, rf.log2):
        base = np.exp(rng.uniform(-100, 88, 20000))
    else:
        base = rng.uniform(low, high, 20000)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 2.0, 8.0, 0.5, -1.0, 1e-40, 1e-45, 3.4e38, 88.72, 88.73,
               -87.3, -103.9, -104.0, -150.0, 127.9, 128.0, 1.0000001, 0.99999994]
    x = np.concatenate([base, rng.standard_normal(2000), special]).astype(np.float32)
    actual, expected = run_cpu(lambda a: fn(a), x)
    a, e = actual[0], expected[0]
    assert np.array_equal(np.isnan(a), np.isnan(e))
    assert np.array_equal(a[np.isinf(e)], e[np.isinf(e)])
    flushed = (a == 0) != (e == 0)  # numpy's exp2 flushes some results below 2**-149 to zero
    assert (np.abs(a - e)[flushed] <= 2.0**-148).all()
    assert ulps(a, e) <= limit


def test_max_and_min_propagate_nan_like_numpy():
    x = np.random.default_rng(5).standard_normal((4, 50)).astype(np.float32)
    x[1, 17] = np.nan
    x[2, 0] = np.nan
    y = x[::-1].copy()
    for body in (lambda a, b: rf.maximum(a, b), lambda a, b: rf.minimum(a, b),
                 lambda a, b: rf.max(a, axis=-1), lambda a, b: rf.min(a, axis=0), lambda a, b: rf.max(a)):
        actual, expected = run_cpu(body, x, y)
        assert_close(actual[0], expected[0], np.float32, 1)


def test_thread_counts_agree():
    x = np.random.default_rng(6).standard_normal((33, 200)).astype(np.float32)
    one = rf.kernel(softmax, backend="cpu", num_threads=1)(x)
    two = rf.kernel(softmax, backend="cpu", num_threads=2)(x)
    assert np.array_equal(one, two)


def test_ranking_int64_values_says_it_is_not_compiled():
    x = np.zeros((4, 8), np.int64)
    with pytest.raises(rf.BackendError, match="rf.topk"):
        rf.kernel(lambda x: rf.topk(x, 2)[0], backend="cpu")(x)


# ---------------------------------------------------------------------------------------------
# the LLVM side: stages, verification, vectorization, the compile cache
# ---------------------------------------------------------------------------------------------
def test_llvm_stage_is_opaque_pointer_ir_that_vectorizes():
    x = np.zeros((64, 1000), np.float32)
    lowered = rf.kernel(softmax, backend="cpu").lower(x)
    assert list(lowered.stages)[-3:] == ["tile", "llvm", "native"]
    text = str(lowered.stages["llvm"])
    assert "define void @" in text and "ptr noalias" in text
    assert not re.search(r"(float|i32|i8|half|double)\*", text), "typed pointers in the module"
    optimized = native.optimized_ir(text)
    assert re.search(r"<(8|16) x float>", optimized), "no vector code"
    assert "@rf.expf" not in optimized.split("define", 1)[1] or "call float @rf.expf" not in optimized
    assert re.search(r"fmul <(8|16) x float>", optimized)
    asm = native.assembly(text)
    assert re.search(r"\bv(add|mul|fmadd\w*|max)ps\b.*[yz]mm", asm)


@pytest.mark.skipif("+avx512f" not in native.host_target().features.split(","), reason="needs an AVX-512 host")
def test_elementwise_loops_use_the_full_512_bit_width_on_avx512_hosts():
    """LLVM's tuning for AVX-512 cores prefers 256-bit loops; the host target turns that off
    (`native.FULL_WIDTH_VECTORS`), so a softmax's exp and division loops run 16 lanes wide (rows of 1024:
    no tails, which take narrower vectors)."""
    x = np.zeros((64, 1024), np.float32)
    text = str(rf.kernel(softmax, backend="cpu").lower(x).stages["llvm"])
    asm = native.assembly(text)
    assert re.search(r"\bv(mul|fmadd\w*|div)ps\b[^\n]*zmm", asm), "no 512-bit arithmetic"
    assert not re.search(r"\bv(mul|fmadd\w*|div)ps\b[^\n]*ymm", asm), "256-bit loops remain"


def test_compile_cache_serves_the_second_build(tmp_path, monkeypatch):
    from redfuser.runtime.cache import reset_default_cache

    monkeypatch.setenv("REDFUSER_CACHE_DIR", str(tmp_path))
    reset_default_cache()
    try:
        x = np.ones((3, 5), np.float32)
        first = rf.kernel(log_softmax, backend="cpu")
        first(x)
        assert first.lower(x).artifacts["compile"].source == "build"
        second = rf.kernel(log_softmax, backend="cpu")
        second(x)
        assert second.lower(x).artifacts["compile"].source == "memory"
        reset_default_cache()  # a new process would find it on disk
        third = rf.kernel(log_softmax, backend="cpu")
        np.testing.assert_array_equal(third(x), first(x))
        assert third.lower(x).artifacts["compile"].source == "disk"
    finally:
        reset_default_cache()
