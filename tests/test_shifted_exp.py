"""The ``shifted_exp`` schedule: an f32 ``exp`` of a value minus the maximum it is part of runs as ``exp2(x log2 e)``
on GPU schedules (`redfuser/schedule/shifted_exp.py`). What the analysis recognizes and refuses, what the PTX
loses, and that results stay within the tolerance rule, subnormals included."""
from __future__ import annotations

import numpy as np
import pytest

import redfuser as rf
from redfuser.ir.loop.printer import format_expr
from redfuser.schedule.shifted_exp import max_shifted_exps
from redfuser.testing import assert_close
from redfuser.workloads import attention, causal_attention, cross_entropy, flash_attention_f16, softmax

RNG = np.random.default_rng(41)


def shifted(body, *args, fuse: bool = True) -> list[str]:
    """The exps the analysis accepts in `body`'s fused program, printed and sorted."""
    program = rf.kernel(body, backend="interpret", fuse=fuse).lower(*args).stages["fused"]
    return sorted(format_expr(e) for e in max_shifted_exps(program))


def test_softmaxes_and_their_rescales_are_recognized():
    x = RNG.standard_normal((8, 100)).astype(np.float32)
    assert shifted(softmax, x) == [
        "exp(m_prev[i0] - where(m[i0] == -inf, 0.0, m[i0]))",             # the running sum's rescale
        "exp(x[i0,i1] - where(m[i0] == -inf, 0.0, m[i0]))",               # the sweep after the loop
        "exp(x[i0,j] - where(m[i0] == -inf, 0.0, m[i0]))"]                # the chunk's terms
    q = RNG.standard_normal((1, 2, 64, 64)).astype(np.float32)
    assert len(shifted(attention, q, q, q)) == 2
    causal = shifted(causal_attention, q, q, q)                           # the mask's `j <= i2` matched too
    assert len(causal) == 2 and any("where(j <= i2" in e for e in causal)
    labels = RNG.integers(0, 100, 8)
    assert len(shifted(cross_entropy, x, labels)) == 2


def _min_shift(x):
    m = rf.min(x, axis=-1, keepdims=True)
    e = rf.exp(x - m)
    return e / rf.sum(e, axis=-1, keepdims=True)


def _reversed(x):
    m = rf.max(x, axis=-1, keepdims=True)
    e = rf.exp(m - x)
    return e / rf.sum(e, axis=-1, keepdims=True)


def _scaled(x):
    m = rf.max(x, axis=-1, keepdims=True)
    e = rf.exp(2.0 * x - m)
    return e / rf.sum(e, axis=-1, keepdims=True)


def _other_values(x, y):
    m = rf.max(x, axis=-1, keepdims=True)
    e = rf.exp(y - m)
    return e / rf.sum(e, axis=-1, keepdims=True)


def _other_axis(x):
    m = rf.max(x, axis=0, keepdims=True)          # column maxima, subtracted along the rows
    return rf.exp(x - rf.swapaxes(m, 0, 1))


def _shifted_row(x):
    m = rf.max(x[:, :50], axis=-1, keepdims=True)
    return rf.exp(x[:, 50:] - m)


@pytest.mark.parametrize("body", [_min_shift, _reversed, _scaled, _other_values, _other_axis, _shifted_row])
def test_arguments_that_may_be_positive_are_refused(body):
    """A minimum, a maximum minus the value, a scaled value, other values than the maximum's, a maximum along
    another axis or over other positions: each argument can be positive, so each keeps the accurate exp. (A
    fused loop's running-max rescale, ``exp(m_prev - m)``, is at most 0 in all of them and is taken.)"""
    x = RNG.standard_normal((100, 100)).astype(np.float32)
    args = (x, x + 1) if body is _other_values else (x,)
    assert all(e.startswith("exp(m_prev[") for e in shifted(body, *args))
    assert len(shifted(softmax, x)) == 3


def ptx_of(body, *args, **options) -> str:
    lowered = rf.kernel(body, backend="cuda", sm="sm_90a", **options).lower(*args)
    return "\n".join(k.ptx for k in lowered.stages["ptx"].kernels)


def test_gpu_schedules_drop_the_range_reduction_of_shifted_exps_and_keep_it_elsewhere():
    """f16 attention as users write it (``p = exp(s - m)`` in f32) and an f32 softmax: no ``cvt.rni`` (the
    range reduction's rounding) by default, one an element with ``shifted_exp=False``; a generic f32 exp
    (``logaddexp``'s) keeps it."""
    q = RNG.standard_normal((1, 2, 256, 64)).astype(np.float16)
    default, accurate = ptx_of(flash_attention_f16, q, q, q), ptx_of(flash_attention_f16, q, q, q,
                                                                      shifted_exp=False)
    assert default.count("cvt.rni.f32.f32") == 0 and accurate.count("cvt.rni.f32.f32") >= 32
    assert "ex2.approx.f32" in default and len(default.splitlines()) < 0.85 * len(accurate.splitlines())
    x = RNG.standard_normal((4096, 1000)).astype(np.float32)     # (rows enough not to split the row)
    assert ptx_of(softmax, x).count("cvt.rni") == 0 and ptx_of(softmax, x, shifted_exp=False).count("cvt.rni")
    assert ptx_of(lambda a, b: rf.logaddexp(a, b), x, x).count("cvt.rni") > 0


