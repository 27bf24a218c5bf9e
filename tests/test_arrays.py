"""Kernel arguments from any library: numpy, DLPack and __cuda_array_interface__ (no GPU needed)."""
from __future__ import annotations

import numpy as np
import pytest

import redfuser as rf
from redfuser.runtime import arrays
from redfuser.runtime.arrays import CPU, CUDA


class FakeCudaArray:
    """What CuPy or a torch CUDA tensor shows through the CUDA Array Interface (v3)."""

    def __init__(self, shape, typestr="<f4", pointer=0x7F0000001000, strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (pointer, False),
                                         "version": 3, "strides": strides}


class DLPackOnly:
    """An object exposing only the DLPack protocol (backed by a numpy array), on a chosen device."""

    def __init__(self, a: np.ndarray, device: tuple[int, int] | None = None):
        self.a, self.device = a, device

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.device or self.a.__dlpack_device__()


def test_numpy_arguments_are_described_without_copying():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    info = arrays.describe(a)
    assert (info.shape, info.strides, info.device_type, info.pointer) == ((3, 4), (4, 1), CPU, a.ctypes.data)
    assert info.contiguous and not arrays.describe(a.T).contiguous


def test_cuda_array_interface_is_read():
    info = arrays.describe(FakeCudaArray((2, 8), "<f2", strides=(32, 2)))
    assert info.on_gpu and info.dtype == rf.ir.types.float16 and info.strides == (16, 1)
    assert info.pointer == 0x7F0000001000


def test_dlpack_capsule_is_read_without_being_consumed():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    info = arrays.describe(DLPackOnly(a, device=(CUDA, 0)))      # parsed as a device tensor would be
    assert info.pointer == a.ctypes.data and info.shape == (2, 3) and info.strides == (3, 1)
    assert info.device_type == CUDA


def test_host_dlpack_arguments_run_on_host_backends_zero_copy():
    a = np.arange(10, dtype=np.float32).reshape(2, 5)
    view = arrays.host_array(DLPackOnly(a))
    assert np.shares_memory(view, a)
    k = rf.kernel(lambda x: rf.sum(x * 2.0, axis=-1), backend="interpret")
    np.testing.assert_array_equal(k(DLPackOnly(a)), (a * 2).sum(-1))
    assert np.array_equal(a, np.arange(10, dtype=np.float32).reshape(2, 5))  # input untouched


def test_gpu_arrays_on_a_host_backend_are_a_clear_error():
    k = rf.kernel(lambda x: x + 1.0, backend="interpret")
    with pytest.raises(rf.ArgumentError, match="lives on a GPU"):
        k(FakeCudaArray((3,)))


def test_unsupported_dtypes_through_protocols_are_named():
    k = rf.kernel(lambda x: x + 1.0, backend="interpret")
    with pytest.raises(rf.DTypeError, match="complex64"):
        k(FakeCudaArray((3,), "<c8"))


def test_torch_cpu_tensors_come_back_as_torch():
    torch = pytest.importorskip("torch")
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    out = rf.kernel(lambda x: rf.max(x, axis=-1), backend="interpret")(x)
    assert isinstance(out, torch.Tensor) and out.tolist() == [3.0, 7.0]
