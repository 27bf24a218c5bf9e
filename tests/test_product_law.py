"""The product law (docs/fusion.md "Products"): ``prod over k of G(x)·exp(L(y))`` with y an earlier result of the
cascade joins the one-pass loop; each chunk that moves y rescales the running product by the sum's rescale raised
to the count of elements already multiplied in. Judged on interpret, cpu and simulate (PTX assembled) with small
chunks and split reductions (the law used at every chunk and in the merge), against numpy-f32 by the tolerance
rule and against float64."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import run_backend

import redfuser as rf
from redfuser.ir import FusedLoop, OnlineState, ReduceOp
from redfuser.testing.tolerance import assert_close

BACKENDS = ("interpret", "cpu", "simulate")
SMALL_CHUNKS = {"interpret": {"interpret_chunk": 4}, "cpu": {"block_n": 16}, "simulate": {"block_n": 16}}


def tempered_product(x):
    """A product of positive weights tempered by the row's max: every factor is at most ``x*x + 1``."""
    m = rf.max(x, axis=-1, keepdims=True)
    return rf.prod((x * x + 1.0) * rf.exp(0.05 * (x - m)), axis=-1)


def product_of_softmax_numerators(x):
    m = rf.max(x, axis=-1, keepdims=True)
    return m, rf.prod(rf.exp(x - m), axis=-1)


def normalized_product(x):
    l = rf.sum(rf.exp(x), axis=-1, keepdims=True)  # noqa: E741
    return rf.prod(rf.exp(x) / l * 8.0, axis=-1)


def _rows(n: int, seed: int) -> np.ndarray:
    """Rows where the max moves at every chunk (ascending), once (descending), never finite (all -inf), a NaN,
    a -inf tail, and random ones."""
    rng = np.random.default_rng(seed)
    x = (0.3 * rng.standard_normal((8, n))).astype(np.float32)   # the products stay inside f32's range
    x[0] = np.sort(x[0])
    x[1] = np.sort(x[1])[::-1]
    x[2] = -np.inf
    x[3, n // 3] = np.nan
    x[4, n // 2:] = -np.inf
    return x


def _outputs(backend: str, body, x: np.ndarray, **options):
    if backend == "simulate":
        outs, _ = run_backend(backend, body, x, **options)
        return outs
    out = rf.kernel(body, backend=backend, **options)(x)
    return out if isinstance(out, tuple) else (out,)


def _product_states(body, x, **options) -> list[OnlineState]:
    lowered = rf.kernel(body, backend="interpret", **options).lower(x)
    loops = [s for s in lowered.program.body if isinstance(s, FusedLoop)]
    return [st for loop in loops for st in loop.states if isinstance(st, OnlineState) and st.op is ReduceOp.PROD]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("n", [37, 300])
def test_tempered_product_equals_numpy(backend, split, n):
    x = _rows(n, seed=n + split)
    options = dict(SMALL_CHUNKS[backend])
    if backend != "interpret":
        options["split"] = split
    (actual,) = _outputs(backend, tempered_product, x, **options)
    expected = tempered_product(x)
    assert_close(actual, expected, np.float32, n)
    exact = tempered_product(x.astype(np.float64))
    finite = np.isfinite(exact)
    own = np.abs(expected[finite] - exact[finite]) / np.abs(exact[finite])
    ours = np.abs(actual[finite] - exact[finite]) / np.abs(exact[finite])
    assert np.all(ours <= 8 * np.maximum(own, n * 2.0 ** -24)), (ours, own)


def test_a_product_with_a_factor_of_the_reduced_values_besides_the_exponential_is_a_second_pass():
    """``prod((x² + 1)·exp(0.05 (x - m)))`` by the product law read each factor with the running max, larger
    than numpy's: over a row whose max comes late the running product overflowed, and the carry's
    ``exp(t·...)`` of 0 made it NaN, for numpy's 2.5e-26 (docs/fusion.md's own example; found by a helper).
    G(x) besides the exponential is refused; the pure exponential keeps the law (the test below)."""
    x = np.full((1, 256), 190.0, np.float32)
    x[0, :12] = 100.0
    x[0, -1] = 400.0
    kernel = rf.kernel(tempered_product, backend="interpret")
    (group,) = kernel.lower(x).groups
    assert "may overflow where the reference's does not" in group.reason
    for backend in BACKENDS:
        np.testing.assert_allclose(_outputs(backend, tempered_product, x)[0], tempered_product(x), rtol=1e-4)


def test_the_product_joins_the_loop_with_a_count_and_a_carry():
    x = _rows(37, seed=1)
    (st,) = _product_states(product_of_softmax_numerators, x)
    assert st.rescale is None and st.carry is not None
    lowered = rf.kernel(product_of_softmax_numerators, backend="interpret").lower(x)
    (group,) = lowered.groups
    assert group.fused and group.fused_members == ("m", "out1")
    names = [s.acc.name for s in group.states]
    assert any(n.endswith("_count") for n in names), names
    text = rf.kernel(product_of_softmax_numerators, backend="interpret").explain(x)
    assert "product law" in text and "raised to the count" in text


@pytest.mark.parametrize("backend", BACKENDS)
def test_product_of_softmax_numerators_on_every_backend(backend):
    rng = np.random.default_rng(7)
    x = (rng.random((5, 200)) * 0.1).astype(np.float32)    # the product stays inside f32's range
    x[0] = np.sort(x[0])
    x[3, :] = -np.inf
    outs = _outputs(backend, product_of_softmax_numerators, x, **SMALL_CHUNKS[backend])
    for actual, expected in zip(outs, product_of_softmax_numerators(x)):
        assert_close(actual, expected, np.float32, 200)


def test_a_product_over_a_ratio_of_earlier_results_is_refused_with_its_reason():
    x = _rows(37, seed=2)
    assert not _product_states(normalized_product, x)
    (group,) = rf.kernel(normalized_product, backend="interpret").lower(x).groups
    assert not group.fused
    assert "not an exponential of earlier results" in group.reason and "1.0 / l" in group.reason
    got = rf.kernel(normalized_product, backend="cpu")(x)
    assert_close(got, normalized_product(x), np.float32, 37)
