"""Shape-polymorphic kernels (`redfuser.shapes`, `redfuser.ir.sizes`): compile counts over varying lengths,
results equal to the numpy body at every length (1 and lengths that are no multiple of a tile included),
the ``dynamic=`` choices, the guards, and the symbolic extents themselves."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import redfuser as rf
from redfuser import workloads
from redfuser.ir.sizes import Sym, SymbolicDecision, ceil_div, evaluate
from redfuser.ir.tile.interpreter import run_tile_program

HOST = ["interpret", "cpu"]


def _close(got, want, tol=2e-6):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=tol, atol=tol)


# -- the symbolic extents ----------------------------------------------------------------------------

def test_sizes_do_arithmetic_and_refuse_every_decision_on_their_value():
    n, m = Sym("n"), Sym("m")
    e = (n * 64 + m) - 1
    assert evaluate(e, {"n": 3, "m": 5}) == 196
    assert evaluate(ceil_div(n, 32), {"n": 65}) == 3
    assert n * 1 is n and n + 0 is n and 0 * n == 0
    assert n == Sym("n") and n != m and hash(n) == hash(Sym("n"))
    assert n != 0 and n != 1                       # a symbol is >= 2
    for decide in (lambda: n < 128, lambda: n >= 2, lambda: n % 64, lambda: bool(n), lambda: int(n),
                   lambda: range(n), lambda: n == 64, lambda: e == 0, lambda: max(n, 1), lambda: n // m):
        with pytest.raises(SymbolicDecision) as info:
            decide()
        assert "n" in info.value.symbols or "m" in info.value.symbols


# -- compile counts and results -----------------------------------------------------------------------

@pytest.mark.parametrize("backend", HOST)
def test_a_decoding_loop_over_a_growing_cache_compiles_at_most_two_kernels(backend):
    rng = np.random.default_rng(0)
    k = rf.kernel(workloads.attention, backend=backend)
    q = rng.standard_normal((4, 1, 32)).astype(np.float32)
    keys = rng.standard_normal((4, 80, 32)).astype(np.float32)
    values = rng.standard_normal((4, 80, 32)).astype(np.float32)
    for n in range(1, 80, 3):                  # 1, 4, 7 ... 79: lengths that are no multiple of a tile
        _close(k(q, keys[:, :n].copy(), values[:, :n].copy()), workloads.attention(q, keys[:, :n], values[:, :n]))
    info = k.cache_info()
    assert info.misses == 2 and info.currsize == 2 and info.hits == 25, info   # exact, then one symbolic
    assert k.polymorphism == {}


@pytest.mark.parametrize("backend", HOST)
def test_prefill_over_random_prompt_lengths_compiles_at_most_two_kernels(backend):
    rng = np.random.default_rng(1)
    k = rf.kernel(workloads.causal_attention, backend=backend)
    for n in rng.integers(1, 90, 12):
        q, kk, v = (rng.standard_normal((2, n, 16)).astype(np.float32) for _ in range(3))
        _close(k(q, kk, v), workloads.causal_attention(q, kk, v))
    assert k.cache_info().misses <= 2


@pytest.mark.parametrize("backend", HOST)
def test_moe_routing_over_varying_token_counts_compiles_at_most_two_kernels(backend):
    rng = np.random.default_rng(2)
    k = rf.kernel(workloads.moe_routing, backend=backend)
    for tokens in (1, 5, 33, 64, 130, 7):
        logits = rng.standard_normal((tokens, 16)).astype(np.float32)
        _close(k(logits), workloads.moe_routing(logits))
    assert k.cache_info().misses <= 2


@pytest.mark.parametrize("backend", HOST)
def test_a_gemm_cascade_over_varying_token_counts_compiles_at_most_two_kernels(backend):
    """Layer norm + GEMM whose rows vary: the cpu's GEMM tile (`ScheduleOptions.gemm_tile`) is halved while a
    static grid would leave a worker idle, and kept whole for a run-time grid (deciding on the run-time
    count of programs made every length a compile of its own)."""
    rng = np.random.default_rng(4)
    k = rf.kernel(workloads.layer_norm_gemm, backend=backend)
    w = rng.standard_normal((96, 160)).astype(np.float32)
    for tokens in (1, 5, 33, 130, 7, 300):
        x = (rng.standard_normal((tokens, 96)) * 2 + 3).astype(np.float32)
        rf.testing.assert_close(k(x, w), workloads.layer_norm_gemm(x, w), np.float32, 96)
    assert k.cache_info().misses <= 2, k.polymorphism


def _mean_pool(x):
    return rf.mean(x, axis=1)


def _spread(x):
    return rf.var(x, axis=-1, ddof=1), rf.std(x, axis=-1), rf.var(x, axis=-1, ddof=3)


def _layer_norm(x):
    mu = rf.mean(x, axis=-1, keepdims=True)
    return (x - mu) / rf.sqrt(rf.var(x, axis=-1, keepdims=True) + 1e-5)


def _last_position_softmax_value(x):
    m = rf.max(x, axis=-1)
    return rf.exp(x[:, -1] - m), x[:, -3] * 2


@pytest.mark.parametrize("backend", HOST + ["simulate"])
def test_a_negative_index_along_a_symbolic_axis_counts_from_its_run_time_length(backend):
    """``x[:, -1]`` (the last position's logits) compiled the position ``n - 1`` in, so the axis stayed static and
    each length made a kernel (7 lengths, 7 compiles; found by a helper). It is the length read when the kernel
    runs minus 1 now; a length below the index's needs is refused as numpy refuses it."""
    k = rf.kernel(_last_position_softmax_value, backend=backend)
    for n in (3, 5, 9, 17, 4, 64, 65):
        x = np.random.default_rng(n).standard_normal((4, n)).astype(np.float32)
        _close(k(x), _last_position_softmax_value(x), 2e-6)
    info = k.cache_info()
    assert info.misses == 2 and info.currsize == 2, info
    with pytest.raises(rf.ShapeError, match="index -3 is out of bounds"):
        k(np.ones((4, 2), np.float32))


def _cross_entropy_by_gather(x, t):
    m = rf.max(x, axis=-1, keepdims=True)
    lse = m[:, 0] + rf.log(rf.sum(rf.exp(x - m), axis=-1))
    return lse - rf.take_along_axis(x, t[:, None], axis=-1)[:, 0]


@pytest.mark.parametrize("backend", HOST + ["simulate"])
def test_a_gather_along_a_symbolic_axis_wraps_around_its_run_time_length(backend):
    """``take_along_axis`` wraps numpy's negative indices around the axis's length: a constant made the
    vocabulary static, so a cross-entropy compiled a kernel per vocabulary size with ``dynamic=True``, and
    `polymorphism` said the body used the length as a number (found by a helper). The length is now read
    when the kernel runs."""
    rng = np.random.default_rng(6)
    k = rf.kernel(_cross_entropy_by_gather, backend=backend, dynamic=True)
    for rows, n in ((3, 7), (5, 300), (2, 33), (4, 2)):
        x = rng.standard_normal((rows, n)).astype(np.float32)
        t = rng.integers(-n, n, rows)
        _close(k(x, t), _cross_entropy_by_gather(x, t), 2e-5)
    info = k.cache_info()
    assert info.misses == 1 and info.currsize == 1, info


@pytest.mark.parametrize("backend", HOST + ["simulate"])
@pytest.mark.parametrize("body,shape", [(_mean_pool, lambda n: (2, n, 8)), (_spread, lambda n: (3, n)),
                                        (_layer_norm, lambda n: (3, n))], ids=["mean", "var_std", "layer_norm"])
def test_a_mean_or_var_over_varying_lengths_compiles_at_most_two_kernels(backend, body, shape):
    """A mean, var or std divides by its axis's length: as a constant it made the axis static, so mean pooling
    over prompts of every length compiled a kernel per length. Over a symbolic axis the count is a `Length`
    read when the kernel runs (``ddof`` subtracted then, and a count below ``ddof`` giving numpy's inf/NaN)."""
    rng = np.random.default_rng(5)
    k = rf.kernel(body, backend=backend)
    for n in (5, 9, 2, 33, 70, 3, 1):
        x = (rng.standard_normal(shape(n)) + 3).astype(np.float32)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)      # (numpy's "Degrees of freedom <= 0")
            want = body(x)
        _close(k(x), want, 2e-5)
    info = k.cache_info()
    assert info.misses == 3 and info.currsize == 3, info     # 5 exactly, the class from 9 on, 1 exactly
    sized = str(k.lower(rng.standard_normal(shape(40)).astype(np.float32)).stages["sized"])
    assert "length(x.1)" in sized, sized
    explained = k.explain(rng.standard_normal(shape(40)).astype(np.float32))
    assert "10009" not in explained and "10007" not in explained, explained


