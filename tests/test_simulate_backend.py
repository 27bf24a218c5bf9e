"""The ``simulate`` backend end to end: every program of the earlier issues, lowered to SIMT IR (the program
that becomes PTX) and run by the SIMT simulator with its bound, race and divergence checks on, equals its numpy
reference (`redfuser.testing.tolerance`). Shapes are small and ragged; tiles are small so programs take
several blocks and several trips of their loops. Random programs, attention at ragged tiles and fully
masked rows run on every backend in `test_end_to_end.py`."""
from __future__ import annotations

from functools import partial

import ml_dtypes
import numpy as np
import pytest
from helpers import as_tuple, assemble_without_spills, run_backend, simulated
from hypothesis import given, note, settings
from hypothesis import strategies as st
from redfuser.codegen.ptx_check import check_ptx
from redfuser.codegen.simt import GpuOptions, lower_to_simt
import redfuser as rf
from redfuser.schedule import options_for, schedule_program
from redfuser.testing import assert_close
from redfuser.testing.quantization import absmax_in_every_window, assert_quantized_gemm, spike_rows
from redfuser.testing.tolerance import wide_reference
from redfuser.testing.strategies import programs
from redfuser.workloads import attention, causal_attention, fp8_quant_gemm, log_softmax, moe_routing, softmax

SMALL = dict(block_m=16, block_n=16, block_k=16)
BF16, F8 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn


run_simulated = partial(run_backend, "simulate")
"""(simulated outputs, reference outputs) through ``rf.kernel(backend="simulate")``; inputs untouched; the PTX
of the simulated program (sm_90) and of the sm_80 build assembled on the way."""


def check(body, *args, n: int | None = None, roundings: int | None = None, wide: bool = False, **options) -> None:
    """The simulated outputs against the numpy body (`wide`: its float64 evaluation, rounded once), under the
    tolerance of each output's dtype; `roundings` counts the f16/bf16 roundings on the way (tolerance.py)."""
    actual, expected = run_simulated(body, *args, **options)
    if wide:
        expected = as_tuple(wide_reference(body, *args))
    for a, e in zip(actual, expected):
        assert_close(a, e, e.dtype, n or args[0].shape[-1], roundings=roundings)


# f16/bf16 roundings (redfuser.testing.tolerance): against the float64 body, the reference's one and, for f16,
# one more (tensor-core attention rounds P to f16); against numpy's f16 attention, the seven on its path
WIDE = {np.dtype(np.float16): 2, np.dtype(BF16): 1}
F16_ATTENTION = 7


RNG = np.random.default_rng(11)


