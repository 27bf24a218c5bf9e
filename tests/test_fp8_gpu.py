"""FP8 per-token quant + GEMM on the GPU path: the GEMM's output columns are tiled across the grid.

The fused loop's states are ``a[M]`` (running absmax) and ``y_acc[M, N]``. N is not shared by every state,
so it used to stay whole in the tile (``f32[block_m, N]`` per program), which no GPU block holds for N in
the thousands. Beyond `WHOLE_MAX` it is tiled by ``block_n`` over one more grid dimension, each program
recomputing ``a`` (exact: ``a`` never reads N). Attention's head dimension (up to 256 on a
GPU) stays whole.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from redfuser.codegen.ptx_check import check_ptx, resource_usage
from redfuser.ir import run_program
from redfuser.ir.tile import nodes as t
from redfuser.ir.tile.interpreter import run_tile_program
from redfuser.ir.tile.verifier import verify_tile_program
from helpers import within_quantization_bound

import redfuser as rf
from redfuser.schedule import ScheduleOptions, options_for, schedule_program
from redfuser.schedule.options import WHOLE_MAX
from redfuser.testing import assert_close
from redfuser.workloads import attention, flash_attention_f16, fp8_quant_gemm

MAX_SHARED = 48 * 1024


def fp8_inputs(m: int, k: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float16)
    x[0, : k // 3] = 0                 # leading zeros: the running absmax starts at 0
    x[1 % m] *= 40                      # a large row
    w = rng.standard_normal((k, n)).astype(ml_dtypes.float8_e4m3fn)
    ws = rng.uniform(0.5, 2.0, n).astype(np.float32)
    return x, w, ws


def within_bound(out, x, w, ws) -> bool:
    return within_quantization_bound("fp8_quant_gemm", out, x, w, ws)


def fused_kernels(tiled: t.TileProgram) -> list[t.TileKernel]:
    return [k for k in tiled.kernels if any(isinstance(op, t.For) for op in k.body)]


def carried_shapes(kernel: t.TileKernel) -> list[tuple[int, ...]]:
    """The shapes of the fused loop's states, in order (the compensations of per-row sums that follow them,
    `schedule.states.compensated_states`, left out)."""
    (loop,) = [op for op in kernel.body if isinstance(op, t.For)]
    return [v.shape for v, a in zip(loop.inits, loop.body.args) if not a.name.split(".")[0].endswith("_comp")]


@pytest.mark.parametrize("n", [512, 300])
def test_long_output_axis_is_tiled_across_the_grid(n):
    x, w, ws = fp8_inputs(64, 256, n)
    opts = options_for("gpu")
    tiled = schedule_program(rf.kernel(fp8_quant_gemm, backend="interpret").lower(x, w, ws).program, opts)
    verify_tile_program(tiled)
    for kernel in fused_kernels(tiled):
        # the states: a[block_m] and y_acc[block_m, block_n], never the whole N
        assert carried_shapes(kernel) == [(opts.rows(),), (opts.rows(), opts.block_n)]
        assert -(-n // opts.block_n) in kernel.grid


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_head_dimension_of_attention_stays_whole(backend):
    """Up to the backend's `WHOLE_MAX` (cpu 128, gpu 256) the head dimension is one tile: no grid dimension
    over it, so no program recomputes ``q @ k^T``."""
    head = WHOLE_MAX[backend]
    q = np.zeros((2, 3, 64, head), np.float32)
    kv = np.zeros((2, 3, 256, head), np.float32)       # key blocks: a loop (one would be inlined)
    tiled = schedule_program(rf.kernel(attention, backend="interpret").lower(q, kv, kv).program,
                             replace(options_for(backend), split=1))
    (kernel,) = fused_kernels(tiled)
    assert carried_shapes(kernel)[-1] == (64, head)
    assert kernel.grid == (2, 3, 1)  # batch, heads, query tiles: no grid dimension over the head dim
    longer = np.zeros((2, 3, 64, 2 * head), np.float32)
    tiled = schedule_program(rf.kernel(attention, backend="interpret").lower(longer, longer, longer).program,
                             replace(options_for(backend), split=1))
    assert len(fused_kernels(tiled)[0].grid) == 4       # past it: one more grid dimension, over the head dim


def test_cpu_attention_with_a_whole_head_of_512_equals_numpy():
    """The cpu keeps a head dimension of 512 in one tile (`WHOLE_MAX`): 64 x 512 accumulators, the same
    values as numpy's body within the f32 tolerance of a 512-long and a 300-long reduction."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, n, 512)).astype(np.float32) for n in (70, 300, 300))
    got = rf.kernel(attention, backend="cpu")(q, k, v)
    assert_close(got, attention(q, k, v), np.float32, 512)