def _length_on_the_left(x):
    n = x.shape[-1]
    return n * x - n, n > x, n / (x + 2)


def _capped_mean(x):
    return rf.sum(x, axis=-1) / rf.minimum(x.shape[-1], 64)


def _int_power_of_length(i):
    return i ** i.shape[-1]


@pytest.mark.parametrize("backend", HOST + ["simulate"])
@pytest.mark.parametrize("body,symbolic", [(_length_on_the_left, True), (_capped_mean, False),
                                           (_int_power_of_length, False)],
                         ids=lambda v: getattr(v, "__name__", str(v)).strip("_"))
def test_a_length_next_to_a_traced_value_is_symbolic_and_one_numpy_computes_with_is_static(backend, body, symbolic):
    """(Found by a helper.) ``n * x`` asked ``int.__mul__`` first, noted as a read: static where ``x * n`` was
    symbolic. ``rf.minimum(n, 64)`` has no traced operand: numpy's, on the value, 64 at both probes, so the
    class divided by 64 at every length (8x off at 5 columns). An int power of a run-time length was 0 on the
    host. Those two read the length."""
    rng = np.random.default_rng(8)
    k = rf.kernel(body, backend=backend, dynamic=True)
    for n in (100, 7, 5, 200):     # (never the other axis's length: equal lengths make another class)
        if body is _int_power_of_length:
            x = rng.integers(-3, 4, (2, n)).astype(np.int64)
        else:
            x = (rng.standard_normal((3, n)) + 3).astype(np.float32)
        _close(k(x), body(x), 2e-6)
    assert (k.cache_info().misses == 1) is symbolic and (k.polymorphism == {}) is symbolic, k.polymorphism


