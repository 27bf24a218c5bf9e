"""The closing *sweep*: a fused loop's kernel also computes the next nest that adds one axis of the loop's
length (softmax's ``exp(x - m) / l``), in a second loop after the states are final, instead of a kernel of
its own reading the states back from memory (`redfuser.schedule.layout._sweep_key`)."""
from __future__ import annotations

import numpy as np
import pytest

import redfuser as rf
from redfuser.codegen.ptx_check import check_ptx
from redfuser.ir.tile import nodes as t
from redfuser.testing import assert_close
from redfuser.workloads import log_softmax, softmax


def _loops(kernel: t.TileKernel) -> list[t.For]:
    return [op for op in kernel.body if isinstance(op, t.For)]


@pytest.mark.parametrize("fn", [softmax, log_softmax])
@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_softmax_is_one_kernel_with_two_loops(fn, backend):
    x = (np.random.default_rng(0).standard_normal((70, 333)) * 3).astype(np.float32)
    x[3] = -np.inf                                   # a fully masked row: NaN out, like the reference
    kern = rf.kernel(fn, backend=backend, split=1, block_n=64)   # chunks, not the GPU's whole rows
    assert_close(kern(x), fn(x), np.float32, 333)
    tiled = kern.lower(x).stages["tile"]
    (kernel,) = tiled.kernels
    assert len(_loops(kernel)) == 2 and not tiled.scratch   # m and l never leave the kernel


def test_the_gpu_kernel_with_a_sweep_assembles_without_spills():
    x = np.zeros((64, 16384), np.float16)
    low = rf.kernel(softmax, backend="cuda", sm="sm_90", split=1).lower(x)
    (k,) = low.stages["ptx"].kernels
    (usage,) = check_ptx(k.ptx)["sm_90"].usage
    assert usage.spill_store_bytes == usage.spill_load_bytes == 0


def test_a_split_loop_leaves_its_sweep_to_a_kernel_over_the_whole_grid():
    x = np.random.default_rng(1).standard_normal((8, 300)).astype(np.float32)
    kern = rf.kernel(softmax, backend="cpu", split=3)
    assert_close(kern(x), softmax(x), np.float32, 300)
    names = [k.name for k in kern.lower(x).stages["tile"].kernels]
    assert names == ["softmax_0_partial", "softmax_0_combine", "softmax_2"]


def test_only_an_axis_of_the_loops_length_is_swept():
    """``out[i, c] = l[i] * w[c]`` adds an axis of another length: it gets a kernel of its own."""
    def scaled(x, w):
        m = rf.max(x, axis=-1, keepdims=True)
        l = rf.sum(rf.exp(x - m), axis=-1, keepdims=True)
        return l * w

    x = np.random.default_rng(2).standard_normal((40, 96)).astype(np.float32)
    w = np.arange(7, dtype=np.float32)
    kern = rf.kernel(scaled, backend="cpu", split=1)
    assert_close(kern(x, w), scaled(x, w), np.float32, 96)
    assert len(kern.lower(x, w).stages["tile"].kernels) == 2


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
@pytest.mark.parametrize("fn", [softmax, log_softmax])
def test_a_batch_of_one_keeps_the_sweep_in_the_loops_kernel(fn, backend):
    """Rows ``[1, 64, 333]``: the sweep reads ``m`` and ``l`` at index 0 of the length-1 batch axis, which
    then joins no axis of the kernel; it is a fixed 0 there, not a reason for a second kernel (a batch of
    two was one kernel, a batch of one two)."""
    x = (np.random.default_rng(3).standard_normal((1, 64, 333)) * 3).astype(np.float32)
    kern = rf.kernel(fn, backend=backend, split=1, block_n=64)
    assert_close(kern(x), fn(x.astype(np.float64)).astype(np.float32), np.float32, 333)
    tiled = kern.lower(x).stages["tile"]
    (kernel,) = tiled.kernels
    assert len(_loops(kernel)) == 2 and not tiled.scratch


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_a_batch_of_one_keeps_attentions_epilogue_in_the_loops_kernel(backend):
    """FlashAttention's f16 body ends in two epilogue nests (``o = acc`` masked, then ``f16(o / l)``), the
    second reading the first at index 0 of the batch axis when the batch is 1: one kernel, as for a batch
    of two; and grouped-query attention (its query heads seen as [B, Hkv, G, N, D]) likewise."""
    from redfuser.workloads import flash_attention_f16, gqa_attention_f16

    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 64, 64)).astype(np.float16) for _ in range(3))
    qg = rng.standard_normal((1, 8, 64, 64)).astype(np.float16)
    for fn, args in ((flash_attention_f16, (q, k, v)), (gqa_attention_f16, (qg, k, v))):
        kern = rf.kernel(fn, backend=backend)
        assert len(kern.lower(*args).stages["tile"].kernels) == 1, fn.__name__
        assert_close(kern(*args).astype(np.float32), fn(*args).astype(np.float32), np.float16, 64)


