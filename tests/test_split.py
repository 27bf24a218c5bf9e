"""Split reductions (flash decoding): a fused loop's axis cut into slices run by different programs, their
partial states merged by the cascade's own merge rule. The Tile IR interpreter and the cpu backend run split
programs and equal the reference, for every seed workload, random splits and splits longer than the axis."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

import redfuser as rf
from redfuser import workloads as W
from redfuser.ir import FusedLoop, run_program
from redfuser.ir.tile import nodes as t
from redfuser.ir.tile.interpreter import run_tile_program
from redfuser.schedule import ScheduleOptions, options_for, schedule_program
from redfuser.schedule.fused import layout_or_fail
from redfuser.schedule.split import MIN_SLICE_CHUNKS, auto_split, plan_split
from redfuser.testing import assert_close
from redfuser.testing.cascade_check import compare, error_bounds
from redfuser.testing.cascades import cascades


def program_of(fn, *args):
    return rf.kernel(fn, backend="interpret").lower(*args).program


def kernel_names(tiled: t.TileProgram) -> list[str]:
    return [k.name.rsplit("_", 1)[-1] for k in tiled.kernels]


def quant_bound(x, w, ws):
    """docs/fusion.md: |result - exact| <= s * sum_k |w_k| (2^-4 |x_k| + 2^-10 a / 448), for any running a' <= a."""
    xa = np.abs(x.astype(np.float64))
    per = 2.0**-4 * xa + 2.0**-10 * xa.max(axis=-1, keepdims=True) / 448.0
    return (per @ np.abs(w.astype(np.float64))) * ws * (1 + 1e-5) + 1e-6


# ---------------------------------------------------------------------------------------------
# the plan: when to split, into what
# ---------------------------------------------------------------------------------------------
def test_automatic_split_fills_the_machine_only_when_the_grid_does_not():
    assert auto_split(programs=64, chunks=512, workers=16) == 1      # the rows fill the cores
    assert auto_split(programs=1, chunks=512, workers=2) == 4        # two programs per worker
    assert auto_split(programs=32, chunks=512, workers=132) == 9     # flash decoding on an H200-sized GPU
    assert auto_split(programs=1, chunks=12, workers=64) == 12 // MIN_SLICE_CHUNKS   # slices stay long
    assert auto_split(programs=1, chunks=2 * MIN_SLICE_CHUNKS - 1, workers=64) == 1   # too short to split


def test_split_plans_whole_chunks_and_never_an_empty_slice():
    x = np.zeros((1, 1000), np.float32)
    lay = layout_or_fail(next(s for s in program_of(W.softmax, x).body if isinstance(s, FusedLoop)), [])
    plan = plan_split(lay, ScheduleOptions(block_n=64, split=3))
    assert (plan.count, plan.length, plan.chunk) == (3, 384, 64)
    plan = plan_split(lay, ScheduleOptions(block_n=64, split=5000))   # longer than the axis
    assert (plan.count, plan.length, plan.chunk) == (1000, 1, 1)
    assert plan_split(lay, ScheduleOptions(split=1)) is None
    assert plan_split(lay, ScheduleOptions(workers=2)).count == 4      # automatic: 1 row, 2 cores
    assert plan_split(lay, ScheduleOptions(workers=1)) is None


def test_gpu_schedules_plan_for_the_devices_sms_or_an_h200(monkeypatch):
    from redfuser.runtime import device

    monkeypatch.setattr(device, "device_available", lambda: False)
    assert options_for("gpu").workers == 132 and options_for("gpu", {"split": 3}).split == 3
    assert options_for("cpu", {"num_threads": 5}).workers == 5
    with pytest.raises(rf.ArgumentError, match="split"):
        ScheduleOptions(split=0)