@pytest.mark.parametrize("backend", HOST + ["simulate"])
def test_a_var_over_a_symbolic_axis_centres_on_the_bodys_mean_as_the_exact_kernel_does(backend):
    """(Found by a helper.) ``S / length`` is one atom of the normal form where ``S / 300.0`` is ``S`` times a
    coefficient, so the symbolic variance was not seen to centre on the body's mean and got a running mean of
    its own (two running sums more), whose final move read the f16-rounded sum: a row of 300 values near 1000
    (numpy's f16 sum overflows: docs/testing.md, note [11]) gave NaN where the exact kernel gives the
    variance of its f32 sums."""
    rng = np.random.default_rng(9)
    x = (1000 + rng.standard_normal((2, 300))).astype(np.float16)
    exact = rf.kernel(_spread, backend=backend, dynamic=False)(x)
    symbolic = rf.kernel(_spread, backend=backend, dynamic=True)
    for got, want in zip(symbolic(x), exact):
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=4e-3)
    fused = str(symbolic.lower(x).stages["fused"])
    assert "centre_sum" not in fused, fused


def test_an_f16_mean_over_a_symbolic_axis_is_numpys():
    """The count is converted to the f32 the 16-bit total is divided in, as a constant count was."""
    rng = np.random.default_rng(6)
    k = rf.kernel(_mean_pool, backend="cpu", dynamic=True)
    for n in (7, 300, 4099):
        x = rng.standard_normal((2, n, 4)).astype(np.float16)
        got, want = k(x), _mean_pool(x)
        assert got.dtype == want.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)
    assert k.cache_info().misses == 1


@pytest.mark.parametrize("backend", HOST)
def test_dynamic_true_compiles_once_for_every_shape_and_false_once_per_shape(backend):
    rng = np.random.default_rng(3)
    shapes = [(3, 5), (40, 300), (2, 1000), (65, 64)]
    every = rf.kernel(workloads.softmax, backend=backend, dynamic=True)
    exact = rf.kernel(workloads.softmax, backend=backend, dynamic=False)
    for shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        _close(every(x), workloads.softmax(x))
        _close(exact(x), workloads.softmax(x))
    assert every.cache_info().misses == 1
    assert exact.cache_info().misses == len(shapes)


def test_named_axes_are_the_only_symbolic_ones():
    rng = np.random.default_rng(4)
    k = rf.kernel(workloads.softmax, backend="cpu", dynamic={"x": (-2,)})
    for rows in (3, 17, 200):
        x = rng.standard_normal((rows, 48)).astype(np.float32)
        _close(k(x), workloads.softmax(x))
    assert k.cache_info().misses == 1
    x = rng.standard_normal((5, 49)).astype(np.float32)   # the other axis is static: a new kernel
    _close(k(x), workloads.softmax(x))
    assert k.cache_info().misses == 2


