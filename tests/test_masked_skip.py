"""``skip_masked=True``: fused loops stop after the last chunk a causal-style mask lets through.

The bound comes from `redfuser.schedule.masked` (the mask found in every state's term, the dead terms checked
on random points); the loop's stop is then a value computed per program (Tile IR ``for ... to %live_stop``)
on every backend that runs Tile IR (the tile interpreter, cpu, simulate, cuda's PTX). Results equal the
reference for finite inputs; the one documented difference (an inf or NaN under the mask, which numpy turns
into NaN through ``0 * v``) is pinned here too.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import redfuser as rf
from redfuser.ir import ArgumentError, VerifyError
from redfuser.ir.tile import nodes as t
from redfuser.ir.tile.interpreter import run_tile_program
from redfuser.ir.tile.verifier import verify_tile_program
from redfuser.schedule import ScheduleOptions, schedule_program
from redfuser.testing import assert_close
from redfuser.workloads import causal_attention


def shifted_causal(shift: int, flipped: bool):
    """Attention where query i sees keys j <= i + shift, masked as ``where(live, s, -inf)`` or, flipped,
    ``where(j > i + shift, -inf, s)``."""
    def fn(q, k, v):
        n, m_ = k.shape[-2], q.shape[-2]
        s = (q @ rf.swapaxes(k, -1, -2)) * 0.25
        j, i = rf.arange(n)[None, :], rf.arange(m_)[:, None]
        s = rf.where(j > i + shift, -rf.inf, s) if flipped else rf.where(j <= i + shift, s, -rf.inf)
        m = rf.max(s, axis=-1, keepdims=True)
        p = rf.exp(s - m)
        return (p / rf.sum(p, axis=-1, keepdims=True)) @ v
    return fn


def unmasked_extra(q, k):
    """A cascade with one state the mask does not cover: no chunk may be skipped."""
    n, m_ = k.shape[-2], q.shape[-2]
    s0 = (q @ rf.swapaxes(k, -1, -2)) * 0.25
    s = rf.where(rf.arange(n)[None, :] <= rf.arange(m_)[:, None], s0, -rf.inf)
    m = rf.max(s, axis=-1, keepdims=True)
    return rf.sum(rf.exp(s - m), axis=-1, keepdims=True) + rf.sum(rf.maximum(s0, 0.0), axis=-1, keepdims=True)


def _qkv(seed: int, rows: int, keys: int, d: int = 16, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((1, 2, rows, d)).astype(dtype),
            rng.standard_normal((1, 2, keys, d)).astype(dtype), rng.standard_normal((1, 2, keys, d)).astype(dtype))


def _tile_text(kern, *args) -> str:
    return str(kern.lower(*args).stages["tile"])


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_causal_attention_skips_blocks_past_the_diagonal_with_the_same_result(backend):
    q, k, v = _qkv(0, 200, 200)
    kern = rf.kernel(causal_attention, backend=backend, skip_masked=True)
    assert_close(kern(q, k, v), causal_attention(q, k, v), np.float32, 200)
    text = _tile_text(kern, q, k, v)
    assert "to %live_stop step" in text
    assert "to %live_stop step" not in _tile_text(rf.kernel(causal_attention, backend=backend), q, k, v)


@pytest.mark.parametrize("shift,flipped", [(3, False), (-5, False), (0, True), (40, True), (-20, False)])
def test_shifted_and_flipped_masks(shift, flipped):
    fn = shifted_causal(shift, flipped)
    q, k, v = _qkv(1, 150, 170)
    ref = fn(q, k, v)      # shift -20: rows 0..19 see no key (NaN, like the reference; a tile loops 0 times)
    for backend in ("cpu", "simulate"):
        kern = rf.kernel(fn, backend=backend, skip_masked=True)
        assert_close(kern(q, k, v), ref, np.float32, 170)
        assert "to %live_stop step" in _tile_text(kern, q, k, v)


@pytest.mark.parametrize("shift", [2**31 - 1, 2**32, 2**40, -(2**40)])
@pytest.mark.parametrize("skip", [None, True])
def test_a_mask_offset_past_the_index_range_runs_the_whole_loop(shift, skip):
    """``j <= i + K`` with ``K = 2**31 - 1`` (a "no limit" sentinel) or more: the loop's stop, the row plus
    ``K``, wrapped in i32, and every row came out NaN on cpu by default (``2**32``: plain causal attention,
    0.8 off, with ``skip_masked=True``; an internal verifier error on simulate). Such a loop is not stopped
    early now: numpy's full attention, or all-NaN rows for ``-2**40``. Found by a helper (hunt_flex/01-02)."""
    fn = shifted_causal(shift, False)
    q, k, v = _qkv(5, 12, 12, d=4)
    with np.errstate(invalid="ignore"):
        ref = fn(q, k, v)
    for backend in ("interpret", "cpu", "simulate"):
        kern = rf.kernel(fn, backend=backend, skip_masked=skip, block_m=4, block_n=4)
        assert_close(kern(q, k, v), ref, np.float32, 12)
        if backend != "interpret":
            assert "live_stop" not in _tile_text(kern, q, k, v)


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_a_split_loop_skips_what_the_unsplit_loop_skips(backend):
    """``skip_masked=True`` did nothing once the loop was split (``split=2``, or the GPU's automatic split of a
    long causal loop): every masked block was computed. Each slice now stops at the unsplit loop's stop;
    with an inf in ``v``'s last key (seen by the last query only) the skipping kernels give finite rows where
    numpy's ``0 * inf`` is NaN (the documented difference), split or not, and the default (``skip_exact`` on
    cpu) numpy's NaNs. Found by a helper (hunt_opts/01)."""
    q, k, v = _qkv(3, 120, 120)
    tiles = {"block_m": 16, "block_n": 16}      # (tiles small enough that a row block ends before the axis)
    ref = causal_attention(q, k, v)
    for split in (2, 3):
        kern = rf.kernel(causal_attention, backend=backend, skip_masked=True, split=split, **tiles)
        assert_close(kern(q, k, v), ref, np.float32, 120)
        assert "slice_live" in _tile_text(kern, q, k, v)
    v[0, 0, -1, 0] = np.inf
    with np.errstate(invalid="ignore"):
        nans = int(np.isnan(causal_attention(q, k, v)).sum())
    skipped = int(np.isnan(rf.kernel(causal_attention, backend=backend, skip_masked=True, **tiles)(q, k, v)).sum())
    assert skipped < nans
    for split in (2, 3):
        got = rf.kernel(causal_attention, backend=backend, skip_masked=True, split=split, **tiles)(q, k, v)
        assert int(np.isnan(got).sum()) == skipped
        if backend == "cpu":
            exact = rf.kernel(causal_attention, backend=backend, split=split, **tiles)
            assert int(np.isnan(exact(q, k, v)).sum()) == nans


