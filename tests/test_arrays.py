"""Kernel arguments from any library: numpy, DLPack and __cuda_array_interface__ (no GPU needed)."""
from __future__ import annotations

import gc
import weakref

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


class HostBfloat16:
    """A host DLPack producer of a bfloat16 tensor, as torch is: numpy's own DLPack import refuses the
    dtype ("Unsupported dtype in DLTensor"); the bits live in a uint16 array."""

    def __init__(self, bits: np.ndarray):
        self.bits = bits

    def __dlpack__(self, **kwargs):
        capsule = self.bits.__dlpack__()
        arrays._capsule_tensor(capsule).dtype.code = arrays._DL_BFLOAT
        return capsule

    def __dlpack_device__(self):
        return (CPU, 0)


def test_host_bfloat16_dlpack_arguments_are_read_zero_copy():
    """numpy cannot import a bfloat16 DLPack tensor; RedFuser reads the capsule itself and views the
    producer's memory as ml_dtypes' bfloat16 (strides kept, the producer kept alive by the view)."""
    values = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5).astype(rf.bfloat16)
    producer = HostBfloat16(values.view(np.uint16))
    with pytest.raises(RuntimeError):
        np.from_dlpack(producer)
    view = arrays.host_array(producer)
    assert view.dtype == rf.bfloat16 and np.shares_memory(view, producer.bits)
    assert np.array_equal(view.astype(np.float32), values.astype(np.float32))
    strided = arrays.host_array(HostBfloat16(values.view(np.uint16)[:, ::2]))
    assert np.array_equal(strided.astype(np.float32), values[:, ::2].astype(np.float32))
    info = arrays.describe(producer)
    assert (info.dtype, info.shape, info.strides, info.device_type) == (rf.ir.types.bfloat16, (3, 4), (4, 1), CPU)
    k = rf.kernel(lambda x: rf.sum(x.astype(np.float32), axis=-1), backend="interpret")
    np.testing.assert_array_equal(k(producer), values.astype(np.float32).sum(-1))


def test_torch_bfloat16_and_float8_cpu_tensors_run_and_come_back_as_torch():
    torch = pytest.importorskip("torch")
    x = torch.linspace(-3, 3, 16).reshape(2, 8).to(torch.bfloat16)
    out = rf.kernel(lambda x: (x * 2.0).astype(rf.bfloat16), backend="cpu")(x)   # numpy: bf16 * 2.0 is f32
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
    assert torch.equal(out, (x.float() * 2).to(torch.bfloat16))
    f8 = torch.linspace(-2, 2, 16).reshape(2, 8).to(torch.float8_e4m3fn)
    total = rf.kernel(lambda x: rf.sum(x.astype(np.float32), axis=-1), backend="cpu")(f8)
    assert torch.equal(total, f8.float().sum(-1))


class _PoisonedOnRelease:
    """The owner of an export's buffer: numpy reads `arena` through it, and when the last reference goes (the
    capsule's deleter dropping the exported array) it overwrites the arena with NaN bits, as a freed buffer's
    memory is reused, so a reader of released memory sees it deterministically."""

    def __init__(self, arena: np.ndarray, nan_bits: int) -> None:
        self.arena, self.nan_bits = arena, nan_bits
        self.__array_interface__ = arena.__array_interface__

    def __del__(self) -> None:
        self.arena[...] = self.nan_bits


class ExportedOnDemand:
    """A host DLPack producer that materializes a fresh buffer on each export (a lazily computed array): only
    the capsule keeps that buffer alive, and its deleter releases it (the protocol's ownership rule). numpy
    cannot import its bfloat16/float8 dtypes, so RedFuser reads the capsule itself."""

    def __init__(self, values: np.ndarray, code: int, nan_bits: int) -> None:
        self.values, self.code, self.nan_bits = values, code, nan_bits
        self.arenas: list[np.ndarray] = []     # (kept: released memory stays mapped, holding the poison)
        self.live: list[weakref.ref] = []

    def __dlpack__(self, **kwargs):
        arena = self.values.view(f"u{self.values.itemsize}").copy()
        self.arenas.append(arena)
        owner = _PoisonedOnRelease(arena, self.nan_bits)
        self.live.append(weakref.ref(owner))
        capsule = np.asarray(owner).__dlpack__()
        arrays._capsule_tensor(capsule).dtype.code = self.code
        return capsule

    def __dlpack_device__(self):
        return (CPU, 0)


@pytest.mark.parametrize("dtype, code, nan_bits", [(rf.bfloat16, arrays._DL_BFLOAT, 0xFFFF),
                                                   (rf.float8_e4m3fn, arrays._DL_FLOAT8_E4M3FN, 0xFF)])
def test_a_host_export_that_only_its_capsule_keeps_alive_is_read_while_the_capsule_lives(dtype, code, nan_bits):
    """RedFuser read the pointer out of the capsule of a bfloat16/float8 export and dropped the capsule at once,
    whose deleter freed a buffer the producer made for that export: the kernel read freed memory (garbage,
    silently). The view now holds the capsule; its buffer is poisoned the moment it is released."""
    values = (np.arange(1, 13, dtype=np.float32).reshape(3, 4) / 4).astype(dtype)
    producer = ExportedOnDemand(values, code, nan_bits)
    view = arrays.host_array(producer)
    gc.collect()
    assert producer.live[-1]() is not None, "the export's buffer was released while its view is in use"
    assert np.array_equal(view.astype(np.float32), values.astype(np.float32))
    del view
    gc.collect()
    assert producer.live[-1]() is None      # and released with the view: nothing leaks
    for backend in ("interpret", "cpu"):
        k = rf.kernel(lambda x: (x.astype(np.float32) * 2).astype(dtype), backend=backend)
        for _ in range(3):
            got = k(producer)
            gc.collect()
            np.testing.assert_array_equal(got.astype(np.float32), (values.astype(np.float32) * 2).astype(dtype)
                                          .astype(np.float32))