@pytest.mark.parametrize("n, masked", [(640, False), (650, True)])
def test_an_overhanging_last_slice_stops_at_the_axis_end(n, masked):
    """3 slices of 256 over 640 keys: each slice stops at min(256, n - start), so no program walks a chunk
    wholly past the axis, and an axis of whole chunks (640 = 10 x 64) loads without a bounds mask."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((2, n)) * 3).astype(np.float32)
    tiled = check_tiles(W.softmax, (x,), ScheduleOptions(block_n=64, split=3), n)
    partial = str(tiled).split("kernel softmax_0_combine")[0]
    assert "for %j: i32 = 0 to %slice_stop step 64" in partial
    assert "%slice_stop: i32 = minimum %slice_left, %c_1" in partial
    assert ("load x[%x_off] mask" in partial) is masked


# ---------------------------------------------------------------------------------------------
# the Tile IR interpreter runs split schedules (checked against the Loop IR interpreter)
# ---------------------------------------------------------------------------------------------
def check_tiles(fn, args, opts, n, scale=None):
    program = program_of(fn, *args)
    tiled = schedule_program(program, opts)
    expected, actual = run_program(program, args), run_tile_program(tiled, args)
    for a, e in zip(actual, expected):
        if e.dtype.kind in "iu":
            assert np.array_equal(a, e)
        else:
            assert_close(a, e, np.float32, n, str(tiled), scale=scale)
    return tiled


splits = st.integers(2, 40)
small_blocks = st.builds(ScheduleOptions, block_m=st.sampled_from([1, 2, 4]), block_n=st.sampled_from([1, 3, 8]),
                         block_k=st.sampled_from([2, 8]), pow2=st.booleans())


@given(cascades(max_axis=300), splits)
def test_fuzzed_cascades_split_on_the_cpu_meet_the_fuzzers_bounds(c, split):
    """The fusion fuzzer's random cascades (masks, NaN/inf, GEMM producers, sums of terms), split."""
    note(c.source())
    arrays = c.data.build()
    args = [arrays[n] for n in c.inputs]
    with np.errstate(all="ignore"):
        want = c.function(*args)
        got = rf.kernel(c.function, backend="cpu", split=split, block_n=8)(*args)
    got, want = (got, want) if len(c.returns) > 1 else ((got,), (want,))
    bounds = error_bounds(c, arrays)
    for name, a, e in zip(c.returns, got, want):
        failure = compare(np.asarray(a), np.asarray(e), bounds[name], c)
        assert failure is None, failure.message