def test_a_state_without_the_mask_keeps_the_whole_loop():
    rng = np.random.default_rng(2)
    q, k = (rng.standard_normal((1, 1, 150, 16)).astype(np.float32) for _ in range(2))
    kern = rf.kernel(unmasked_extra, backend="cpu", skip_masked=True)
    assert_close(kern(q, k), unmasked_extra(q, k), np.float32, 150)
    assert "live_stop" not in _tile_text(kern, q, k)


def test_infinity_under_the_mask_is_the_documented_difference():
    """numpy's 0 * inf makes every row that masks key 149 NaN; a skipped block never reads it, so only the
    rows whose own last block holds key 149 (masked there, computed as 0 * inf) turn NaN."""
    q, k, v = _qkv(3, 150, 150)
    v[0, 0, 149] = np.inf
    ref = causal_attention(q, k, v)
    whole = rf.kernel(causal_attention, backend="cpu")(q, k, v)
    skipping = rf.kernel(causal_attention, backend="cpu", skip_masked=True, block_m=32, block_n=64)(q, k, v)
    assert np.isnan(ref[0, 0]).any(-1).sum() == 149 and np.array_equal(np.isnan(whole), np.isnan(ref))
    nan_rows = np.flatnonzero(np.isnan(skipping[0, 0]).any(-1))
    assert list(nan_rows) == list(range(128, 149))       # the row tile 128..159 reads the block 128..191
    finite = ~np.isnan(ref).any(-1, keepdims=True) | np.isnan(skipping).any(-1, keepdims=True)
    assert_close(np.where(finite, skipping, 0), np.where(finite, ref, 0), np.float32, 150)


def test_gpu_code_for_the_skipping_loop_assembles():
    q, k, v = _qkv(4, 128, 128, 64, np.float16)
    low = rf.kernel(causal_attention, backend="cuda", sm="sm_90", skip_masked=True).lower(q, k, v)
    assert "to %live_stop" in str(low.stages["tile"]) and "mma.sync" in str(low.stages["ptx"])


def test_a_loop_stop_must_be_an_iv_typed_scalar():
    q, k, v = _qkv(5, 64, 64)
    tiled = rf.kernel(causal_attention, backend="cpu", skip_masked=True).lower(q, k, v).stages["tile"]
    (kernel,) = tiled.kernels
    (loop,) = [op for op in kernel.body if isinstance(op, t.For)]
    wrong = t.Value("bad_stop", t.TileType(rf.float32, ()))
    body: list = []
    for op in kernel.body:
        body += [t.Constant(wrong, 1.0), t.For(loop.results, 0, wrong, loop.step, loop.inits, loop.body)] \
            if op is loop else [op]
    broken = t.TileKernel(kernel.name, kernel.grid, kernel.params, tuple(body))
    with pytest.raises(VerifyError, match="loop stop"):
        verify_tile_program(t.TileProgram(tiled.name, tiled.inputs, tiled.outputs, tiled.scratch, (broken,)))


def test_skip_masked_is_a_known_option_and_its_default_is_the_backends():
    assert rf.kernel(causal_attention).options.skip_masked is None
    with pytest.raises(ArgumentError, match="unknown option"):
        rf.kernel(causal_attention, skip_mask=True)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), keys=st.integers(1, 70), shift=st.integers(-8, 8), block_m=st.sampled_from([1, 4, 16]),
       block_n=st.sampled_from([1, 3, 8, 32]), flipped=st.booleans(), seed=st.integers(0, 2**16))
