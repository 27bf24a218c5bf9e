"""The merge law: merging the partial states of two halves of the axis gives the state of the whole."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import redfuser as rf
from redfuser import workloads as W
from redfuser.fusion.merge import merge_partials
from redfuser.ir import FusedLoop
from redfuser.ir.loop.interpreter import Env, run_fused_loop, run_stmt
from redfuser.testing.tolerance import assert_close


def _loop_and_env(fn, args):
    """The program's fused loop and everything computed before it (its inputs)."""
    lowered = rf.kernel(fn, backend="interpret").lower(*args)
    env = Env({b.name: a for b, a in zip(lowered.program.inputs, args)})
    for s in lowered.program.body:
        if isinstance(s, FusedLoop):
            return s, env
        env[s.out.name] = run_stmt(s, env)
    raise AssertionError("no fused loop")


@st.composite
def cases(draw):
    n = draw(st.sampled_from([1, 2, 5, 17, 64, 131]))
    cut = draw(st.integers(0, n))
    chunk_a, chunk_b = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    seed = draw(st.integers(0, 2**16))
    masked = draw(st.sampled_from(["none", "prefix", "row"]))
    return n, cut, chunk_a, chunk_b, seed, masked


def _data(n, seed, masked):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((4, n)) * 3).astype(np.float32)
    if masked == "prefix":
        x[1, : n // 2 + 1] = -np.inf
    elif masked == "row":
        x[2] = -np.inf
    return x


def _assert_law(fn, args, n, cut, chunk_a, chunk_b):
    loop, env = _loop_and_env(fn, args)
    whole = run_fused_loop(loop, env, chunk=5)
    a = run_fused_loop(loop, env, chunk=chunk_a, span=(0, cut))
    b = run_fused_loop(loop, env, chunk=chunk_b, span=(cut, n))
    merged = merge_partials(loop, a, b)
    for name, value in whole.items():
        assert_close(merged[name], value, np.float32, n, err_msg=name)
    swapped = merge_partials(loop, b, a)     # the merge is commutative too
    for name, value in whole.items():
        assert_close(swapped[name], value, np.float32, n, err_msg=name)


@given(cases())
def test_merge_law_softmax_and_entropy(case):
    n, cut, ca, cb, seed, masked = case
    x = _data(n, seed, masked)
    _assert_law(W.log_softmax, (x,), n, cut, ca, cb)
    _assert_law(W.softmax_entropy, (x,), n, cut, ca, cb)


@given(cases())
def test_merge_law_attention(case):
    n, cut, ca, cb, seed, _ = case
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, 2, s, 8)).astype(np.float32) for s in (3, n, n))
    _assert_law(W.attention, (q, k, v), n, cut, ca, cb)