def _rms_norm(x, w):
    return x / rf.sqrt(rf.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def _l1_normalize(x):
    return x / rf.sum(rf.abs(x), axis=-1, keepdims=True)


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_a_lone_reduction_and_the_nest_that_sweeps_its_row_are_one_kernel(backend):
    """RMSNorm and a row normalized by its own sum: one reduction, then a nest over the same row reading it.
    The reduction is a fused loop of one (`fusion.cascade.swept_later`) and the nest its sweep, so the
    statistic never leaves the kernel (two kernels before: the row read from memory twice). A reduction
    whose reader adds no axis of the row's length stays a plain reduction."""
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((70, 600)).astype(np.float32), rng.standard_normal(600).astype(np.float32)
    for fn, args in ((_rms_norm, (x, w)), (_l1_normalize, (x,))):
        kern = rf.kernel(fn, backend=backend)
        lowered = kern.lower(*args)
        assert "fused loop over" in str(lowered.stages["fused"])
        tiled = lowered.stages["tile"]
        assert len(tiled.kernels) == 1 and not tiled.scratch, fn.__name__
        want = fn(*(a.astype(np.float64) for a in args)).astype(np.float32)
        assert_close(kern(*args), want, np.float32, 600)

    def total_only(x):
        return rf.sum(x, axis=-1) * 2.0

    assert "fused loop" not in str(rf.kernel(total_only, backend=backend).lower(x).stages["fused"])


def test_cpu_row_loops_take_whole_rows_up_to_4096_in_l1_sized_tiles():
    """The cpu's row tile (`layout.row_tile`, `options.ROW_TILE`): a row of 1000 is one chunk, 8 rows a tile;
    a row of 5000 is a chunk of 4096 and a peeled tail of 904, 2 rows a tile; a tiny input keeps one program
    (`ROW_TILE_LEAST`); a tile given by the user is the tile."""
    rng = np.random.default_rng(7)

    def shape_of(x, **options):
        kern = rf.kernel(softmax, backend="cpu", num_threads=2, **options)
        tiled = kern.lower(x).stages["tile"]
        (kernel,) = tiled.kernels
        assert_close(kern(x), softmax(x.astype(np.float64)).astype(np.float32), np.float32, x.shape[-1])
        return kernel.grid, str(tiled)

    grid, text = shape_of((rng.standard_normal((64, 1000)) * 3).astype(np.float32))
    assert grid == (8,) and "f32[8,1000] = load" in text and " = for " not in text.split("load")[0]
    grid, text = shape_of((rng.standard_normal((6, 5000)) * 3).astype(np.float32))
    assert grid == (3,) and "f32[2,4096] = load" in text and "_tail" in text   # (one whole chunk: inlined)
    grid, _ = shape_of(rng.standard_normal((4, 16)).astype(np.float32))
    assert grid == (1,)
    grid, text = shape_of((rng.standard_normal((64, 1000)) * 3).astype(np.float32), block_m=32, block_n=64)
    assert grid == (2,) and "step 64" in text