@pytest.mark.parametrize("scale", [1.0, 4.0, 30.0])        # scores of std 1, 16 (exponents to -100), 900
def test_shifted_exps_stay_within_the_tolerance_rule_in_the_simulator(scale):
    q = (RNG.standard_normal((1, 2, 64, 32)) * np.sqrt(scale)).astype(np.float32)
    k = (RNG.standard_normal((1, 2, 96, 32)) * np.sqrt(scale)).astype(np.float32)
    v = RNG.standard_normal((1, 2, 96, 32)).astype(np.float32)
    for body in (attention, causal_attention):
        got = rf.kernel(body, backend="simulate", sm="sm_90a")(q, k, v)
        assert_close(got, body(q, k, v), np.float32, 96)
    x = (RNG.standard_normal((16, 300)) * scale).astype(np.float32)
    got = rf.kernel(softmax, backend="simulate", sm="sm_90a")(x)
    assert_close(got, softmax(x), np.float32, 300)


def test_subnormal_results_are_kept_where_fast_exp_flushes_them():
    """Scores of std 30: exponents below -87 give subnormal softmax values, which the shifted exp keeps (as
    numpy does) and ``fast_exp``'s ``exp2_ftz`` flushes to 0."""
    x = (RNG.standard_normal((16, 300)) * 30).astype(np.float32)
    want = softmax(x)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    tiny = (e > 0) & (e < 2.0 ** -127) & (want > 0)           # subnormal exponentials, a nonzero result
    assert tiny.any()
    kept = rf.kernel(softmax, backend="simulate", sm="sm_90a")(x)
    flushed = rf.kernel(softmax, backend="simulate", sm="sm_90a", fast_exp=True)(x)
    assert (kept[tiny] > 0).all() and (flushed[tiny] == 0).all()
    np.testing.assert_allclose(kept[tiny], want[tiny], rtol=1e-4, atol=4 * 2.0 ** -149)   # (subnormal ulps)


def test_inside_its_loop_a_running_max_bounds_only_the_current_chunk():
    """``exp(x[i, c] - m[i])`` with ``c`` an axis as long as the loop's: after the loop (the final max covers
    every position) the argument is at most 0; inside the loop the running max has seen only the chunks so far,
    so only the loop's own axis is taken there."""
    from dataclasses import replace as replaced

    from redfuser.ir import Axis, Binary, BinaryOp, FusedLoop, Load
    from redfuser.schedule import shifted_exp as se

    x = RNG.standard_normal((8, 100)).astype(np.float32)
    program = rf.kernel(softmax, backend="interpret").lower(x).stages["fused"]
    (position,) = [i for i, s in enumerate(program.body) if isinstance(s, FusedLoop)]
    loop = program.body[position]
    term = next(st for st in loop.states if st.op.name == "SUM").term
    arg = next(n.x for n in se.walk(term) if isinstance(n, se.Unary) and n.op is se.UnaryOp.EXP)
    assert isinstance(arg, Binary) and arg.op is BinaryOp.SUB and isinstance(arg.a, Load)
    other = replaced(arg, a=replaced(arg.a, indices=(arg.a.indices[0], Axis("c", loop.axis.extent))))
    maxima = se._maxima(program)
    assert se._at_most_zero(arg, maxima, position) and se._at_most_zero(arg, maxima, None)
    assert se._at_most_zero(other, maxima, None) and not se._at_most_zero(other, maxima, position)


def _exp_of_shifted(x):
    return rf.exp(x - rf.max(x, axis=-1, keepdims=True))