def normal(*shape, dtype=np.float32, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


# --- programs of the earlier issues --------------------------------------------------------------

def test_elementwise_chain_with_casts_bools_and_ints():
    def body(x, y, n):
        z = rf.where(x > y, rf.exp(x) * y + 1.0, rf.sqrt(rf.abs(y)))
        return z.astype(rf.float16), (x > 0) & (y < 0.5), n * 3 + 1, rf.maximum(x, y) ** 2

    x, y = normal(5, 37), normal(5, 37)
    y[0, :3] = np.nan                        # maximum propagates NaN like numpy
    # the f16 output is computed in f32 and rounded once, by numpy as by the kernel
    check(body, x, y, RNG.integers(-50, 50, (5, 37)).astype(np.int32), roundings=1, block_m=4, block_n=16)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_reductions_with_keepdims(op, axis):
    x = normal(6, 3, 37)
    x[1, 2, 5] = np.nan if op != "sum" else x[1, 2, 5]
    fn = getattr(rf, op)
    check(lambda a: fn(a, axis=axis, keepdims=True) + 1.0, x, block_m=4, block_n=8, block_k=8)


@pytest.mark.parametrize("shapes", [((3, 20, 30), (3, 30, 10)), ((30,), (30, 7)), ((7, 30), (30,)),
                                    ((2, 1, 17, 8), (5, 8, 3))])
def test_batched_and_1d_matmuls(shapes):
    a, b = normal(*shapes[0]), normal(*shapes[1])
    check(lambda x, y: x @ y, a, b, n=shapes[0][-1], block_m=8, block_n=8, block_k=8)


def test_transposes_and_swapped_axes():
    x, y = normal(5, 9, 12), normal(12, 9)
    check(lambda a, b: rf.swapaxes(a, -1, -2) * 2.0 + b, x, y, block_m=4, block_n=4)


@pytest.mark.parametrize("fn", [softmax, log_softmax])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_softmax_and_log_softmax(fn, dtype):
    low = np.dtype(dtype) in WIDE         # numpy's bf16 sum adds in bf16: the float64 body is the reference
    check(fn, normal(9, 70, dtype=dtype, scale=3.0), roundings=WIDE.get(np.dtype(dtype)), wide=low,
          block_m=4, block_n=16)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
@pytest.mark.parametrize("head", [16, 32, 128])
def test_attention(dtype, head):
    # bf16: numpy's bf16 matmul gives f32, so the output and the whole reference are f32 (the f32 rule)
    q, k, v = (normal(1, 2, 19, head, dtype=dtype) for _ in range(3))
    check(attention, q, k, v, n=19, roundings=F16_ATTENTION, **SMALL)


def test_f32_attention_head_dim_128_at_default_tiles():
    # P @ V by FMA in chunks of the key axis: both operands whole would not fit 48 KiB of shared memory.
    q, k, v = (normal(1, 1, 40, 128) for _ in range(3))
    check(attention, q, k, v, n=40)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_causal_attention(dtype):
    q, k, v = (normal(2, 1, 24, 16, dtype=dtype) for _ in range(3))
    check(causal_attention, q, k, v, n=24, roundings=F16_ATTENTION, **SMALL)


def test_attention_with_fully_masked_rows_gives_nan_rows():
    def masked_attention(q, k, v, keep):
        s = rf.where(keep, q @ rf.swapaxes(k, -1, -2), -rf.inf)
        p = rf.exp(s - rf.max(s, axis=-1, keepdims=True))
        return (p / rf.sum(p, axis=-1, keepdims=True)) @ v

    q, k, v = (normal(20, 16) for _ in range(3))
    keep = RNG.random((20, 20)) < 0.7
    keep[4] = False
    keep[7, :17] = False
    keep[7, 17] = True       # (row 7 partly masked whatever the shared RNG's state: all of it 0.3**3 of the time)
    actual, expected = run_simulated(masked_attention, q, k, v, keep, **SMALL)
    assert np.isnan(expected[0][4]).all() and not np.isnan(expected[0][7]).any()
    assert_close(actual[0], expected[0], np.float32, 20)


@pytest.mark.parametrize("sm", ["sm_80", "sm_90"])
def test_fp8_quant_gemm_within_the_quantization_bound(sm):
    """Every element within the quantization bound; on rows repeating their absmax every 16 elements
    (quantized exactly like the body by any chunking), within f32 accumulation of the quantized body."""
    x = spike_rows(normal(20, 64)).astype(np.float16)
    x[3] = 0                                        # an all-zero row gives the reference's result
    x[5] = normal(64)                               # a plain row: the running absmax grows chunk by chunk
    w, ws = normal(64, 24, dtype=F8), RNG.uniform(0.5, 2.0, 24).astype(np.float32)
    kernel = rf.kernel(fp8_quant_gemm, backend="simulate", sm=sm, **SMALL)
    actual = kernel(x, w, ws)
    assemble_without_spills(kernel.lower(x, w, ws))
    assert np.array_equal(np.isnan(actual), np.isnan(fp8_quant_gemm(x, w, ws)))
    result = assert_quantized_gemm(actual, x, w, ws)
    assert result.exact_rows == 18 == absmax_in_every_window(x).sum()


@pytest.mark.parametrize("dtype", [np.float16, BF16, F8, np.int32, np.bool_])
def test_casts_round_like_numpy(dtype):
    x = np.concatenate([RNG.standard_normal(500) * 300, RNG.standard_normal(500) * 1e-3,
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 470, 2.0**-9, 3e38, -2.0**-10]]).astype(np.float32)
    if dtype is np.int32:
        x = x[np.abs(x) < 2**31]   # numpy's NaN/inf/out-of-range -> int conversion is undefined behaviour in C
    with np.errstate(all="ignore"):
        expected = x.astype(dtype)
        round_trip = expected.astype(np.float32)
    actual, _ = run_simulated(lambda a: a.astype(dtype), x) if dtype is not F8 else (
        (rf.kernel(lambda a: a.astype(dtype), backend="simulate")(x),), None)
    actual = actual[0]
    assert np.array_equal(actual.astype(np.float32), expected.astype(np.float32), equal_nan=True)
    for sm in ("sm_80", "sm_90"):   # sm_80 has no e4m3 conversion instruction: rounded in f32 arithmetic
        back = simulated(lambda a: a.astype(dtype).astype(rf.float32), x, sm=sm)[0]
        assert np.array_equal(back, round_trip, equal_nan=True), sm


