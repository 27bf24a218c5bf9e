"""``rf.take_along_axis``: numpy's gather along an axis, as a load at a computed position ``idx % n``.

The index buffer is read inside the position (a child of the load), so every analysis sees that read: a gather
of a cascade's result waits for it, and one of the inputs joins the pass as any other read. Cross-entropy gathers
the label's logit without an O(V) one-hot; MoE routing gathers the chosen experts' probabilities.
"""
from __future__ import annotations

import numpy as np
import pytest

import redfuser as rf
from helpers import run_backend

BACKENDS = ("interpret", "cpu", "simulate")
RNG = np.random.default_rng(17)


def _check(got, want, n: int = 1) -> None:
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind in "biu":
            assert np.array_equal(g, w)
        else:
            rf.testing.assert_close(g, w, w.dtype, n)


def _cross_entropy(logits, labels):
    m = rf.max(logits, axis=-1, keepdims=True)
    lse = m[:, 0] + rf.log(rf.sum(rf.exp(logits - m), axis=-1))
    return lse - rf.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_cross_entropy_gathers_the_label_logit_after_one_pass(backend):
    logits = (RNG.standard_normal((13, 1000)) * 3).astype(np.float32)
    labels = RNG.integers(-1000, 1000, 13)             # negative labels count from the end, as numpy's
    kernel = rf.kernel(_cross_entropy, backend=backend)
    assert [g.fused for g in kernel.lower(logits, labels).groups] == [True]
    assert "logits[i0,labels[i0] % 1000]" in str(kernel.lower(logits, labels).stages["fused"])
    _check(*run_backend(backend, _cross_entropy, logits, labels), 1000)


def _routing_weights(logits):
    m = rf.max(logits, axis=-1, keepdims=True)
    p = rf.exp(logits - m)
    p = p / rf.sum(p, axis=-1, keepdims=True)
    _, experts = rf.topk(p, 2)
    w = rf.take_along_axis(p, experts, axis=-1)          # the chosen experts' probabilities, renormalized
    return w / rf.sum(w, axis=-1, keepdims=True), experts


@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_routing_gathers_the_chosen_experts_probabilities(backend):
    logits = RNG.standard_normal((40, 64)).astype(np.float32)
    _check(*run_backend(backend, _routing_weights, logits), 64)