def test_random_shapes_tiles_and_shifts_in_the_tile_interpreter(rows, keys, shift, block_m, block_n, flipped, seed):
    fn = shifted_causal(shift, flipped)
    q, k, v = _qkv(seed, rows, keys)
    program = rf.kernel(fn, backend="interpret").lower(q, k, v).program
    tiled = schedule_program(program, ScheduleOptions(block_m=block_m, block_n=block_n, skip_masked=True))
    verify_tile_program(tiled)
    (out,) = run_tile_program(tiled, (q, k, v))
    assert_close(out, fn(q, k, v), np.float32, keys)


def test_a_far_shifted_mask_still_fuses_and_skips():
    """With the mask keeping few (i, j) pairs, the fusion engine's random-point checks used to find too few
    live points and left the program unfused; they now draw enough points."""
    from redfuser.ir import FusedLoop

    fn = shifted_causal(-60, False)
    q, k, v = _qkv(6, 150, 170)
    kern = rf.kernel(fn, backend="cpu", skip_masked=True)
    assert any(isinstance(s, FusedLoop) for s in kern.lower(q, k, v).program.body)
    assert_close(kern(q, k, v), fn(q, k, v), np.float32, 170)
    assert "to %live_stop step" in _tile_text(kern, q, k, v)


# -- the exact skip (the cpu backend's default): dead chunks skipped where a scan shows it changes nothing --
def test_the_exact_skip_scans_only_the_loads_a_mask_cannot_hide():
    """In causal attention only ``v`` can break a dead chunk (``0 * inf``); ``k``'s scores are replaced by the
    mask, and the running max and sum are states (their dead-chunk values are their live ones)."""
    from redfuser.schedule.masked import live_bound
    from redfuser.schedule.unify import unify

    q, k, v = _qkv(0, 8, 16)
    program = rf.kernel(causal_attention, backend="interpret").lower(q, k, v).program
    (fl,) = [s for s in program.body if type(s).__name__ == "FusedLoop"]
    classes = unify(fl, [])
    key = classes.of(len(fl.locals), fl.axis)
    bound = live_bound(fl, classes, key)
    assert bound is not None
    assert sorted({load.buffer.name for _, load in bound.unsafe}) == ["v"]


@pytest.mark.parametrize("n", [1, 100, 256, 300])
def test_the_cpu_default_skips_exactly(n):
    q, k, v = _qkv(n, n, n)
    default, never = rf.kernel(causal_attention, backend="cpu"), rf.kernel(causal_attention, backend="cpu",
                                                                            skip_masked=False)
    assert np.array_equal(default(q, k, v), never(q, k, v))
    text = str(default.lower(q, k, v).stages["tile"])
    assert ("live_stop" in text) == (n > 64)      # one 128-key chunk or less: nothing to skip
    assert "live_stop" not in str(never.lower(q, k, v).stages["tile"])


@pytest.mark.parametrize("backend", ["cpu", "interpret"])
def test_the_exact_skip_keeps_numpys_nan_from_an_infinity_under_the_mask(backend):
    """``v = inf`` in a key block every row of some programs masks: numpy's ``0 * inf`` makes those rows NaN,
    and ``skip_masked=True`` (finite values assumed) would not; the default scan finds it and computes the
    block. A NaN in ``k`` under the mask changes nothing, in numpy and in the kernel."""
    q, k, v = _qkv(7, 300, 300)
    v[0, 1, 200, 3] = np.inf
    k[0, 0, 250, 1] = np.nan
    with np.errstate(all="ignore"):
        want = causal_attention(q, k, v)
        got = rf.kernel(causal_attention, backend=backend)(q, k, v)
    assert np.isnan(want).any()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert_close(np.where(finite, got, 0), np.where(finite, want, 0), np.float32, 300)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 40), keys=st.integers(1, 70), shift=st.integers(-8, 8), block_m=st.sampled_from([1, 4, 16]),
       block_n=st.sampled_from([1, 3, 8, 32]), flipped=st.booleans(), seed=st.integers(0, 2**16),
       bad=st.sampled_from([np.inf, -np.inf, np.nan]), where=st.floats(0, 1))
def test_the_exact_skip_equals_numpy_for_any_value_under_the_mask(rows, keys, shift, block_m, block_n, flipped, seed,
                                                                   bad, where):
    fn = shifted_causal(shift, flipped)
    q, k, v = _qkv(seed, rows, keys)
    v[0, 1, min(int(where * keys), keys - 1), 0] = bad
    program = rf.kernel(fn, backend="interpret").lower(q, k, v).program
    tiled = schedule_program(program, ScheduleOptions(block_m=block_m, block_n=block_n, skip_exact=True))
    verify_tile_program(tiled)
    (out,) = run_tile_program(tiled, (q, k, v))
    with np.errstate(all="ignore"):
        want = fn(q, k, v)
    assert np.array_equal(np.isnan(out), np.isnan(want))
    finite = ~np.isnan(want)
    assert_close(np.where(finite, out, 0), np.where(finite, want, 0), np.float32, keys)
