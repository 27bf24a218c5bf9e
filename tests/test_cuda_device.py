"""The cuda backend on a real device: every workload against its numpy body, and the caller's arrays and
streams through the real driver, torch and cupy.

`test_cuda_interop.py` checks the same paths against a fake driver (what reaches the driver: pointers,
handles, synchronizations); these tests check that the real driver, torch's allocator and streams and
cupy's ``__cuda_array_interface__`` agree with it. All are ``gpu``-marked: skipped, with the reason,
where there is no device. torch's and cupy's tests also skip where those libraries cannot reach a GPU.
"""
from __future__ import annotations

import numpy as np
import pytest
from helpers import QUANTIZATION_BOUNDS, as_tuple, expected_softmax, within_quantization_bound

import redfuser as rf
import nvptx_samples
from redfuser.codegen import nvptx
from redfuser.ir.errors import BackendError, CudaError
from redfuser.runtime import cuda_driver, device
from redfuser.runtime.cuda_memory import DeviceBuffer
from redfuser.testing import assert_close
from redfuser.testing.quantization import assert_quantized_gemm, spike_rows
from redfuser.workloads import WORKLOADS, softmax

pytestmark = pytest.mark.gpu


@pytest.fixture
def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch is installed without CUDA or sees no device")
    return torch


# --- every workload, numpy in and out ----------------------------------------------------------------

@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_workload_on_the_device_equals_its_numpy_body(name):
    w = WORKLOADS[name]
    args = w.make_inputs(np.random.default_rng(11))
    copies = [a.copy() for a in args]
    with np.errstate(all="ignore"):
        expected = as_tuple(w.fn(*args))
    actual = as_tuple(rf.kernel(w.fn, backend="cuda")(*args))
    assert all(a.tobytes() == c.tobytes() for a, c in zip(args, copies)), "an input was modified"
    assert all(isinstance(a, np.ndarray) for a in actual)
    if name in QUANTIZATION_BOUNDS:   # the running absmax quantizes within the quantization error
        assert within_quantization_bound(name, actual[0], *args)
        return
    for a, e in zip(actual, expected):
        assert_close(a, e, e.dtype, args[0].shape[-1], name)


@pytest.mark.parametrize("name,shape,options", [
    ("attention", (2, 4, 256, 64), {"prefetch": True, "min_blocks_per_sm": 3}),
    ("causal_attention", (1, 2, 256, 128), {"prefetch": True, "num_warps": 8, "skip_masked": True}),
    ("softmax", (512, 4096), {}),                                  # the default: whole rows, one pass
    ("log_softmax", (512, 4096), {"num_warps": 16}),
    ("softmax", (512, 4096), {"block_n": 64}),                     # chunks: two passes
    ("log_softmax", (8, 4096), {}),                                # too few rows: chunked and split
])
def test_the_variants_the_device_check_times_equal_the_numpy_body(name, shape, options):
    """What `gpu_check.py` times beside the defaults (prefetched operand tiles, whole or chunked rows)
    computes the same values on the device as the defaults' numpy body."""
    rng = np.random.default_rng(13)
    fn = WORKLOADS[name].fn
    attention_like = "attention" in name
    args = tuple((rng.standard_normal(shape) * (1 if attention_like else 3)).astype(np.float16)
                 for _ in range(3 if attention_like else 1))
    with np.errstate(all="ignore"):
        expected = fn(*args)
    reduced = shape[-2] if attention_like else shape[-1]           # keys, or the row
    assert_close(rf.kernel(fn, backend="cuda", **options)(*args), expected, expected.dtype, reduced,
                 f"{name} {options}")


# --- torch tensors and streams -------------------------------------------------------------------------

_CUTS = {"softmax": (0,), "attention": (1, 2), "causal_attention": (0, 1, 2), "moe_routing": (0,),
         "fp8_quant_gemm": (0,)}
"""Which arguments' second-to-last axis (rows, keys) a polymorphic call shortens."""