def _row_sum_over_count(x):
    return rf.sum(x, axis=-1) * (1.0 / x.shape[-1])     # (Python computes 1 / n: a constant of the length)


def test_a_length_used_as_a_number_keeps_its_axis_static_and_says_so():
    rng = np.random.default_rng(5)
    k = rf.kernel(_row_sum_over_count, backend="cpu", dynamic=True)
    for shape in ((3, 5), (40, 5), (7, 300)):
        x = rng.standard_normal(shape).astype(np.float32)
        _close(k(x), _row_sum_over_count(x), tol=1e-5)
    assert k.cache_info().misses == 2     # rows symbolic; one kernel per number of columns
    (why,) = k.polymorphism.values()
    assert "depends on the value of x.1" in why


@pytest.mark.parametrize("backend", HOST + ["simulate"])
def test_a_length_handed_to_an_op_as_it_is_is_read_when_the_kernel_runs(backend):
    """``rf.sum(x) / n`` with ``n = x.shape[-1]`` (the layer-norm statistics as users write them): the body
    computes nothing with ``n`` itself, so the op gets the probe and makes it a `Length`: one kernel for every
    number of columns. An f16 operand gets the length rounded to f16 as numpy converts the Python int (2049
    is 2048 there); an int one exactly."""
    rng = np.random.default_rng(5)
    k = rf.kernel(workloads.layer_norm_stats, backend=backend, dynamic=True)
    for shape in ((3, 5), (40, 5), (7, 300), (2, 3)):
        x = rng.standard_normal(shape).astype(np.float32)
        _close(k(x), workloads.layer_norm_stats(x), tol=1e-5)
    assert k.cache_info().misses == 1 and k.polymorphism == {}

    def scaled(x, i):
        return x / x.shape[-1], i * i.shape[-1]
    k = rf.kernel(scaled, backend=backend, dynamic=True)
    for n in (2049, 7):
        x, i = (rng.standard_normal((2, n)) * 1000).astype(np.float16), rng.integers(-9, 9, (3, n), np.int32)
        got, want = k(x, i), scaled(x, i)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
    assert k.cache_info().misses == 1 and k.polymorphism == {}


def test_symbolic_axes_of_equal_length_share_a_symbol_and_unequal_ones_make_another_class():
    rng = np.random.default_rng(6)

    def add(a, b):
        return a + b

    k = rf.kernel(add, backend="cpu", dynamic=True)
    for n in (4, 9):
        a, b = rng.standard_normal((n, 3)).astype(np.float32), rng.standard_normal((n, 3)).astype(np.float32)
        _close(k(a, b), a + b)
    assert k.cache_info().misses == 1
    with pytest.raises(rf.RedFuserError):      # different lengths: numpy refuses, and so does the kernel
        k(np.ones((4, 3), np.float32), np.ones((5, 3), np.float32))


@pytest.mark.parametrize("backend", HOST)
def test_an_int_index_guards_the_length_it_needs(backend):
    def pick(x):
        return x[:, 7] * 2.0

    k = rf.kernel(pick, backend=backend, dynamic=True)
    x = np.arange(40, dtype=np.float32).reshape(4, 10)
    _close(k(x), pick(x))
    y = np.arange(48, dtype=np.float32).reshape(4, 12)
    _close(k(y), pick(y))
    assert k.cache_info().misses == 1
    with pytest.raises(rf.RedFuserError, match="index 7 is out of bounds"):
        k(np.ones((4, 5), np.float32))          # numpy raises IndexError here


@pytest.mark.parametrize("dynamic, short, later", [
    (None, (2, 3), [(2, 9), (2, 11), (2, 13), (2, 15)]),
    (True, (4, 3), [(5, 9), (6, 11), (7, 13)]),
], ids=["automatic", "dynamic-first-call-short"])
def test_a_call_below_a_guard_leaves_the_class_to_longer_calls(dynamic, short, later):
    """The class compiled first at a call of 3 columns: its trace indexed past the call's length (``x[:, 7]``),
    which `probes.needed_past_the_call` takes as a read of the length, and the axis was kept static for the
    class for good: after the (rightly failed) short call every length compiled a kernel of its own, and
    `polymorphism` said the body used the length as a number. The short call is about itself only."""
    def pick(x):
        return rf.sum(x, axis=-1) + x[:, 7]

    k = rf.kernel(pick, backend="interpret", dynamic=dynamic)
    if dynamic is None:
        k(np.ones((2, 12), np.float32))
    with pytest.raises(rf.RedFuserError, match="index 7 is out of bounds"):
        k(np.ones(short, np.float32))             # numpy raises IndexError here
    before = k.cache_info().misses
    rng = np.random.default_rng(31)
    for shape in later:
        x = rng.standard_normal(shape).astype(np.float32)
        _close(k(x), pick(x), tol=1e-5)
    assert k.cache_info().misses - before == 1
    assert not any("as a number" in why for why in k.polymorphism.values())
    with pytest.raises(rf.RedFuserError, match="index 7 is out of bounds"):
        k(np.ones(short, np.float32))