@given(st.integers(1, 30), splits, small_blocks, st.integers(0, 2**16), st.sampled_from(["none", "prefix", "row"]))
def test_interpreter_runs_split_softmax_cascades(n, split, opts, seed, masked):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, n)) * 3).astype(np.float32)
    if masked == "prefix":
        x[1, : n // 2 + 1] = -np.inf
    elif masked == "row":
        x[2] = -np.inf
    opts = ScheduleOptions(opts.block_m, opts.block_n, opts.block_k, opts.pow2, split=split)
    finite = float(np.abs(x[np.isfinite(x)]).max(initial=1.0))
    for fn in (W.log_softmax, W.softmax_entropy, W.softmax):
        # the entropy cancels terms of size |x| (log l against sum p (x - m)): that is its honest scale
        tiled = check_tiles(fn, (x,), opts, n, scale=finite if fn is W.softmax_entropy else None)
        note(str(tiled))
        if n > opts.tile(opts.block_n, -(-n // split)):
            assert "combine" in kernel_names(tiled)


@given(st.sampled_from([(1, 2, 1, 4), (2, 1, 3, 8), (1, 1, 4, 5)]), st.integers(1, 40), splits, small_blocks,
       st.sampled_from([W.attention, W.causal_attention]))
def test_interpreter_runs_split_attention(qshape, n, split, opts, fn):
    rng = np.random.default_rng(n)
    b, h, m, d = qshape
    if fn is W.causal_attention:
        n = m
    q = rng.standard_normal(qshape).astype(np.float32)
    k, v = (rng.standard_normal((b, h, n, d)).astype(np.float32) for _ in range(2))
    check_tiles(fn, (q, k, v), ScheduleOptions(opts.block_m, opts.block_n, opts.block_k, opts.pow2, split=split), n)


@given(splits, st.integers(0, 2**16))
def test_interpreter_runs_split_routing_and_quantized_gemm(split, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((5, 24)) * 3).astype(np.float32)
    check_tiles(W.moe_routing, (x,), ScheduleOptions(block_m=2, block_n=4, split=split), 24)
    xq = rng.standard_normal((4, 20)).astype(np.float16)
    xq[1, :7] = 0
    w = rng.standard_normal((20, 6)).astype(rf.float8_e4m3fn)
    ws = rng.uniform(0.5, 2.0, 6).astype(np.float32)
    tiled = schedule_program(program_of(W.fp8_quant_gemm, xq, w, ws), ScheduleOptions(block_m=2, block_n=3, split=split))
    (out,) = run_tile_program(tiled, [xq, w, ws])
    exact = (xq.astype(np.float64) @ w.astype(np.float64)) * ws
    assert np.all(np.abs(out - exact) <= quant_bound(xq, w, ws))


# ---------------------------------------------------------------------------------------------
# the cpu backend
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rows", [1, 4])
def test_split_flash_decoding_at_32768_keys(rows):
    rng = np.random.default_rng(rows)
    q = rng.standard_normal((1, 2, rows, 16)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, 32768, 16)).astype(np.float32) for _ in range(2))
    k[0, 1, 20000] = q[0, 1, 0] * 4          # one key far above the rest, late in the axis
    ref = W.attention(q, k, v)
    for split in (None, 7, 64):
        kern = rf.kernel(W.attention, backend="cpu", split=split, num_threads=4)
        assert_close(kern(q, k, v), ref, np.float32, 32768)
        tiled = kern.lower(q, k, v).stages["tile"]
        assert kernel_names(tiled) == ["partial", "combine"]
        # auto, 4 workers: 2 programs (one per head, whether it has 1 or 4 query rows) -> 4 slices
        assert tiled.kernels[0].grid[-1] == (split or 4)
    unsplit = rf.kernel(W.attention, backend="cpu", split=1)
    assert len(unsplit.lower(q, k, v).stages["tile"].kernels) == 1


@given(st.integers(1, 300), st.integers(2, 400), st.integers(0, 2**16))
def test_cpu_random_splits_including_splits_longer_than_the_axis(n, split, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, n)) * 3).astype(np.float32)
    x[1, : n // 3] = -np.inf
    finite = float(np.abs(x[np.isfinite(x)]).max(initial=1.0))
    for fn in (W.softmax, W.log_softmax, W.softmax_entropy):
        got, ref = rf.kernel(fn, backend="cpu", split=split, block_n=8)(x), fn(x)
        assert_close(got, ref, np.float32, n, scale=finite if fn is W.softmax_entropy else None)
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    k, v = (rng.standard_normal((1, 1, n, 8)).astype(np.float32) for _ in range(2))
    assert_close(rf.kernel(W.attention, backend="cpu", split=split, block_n=16)(q, k, v), W.attention(q, k, v),
                 np.float32, n)


@pytest.mark.parametrize("split", [None, 2, 5, 1000])
def test_cpu_split_routing_and_quantized_gemm(split):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 256)) * 3).astype(np.float32)
    x[2] = -np.inf
    (wt, idx), (w_ref, idx_ref) = rf.kernel(W.moe_routing, backend="cpu", split=split, num_threads=64)(x), W.moe_routing(x)
    assert np.array_equal(idx, idx_ref)
    assert_close(wt, w_ref, np.float32, 256)
    xq = rng.standard_normal((3, 700)).astype(np.float16)
    xq[0, :300] = 0
    xq[2] = 0                                   # an all-zero row gives the reference's NaN
    w = rng.standard_normal((700, 40)).astype(rf.float8_e4m3fn)
    ws = rng.uniform(0.5, 2.0, 40).astype(np.float32)
    out = rf.kernel(W.fp8_quant_gemm, backend="cpu", split=split, num_threads=64)(xq, w, ws)
    exact = (xq.astype(np.float64) @ w.astype(np.float64)) * ws
    assert np.isnan(out[2]).all() and np.isnan(W.fp8_quant_gemm(xq, w, ws)[2]).all()
    assert np.all(np.abs(out[:2] - exact[:2]) <= quant_bound(xq, w, ws)[:2])


def test_the_combine_uses_this_cascades_merge_rule():
    x = np.zeros((1, 4096), np.float32)
    tiled = rf.kernel(W.fp8_quant_gemm, backend="cpu", split=4).lower(
        np.zeros((2, 4096), np.float16), np.zeros((4096, 8), rf.float8_e4m3fn), np.ones(8, np.float32)).stages["tile"]
    combine = str(tiled.kernels[1])
    assert "y_acc_scaled" in combine and "exp" not in combine      # rescaled by a ratio of absmaxes, not exp
    combine = str(rf.kernel(W.log_softmax, backend="cpu", split=4).lower(x).stages["tile"].kernels[1])
    assert "exp" in combine and "maximum" in combine