@pytest.mark.parametrize("name", list(_CUTS))
def test_a_shape_polymorphic_kernel_on_the_device_equals_the_numpy_body_at_every_length(name):
    """The run-time extents reach the PTX as scalar parameters (`SimtKernel.sizes`): one kernel, several
    lengths, each equal to the body on numpy."""
    w = WORKLOADS[name]
    k = rf.kernel(w.fn, backend="cuda", dynamic=True)
    base = w.make_inputs(np.random.default_rng(12))
    for cut in (1.0, 0.37, 0.05):
        args = [a[..., :max(2, int(a.shape[-2] * cut)), :].copy() if i in _CUTS[name] else a
                for i, a in enumerate(base)]
        with np.errstate(all="ignore"):
            expected = as_tuple(w.fn(*args))
        actual = as_tuple(k(*args))
        if name in QUANTIZATION_BOUNDS:
            assert within_quantization_bound(name, actual[0], *args)
            continue
        for a, e in zip(actual, expected):
            assert_close(a, e, e.dtype, args[-1].shape[-2 if name.endswith("attention") else -1], name)
    assert k.cache_info().misses <= 2, k.polymorphism


def test_torch_cuda_tensors_in_give_torch_cuda_tensors_out_and_the_input_is_untouched(torch_cuda):
    torch = torch_cuda
    x = torch.randn(96, 700, device="cuda") * 3
    before = x.clone()
    out = rf.kernel(softmax, backend="cuda")(x)
    torch.cuda.synchronize()
    assert isinstance(out, torch.Tensor) and out.device == x.device and out.dtype == torch.float32
    assert torch.equal(x, before)
    np.testing.assert_allclose(out.cpu().numpy(), expected_softmax(before.cpu().numpy()), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["torch stream", "int handle"])
def test_a_user_given_torch_stream_is_the_one_the_kernel_runs_on(torch_cuda, how):
    """The new values reach `x` on a side stream behind a ~25 ms sleep. A kernel on that stream reads them;
    one on any other (torch's streams do not synchronize with the legacy default stream) would read the
    old values before the copy ran."""
    torch = torch_cuda
    old, new = (torch.randn(64, 512, device="cuda") * 3 for _ in range(2))
    x = old.clone()
    kernel = rf.kernel(softmax, backend="cuda")
    kernel(x)                                    # compiled and loaded before the race is set up
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        x.copy_(new)
    out = kernel(x, stream=side if how == "torch stream" else side.cuda_stream)
    side.synchronize()
    np.testing.assert_allclose(out.cpu().numpy(), expected_softmax(new.cpu().numpy()), rtol=1e-5, atol=1e-6)


def test_bf16_torch_tensors_through_dlpack(torch_cuda):
    torch = torch_cuda
    q, k, v = (torch.randn(1, 2, 80, 64, device="cuda").to(torch.bfloat16) for _ in range(3))
    out = rf.kernel(WORKLOADS["attention"].fn, backend="cuda")(q, k, v)
    assert isinstance(out, torch.Tensor) and out.device == q.device
    host = [t.float().cpu().numpy().astype(rf.bfloat16) for t in (q, k, v)]
    expected = WORKLOADS["attention"].fn(*host)
    assert_close(out.float().cpu().numpy().astype(expected.dtype), expected, expected.dtype, 80)


# --- cupy arrays (__cuda_array_interface__) -------------------------------------------------------------

def test_cupy_arrays_in_give_cupy_arrays_out():
    cupy = pytest.importorskip("cupy")
    try:
        x = cupy.asarray(np.random.default_rng(5).standard_normal((40, 300)).astype(np.float32) * 3)
    except Exception as exc:  # cupy installed for another CUDA than the driver has
        pytest.skip(f"cupy cannot allocate here ({type(exc).__name__})")
    out = rf.kernel(softmax, backend="cuda")(x)
    assert isinstance(out, cupy.ndarray) and out.device.id == x.device.id
    np.testing.assert_allclose(cupy.asnumpy(out), expected_softmax(cupy.asnumpy(x)), rtol=1e-5, atol=1e-6)


# --- the real driver's errors ------------------------------------------------------------------------

def test_the_real_drivers_errors_carry_its_error_name_and_the_context_survives_them():
    with pytest.raises(CudaError, match="cuModuleLoadData failed: CUDA_ERROR_"):
        cuda_driver.load_module("this is not PTX")
    sm = device.target_sm() if device.target_sm() in nvptx.SM_MIN_PTX else "sm_90"
    mirror = cuda_driver.load_module(nvptx.compile_to_ptx(nvptx_samples.reverse_in_block(), sm)).function(
        "reverse_in_block")
    x = np.arange(256, dtype=np.float32)
    with DeviceBuffer.from_numpy(x) as src, DeviceBuffer.alloc(x.nbytes) as out:
        with pytest.raises(CudaError, match="cuLaunchKernel failed: CUDA_ERROR_(INVALID_VALUE|LAUNCH_OUT_OF_RESOURCES)"):
            mirror.launch((1,), (4096,), [src, out], shared_bytes=1024)        # past 1024 threads a block
        # Shared memory past the device's opt-in limit is refused before the driver is asked, naming both.
        with pytest.raises(BackendError, match=r"asks for 1048576 B dynamic .* the device allows \d+ B"):
            mirror.launch((1,), (256,), [src, out], shared_bytes=1 << 20)
        mirror.launch((1,), (256,), [src, out], shared_bytes=1024)              # the context still works
        cuda_driver.primary_context().synchronize()
        np.testing.assert_array_equal(out.to_numpy(x.shape, np.float32), x[::-1])