def test_storing_float8_on_sm80_converts_in_software():   # bit-exact over every f16: tests/test_f8_convert.py
    x = normal(64) * 200
    actual = rf.kernel(lambda a: a.astype(F8), backend="simulate", sm="sm_80")(x)
    assert np.array_equal(actual.view(np.uint8), x.astype(F8).view(np.uint8))


def test_topk_lowers_to_the_gpu():   # E = 8..256, k = 1..8, ties, NaN: tests/test_topk_gpu.py
    actual, expected = run_simulated(moe_routing, normal(16, 8))
    assert np.array_equal(actual[1], expected[1])


# --- random programs and shapes (hypothesis, the suite's profile) ---------------------------------

@given(programs(max_steps=5, max_size=256), st.sampled_from([{}, {"block_m": 16, "block_n": 16, "block_k": 16}]))
def test_random_programs_compile_to_ptx_that_assembles(program, tiles):
    """What the simulator runs, LLVM compiles: each random program's SIMT IR emits a module LLVM verifies
    (after the emitter's deferred plumbing) and PTX nvJitLink assembles for sm_90."""
    note(repr(program))
    lowered = rf.kernel(program.body, backend="cuda", sm="sm_90", **tiles).lower(*program.inputs)
    for k in lowered.stages["ptx"].kernels:
        result = check_ptx(k.ptx, ("sm_90",))["sm_90"]
        assert result.cubin and [u.kernel for u in result.usage if u.kernel == k.entry] == [k.entry]


# --- the cuda backend: compiled everywhere, run where there is a device -------------------------

def test_cuda_runs_where_there_is_a_device_and_says_why_not_elsewhere():
    from redfuser import backends
    from redfuser.runtime.device import device_available

    q = normal(1, 2, 24, 16, dtype=np.float16)
    kernel = rf.kernel(attention, backend="cuda", **SMALL)
    assert "mma.sync" in str(kernel.lower(q, q, q).stages["ptx"])      # compiling needs no GPU
    if device_available():
        assert backends.resolve("auto")[0] == "cuda"
        assert_close(kernel(q, q, q), attention(q, q, q), np.float16, 24, roundings=F16_ATTENTION)
    else:
        assert backends.resolve("auto")[0] == "cpu"
        with pytest.raises(rf.BackendError, match="no CUDA driver found|no CUDA device"):
            kernel(q, q, q)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_attention_on_the_device_equals_the_simulator(dtype):
    # the output's dtype: f32 for bf16 inputs (numpy's bf16 matmul gives f32), f16 for f16
    q, k, v = (normal(2, 2, 70, 64, dtype=dtype) for _ in range(3))
    on_device = rf.kernel(attention, backend="cuda")(q, k, v)
    expected = attention(q, k, v)
    assert_close(on_device, expected, expected.dtype, 70, roundings=F16_ATTENTION)
    assert_close(on_device, wide_reference(attention, q, k, v), expected.dtype, 70, roundings=WIDE.get(q.dtype))
    assert_close(on_device, rf.kernel(attention, backend="simulate")(q, k, v), expected.dtype, 70, roundings=2)