def test_an_index_that_follows_the_length_still_keeps_it_static(monkeypatch):
    """A loop over a length (``range`` reads it without a hook) indexes past every call's own length: once a
    call meets what an earlier one lacked and still falls short, the length is read for the class, which is
    not traced again for later lengths."""
    import importlib

    kernel_module = importlib.import_module("redfuser.kernel")   # (rf.kernel is the function)
    real, classes = kernel_module.lower, []

    def counted(fn, specs, backend, options, shapes=None):
        classes.extend([shapes] if shapes is not None else [])
        return real(fn, specs, backend, options, shapes)

    monkeypatch.setattr(kernel_module, "lower", counted)

    def running(x):
        acc = x[:, 0]
        for i in range(1, x.shape[1]):
            acc = acc + x[:, i]
        return acc

    k = rf.kernel(running, backend="interpret")
    for n in (5, 6, 7, 8, 9):
        x = np.random.default_rng(n).standard_normal((2, n)).astype(np.float32)
        _close(k(x), running(x), tol=1e-5)
    assert "uses the length x.1 as a number" in " ".join(k.polymorphism.values())
    # (the reason names the user's line of the read, as errors do)
    assert "test_shapes.py:377: acc = acc + x[:, i]" in " ".join(k.polymorphism.values()), k.polymorphism
    assert len(classes) == 2 and k.cache_info().misses == 5     # (tried at 6 and at 7, which met 6's need)


def test_the_tile_interpreter_runs_the_symbolic_tile_program_at_any_length():
    rng = np.random.default_rng(7)
    k = rf.kernel(workloads.softmax, backend="cpu", dynamic=True)
    lowered = k.lower(rng.standard_normal((6, 70)).astype(np.float32))
    assert "x.0" in str(lowered.stages["sized"]) and "extent" in str(lowered.stages["tile"])
    for shape in ((2, 2), (33, 65), (1, 130)):
        x = rng.standard_normal(shape).astype(np.float32)
        _close(run_tile_program(lowered.stages["tile"], [x])[0], workloads.softmax(x))


def test_a_dynamic_argument_that_is_not_a_choice_is_refused():
    with pytest.raises(rf.ArgumentError, match="not a parameter"):
        rf.kernel(workloads.softmax, dynamic={"y": (0,)})
    with pytest.raises(rf.ArgumentError, match="dynamic must be"):
        rf.kernel(workloads.softmax, dynamic="yes")
    # (an axis named twice, as written or as -2 and 0 of a 2-d argument, was taken silently)
    for axes in ((-2, -2), (-2, 0)):
        with pytest.raises(rf.ArgumentError, match="names an axis twice"):
            rf.kernel(workloads.softmax, dynamic={"x": axes}, backend="interpret")(np.ones((3, 4), np.float32))


@pytest.mark.parametrize("backend", ["simulate"])
def test_gpu_backends_give_numpy_results_at_every_length(backend):
    rng = np.random.default_rng(8)
    k = rf.kernel(workloads.softmax, backend=backend)
    for shape in ((3, 5), (3, 70), (9, 70)):
        x = rng.standard_normal(shape).astype(np.float32)
        _close(k(x), workloads.softmax(x))
    assert k.cache_info().misses <= 3


def test_a_call_at_a_new_length_of_a_class_made_before_takes_the_fast_path():
    rng = np.random.default_rng(9)
    k = rf.kernel(workloads.softmax, backend="cpu")
    xs = [rng.standard_normal((4, n)).astype(np.float32) for n in range(16, 40)]
    k(xs[0]), k(xs[1])
    full = []
    compiled = k._compiled
    k._compiled = lambda *a, **kw: full.append(1) or compiled(*a, **kw)
    for x in xs[2:]:
        _close(k(x), workloads.softmax(x))
    assert not full and k.cache_info().hits == len(xs) - 2
    with pytest.raises(rf.RedFuserError, match="index 7"):    # a guard failing takes the full path and fails
        def pick(x):
            return x[:, 7]
        p = rf.kernel(pick, backend="cpu")
        p(np.ones((2, 9), np.float32)), p(np.ones((2, 10), np.float32))
        p(np.ones((2, 5), np.float32))