@pytest.mark.parametrize("sm,whole_max,head_tiles", [("sm_90a", None, 1), ("sm_90", None, 1), ("sm_80", None, 1),
                                                     ("sm_90a", 128, 4), ("sm_90", 128, 4)])
def test_head_256_stays_whole_on_gpus(sm, whole_max, head_tiles):
    """Head 256 stays whole on every GPU target (`WHOLE_MAX`: 2.0-2.9x faster on an H200 than 4 grid programs
    of 64 columns, each recomputing q @ k^T); the ``whole_max`` option tiles it."""
    q = np.zeros((1, 2, 128, 256), np.float16)
    lowered = rf.kernel(flash_attention_f16, backend="simulate", sm=sm, whole_max=whole_max,
                        split=1).lower(q, q, q)
    kernel = fused_kernels(lowered.stages["tile"])[0]
    rows = 64 if head_tiles == 1 else 128    # a 128-row tile of a 256-wide accumulator passes ACC_TILE
    assert carried_shapes(kernel)[-1] == (rows, 256 // head_tiles)
    assert math.prod(kernel.grid) == 2 * (128 // rows) * head_tiles     # heads x query tiles x head tiles


@pytest.mark.parametrize("opts", [ScheduleOptions(block_m=16, block_n=32, split=1),
                                  ScheduleOptions(block_m=8, block_n=64, pow2=True),            # automatic split
                                  ScheduleOptions(block_m=32, block_n=16, split=3, pow2=True)])
@pytest.mark.parametrize("n", [200, 257])
def test_tile_interpreter_matches_the_fused_program(opts, n):
    x, w, ws = fp8_inputs(37, 150, n, seed=n)
    program = rf.kernel(fp8_quant_gemm, backend="interpret").lower(x, w, ws).program
    tiled = schedule_program(program, opts)
    verify_tile_program(tiled)
    assert any(len(k.grid) >= 2 and -(-n // opts.tile(opts.block_n, n)) in k.grid for k in fused_kernels(tiled))
    (out,) = run_tile_program(tiled, (x, w, ws))
    assert within_bound(out, x, w, ws)
    if opts.split == 1:  # same chunks, same running absmax: the loop quantizes the same values
        (ref,) = run_program(program, (x, w, ws), chunk=opts.block_n)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["cpu", "simulate"])
def test_backends_run_a_moderate_fp8_gemm_within_the_quantization_bound(backend):
    x, w, ws = fp8_inputs(64, 512, 512)
    out = rf.kernel(fp8_quant_gemm, backend=backend)(x, w, ws)
    assert out.shape == (64, 512) and within_bound(out, x, w, ws)


def test_simulate_ragged_columns():
    x, w, ws = fp8_inputs(20, 96, 200, seed=3)
    out = rf.kernel(fp8_quant_gemm, backend="simulate")(x, w, ws)
    assert within_bound(out, x, w, ws)


def test_4096_cube_compiles_for_sm90_in_shared_memory_without_spills():
    m = k = n = 4096
    x = np.ones((m, k), np.float16)
    w = np.ones((k, n), ml_dtypes.float8_e4m3fn)
    ws = np.ones(n, np.float32)
    lowered = rf.kernel(fp8_quant_gemm, backend="cuda", sm="sm_90").lower(x, w, ws)
    (kernel,) = fused_kernels(lowered.stages["tile"])
    assert kernel.grid == (m // 64, n // 64)
    for kp in lowered.stages["ptx"].kernels:
        check_ptx(kp.ptx, archs=("sm_90",))
        usage = resource_usage(kp.ptx, "sm_90")
        assert usage.shared_bytes <= MAX_SHARED
        assert usage.spill_store_bytes == 0 and usage.spill_load_bytes == 0


def test_llvm_block_names_stay_short():
    """Masked loads and stores name their blocks by kind (llvmlite numbers repeats), not by the block before."""
    x, w, ws = fp8_inputs(100, 300, 1000)
    llvm = str(rf.kernel(fp8_quant_gemm, backend="cuda", sm="sm_90").lower(x, w, ws).stages["llvm"])
    labels = re.findall(r"^([\w.$-]+):", llvm, re.MULTILINE)
    assert len(labels) > 20 and max(map(len, labels)) <= 24