# --- Hopper's wgmma (sm_90a) ------------------------------------------------------------------------

def _hopper() -> None:
    if device.device_info().compute_capability != (9, 0):
        pytest.skip("wgmma needs a Hopper device (compute capability 9.0)")


@pytest.mark.parametrize("m,k,n", [(64, 64, 64), (256, 512, 256), (1000, 700, 300)])
def test_a_matmul_on_wgmma_equals_numpy_and_the_mma_sync_kernel(m, k, n):
    """The shared-memory descriptors (128-byte swizzle, K-major, leading 16 and stride 1024 bytes) and the
    staging follow the PTX ISA: within numpy's tolerance, and bit for bit the mma.sync kernel on the same
    device. (Not the simulator's bits: on an H200 the f16 tensor cores' sums of a k-step differ from its
    model, exact then rounded once, by about an ulp: run 9 in benchmarks/device_notes.md.) 1000 x 700 x 300
    is ragged along K: its dot stays on the tensor cores (`narrow._zero_where_false`)."""
    _hopper()
    rng = np.random.default_rng(21)
    x, w = rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, n)).astype(np.float16)

    def body(x, w):
        return x.astype(rf.float32) @ w.astype(rf.float32)

    kernel = rf.kernel(body, backend="cuda", sm="sm_90a")
    assert "wgmma.mma_async" in str(kernel.lower(x, w).stages["ptx"])
    got = kernel(x, w)
    assert_close(got, body(x, w), np.float32, k)
    np.testing.assert_array_equal(got, rf.kernel(body, backend="cuda", sm="sm_90")(x, w))


@pytest.mark.parametrize("name,dtype", [("flash_attention_f16", np.float16), ("flash_attention_bf16", "bfloat16"),
                                        ("causal_attention", np.float16), ("fp8_quant_gemm", None)])
def test_tensor_core_workloads_on_wgmma_equal_the_mma_sync_kernels(name, dtype):
    """Q·Kᵀ through two descriptors, P·V with P from registers: the same values as the mma.sync kernels
    (the same tensor-core sums of each k-step). The FP8 GEMM's e4m3 wgmma accumulates with less precision than
    mma.sync's f16 products on sm_90 (about 14 bits: run 9 of benchmarks/device_notes.md), so it is held to
    both bounds of the FP8 check instead, on rows that quantize exactly like the body."""
    _hopper()
    from redfuser import workloads

    rng = np.random.default_rng(12)
    if dtype is None:
        body = workloads.fp8_quant_gemm
        args = (spike_rows(rng.standard_normal((512, 1024)).astype(np.float32)).astype(np.float16),
                (rng.standard_normal((1024, 384)) * 0.1).astype(rf.float8_e4m3fn),
                rng.uniform(0.5, 2.0, 384).astype(np.float32))
        on_wgmma = rf.kernel(body, backend="cuda", sm="sm_90a")
        assert "wgmma.mma_async" in str(on_wgmma.lower(*args).stages["ptx"])
        print(assert_quantized_gemm(on_wgmma(*args), *args))
        return
    else:
        body = getattr(workloads, name)
        args = tuple(rng.standard_normal((2, 4, 300, 64)).astype(getattr(rf, dtype) if isinstance(dtype, str) else dtype)
                     for _ in range(3))
    on_wgmma = rf.kernel(body, backend="cuda", sm="sm_90a")
    assert "wgmma.mma_async" in str(on_wgmma.lower(*args).stages["ptx"])
    got = as_tuple(on_wgmma(*args))
    want = as_tuple(rf.kernel(body, backend="cuda", sm="sm_90")(*args))
    for g, e in zip(got, want):
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("name,dtype,shape", [
    ("flash_attention_f16", np.float16, (2, 4, 256, 64)), ("flash_attention_bf16", "bfloat16", (2, 4, 320, 128)),
    ("causal_attention", np.float16, (1, 2, 384, 128)), ("flash_attention_bf16", "bfloat16", (1, 2, 128, 256)),
    ("gemm", np.float16, (512, 1024, 256))])
