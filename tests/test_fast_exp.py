"""The ``fast_exp`` option: f32 exponentials as ``exp2_ftz(x * log2 e)``, one ``ex2.approx.ftz`` on a GPU, as
FlashAttention computes them, instead of the range-reduced exponential (about 2 ulp) that f32 programs get
by default. Off by default; with it, attention's key loop has no ``cvt.rni`` (the range reduction's
rounding, a quarter-rate instruction per element) and its results stay within the tolerance rule
(docs/gpu-backend.md, "Numerics")."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import redfuser as rf
from redfuser.testing import assert_close
from redfuser.workloads import flash_attention_bf16, flash_attention_f16, softmax

RNG = np.random.default_rng(31)


def ptx_of(body, *args, **options) -> str:
    lowered = rf.kernel(body, backend="cuda", sm="sm_90a", **options).lower(*args)
    return "\n".join(k.ptx for k in lowered.stages["ptx"].kernels)


def test_fast_exp_drops_the_range_reduction_from_attentions_key_loop():
    q = RNG.standard_normal((1, 2, 256, 64)).astype(np.float16)
    accurate = ptx_of(flash_attention_f16, q, q, q, shifted_exp=False)
    fast = ptx_of(flash_attention_f16, q, q, q, fast_exp=True)
    assert accurate.count("cvt.rni.f32.f32") >= 32          # one range reduction an element of P
    assert fast.count("cvt.rni.f32.f32") == 0
    assert fast.count("ex2.approx.ftz.f32") == accurate.count("ex2.approx.ftz.f32")
    assert len(fast.splitlines()) < 0.8 * len(accurate.splitlines())


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
@pytest.mark.parametrize("body,dtype,scale", [
    (flash_attention_f16, np.float16, 1.0), (flash_attention_bf16, ml_dtypes.bfloat16, 1.0),
    (flash_attention_f16, np.float16, 4.0)])                        # scores of std 16: exponents to -100
def test_attention_with_fast_exp_stays_within_the_tolerance_rule(backend, body, dtype, scale):
    q = (RNG.standard_normal((1, 2, 128, 64)) * scale).astype(dtype)
    k = (RNG.standard_normal((1, 2, 192, 64)) * scale).astype(dtype)
    v = RNG.standard_normal((1, 2, 192, 64)).astype(dtype)
    options = {"sm": "sm_90a"} if backend == "simulate" else {}
    got = rf.kernel(body, backend=backend, fast_exp=True, **options)(q, k, v)
    want = body(q, k, v)
    assert_close(got.astype(np.float32), want.astype(np.float32), dtype, 192)


def test_an_f32_softmax_with_fast_exp_stays_within_the_tolerance_rule_and_flushes_tiny_results():
    x = (RNG.standard_normal((16, 300)) * 30).astype(np.float32)     # exponents far below -87: flushed
    kernel = rf.kernel(softmax, backend="cpu", fast_exp=True)
    got, want = kernel(x), softmax(x)
    assert_close(got, want, np.float32, 300)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    tiny = (e > 0) & (e < 2.0 ** -127) & (want > 0)                 # subnormal exponentials, a nonzero result
    assert tiny.any() and (got[tiny] == 0).all()
    assert (rf.kernel(softmax, backend="cpu")(x)[tiny] > 0).all()  # the default keeps them