@settings(max_examples=max(8, settings().max_examples // 5))   # each example simulates a whole attention
@given(st.sampled_from([np.float16, BF16]), st.sampled_from([16, 32, 64]), st.integers(1, 48),
       st.sampled_from([16, 32, 64]), st.sampled_from([16, 32, 64]), st.sampled_from([1, 2, 4]), st.integers(0, 2**16),
       st.booleans())
def test_tensor_core_operands_read_through_ldmatrix_at_random_shapes(dtype, head, n, block_m, block_n, warps, seed,
                                                                     prefetch):
    """Attention's mma operands come out of shared memory by ``ldmatrix`` (``.trans`` for V, from a padded
    scratch) for every tile shape and warp count, with the k and v tiles loaded one iteration ahead or not:
    the simulator runs the PTX ISA's rule, the result must still be the reference, with no spills."""
    # A warp holding 64 rows of a 64-wide head runs out of registers (255 and spills, which `check` refuses):
    # at most 32 rows a warp, as the default tiles have. bf16 holds more per row (numpy makes P f32, and
    # `P @ V` is split into three bf16 products): at most 16 rows a warp, as its default tiles have (one
    # warp of 32 rows x 64 keys at head 64 sits at 255 registers, and spills 32 bytes or none depending on
    # LLVM's loop strength reduction, which RedFuser turns off: `codegen.nvptx.GPU_PIPELINE_OPTIONS`).
    block_m = min(block_m, (16 if dtype == BF16 else 32) * warps)
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, 2, n, head)).astype(dtype) for _ in range(3))
    options = dict(block_m=block_m, block_n=block_n, block_k=16, num_warps=warps)
    check(attention, q, k, v, n=n, roundings=F16_ATTENTION, prefetch=prefetch, **options)
    tile = schedule_program(rf.kernel(attention, backend="interpret").lower(q, k, v).program,
                            options_for("gpu", options))
    text = str(lower_to_simt(tile, GpuOptions(num_warps=warps)))
    assert "ldmatrix.x" in text or "mma." not in text     # tiny tiles shrink below an mma: FMA, no operands


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_a_16_bit_dot_for_sm_75_runs_on_fma(dtype):
    """sm_75 is an accepted target without ``mma.m16n8k16`` (sm_80): a 16-bit dot takes the FMA path there, as
    an e4m3 one does below sm_89 (it was lowered to the sm_80 instruction and refused late, by LLVM)."""
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(shape).astype(dtype) for shape in ((16, 32), (32, 16)))
    kernel = rf.kernel(lambda x, w: x @ w, backend="simulate", sm="sm_75")
    assert "mma" not in kernel.lower(x, w).stages["ptx"].kernels[0].ptx
    out_dtype = (x @ w).dtype                 # (numpy's bf16 @ gives f32)
    want = (x.astype(np.float64) @ w.astype(np.float64)).astype(out_dtype)
    assert_close(kernel(x, w), want, out_dtype, 32)


def test_a_view_spanning_more_memory_than_the_simulator_copies_is_a_backend_error(monkeypatch):
    """The simulator copies the memory a strided view spans: a 4-element view ``m[::2**31]`` of a sparse
    memory map spans 24 GiB, and the copy ended in a bare numpy `MemoryError`. Found by a helper; here the
    limit is lowered so a small view passes it."""
    from redfuser.codegen.simulator import machine

    monkeypatch.setattr(machine, "SPAN_LIMIT_BYTES", 64)
    x = np.arange(64, dtype=np.float32)
    kernel = rf.kernel(lambda a: rf.sum(a, axis=-1), backend="simulate")
    with pytest.raises(rf.BackendError, match="spans .* GiB of memory"):
        kernel(x[::8])
    assert float(rf.kernel(lambda a: rf.sum(a, axis=-1), backend="cpu")(x[::8])) == float(x[::8].sum())