@pytest.mark.parametrize("backend", HOST)
def test_out_takes_the_results_at_the_calls_lengths(backend):
    rng = np.random.default_rng(10)
    k = rf.kernel(workloads.softmax, backend=backend, dynamic=True)
    for shape in ((3, 5), (8, 70)):
        x = rng.standard_normal(shape).astype(np.float32)
        out = np.empty_like(x)
        assert k(x, out=out) is out
        _close(out, workloads.softmax(x))
    with pytest.raises(rf.ArgumentError):
        k(x, out=np.empty((8, 71), np.float32))


def test_explain_and_the_sized_stage_name_the_symbols_not_the_probes():
    k = rf.kernel(workloads.softmax, backend="cpu", dynamic=True)
    x = np.ones((4, 100), np.float32)
    text = k.explain(x)
    assert "over an axis of x.1 elements" in text and "f32[x.0,x.1]" in text
    assert not any(str(p) in text for p in (10007, 10009))
    lowered = k.lower(x)
    assert "10007" in str(lowered.stages["traced"]) and "10007" not in str(lowered.stages["sized"])


@pytest.mark.parametrize("name,options", [("attention", {}), ("flash_attention_f16", {"sm": "sm_90a"}),
                                          ("causal_attention", {"prefetch": True}),
                                          ("causal_attention", {"skip_masked": True})])
def test_the_gpu_lowering_of_a_class_equals_numpy_at_every_length(name, options):
    """On `simulate`: the run-time extents as kernel parameters, the grid evaluated per launch, the split
    of a decoding loop over a run-time length, wgmma dots, prefetched operands, skipped masked blocks."""
    fn = getattr(workloads, name)
    rng = np.random.default_rng(11)
    dtype = np.float16 if name.endswith("f16") else np.float32
    k = rf.kernel(fn, backend="simulate", dynamic={"q": (-2,), "k": (-2,), "v": (-2,)}, **options)
    for n_q, n_k in ((1, 70), (1, 3), (17, 17), (40, 40)) if name == "attention" else ((70, 70), (9, 9)):
        q = rng.standard_normal((2, n_q, 32)).astype(dtype)
        kv = [rng.standard_normal((2, n_k, 32)).astype(dtype) for _ in range(2)]
        tol = 2e-3 if dtype == np.float16 else 2e-6
        _close(k(q, *kv), fn(q, *kv), tol=tol)
    assert k.polymorphism == {}
    assert k.cache_info().misses <= 2


@pytest.mark.parametrize("backend", HOST)
def test_a_decision_on_a_length_both_probes_take_alike_keeps_the_axis_static(backend):
    """Both probes are long, so the two traces agree on ``x.shape[0] > 8``; the body's read of the length as a
    number is noted instead (`redfuser.probes`), and rows stay static: 5 rows take numpy's other branch."""
    def branchy(x):
        if x.shape[0] > 8:
            return x * 2.0
        return x * 3.0

    def counted(x):
        return x * float(len(x))

    for body in (branchy, counted):
        k = rf.kernel(body, backend=backend, dynamic=True)
        for rows in (20, 30, 5):
            x = np.ones((rows, 4), np.float32)
            _close(k(x), body(x))
        assert "uses the length x.0 as a number" in " ".join(k.polymorphism.values())


def test_a_length_handed_to_an_op_stays_symbolic():
    """``rf.arange(k.shape[-2])`` is RedFuser's own use of the length (an axis), not the body's."""
    k = rf.kernel(workloads.causal_attention, backend="cpu", dynamic={"q": (-2,), "k": (-2,), "v": (-2,)})
    rng = np.random.default_rng(12)
    for n in (9, 40):
        q, kk, v = (rng.standard_normal((2, n, 16)).astype(np.float32) for _ in range(3))
        _close(k(q, kk, v), workloads.causal_attention(q, kk, v))
    assert k.cache_info().misses == 1 and k.polymorphism == {}