def test_the_cpus_nonpositive_exp_gives_expfs_results_within_two_ulp_of_numpy():
    """Rows whose maximum is 0 make ``x - max`` exactly ``x``: 250 000 arguments in [-110, 0] (subnormal and
    flushed results among them) and the ends, through the cpu's `expf_nonpositive`. Its results are the
    accurate `expf`'s bit for bit and within 2 ulp of numpy's (subnormals: 2 units of 2**-149); a row with
    a NaN is NaN."""
    rng = np.random.default_rng(4)
    ends = [0.0, -0.0, -np.inf, -87.3, -87.33, -88.72, -103.9, -104.0, -150.0, -1e-40, -1e-45, -0.5, -1.0]
    x = np.concatenate([rng.uniform(-110, 0, 200_000), -np.exp(rng.uniform(-100, 4.6, 50_000)), ends])
    rows = np.full(-(-x.size // 127) * 127, -1.0)
    rows[:x.size] = x
    x = np.concatenate([rows.reshape(-1, 127), np.zeros((rows.size // 127, 1))], axis=1).astype(np.float32)
    x[-1, 5] = np.nan
    kernel = rf.kernel(_exp_of_shifted, backend="cpu")
    assert "exp_nonpos" in str(kernel.lower(x).stages["tile"])
    got, accurate, want = kernel(x), rf.kernel(_exp_of_shifted, backend="cpu", shifted_exp=False)(x), np.exp(x)
    np.testing.assert_array_equal(got, accurate)
    assert np.isnan(got[-1]).all() and not np.isnan(got[:-1]).any()
    got, want = got[:-1], want[:-1]
    assert np.array_equal(got == 0, want == 0)
    normal = want >= 2.0 ** -126
    assert (np.abs(got[normal].astype(np.float64) - want[normal]) / np.spacing(want[normal])).max() <= 2
    assert np.abs(got[~normal].astype(np.float64) - want[~normal]).max() <= 2 * 2.0 ** -149


def _product_of_shifted(x):
    return rf.prod(rf.exp(x - rf.max(x, axis=-1, keepdims=True)), axis=-1)


@pytest.mark.parametrize("n", [2, 3, 8, 16, 64])
def test_a_product_of_nonpositive_exps_keeps_each_factors_scale_inside_it(n):
    """``prod(exp(x - max(x)))`` on the cpu: each factor is ``(p * 2**(n + 64)) * 2**-64``, and the product's
    reassociating multiplies once hoisted the constants out of the factors, so two ``2**64`` met first:
    ``[-3, -3]`` gave inf, three factors NaN (fuzz seed 38). The factors are fenced
    (`codegen.host.stmts.fenced_factor`): numpy's products, rows of equal values (each factor exactly 1)
    included."""
    x = np.concatenate([np.full((1, n), -3.0), np.linspace(-3, 0, n)[None], RNG.uniform(-1, 0, (3, n))])
    x = x.astype(np.float32)
    got = rf.kernel(_product_of_shifted, backend="cpu")(x)
    assert got[0] == 1.0
    assert_close(got, _product_of_shifted(x.astype(np.float64)).astype(np.float32), np.float32, n)


def flushable(body, *args) -> list[str]:
    """The exps `flush_safe_exps` takes in `body`'s fused program, printed and sorted."""
    from redfuser.schedule.shifted_exp import flush_safe_exps

    program = rf.kernel(body, backend="interpret").lower(*args).stages["fused"]
    return sorted(format_expr(e) for e in flush_safe_exps(program, max_shifted_exps(program)))


def test_only_exps_no_result_can_tell_flushed_are_flushable():
    """f16 attention as users write it: ``p`` summed into ``l`` and rounded to f16 for ``P·V``, so a value
    below 2**-126 shows nowhere; its rescale multiplies the accumulator too and is not taken. f32 attention
    (``P·V`` in f32) and bf16 attention (bf16 keeps values down to 2**-133) flush none of their terms. A
    softmax's and a cross-entropy's running sum ``l`` flushes its terms; the softmax's sweep, which stores
    ``exp(x - m) / l``, does not."""
    q16 = RNG.standard_normal((1, 2, 64, 64)).astype(np.float16)
    assert flushable(flash_attention_f16, q16, q16, q16) == [
        "exp(f32(s_matmul[0,i1,i2,j] * 0.125) - where(m[0,i1,i2] == -inf, 0.0, m[0,i1,i2]))"]
    q = q16.astype(np.float32)
    assert flushable(attention, q, q, q) == []
    import ml_dtypes

    from redfuser.workloads import flash_attention_bf16
    qb = q16.astype(ml_dtypes.bfloat16)
    assert flushable(flash_attention_bf16, qb, qb, qb) == []
    x = RNG.standard_normal((8, 100)).astype(np.float32)
    assert flushable(softmax, x) == ["exp(x[i0,j] - where(m[i0] == -inf, 0.0, m[i0]))"]       # not x[i0,i1]
    assert flushable(cross_entropy, x, RNG.integers(0, 100, 8)) == [
        "exp(logits[i0,j] - where(m[i0] == -inf, 0.0, m[i0]))"]


def test_gpu_f16_attention_flushes_its_terms_and_keeps_its_rescale_exact():
    """The flushable terms are one ``ex2.approx.ftz`` each on sm_90a; results stay within the tolerance rule
    at scores far below -87 (std 16 and 30)."""
    q = RNG.standard_normal((1, 2, 128, 64)).astype(np.float16)
    ptx = ptx_of(flash_attention_f16, q, q, q)
    assert ptx.count("cvt.rni") == 0 and ptx.count("ex2.approx.ftz.f32") >= 32      # the terms: one ex2.ftz each
    assert 0 < ptx.count("ex2.approx.f32") < 16           # the rescales (a few a thread), not the 32 terms
    for scale in (4.0, 5.5):
        q = (RNG.standard_normal((1, 2, 64, 64)) * scale).astype(np.float16)
        k = (RNG.standard_normal((1, 2, 96, 64)) * scale).astype(np.float16)
        v = RNG.standard_normal((1, 2, 96, 64)).astype(np.float16)
        got = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a")(q, k, v)
        assert_close(got.astype(np.float32), flash_attention_f16(q, k, v).astype(np.float32), np.float16, 96)