def test_operand_tiles_copied_by_tma_equal_the_threads_staged_kernels(name, dtype, shape):
    """TMA (the default on sm_90a): Q, K, V (and a GEMM's x and w) reach the wgmma tiles by the copy engine, through tensor maps
    encoded per launch, the mbarrier phase from the loop counters: bit for bit the kernel whose threads stage
    the same tiles (the same tensor-core sums), at odd and even key-block counts and head 256's inner loop."""
    _hopper()
    from redfuser import workloads

    rng = np.random.default_rng(14)
    dt = getattr(rf, dtype) if isinstance(dtype, str) else dtype
    if name == "gemm":
        m, k, n = shape
        body = workloads.gemm
        args = (rng.standard_normal((m, k)).astype(dt), rng.standard_normal((k, n)).astype(dt))
    else:
        body = getattr(workloads, name)
        args = tuple(rng.standard_normal(shape).astype(dt) for _ in range(3))
    with_tma = rf.kernel(body, backend="cuda", sm="sm_90a")               # the default on sm_90a
    assert "cp.async.bulk.tensor" in str(with_tma.lower(*args).stages["ptx"])
    got = as_tuple(with_tma(*args))
    want = as_tuple(rf.kernel(body, backend="cuda", sm="sm_90a", tma=False)(*args))
    for g, e in zip(got, want):
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("name,dtype,shape,options", [
    ("flash_attention_f16", np.float16, (2, 8, 2048, 64), {"tma_stages": 2}),
    ("flash_attention_f16", np.float16, (2, 8, 1984, 64), {"tma_stages": 4}),          # 31 key blocks
    ("flash_attention_bf16", "bfloat16", (2, 8, 2048, 128), {"min_blocks_per_sm": 2, "tma_stages": 4}),
    ("causal_attention", np.float16, (1, 8, 2048, 128), {"tma_stages": 2}),
    ("gemm", np.float16, (1024, 4096, 512), {"tma_stages": 4})])
def test_tma_rings_equal_the_threads_staged_kernels(name, dtype, shape, options):
    """A ring's copies run an iteration (or three) ahead of the wgmmas on the device, truly asynchronously: a
    stage reused too early or a wait on the wrong phase would show as other bits than the kernel whose threads
    stage the tiles (or as a hang, which the run's timeout catches), over many loop iterations."""
    _hopper()
    from redfuser import workloads

    rng = np.random.default_rng(21)
    dt = getattr(rf, dtype) if isinstance(dtype, str) else dtype
    if name == "gemm":
        m, k, n = shape
        args = (rng.standard_normal((m, k)).astype(dt), rng.standard_normal((k, n)).astype(dt))
    else:
        args = tuple(rng.standard_normal(shape).astype(dt) for _ in range(3))
    body = getattr(workloads, name)
    ringed = rf.kernel(body, backend="cuda", sm="sm_90a", **options)
    assert "mbarrier.try_wait.parity" in str(ringed.lower(*args).stages["ptx"])
    want = as_tuple(rf.kernel(body, backend="cuda", sm="sm_90a", tma=False,
                              **{k: v for k, v in options.items() if k != "tma_stages"})(*args))
    for _ in range(3):
        for g, e in zip(as_tuple(ringed(*args)), want):
            np.testing.assert_array_equal(g, e)


def test_a_shape_polymorphic_tma_kernel_equals_the_threads_staged_one_at_every_length():
    """``dynamic=True`` on sm_90a: K and V of the whole key blocks copied by TMA through maps encoded per
    call at its lengths (`runtime/tensor_maps.py`), one compile for every length."""
    _hopper()
    from redfuser import workloads

    rng = np.random.default_rng(22)
    kernel = rf.kernel(workloads.flash_attention_f16, backend="cuda", sm="sm_90a", dynamic=True)
    staged = rf.kernel(workloads.flash_attention_f16, backend="cuda", sm="sm_90a", dynamic=True, tma=False)
    for n in (1024, 777, 2048, 130):
        q, k, v = (rng.standard_normal((2, 4, n, 64)).astype(np.float16) for _ in range(3))
        np.testing.assert_array_equal(kernel(q, k, v), staged(q, k, v))
    assert kernel.cache_info().misses == 1
