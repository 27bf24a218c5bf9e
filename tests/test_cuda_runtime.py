"""The CUDA runtime: clean answers without a driver, checked driver calls (on a fake driver), and on a
GPU (``gpu`` marker) the hand-built kernels launched and compared with numpy."""
from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest
from cuda.bindings import driver as real_driver
from helpers import OK, FakeDriver

import nvptx_samples
from redfuser.codegen import nvptx
from redfuser.ir.errors import BackendError, CudaError, RedFuserError
from redfuser.runtime import cuda_driver, device
from redfuser.runtime.cuda_memory import DeviceBuffer, Stream


@pytest.fixture
def fake(monkeypatch):
    """Install a fake driver (and forget the real driver's state before and after)."""
    def install(**overrides):
        fake_driver = FakeDriver(**overrides)
        monkeypatch.setattr(cuda_driver, "driver", fake_driver)
        cuda_driver.reset_state()
        return fake_driver
    yield install
    cuda_driver.reset_state()


# --- without a GPU ---------------------------------------------------------------------------------

def test_device_probe_never_raises_and_matches_the_suite_probe():
    from conftest import cuda_device_count
    assert device.device_available() == (cuda_device_count()[0] > 0)
    assert (device.why_no_device() == "") == device.device_available()
    assert device.target_sm() == (device.device_info().sm if device.device_available() else "sm_90")


def test_no_driver_found(fake):
    def missing(flags):
        raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search')
    fake(cuInit=missing)
    assert not device.device_available()
    assert device.why_no_device() == "no CUDA driver found"
    assert device.device_count() == 0
    ptx = nvptx.compile_to_ptx(nvptx_samples.vector_add(), "sm_90")   # compiling never needs a device
    with pytest.raises(BackendError, match="cannot use the cuda backend: no CUDA driver found"):
        cuda_driver.load_module(ptx)
    with pytest.raises(BackendError, match="no CUDA driver found"):
        DeviceBuffer.alloc(16)
    with pytest.raises(BackendError, match="no CUDA driver found"):
        device.device_info()


@pytest.mark.parametrize("how", ["init", "count"])
def test_no_device(fake, how):
    if how == "init":
        fake(cuInit=lambda flags: (real_driver.CUresult.CUDA_ERROR_NO_DEVICE,))
    else:
        fake(cuDeviceGetCount=lambda: (OK, 0))
    assert device.why_no_device() == "no CUDA device"
    with pytest.raises(BackendError, match="no CUDA device"):
        cuda_driver.primary_context()


def test_driver_error_carries_name_and_message(fake):
    fake(cuMemAlloc=lambda n: (real_driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None),
         cuGetErrorName=lambda err: (OK, b"CUDA_ERROR_OUT_OF_MEMORY"),
         cuGetErrorString=lambda err: (OK, b"out of memory"))
    with pytest.raises(CudaError) as info:
        DeviceBuffer.alloc(1 << 40)
    err = info.value
    assert (err.call, err.error_name, err.error_message) == ("cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY", "out of memory")
    assert str(err) == "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory"
    assert isinstance(err, BackendError) and isinstance(err, RedFuserError)


def test_driver_error_named_even_when_the_driver_cannot_describe_it(fake):
    def cannot(err):
        raise RuntimeError("no driver")
    fake(cuModuleLoadData=lambda image: (real_driver.CUresult.CUDA_ERROR_UNSUPPORTED_PTX_VERSION, None),
         cuGetErrorName=cannot)
    with pytest.raises(CudaError, match="CUDA_ERROR_UNSUPPORTED_PTX_VERSION.*older than the PTX ISA") as info:
        cuda_driver.load_module(".version 8.4\n")
    assert info.value.call == "cuModuleLoadData"


def test_modules_cached_and_launch_packs_arguments(fake):
    drv = fake()
    ptx = nvptx.compile_to_ptx(nvptx_samples.vector_add(), "sm_90")
    module = cuda_driver.load_module(ptx)
    assert cuda_driver.load_module(ptx) is module                      # cached per context + PTX
    assert drv.names().count("cuModuleLoadData") == 1
    (image,) = next(args for name, args in drv.calls if name == "cuModuleLoadData")
    assert image == ptx.encode() + b"\0"                               # PTX handed over NUL-terminated
    kernel = module.function("vector_add")
    assert module.function("vector_add") is kernel
    a = DeviceBuffer.alloc(4096)
    kernel.launch((4,), (256,), [a, a, a, np.int64(1000)])
    launch = next(args for name, args in drv.calls if name == "cuLaunchKernel")
    assert launch[:5] == ("fn:vector_add", (4, 1, 1), (256, 1, 1), 0, 0)
    assert launch[5] == [a.ptr, 1000]                                  # what the kernel would read
    assert "cuFuncSetAttribute" not in drv.names()                     # no opt-in needed for 0 B


def test_launch_raises_the_dynamic_shared_limit_once(fake):
    drv = fake()
    kernel = cuda_driver.load_module("ptx").function("k")
    kernel.launch((1,), (128,), [], shared_bytes=100 * 1024)
    kernel.launch((1,), (128,), [], shared_bytes=90 * 1024)
    sets = [args for name, args in drv.calls if name == "cuFuncSetAttribute"]
    assert sets == [("fn:k", real_driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                     100 * 1024)]
    assert drv.names().index("cuFuncSetAttribute") < drv.names().index("cuLaunchKernel")
    with pytest.raises(BackendError, match="the device allows 232448 B per block"):
        kernel.launch((1,), (128,), [], shared_bytes=227 * 1024)      # + 1024 B static: over the opt-in