def _gathers(a, rows, cols):
    return (rf.take_along_axis(a, rows, axis=0),                     # along the first axis
            rf.take_along_axis(a[:, ::-1], cols, axis=1),            # of a view
            rf.take_along_axis(a.reshape(-1), cols.reshape(-1), axis=None),
            rf.take_along_axis(a > 0, cols[:1], 1),                  # bools, indices broadcast over rows
            rf.take_along_axis(a.astype(rf.int32), cols, -1) * 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gathers_equal_numpy(backend):
    a = RNG.standard_normal((6, 7)).astype(np.float32)
    rows = RNG.integers(-6, 6, (3, 7)).astype(np.int32)
    cols = RNG.integers(-7, 7, (6, 4)).astype(np.int64)
    _check(*run_backend(backend, _gathers, a, rows, cols))


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_numpy_refuses_is_read_modulo_the_length(backend):
    """numpy raises IndexError for an index outside [-n, n); a kernel cannot raise from inside: it reads the
    index modulo n (README, "Op subset"). This pins the divergence: it must stay exactly that."""
    a = np.arange(10, dtype=np.float32)[None, :]
    idx = np.array([[10, -11, 23, 3]])
    with pytest.raises(IndexError):
        np.take_along_axis(a, idx, axis=-1)
    got = rf.kernel(lambda x, i: rf.take_along_axis(x, i, axis=-1), backend=backend)(a, idx)
    assert np.array_equal(got, a[:, idx[0] % 10])


def test_gather_errors_name_the_op():
    a, idx = np.zeros((3, 4), np.float32), np.zeros((3, 2), np.int32)
    cases = [(lambda x, i: rf.take_along_axis(x, i.astype(rf.float32), -1), rf.DTypeError, "integer array"),
             (lambda x, i: rf.take_along_axis(x, i[0], -1), rf.ShapeError, "same number of dimensions"),
             (lambda x, i: rf.take_along_axis(x, i, 2), rf.ShapeError, "axis 2"),
             (lambda x, i: rf.take_along_axis(x, i, None), rf.ShapeError, "1-d"),
             (lambda x, i: rf.take_along_axis(x[:, :0], i, -1), rf.ShapeError, "no elements")]
    for body, error, text in cases:
        with pytest.raises(error) as info:
            rf.kernel(body, backend="interpret")(a, idx)
        assert "take_along_axis" in str(info.value) and text in str(info.value)
        assert info.value.loc.file == __file__


def _linear_cross_entropy(h, w, labels):
    return _cross_entropy(h @ w, labels)


def _linear_top_half(h, w):
    logits = h @ w
    m = rf.max(logits, axis=-1, keepdims=True)
    lse = m[:, 0] + rf.log(rf.sum(rf.exp(logits - m), axis=-1))
    return lse[:, None] - logits[:, ::2]        # half of every row read after the pass


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_cross_entropy_keeps_the_logits_in_the_pass(backend):
    """``h @ w`` is computed chunk by chunk inside the log-sum-exp's pass, never stored; the label's logit,
    read after the pass, is its own reduction at the gathered position (`fusion/gathered_reads.py`)."""
    h = RNG.standard_normal((13, 40)).astype(np.float32)
    w = RNG.standard_normal((40, 300)).astype(np.float32)
    labels = RNG.integers(-300, 300, 13)
    kernel = rf.kernel(_linear_cross_entropy, backend=backend)
    lowered = kernel.lower(h, w, labels)
    fused = str(lowered.stages["fused"])
    assert "local logits" in fused and "logits_at: f32[13] = " in fused, fused
    if backend != "interpret":
        assert "scratch logits:" not in str(lowered.stages["tile"])
    _check([kernel(h, w, labels)], [_linear_cross_entropy(h, w, labels)], 300)


def test_reads_of_many_positions_keep_the_reduction_in_memory():
    """Reading half of every row after the pass would redo half the GEMM: the logits are stored instead."""
    h = RNG.standard_normal((13, 40)).astype(np.float32)
    w = RNG.standard_normal((40, 300)).astype(np.float32)
    lowered = rf.kernel(_linear_top_half, backend="cpu").lower(h, w)
    assert "local" not in str(lowered.stages["fused"]) and "_at" not in str(lowered.stages["fused"])
    _check([rf.kernel(_linear_top_half, backend="cpu")(h, w)], [_linear_top_half(h, w)], 300)


@pytest.mark.parametrize("backend", ["interpret", "cpu", "simulate"])
def test_a_diagonal_by_take_along_axis_of_arange(backend):
    """``take_along_axis(s, arange(n)[:, None], -1)`` (contrastive losses' positives) simplifies to the
    read ``s[i, i]``; the interpreter laid such a read out by slicing and failed with numpy's reshape error."""
    def diagonal(s):
        picked = rf.take_along_axis(s, rf.arange(s.shape[-1])[None, :, None], -1)[..., 0]
        return picked - rf.max(s, axis=-1)

    s = np.random.default_rng(0).standard_normal((2, 5, 5)).astype(np.float32)
    np.testing.assert_array_equal(rf.kernel(diagonal, backend=backend)(s), diagonal(s))


def _gathered_plus_one(x, i):
    return rf.take_along_axis(x, i, axis=-1) + 1


def _cross_entropy_of_rows(x, i):
    return rf.log(rf.sum(rf.exp(x), axis=-1, keepdims=True)) - rf.take_along_axis(x, i, axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("body,shape", [(_gathered_plus_one, (0,)), (_gathered_plus_one, (3, 0)),
                                        (_cross_entropy_of_rows, (3, 0))], ids=["1d", "2d", "cross_entropy"])
def test_a_gather_of_no_element_reads_nothing(backend, body, shape):
    """(Found by a helper.) An empty index array gathers nothing, but the read of ``x`` at the wrapped index was
    hoisted out of the empty loop and clamped to the empty axis's -1: simulate loaded x[-1] (an out-of-bounds
    SimulationError) and the interpreter raised a bare IndexError; numpy gives an empty result."""
    x = np.zeros(shape, np.float32)
    i = np.zeros(shape, np.int64)
    actual, expected = run_backend(backend, body, x, i)
    _check(actual, expected)