def test_any_failure_of_a_class_compile_falls_back_to_the_exact_shapes(monkeypatch):
    """A bug in the symbolic path must cost polymorphism, never the call: the exact shapes compile."""
    import importlib

    kernel_module = importlib.import_module("redfuser.kernel")   # (rf.kernel is the function)
    real = kernel_module.lower

    def broken(fn, specs, backend, options, shapes=None):
        if shapes is not None:
            raise TypeError("unsupported operand type(s) for *: 'Sym' and 'float'")
        return real(fn, specs, backend, options)

    monkeypatch.setattr(kernel_module, "lower", broken)
    k = rf.kernel(workloads.softmax, backend="cpu", dynamic=True)
    x = np.random.default_rng(13).standard_normal((5, 33)).astype(np.float32)
    _close(k(x), workloads.softmax(x))
    assert k.cache_info().misses == 1
    assert "TypeError: unsupported operand" in " ".join(k.polymorphism.values())


def test_a_class_kept_static_says_why_in_the_users_lengths():
    """A reshape into halves of a symbolic axis fails at the (prime) probe lengths; `polymorphism` said
    ``cannot reshape f32[10007,10009]``, lengths the user never chose: it names the symbols instead."""
    def halves(x):
        return rf.sum(rf.reshape(x, (x.shape[0], -1, 2)), axis=-1)

    k = rf.kernel(halves, backend="interpret", dynamic=True)
    for n in (8, 12):
        np.testing.assert_array_equal(k(np.ones((3, n), np.float32)), np.full((3, n // 2), 2.0, np.float32))
    (why,) = k.polymorphism.values()
    assert why.startswith("kept static: with these axes symbolic, reshape: cannot reshape f32[x.0,x.1]")
    assert "10007" not in why and "10009" not in why


@pytest.mark.parametrize("backend", ["interpret", "cpu", "simulate"])
def test_a_kv_cache_slice_of_a_preallocated_buffer_compiles_one_class(backend):
    """Decoding with a preallocated cache reads ``keys[:, :, :n]``, a strided view whose strides are the
    buffer's (they do not change with ``n``). Views kept every axis static, so each step compiled a kernel;
    a view's axes are now symbolic under its exact strides (the class key holds them)."""
    rng = np.random.default_rng(21)
    keys, values = (rng.standard_normal((1, 2, 300, 16)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((1, 2, 1, 16)).astype(np.float32)
    k = rf.kernel(workloads.attention, backend=backend)
    lengths = (1, 2, 3, 17, 65, 130) + ((299, 300) if backend != "simulate" else ())
    for n in lengths:
        _close(k(q, keys[:, :, :n], values[:, :, :n]), workloads.attention(q, keys[:, :, :n], values[:, :, :n]),
               tol=1e-5)
    # n = 1 (a broadcast), then one class; the full slice at n = 300 is dense, with the views' strides, and
    # runs in their class (it compiled a class of its own: found by a helper running benchmarks/dynamic_shapes.py)
    assert k.cache_info().misses == 2 and k.polymorphism == {}
    # a dense array of another length is not such a view: it gets a class of its own, and the right values
    for n in (40, 41):
        fresh = [np.ascontiguousarray(a[:, :, :n]) for a in (keys, values)]
        _close(k(q, *fresh), workloads.attention(q, *fresh), tol=1e-5)
        _close(k(q, keys, values), workloads.attention(q, keys, values), tol=1e-5)


@pytest.mark.parametrize("backend", ["interpret", "cpu", "simulate"])
def test_views_of_every_kind_are_read_right_at_every_length_of_their_class(backend):
    """Reversed, transposed, stepped and broadcast views with symbolic axes: each length read in place under
    the view's strides equals numpy on a copy."""
    rng = np.random.default_rng(22)
    big = rng.standard_normal((40, 300)).astype(np.float32)
    k = rf.kernel(workloads.softmax, backend=backend, dynamic=True)
    for n in (7, 9, 33, 100):
        for view in (big[:n, ::-1], big[:n, :n].T, big[::2, :n], np.broadcast_to(big[0, :n], (5, n))):
            _close(k(view), workloads.softmax(np.ascontiguousarray(view)))
    assert k.cache_info().misses <= 8     # a class per kind of view (its strides), a transpose's per length


_SCALE = {64: 0.125, 128: 0.0884}        # a per-head-dim table, as a user keeps one


def _scores(q, k):
    return rf.max((q @ rf.swapaxes(k, -1, -2)) * _SCALE.get(q.shape[-1], 1.0), axis=-1)


def _small_rows(x):
    if x.shape[-1] in {1, 2, 3}:
        return rf.max(x, axis=-1)
    return rf.sum(x, axis=-1)


def _long_digits(x):
    if len(str(x.shape[-1])) > 2:
        return rf.max(x, axis=-1)
    return rf.sum(x, axis=-1)


def _last_window(x):
    return rf.sum(x[:, -32768:], axis=-1)


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
@pytest.mark.parametrize("body, shapes", [
    (_scores, [((2, 64), (3, 64)), ((2, 32), (3, 32)), ((2, 128), (3, 128))]),
    (_small_rows, [((2, 8),), ((2, 9),), ((2, 3),)]),
    (_long_digits, [((2, 5),), ((2, 7),), ((2, 120),)]),
    (_last_window, [((1, 5),), ((1, 7),), ((1, 32868),)]),
], ids=["dict-lookup", "set-membership", "str", "slice-past-the-probes"])
def test_decisions_both_probes_take_alike_keep_their_axis_static(backend, body, shapes):
    """A shape class is traced at two probe lengths (10007, 20011); a decision on a length that both take
    the same way and that the tracer did not see as a read was compiled into every length: a dict or set
    lookup (hashing calls no comparison), ``str`` of a length, a slice whose bound is past both probes
    (``x[:, -32768:]`` is whole there). Each gave another branch's answer (a scale of 1.0 for 0.0884)."""
    rng = np.random.default_rng(23)
    k = rf.kernel(body, backend=backend)
    for call in shapes:
        args = [rng.standard_normal(s).astype(np.float32) + 1 for s in call]
        _close(k(*args), body(*args), tol=1e-4)


def _chose_max_where(predicate):
    """A body taking each row's max where `predicate` holds of the row length, else its sum."""
    def body(x):
        if predicate(x.shape[-1]):
            return rf.max(x, axis=-1)
        return rf.sum(x, axis=-1)

    return body


@pytest.mark.parametrize("predicate", [
    lambda n: math.log2(n).is_integer(),
    lambda n: math.gcd(n, 8) == 8,
    lambda n: math.isqrt(n) == 4,
    lambda n: divmod(64, n)[1] == 0,
    lambda n: n.bit_length() == 5,
    lambda n: (7 & n) == 0,
    lambda n: round(n, -1) == 20,
], ids=["math.log2", "math.gcd", "math.isqrt", "divmod-reflected", "bit_length", "and-reflected", "round-ndigits"])
def test_every_way_of_reading_a_length_as_a_number_is_seen(predicate):
    """The probes (10007, 20011) take each of these decisions the same way (false), and none of them was seen
    as a read: ``math``'s functions read an int's digits in C, ``c & n`` and ``divmod(c, n)`` call reflected
    methods, ``round(n, -1)`` ``__round__``, ``bit_length`` a method -- none of which `ProbeLength` wrapped --,
    so the class took the sum for every length, 16 included. Each is true at 16 and false at 12 and 13."""
    body = _chose_max_where(predicate)
    math_functions = {name: getattr(math, name) for name in ("log2", "gcd", "isqrt")}
    k = rf.kernel(body, backend="interpret")
    rng = np.random.default_rng(29)
    for n in (12, 13, 16):
        x = rng.standard_normal((2, n)).astype(np.float32)
        _close(k(x), body(x), tol=1e-5)
    assert "uses the length x.1 as a number" in " ".join(k.polymorphism.values())
    assert all(getattr(math, name) is f for name, f in math_functions.items())   # (wrapped only while tracing)


def test_an_arange_of_a_symbolic_size_is_not_made_at_the_probe_lengths():
    """``rf.arange(x.size)`` was evaluated by numpy while the class was traced: 4·10007·10009 elements
    (1.6 GB) for a 4x6x7 call, terabytes with a third symbolic axis."""
    import tracemalloc

    def weighted_max(x):
        return rf.max(x.reshape(-1) * rf.arange(x.size, dtype=rf.float32))

    k = rf.kernel(weighted_max, backend="interpret")
    k(np.ones((4, 5, 6), np.float32))
    tracemalloc.start()
    try:
        x = np.ones((4, 6, 7), np.float32)
        np.testing.assert_array_equal(k(x), weighted_max(x))
        assert tracemalloc.get_traced_memory()[1] < 64 * 2**20
    finally:
        tracemalloc.stop()


def test_an_argmax_on_interpret_warns_nothing(recwarn):
    """The interpreter's empty top-k list filled an int32 key list with NaN (numpy's invalid-cast warning
    on every call, an error under warnings-as-errors); numpy's argmax warns nothing."""
    import warnings

    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(rf.kernel(lambda v: rf.argmax(v, axis=-1), backend="interpret")(x), [4, 4])
