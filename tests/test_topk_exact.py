"""A top-k in a cascade gives the reference's indices exactly (issue 20, item 5).

The reference ranks ``p = F(x, ȳ)`` computed per element with the final earlier results ``ȳ``, rounding on
the way; equal values go to the lower index. A running list cannot know which elements those roundings
make equal (`redfuser/fusion/topk_order.py`), so a top-k whose value reads an earlier result runs after the
loop, on the final results; the rest of the cascade stays in one pass. Checked on `interpret`, `cpu` and
`simulate`: equal values first seen under different running maxima, bf16 logits with many ties, distinct
bf16 logits the reference's ``exp`` rounds to one value, non-finite logits, all-equal rows and k = the
number of experts. Indices are compared with ``==``, values by the tolerance rule.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from helpers import routing

import redfuser as rf
from redfuser.codegen.ptx_check import check_ptx
from redfuser.ir import FusedLoop, TopK, TopKState
from redfuser.testing import assert_close

BF16 = ml_dtypes.bfloat16

# Each backend with the chunkings it is run under (the interpreter's chunk, the tile's block along experts).
BACKENDS = [("interpret", {"interpret_chunk": 1}), ("interpret", {"interpret_chunk": 4}),
            ("interpret", {"interpret_chunk": 7}), ("cpu", {"block_n": 8}), ("cpu", {"block_n": 16}),
            ("cpu", {}), ("simulate", {"block_n": 16}), ("simulate", {})]
IDS = [f"{b}-{'-'.join(f'{k}{v}' for k, v in o.items()) or 'default'}" for b, o in BACKENDS]



def check(body, x, backend, opts, n):
    """`body` on `backend` against the body run on numpy: indices equal, values by the tolerance rule."""
    (w, idx), (w_ref, idx_ref) = rf.kernel(body, backend=backend, **opts)(x), body(x)
    assert np.array_equal(idx, idx_ref), np.nonzero((idx != idx_ref).any(-1))[0]
    assert_close(w, w_ref, w_ref.dtype, n)


def cross_chunk_ties(rows: int, n: int, seed: int) -> np.ndarray:
    """Random logits whose first quarter repeats in the last: each value is seen again after the running max
    has grown (a list rescaled chunk by chunk holds the two copies an ulp apart)."""
    x = (np.random.default_rng(seed).standard_normal((rows, n)) * 2).astype(np.float32)
    x[:, n - n // 4:] = x[:, : n // 4]
    return x


@pytest.mark.parametrize("backend,opts", BACKENDS, ids=IDS)
def test_equal_probabilities_in_different_chunks_rank_by_index(backend, opts):
    check(routing(8), cross_chunk_ties(64, 64, 0), backend, opts, 64)


@pytest.mark.parametrize("backend,opts", BACKENDS, ids=IDS)
def test_bf16_logits_with_many_ties_route_like_the_reference(backend, opts):
    # 256 experts, top 8, logits on a grid of 25 values: each value about ten times a row, so the 8th place
    # is nearly always tied. Grid steps are far apart next to a bf16 ulp, so which values are equal does not
    # hang on the last bit of the normalizer (see docs/fusion.md for that limit).
    rng = np.random.default_rng(1)
    x = (rng.integers(-12, 13, (32, 256)) * 0.25).astype(BF16)
    check(routing(8), x, backend, opts, 256)


@pytest.mark.parametrize("backend,opts", BACKENDS, ids=IDS)
def test_distinct_bf16_logits_the_reference_rounds_to_one_value_rank_by_index(backend, opts):
    # Logits within 1 of the row's maximum: bf16 exp maps neighbouring inputs to one value, so distinct logits
    # tie in the reference and the lower index wins, whatever the logits' order.
    def softmax_numerator_topk(x):
        m = rf.max(x, axis=-1, keepdims=True)
        vals, idx = rf.topk(rf.exp(x - m), 6)
        return vals, idx

    rng = np.random.default_rng(2)
    x = (-rng.random((24, 64)) * 0.9).astype(BF16)
    x[:, 40] = 0.0                                          # the maximum, late: earlier chunks ran under another
    ref_vals, ref_idx = softmax_numerator_topk(x)
    logits = np.take_along_axis(x, ref_idx, axis=-1)
    merged = (ref_vals[:, :-1] == ref_vals[:, 1:]) & (logits[:, :-1] != logits[:, 1:])
    assert merged.sum() >= 10, "the data must hold distinct logits the reference's exp makes equal"
    check(softmax_numerator_topk, x, backend, opts, 64)


def special_rows(experts: int, k: int) -> np.ndarray:
    """Non-finite logits and ties on purpose, one case per row."""
    x = (np.random.default_rng(experts + k).standard_normal((12, experts)) * 3).astype(np.float32)
    x[0, 5] = np.inf                     # the reference's row is NaN (inf - inf): positions 0..k-1
    x[1, experts - 1] = np.inf           # the same, met in the last chunk
    x[2, 3], x[2, 9] = np.inf, np.inf    # two of them
    x[3] = -np.inf                       # every logit -inf: -inf - -inf is NaN, positions 0..k-1
    x[4, : experts // 2] = -np.inf       # the first chunks -inf: they rank last, as 0
    x[5, experts - 2] = np.nan           # NaN spreads to the whole row
    x[6, 1] = -np.inf                    # one -inf: probability 0
    x[7] = 0.5                           # all equal: the lowest indices
    x[8, :] = -1.0
    x[8, experts - k - 1:] = 2.0         # ties at the maximum, in the last chunk: the lowest of them
    x[9, ::3] = x[9, 0]                  # a value repeated across every chunk
    x[10, 7] = np.float32(3e38)          # near the top of the range
    x[11, 2] = -np.float32(3e38)
    return x


@pytest.mark.parametrize("backend,opts", BACKENDS, ids=IDS)
@pytest.mark.parametrize("experts,k", [(40, 3), (16, 16)])
def test_non_finite_logits_and_special_rows_route_like_the_reference(backend, opts, experts, k):
    with np.errstate(invalid="ignore"):
        check(routing(k), special_rows(experts, k), backend, opts, experts)


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_split_reductions_route_like_the_reference(backend):
    # Partial m and l from several programs, merged, then the top-k on the merged values.
    check(routing(8), cross_chunk_ties(16, 64, 3), backend, {"split": 3, "block_n": 8}, 64)


@pytest.mark.parametrize("backend,opts", BACKENDS, ids=IDS)
def test_top_k_of_logits_minus_their_max_ranks_an_infinite_row_like_the_reference(backend, opts):
    # `x - m` with m = +inf: NaN at the inf and -inf elsewhere; NaN ranks last, equal values by index.
    def shifted_topk(x):
        m = rf.max(x, axis=-1, keepdims=True)
        return rf.topk(x - m, 3)

    x = cross_chunk_ties(6, 40, 5)
    x[0, 2] = np.inf
    x[1, 39] = np.inf
    x[2] = -np.inf
    with np.errstate(invalid="ignore"):
        (v, i), (v_ref, i_ref) = rf.kernel(shifted_topk, backend=backend, **opts)(x), shifted_topk(x)
    assert i_ref[0].tolist() == [0, 1, 3] and np.array_equal(i, i_ref)
    assert np.array_equal(v, v_ref, equal_nan=True)


def test_the_top_k_runs_after_the_loop_and_explain_says_why():
    x = cross_chunk_ties(4, 64, 0)
    kern = rf.kernel(routing(8), backend="interpret")
    lowered = kern.lower(x)
    group, renormalization = lowered.groups   # (the weights' sum and division: a loop of one and its sweep)
    assert group.fused and group.fused_members == ("m", "p_sum") and renormalization.fused_members == ("sum",)
    loop = next(s for s in lowered.program.body if isinstance(s, FusedLoop))
    assert not any(isinstance(st, TopKState) for st in loop.states)
    topks = [s for s in lowered.program.body if isinstance(s, TopK)]
    assert len(topks) == 1 and lowered.program.body.index(topks[0]) > lowered.program.body.index(loop)
    text = kern.explain(x)
    assert "vals: NOT fused" in text and "round to equal values, ordered by index" in text
    assert "with the final `m`, `p_sum`" in text and "the top-k runs after the loop" in text


def test_a_top_k_reading_no_earlier_result_still_joins_the_pass():
    # The running list holds the reference's own values: nothing is rescaled, ties and NaN rank as they do.
    def max_and_topk(x):
        m = rf.max(x, axis=-1)
        vals, idx = rf.topk(x, 3)
        return m, vals, idx

    x = np.random.default_rng(4).integers(-3, 4, (8, 40)).astype(np.float32)
    x[0, 20] = np.nan
    x[1, 30] = np.inf
    lowered = rf.kernel(max_and_topk, backend="interpret").lower(x)
    (group,) = lowered.groups
    assert group.fused and len(group.fused_members) == 2
    for backend, opts in BACKENDS:
        got, ref = rf.kernel(max_and_topk, backend=backend, **opts)(x), max_and_topk(x)
        assert np.array_equal(got[2], ref[2]), (backend, opts)
        assert np.array_equal(got[1], ref[1], equal_nan=True) and np.array_equal(got[0], ref[0], equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_routing_ptx_assembles_for_sm80_and_sm90(dtype):
    x = special_rows(256, 8).astype(dtype)
    for sm in ("sm_80", "sm_90"):
        ptx = rf.kernel(routing(8), backend="cuda", sm=sm).lower(x).stages["ptx"]
        for kernel in ptx.kernels:
            check_ptx(kernel.ptx)    # raises with the assembler's log on bad PTX


def test_int64_values_near_the_limits_rank_exactly():
    """A float64 ranking key rounds int64 values near 2**63 into ties (the top-1 of [2**63 - 2, 2**63 - 1] was
    index 0): integers rank by themselves, so rf.topk's own reference and the interpreter's argmax are exact."""
    a = np.array([[-2**63, 2**63 - 2, -2**63 + 1, 2**63 - 2, 2**63 - 1]], np.int64)
    values, indices = rf.topk(a, 5)
    assert indices.tolist() == [[4, 1, 3, 2, 0]] and values.tolist() == [sorted(a[0].tolist(), reverse=True)]
    k = rf.kernel(lambda x: (rf.argmax(x, axis=-1), rf.argmin(x, axis=-1), rf.topk(x, 2)[1]), backend="interpret")
    got = k(np.concatenate([a, a[:, ::-1]]))
    assert got[0].tolist() == [4, 0] and got[1].tolist() == [0, 4] and got[2].tolist() == [[4, 1], [0, 1]]


def _argmax_of_two_steps(x):
    return rf.argmax(rf.exp(12.0 - x), axis=-1)


def _top1_of_a_square(x):
    return rf.topk((12.0 - x) ** 2, 1, axis=-1)[1]


def _argmin_of_a_fused_softmax(x):
    m = rf.max(x, axis=-1, keepdims=True)
    e = rf.exp(x - m)
    return rf.argmin(e / rf.sum(e, axis=-1, keepdims=True), axis=-1)


@pytest.mark.parametrize("backend", ["interpret", "cpu", "simulate"])
@pytest.mark.parametrize("body", [_argmax_of_two_steps, _top1_of_a_square, _argmin_of_a_fused_softmax],
                         ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["f16", "bf16"])
def test_16_bit_values_computed_in_steps_rank_as_numpy_rounds_them(backend, body, dtype):
    """A ranking decides, so its values are numpy's, rounded after every step (`schedule.topk.ranked_values`,
    `rewrite.read_as_held`): f16 ``12 - x`` of ``[2.002, 2.0]`` is 10 for both, so ``exp(12 - x)`` ties and
    numpy's argmax is 0; the f32 chain rounded once ranked index 1 first on cpu and simulate, and the fused
    softmax's ``x - m`` (unrounded) did so on the interpreter too (found by a helper)."""
    x = np.array([[2.0 + 2 ** -9, 2.0, 12.0], [2.0, 2.0 + 2 ** -9, 12.0], [11.0625, 10.9375, 2.0]], np.float32)
    x = x.astype(dtype)
    if body is not _argmin_of_a_fused_softmax:
        x = x[:, :2]
    expected = body(x)
    np.testing.assert_array_equal(rf.kernel(body, backend=backend)(x), expected)
