"""Bugs the whole-compiler fuzzer found, each kept as the shrunk program it printed (docs/testing.md, "The fuzzer")."""
from __future__ import annotations

import numpy as np
import pytest

import redfuser as rf

BACKENDS = ("interpret", "cpu", "simulate")


def topk_values(x):
    v, i = rf.topk(x, 2)
    return v


def topk_indices(x):
    return rf.topk(x, 3)[1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("body", [topk_values, topk_indices])
def test_topk_with_one_of_its_results_unused(body, backend):
    """A lone top-k kernel stored both results; the unused one was no buffer of the program (VerifyError)."""
    x = np.array([[-1.0, 0.0, -2.0, 3.0], [5.0, 4.0, 3.0, 2.0]], np.float32)
    got, want = rf.kernel(body, backend=backend)(x), body(x)
    assert got.dtype == want.dtype and np.array_equal(got, want)
