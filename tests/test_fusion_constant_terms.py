"""A bare constant term in a fused sum: ``sum(G(x)·H(y) + c)`` is the sum of two separable terms.

Issue 20, item 3: these bodies once crashed the fusion engine's numeric check with a bare
``IndexError`` (a term reading no sampled point evaluated to one value; fixed in c2a86fc). They must
fuse, give numpy's values on interpret, cpu and simulate, and explain themselves.
"""
from __future__ import annotations

import numpy as np
import pytest
from helpers import run_backend

import redfuser as rf
from redfuser.testing.tolerance import assert_close

BACKENDS = ("interpret", "cpu", "simulate")
ROWS, N = 5, 48


def exp_plus_constant(x):
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.sum(rf.exp(x - m) + 0.25, axis=-1)


def probabilities_minus_uniform(x):
    m = rf.max(x, axis=-1, keepdims=True)
    p = rf.exp(x - m)
    p = p / rf.sum(p, axis=-1, keepdims=True)
    return rf.sum(p - 1.0 / N, axis=-1)


def squared_distance_to_uniform(x):
    m = rf.max(x, axis=-1, keepdims=True)
    p = rf.exp(x - m)
    p = p / rf.sum(p, axis=-1, keepdims=True)
    return rf.sum((p - 1.0 / N) ** 2, axis=-1)


def scaled_plus_constant(x):
    s = rf.sum(rf.abs(x), axis=-1, keepdims=True) + 1.0
    return rf.sum(x / s + 0.25, axis=-1)


BODIES = [exp_plus_constant, probabilities_minus_uniform, squared_distance_to_uniform, scaled_plus_constant]


def _inputs(seed: int = 0) -> np.ndarray:
    x = (3.0 * np.random.default_rng(seed).standard_normal((ROWS, N))).astype(np.float32)
    x[1, ::4] = -np.inf     # masked positions among finite ones
    return x


@pytest.mark.parametrize("body", BODIES)
def test_a_constant_term_fuses_and_explains_itself(body):
    x = _inputs()
    k = rf.kernel(body, backend="interpret", interpret_chunk=7)
    (g,) = k.lower(x).groups
    assert g.fused and g.reason is None and g.fused_members == g.reductions
    text = k.explain(x)
    assert "NOT fused" not in text and ("sum of separable terms" in text or "separable" in text)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("body", BODIES)
def test_a_constant_term_matches_numpy(backend, body):
    x = _inputs(1)
    actual, expected = run_backend(backend, body, x)
    for a, e in zip(actual, expected):
        # the expansion sums the constant apart from the separable term: a cancellation the size of
        # the terms, which the tolerance's scale (the terms' magnitude, N * 0.25 at most here) covers
        assert_close(a, e, np.float32, N, scale=float(N))