def test_launch_argument_checks(fake):
    fake()
    kernel = cuda_driver.load_module("ptx").function("k")
    with pytest.raises(BackendError, match="np.int64"):
        kernel.launch((1,), (32,), [1000])
    with pytest.raises(BackendError, match="grid must be 1 to 3 positive sizes"):
        kernel.launch((0,), (32,), [])
    with pytest.raises(BackendError, match="block must be"):
        kernel.launch((1,), (1, 2, 3, 4), [])
    params, keep = cuda_driver.pack_params([np.float32(1.5), np.int32(-7), ctypes.c_uint16(9)])
    assert ctypes.c_float.from_address(params[0]).value == 1.5
    assert ctypes.c_int32.from_address(params[1]).value == -7
    assert ctypes.c_uint16.from_address(params[2]).value == 9 and len(keep) == 3


def test_memory_and_streams_on_the_fake(fake):
    drv = fake()
    with DeviceBuffer.from_numpy(np.arange(4, dtype=np.float32)) as buf:
        assert buf.nbytes == 16 and "cuMemcpyHtoD" in drv.names()
        with pytest.raises(BackendError, match="copy of 32 B into a device buffer of 16 B"):
            buf.copy_from(np.zeros(8, np.float32))
        stream = Stream.create()
        buf.copy_to(np.empty(4, np.float32), stream)
        stream.destroy()
    assert drv.names()[-1] == "cuMemFree"
    assert "cuMemAllocManaged" not in drv.names()
    assert [n for n in drv.names() if n.startswith("cuStream")] == ["cuStreamCreate", "cuStreamSynchronize",
                                                                    "cuStreamDestroy"]


def test_device_info_on_the_fake(fake):
    fake()
    info = device.device_info()
    # compute capability 9.0 compiles for the architecture-specific sm_90a (wgmma for tensor-core dots)
    assert (info.name, info.sm, info.sm_count, info.max_shared_per_block_optin) == ("Fake H200", "sm_90a", 132,
                                                                                    227 * 1024)
    assert "compute capability 9.0" in str(info) and device.target_sm() == "sm_90a"


# --- on a GPU --------------------------------------------------------------------------------------

def _compile(module) -> str:
    return nvptx.compile_to_ptx(module, device.target_sm() if device.target_sm() in nvptx.SM_MIN_PTX else "sm_90")


@pytest.mark.gpu
def test_gpu_vector_add():
    n = 1000                                                           # not a multiple of the block: masked tail
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    kernel = cuda_driver.load_module(_compile(nvptx_samples.vector_add())).function("vector_add")
    with DeviceBuffer.from_numpy(x) as a, DeviceBuffer.from_numpy(y) as b, DeviceBuffer.alloc(4 * n) as c:
        kernel.launch(((n + 255) // 256,), (256,), [a, b, c, np.int64(n)])
        cuda_driver.primary_context().synchronize()
        np.testing.assert_array_equal(c.to_numpy((n,), np.float32), x + y)


@pytest.mark.gpu
def test_gpu_block_sum_and_dynamic_shared():
    n = 256 * 6 - 100
    x = np.random.default_rng(2).standard_normal(256 * 6).astype(np.float32)
    ctx = cuda_driver.primary_context()
    summer = cuda_driver.load_module(_compile(nvptx_samples.block_sum())).function("block_sum")
    mirror = cuda_driver.load_module(_compile(nvptx_samples.reverse_in_block())).function("reverse_in_block")
    stream = Stream.create()
    with DeviceBuffer.from_numpy(x) as src, DeviceBuffer.alloc(4 * 6) as sums, DeviceBuffer.alloc(x.nbytes) as out:
        summer.launch((6,), (256,), [src, sums, np.int64(n)], stream=stream)
        mirror.launch((6,), (256,), [src, out], shared_bytes=64 * 1024, stream=stream)   # past 48 KiB: opt-in
        stream.synchronize()
        expected = np.add.reduce(np.where(np.arange(x.size) < n, x, 0).reshape(6, 256), axis=1)
        np.testing.assert_allclose(sums.to_numpy((6,), np.float32), expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(out.to_numpy(x.shape, np.float32), x.reshape(6, 256)[:, ::-1].ravel())
    stream.destroy()
    ctx.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["f16", "bf16", "e4m3"])
def test_gpu_mma_matches_numpy(kind):
    if kind == "e4m3" and device.device_info().compute_capability < (8, 9):
        pytest.skip("FP8 mma needs compute capability 8.9+")
    k = 32 if kind == "e4m3" else 16
    dtype = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn}[kind]
    rng = np.random.default_rng(3)
    a = rng.standard_normal((16, k)).astype(dtype)
    b = rng.standard_normal((k, 8)).astype(dtype)
    a_regs, b_regs = nvptx_samples.pack_mma_operands(kind, a, b)
    kernel = cuda_driver.load_module(_compile(nvptx_samples.mma_tile(kind))).function(f"mma_{kind}")
    with DeviceBuffer.from_numpy(a_regs) as ra, DeviceBuffer.from_numpy(b_regs) as rb, \
            DeviceBuffer.alloc(32 * 4 * 4) as rd:
        kernel.launch((1,), (32,), [ra, rb, rd])
        d = nvptx_samples.unpack_mma_result(rd.to_numpy((32, 4), np.float32))
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(d, expected, rtol=1e-4, atol=1e-4)
