"""Top-k: the numpy definition, tracing and interpreting it, and top-k in a softmax cascade (MoE routing): the
softmax's normalizers in one pass, the top-k after it on their final values (tests/test_topk_exact.py says why)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import redfuser as rf
from redfuser.fusion.merge import merge_partials
from redfuser.ir import FusedLoop, TopKState
from redfuser.ir.loop.interpreter import Env, run_fused_loop, run_stmt
from redfuser.testing.tolerance import assert_close


def route(x):
    """MoE routing: softmax over experts, top-k, renormalize by the kept sum."""
    m = rf.max(x, axis=-1, keepdims=True)
    e = rf.exp(x - m)
    p = e / rf.sum(e, axis=-1, keepdims=True)
    vals, idx = rf.topk(p, 3)
    return vals / rf.sum(vals, axis=-1, keepdims=True), idx


def test_topk_on_arrays_is_sorted_descending_with_ties_to_the_lower_index():
    x = np.array([[1.0, 3.0, 3.0, np.nan, -np.inf, 2.0]], np.float32)
    values, indices = rf.topk(x, 4)
    assert values.tolist() == [[3.0, 3.0, 2.0, 1.0]] and indices.tolist() == [[1, 2, 5, 0]]
    values, indices = rf.topk(x, 6)
    assert indices.tolist() == [[1, 2, 5, 0, 4, 3]]        # NaN counts as the smallest
    assert indices.dtype == np.int64


@given(st.integers(1, 40), st.integers(1, 6), st.integers(0, 2**16), st.sampled_from([0, 1, -1]))
def test_traced_topk_equals_its_definition(n, k, seed, axis):
    k = min(k, n)
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, size=(3, n)).astype(np.float32)   # many ties on purpose
    if axis == 0:
        x = x.T.copy()
        k = min(k, x.shape[0])

    def f(x):
        return rf.topk(x * 2.0, k, axis=axis)

    got, ref = rf.kernel(f, backend="interpret")(x), f(x)
    assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])


def test_topk_k_out_of_range_is_a_shape_error():
    def f(x):
        return rf.topk(x, 9)

    with pytest.raises(rf.ShapeError, match="topk"):
        rf.kernel(f, backend="interpret")(np.ones((2, 4), np.float32))


@pytest.mark.parametrize("chunk", [1, 4, 7, 256])
def test_moe_routing_fuses_the_softmax_and_ranks_after_the_pass(chunk):
    rng = np.random.default_rng(chunk)
    x = (rng.standard_normal((9, 64)) * 3).astype(np.float32)
    x[1, :40] = -np.inf        # first chunks masked
    x[2] = -np.inf             # a fully masked row: NaN weights, indices 0..k-1 as in the reference
    k = rf.kernel(route, backend="interpret", interpret_chunk=chunk)
    (w, idx), (w_ref, idx_ref) = k(x), route(x)
    assert np.array_equal(idx, idx_ref)
    assert_close(w, w_ref, np.float32, 64)
    lowered = k.lower(x)
    g, renormalization = lowered.groups     # (the weights' sum and division: a loop of one and its sweep)
    assert g.fused and g.fused_members == ("m", "p_sum") and renormalization.fused_members == ("sum",)
    loop = next(s for s in lowered.program.body if isinstance(s, FusedLoop))
    assert not any(isinstance(st, TopKState) for st in loop.states)


@given(st.integers(3, 70), st.integers(0, 2**16), st.data())
def test_topk_merge_law(n, seed, data):
    cut = data.draw(st.integers(0, n))
    x = (np.random.default_rng(seed).standard_normal((4, n)) * 2).astype(np.float32)
    lowered = rf.kernel(route, backend="interpret").lower(x)
    env = Env({"x": x})
    loop = next(s for s in lowered.program.body if isinstance(s, FusedLoop))
    for s in lowered.program.body:
        if s is loop:
            break
        env[s.out.name] = run_stmt(s, env)
    whole = run_fused_loop(loop, env, chunk=5)
    a = run_fused_loop(loop, env, chunk=3, span=(0, cut))
    b = run_fused_loop(loop, env, chunk=4, span=(cut, n))
    merged = merge_partials(loop, a, b)
    for name, value in whole.items():
        if value.dtype == np.int64:
            assert np.array_equal(merged[name], value), name
        else:
            assert_close(merged[name], value, np.float32, n, err_msg=name)


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_a_nan_met_late_gives_the_references_indices(chunk):
    x = (np.random.default_rng(3).standard_normal((3, 40)) * 2).astype(np.float32)
    x[0, 33] = np.nan          # the reference's whole softmax row is NaN: top-k keeps positions 0, 1, 2
    x[1, 0] = np.nan
    k = rf.kernel(route, backend="interpret", interpret_chunk=chunk)
    (w, idx), (w_ref, idx_ref) = k(x), route(x)
    assert np.array_equal(idx, idx_ref) and idx_ref[0].tolist() == [0, 1, 2]
    assert np.array_equal(np.isnan(w), np.isnan(w_ref))
