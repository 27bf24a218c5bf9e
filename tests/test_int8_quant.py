"""Per-token int8 quantization (``clip(rint(x / s), -127, 127)``) fused with its GEMM, like the FP8 case.

Two checks, per output element, with ``a_i = max_k |x_ik|`` and ``s_j`` the weight scale
(`redfuser/fusion/grid_quantization.py`, docs/fusion.md "Quantization inside a cascade"):

1. the quantization bound against the exact product: ``|out - x@w*s| <= s_j Σ_k |w_kj| (a_i/127)/2``
   (plus the f32 accumulation), met by the unfused body and by the fused loop, which rounds each chunk with
   its running absmax ``a_t <= a_i``;
2. on rows whose absmax occurs in every 16-element window, every chunking rounds exactly like the body:
   the fused result equals the numpy body within f32 accumulation, which an unquantized GEMM or an output
   off by 1% does not.
"""
from __future__ import annotations


import numpy as np
import pytest

import redfuser as rf
from helpers import assemble_without_spills
from redfuser import workloads as W
from redfuser.testing.quantization import int8_quantization_bound

K = 160


def _inputs(seed: int, repeat_absmax: bool = False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((9, K)).astype(np.float32)
    x[2, :40] = 0                     # leading zeros: the running absmax starts at 0
    x[3] *= 50                        # a large row
    if repeat_absmax:                 # every 16-element window holds the row's absmax
        a = np.abs(x).max(axis=1, keepdims=True) * 1.5
        x[:, ::16] = np.where(np.arange(x.shape[1] // 16) % 2 == 0, a, -a)
    w = rng.integers(-127, 128, (K, 11)).astype(np.float32)
    ws = rng.uniform(0.001, 0.01, 11).astype(np.float32)
    return x, w, ws


def _accumulation(x, w, ws):
    """The f32 accumulation's share: K ulps of the sum of |terms| (any order), scaled like the output."""
    a = np.abs(x.astype(np.float64)).max(axis=1, keepdims=True)
    return K * 2.0**-23 * (127.0 * np.ones_like(x, np.float64) @ np.abs(w.astype(np.float64))) * (a / 127) * ws


def _exact(x, w, ws):
    return (x.astype(np.float64) @ w.astype(np.float64)) * ws


@pytest.mark.parametrize("chunk", [1, 16, 48, 1024])
def test_fused_int8_gemm_is_within_the_quantization_bound(chunk):
    x, w, ws = _inputs(chunk)
    k = rf.kernel(W.int8_quant_gemm, backend="interpret", interpret_chunk=chunk)
    (g,) = k.lower(x, w, ws).groups
    assert g.fused
    out, ref = k(x, w, ws), W.int8_quant_gemm(x, w, ws)
    bound = int8_quantization_bound(x, w, ws)
    ok = ~np.isnan(ref)
    assert np.all(np.abs(ref - _exact(x, w, ws))[ok] <= bound[ok])   # the unfused body meets the bound
    assert np.all(np.abs(out - _exact(x, w, ws))[ok] <= bound[ok])   # and so does the fused loop
    assert np.array_equal(np.isnan(out), np.isnan(ref))


@pytest.mark.parametrize("backend", ["interpret", "cpu", "simulate"])
def test_rows_repeating_their_absmax_round_exactly_like_the_body(backend):
    x, w, ws = _inputs(5, repeat_absmax=True)
    k = rf.kernel(W.int8_quant_gemm, backend=backend)
    assert [g.fused for g in k.lower(x, w, ws).groups] == [True]
    out, ref = k(x, w, ws), W.int8_quant_gemm(x, w, ws)
    allowance = _accumulation(x, w, ws) + 2.0**-22 * np.abs(ref)
    assert np.all(np.abs(out - ref) <= allowance)


def test_the_exact_check_fails_on_planted_wrong_kernels():
    """Check 2 has teeth: a GEMM that never rounds, or an output off by 1%, is far outside its allowance."""
    x, w, ws = _inputs(5, repeat_absmax=True)
    ref = W.int8_quant_gemm(x, w, ws)
    allowance = _accumulation(x, w, ws) + 2.0**-22 * np.abs(ref)
    unquantized = (x.astype(np.float64) @ w) * ws
    for planted in (unquantized, ref * 1.01):
        assert np.any(np.abs(planted - ref) > allowance)


def test_the_bound_fails_on_a_planted_wrong_kernel():
    x, w, ws = _inputs(6)
    bound = int8_quantization_bound(x, w, ws)
    ref = W.int8_quant_gemm(x, w, ws)
    assert np.any(np.abs(ref * 0.9 - _exact(x, w, ws)) > bound)


def _clipped_at_100(x, w, ws):
    s = rf.max(rf.abs(x), axis=-1, keepdims=True) / 127.0
    return (rf.clip(rf.rint(x / s), -100.0, 100.0) @ w) * s * ws


def _floored(x, w, ws):
    s = rf.max(rf.abs(x), axis=-1, keepdims=True) / 127.0
    return (rf.clip(rf.floor(x / s), -127.0, 127.0) @ w) * s * ws


def _scaled_by_a_plain_max(x, w, ws):
    s = rf.max(x, axis=-1, keepdims=True) / 127.0
    return (rf.clip(rf.rint(x / s), -127.0, 127.0) @ w) * s * ws


@pytest.mark.parametrize("body", [_clipped_at_100, _floored, _scaled_by_a_plain_max],
                         ids=["clip that binds", "floor", "max without abs"])
def test_other_roundings_stay_unfused_and_equal_numpy(body):
    """A clip that can bind clips different values at the running scale; a floor has a whole step of error;
    a scale that is no absmax does not bound the rounded value: none of these fuses, so each is exact."""
    x, w, ws = _inputs(7)
    k = rf.kernel(body, backend="cpu")
    assert [g.fused for g in k.lower(x, w, ws).groups] == [False]
    out, ref = k(x, w, ws), body(x, w, ws)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6 * np.nanmax(np.abs(ref)))


def test_ptx_assembles_for_sm80_and_sm90():
    x, w, ws = _inputs(1)
    assemble_without_spills(rf.kernel(W.int8_quant_gemm, backend="cuda", sm="sm_80").lower(x, w, ws))


def test_explain_says_the_rounding_uses_the_running_scale():
    x, w, ws = _inputs(2)
    text = rf.kernel(W.int8_quant_gemm, backend="cpu").explain(x, w, ws)
    assert "quantized with the running values: minimum(maximum(rint(" in text and "one quantization bound" in text


@pytest.mark.parametrize("workload", ["fp8_quant_gemm", "int8_quant_gemm"])
def test_the_demos_check_fails_on_planted_wrong_kernels(workload):
    """(Found by a helper.) The demo's checks (and the examples' and cpu_bench's) judged a quantized GEMM by its
    quantization bound alone, which a GEMM that never quantizes, or an output 25% off, meets on random rows.
    The workload's inputs now repeat their absmax in half the rows, where the result must be the body's."""
    from redfuser import cli

    x, w, ws = W.WORKLOADS[workload].make_inputs(np.random.default_rng(0))
    check = cli._check_quantized if workload == "fp8_quant_gemm" else cli._check_int8
    body = W.WORKLOADS[workload].fn(x, w, ws)
    assert check(rf.kernel(W.WORKLOADS[workload].fn, backend="cpu")(x, w, ws), x, w, ws) == 0
    unquantized = ((x.astype(np.float64) @ w.astype(np.float64)) * ws).astype(np.float32)
    for planted in (unquantized, body * np.float32(1.001)):
        with pytest.raises(AssertionError):
            check(planted, x, w, ws)
