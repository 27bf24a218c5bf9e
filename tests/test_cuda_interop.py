"""The cuda backend's arguments without a GPU: numpy, device tensors (zero copy), streams, device ordinals.

A fake driver (`FakeGpu`) stands in for ``cuda.bindings.driver``: its "device memory" is host memory
(numpy arrays at their real addresses), copies are ``memmove``s, and a launch runs the very SIMT kernel
the PTX was made from in the simulator over the buffers the launch's pointers name. So these tests check
what would reach the GPU (pointers, sizes, stream handles, synchronizations, frees) and that the values
land in the caller's arrays. A fake ``torch`` module plays the caller's library (allocation under a
stream, ``contiguous()``, current and external streams). The no-GPU paths (clean errors, ``auto`` on cpu,
the demo's message) run against a fake driver that is missing, so they hold on any machine.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import subprocess
import sys
import types
from dataclasses import replace

import numpy as np
import pytest
from cuda.bindings import driver as real_driver

import redfuser as rf
from redfuser import backends, cli
from redfuser.ir.buffer import Buffer
from redfuser.ir.errors import ArgumentError, BackendError, CudaError
from redfuser.ir.types import BufferType
from redfuser.runtime import arrays, cuda_driver
from redfuser.runtime.arrays import CUDA
from redfuser.runtime.cuda_backend import stream_handle
from redfuser.runtime.cuda_memory import Stream
from redfuser.codegen.simt_to_llvm.kernel import tensor_map_sources
from redfuser.ir.simt.nodes import TmaLoad, Wgmma, walk_stmts
from redfuser.workloads import attention, flash_attention_f16, softmax
from helpers import OK, FakeDriver, expected_softmax


class FakeGpu(FakeDriver):
    """A driver whose memory is host memory and whose launches run the simulator (see the module doc)."""

    def __init__(self, **overrides):
        super().__init__(CUstream=real_driver.CUstream, CUcontext=real_driver.CUcontext,
                         CUpointer_attribute=real_driver.CUpointer_attribute, **overrides)
        self.regions: dict[int, tuple[np.ndarray, int]] = {}     # base address -> (bytes, device)
        self.kernels: dict[str, object] = {}                      # PTX entry -> SIMT kernel
        self.launches: list[dict] = []
        self.current = real_driver.CUcontext(0)
        self.tensor_maps: list[tuple] = []                        # the arguments of each encoded tensor map

    def cuTensorMapEncodeTiled(self, dtype, rank, address, dims, strides, box, element_strides, interleave,
                               swizzle, l2_promotion, oob_fill):
        """A 128-byte stand-in for the map: the source's address and the map's number, which a launch checks."""
        self._region(address)
        number = len(self.tensor_maps)
        self.tensor_maps.append((dtype.name, rank, address, [int(n) for n in dims], [int(n) for n in strides],
                                 [int(n) for n in box], swizzle.name, oob_fill.name))
        blob = (ctypes.c_uint8 * 128)()
        ctypes.c_uint64.from_buffer(blob, 0).value = address
        ctypes.c_uint64.from_buffer(blob, 8).value = number
        return self._record("cuTensorMapEncodeTiled", (number,), (OK, types.SimpleNamespace(
            getPtr=lambda: ctypes.addressof(blob), blob=blob)))

    def program(self, lowered) -> None:
        self.kernels.update({k.entry: s for k, s in zip(lowered.stages["ptx"].kernels, lowered.stages["simt"].kernels)})

    def own(self, array: np.ndarray, device: int = 0) -> int:
        base = array.ctypes.data
        self.regions[base] = (array.reshape(-1).view(np.uint8), device)
        return base

    def _region(self, ptr: int) -> tuple[np.ndarray, int, int]:
        for base, (data, device) in self.regions.items():
            if base <= ptr < base + max(1, data.size):
                return data, ptr - base, device
        raise AssertionError(f"pointer {ptr:#x} is not fake device memory")

    def cuMemAlloc(self, nbytes):
        data = np.full(nbytes, 0xFF, np.uint8)                    # poison: NaN in every float type
        self.calls.append(("cuMemAlloc", (nbytes,)))
        return OK, self.own(data)

    def cuMemFree(self, ptr):
        self.calls.append(("cuMemFree", (ptr,)))
        self.regions.pop(int(ptr))
        return (OK,)

    def cuMemcpyHtoD(self, dst, src, nbytes):
        self._region(dst)
        ctypes.memmove(dst, src, nbytes)
        return self._record("cuMemcpyHtoD", (dst, nbytes), (OK,))

    def cuMemcpyDtoH(self, dst, src, nbytes):
        self._region(src)
        ctypes.memmove(dst, src, nbytes)
        return self._record("cuMemcpyDtoH", (src, nbytes), (OK,))

    def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):
        self._region(src)
        ctypes.memmove(dst, src, nbytes)
        return self._record("cuMemcpyDtoHAsync", (src, nbytes, int(stream)), (OK,))

    def cuMemcpyDtoDAsync(self, dst, src, nbytes, stream):
        self._region(dst), self._region(src)
        ctypes.memmove(dst, src, nbytes)
        return self._record("cuMemcpyDtoDAsync", (dst, src, nbytes, int(stream)), (OK,))

    def cuCtxGetCurrent(self):
        return self._record("cuCtxGetCurrent", (), (OK, self.current))

    def cuDevicePrimaryCtxRetain(self, dev):
        return self._record("cuDevicePrimaryCtxRetain", (dev,), (OK, real_driver.CUcontext(0x100 + dev)))

    def cuDeviceGetCount(self):
        return self._record("cuDeviceGetCount", (), (OK, 2))

    def cuPointerGetAttribute(self, attribute, ptr):
        assert attribute == real_driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        return self._record("cuPointerGetAttribute", (ptr,), (OK, self._region(ptr)[2]))

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        from redfuser.codegen.simulator import simulate

        kernel = self.kernels[fn.split(":", 1)[1]]
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        pointers = [ctypes.c_uint64.from_address(slots[i]).value for i in range(len(kernel.buffers))]
        # a shape-polymorphic kernel: its run-time extents are scalar params after the buffers, its grid the
        # launch's, and its buffers the memory behind their pointers, flat
        symbolic = bool(kernel.sizes)
        scalars = {}
        for i, q in enumerate(kernel.params[len(kernel.buffers):], start=len(kernel.buffers)):
            scalars[q.name] = q.dtype.numpy.type(np.ctypeslib.as_array(
                (ctypes.c_byte * q.dtype.itemsize).from_address(slots[i])).view(q.dtype.numpy)[0])
        views = {}
        flat_params = []
        for b, ptr in zip(kernel.buffers, pointers):
            data, offset, _ = self._region(ptr)
            assert ptr % 16 == 0, f"{b.name} at {ptr:#x}: a vector load would fault on a misaligned address"
            nbytes = (data.size - offset) if symbolic else b.type.span * b.dtype.itemsize
            flat = data[offset:offset + nbytes].view(b.dtype.numpy)
            views[b.name] = flat if symbolic or b.type.strides is not None else flat.reshape(b.shape)
            flat_params.append(Buffer(b.name, BufferType(b.dtype, (flat.size,))))
        if symbolic:
            kernel = replace(kernel, grid=(gx,), params=tuple(flat_params) + kernel.params[len(kernel.buffers):])
        # a TMA source's tensor map follows the parameters, by value: it must describe that buffer
        maps = []
        for i, name in enumerate(tensor_map_sources(kernel), start=len(kernel.params)):
            address, number = (ctypes.c_uint64.from_address(slots[i] + at).value for at in (0, 8))
            assert address == pointers[[b.name for b in kernel.buffers].index(name)], f"{name}'s tensor map"
            maps.append(number)
            if symbolic:    # the copy engine sees the buffer as its map describes it (dims innermost first)
                shape = tuple(reversed(self.tensor_maps[number][3]))
                at = [b.name for b in kernel.buffers].index(name)
                views[name] = views[name][:math.prod(shape)]
                kernel = replace(kernel, params=kernel.params[:at] + (Buffer(name, BufferType(
                    kernel.params[at].dtype, shape)),) + kernel.params[at + 1:])
        for name, value in simulate(kernel, views | scalars, verify=False).items():
            views[name][...] = np.reshape(value, views[name].shape)
        self.launches.append({"entry": kernel.name, "grid": (gx, gy, gz), "block": (bx, by, bz),
                              "stream": int(stream), "pointers": pointers, "shared": shared, "maps": maps})
        return self._record("cuLaunchKernel", (kernel.name, int(stream)), (OK,))


@pytest.fixture
def gpu(monkeypatch):
    """A fresh `FakeGpu` installed as the driver (the real driver's state forgotten before and after)."""
    fake = FakeGpu()
    monkeypatch.setattr(cuda_driver, "driver", fake)
    cuda_driver.reset_state()
    yield fake
    cuda_driver.reset_state()


# --- a fake torch: tensors in fake device memory, streams, allocation under a stream ----------------

class FakeTensor:
    """What the backend sees of a torch CUDA tensor: the CUDA Array Interface (the device is asked of the
    driver) and ``contiguous()``; its data is a numpy array the fake GPU knows as device memory."""

    __module__ = "torch"                                      # the caller's library, as `arrays` reads it

    def __init__(self, data: np.ndarray, gpu: FakeGpu, device: int = 0, base: np.ndarray | None = None):
        self.data, self.gpu, self.device = data, gpu, device
        gpu.own(data if base is None else base, device)

    @property
    def __cuda_array_interface__(self):
        strides = None if self.data.flags.c_contiguous else self.data.strides
        return {"shape": self.data.shape, "typestr": self.data.dtype.str, "data": (self.data.ctypes.data, False),
                "version": 2, "strides": strides}

    def contiguous(self) -> "FakeTensor":
        self.gpu.torch.log.append(("contiguous", self.gpu.torch.cuda.current.cuda_stream))
        return FakeTensor(np.ascontiguousarray(self.data), self.gpu, self.device)

    @property
    def T(self) -> "FakeTensor":
        return FakeTensor(self.data.T, self.gpu, self.device, base=self.data)


def fake_torch(gpu: FakeGpu) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.log = []
    for name, dtype in [("float32", np.float32), ("float16", np.float16), ("int32", np.int32),
                        ("int64", np.int64), ("bool", np.bool_), ("float64", np.float64),
                        ("bfloat16", rf.bfloat16), ("float8_e4m3fn", rf.float8_e4m3fn)]:
        setattr(torch, name, np.dtype(dtype))

    class Stream:
        def __init__(self, cuda_stream: int = 0x5000):
            self.cuda_stream = cuda_stream

    class ExternalStream(Stream):
        def __init__(self, handle: int, device: int = 0):
            super().__init__(handle)

    cuda = types.SimpleNamespace(Stream=Stream, ExternalStream=ExternalStream, current=Stream(0x5000))
    cuda.current_stream = lambda device=None: cuda.current

    @contextlib.contextmanager
    def stream(s):
        before, cuda.current = cuda.current, s
        try:
            yield
        finally:
            cuda.current = before

    cuda.stream = stream
    torch.cuda = cuda

    def empty(shape, dtype, device):
        torch.log.append(("empty", device, cuda.current.cuda_stream))
        index = int(device.split(":")[1]) if device.startswith("cuda") else -1
        return FakeTensor(np.full(shape, np.nan).astype(dtype), gpu, index)

    torch.empty = empty
    gpu.torch = torch
    return torch


@pytest.fixture
def torch(gpu, monkeypatch):
    module = fake_torch(gpu)
    monkeypatch.setitem(sys.modules, "torch", module)
    return module


def compiled(gpu: FakeGpu, fn, *args, **options):
    k = rf.kernel(fn, backend="cuda", **options)
    gpu.program(k.lower(*args))
    return k


def rows(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3


# --- numpy in, numpy out -----------------------------------------------------------------------------

def test_numpy_arguments_are_copied_in_and_out(gpu):
    x = rows(4, 64)
    k = compiled(gpu, softmax, x)
    out = k(x)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, expected_softmax(x), rtol=1e-5, atol=1e-6)
    names = gpu.names()
    assert names.count("cuMemcpyHtoD") == 1 and names.count("cuMemcpyDtoH") == 1
    assert [c for c in gpu.calls if c[0] == "cuMemcpyHtoD"][0][1][1] == x.nbytes
    assert all(launch["stream"] == 0 for launch in gpu.launches)                # the legacy default stream
    assert names.index("cuCtxSynchronize") < names.index("cuMemcpyDtoH")
    scratch = len(k.lower(x).stages["simt"].scratch)                            # softmax's row statistics
    assert names.count("cuMemAlloc") == 2 + scratch and names.count("cuMemFree") == 2   # input, output freed


def test_numpy_arguments_on_a_given_stream(gpu):
    x = rows(4, 64)
    k = compiled(gpu, softmax, x)
    out = k(x, stream=0x77)
    np.testing.assert_allclose(out, expected_softmax(x), rtol=1e-5, atol=1e-6)
    assert {launch["stream"] for launch in gpu.launches} == {0x77}
    assert ("cuMemcpyDtoHAsync", (gpu.launches[-1]["pointers"][-1], x.nbytes, 0x77)) in gpu.calls
    assert any(n == "cuStreamSynchronize" and int(a[0]) == 0x77 for n, a in gpu.calls)


# --- device arrays -----------------------------------------------------------------------------------

def test_torch_tensors_are_read_in_place_and_outputs_are_torch_tensors_on_their_device(gpu, torch):
    x = rows(4, 64)
    k = compiled(gpu, softmax, x)
    t = FakeTensor(x.copy(), gpu)
    out = k(t)
    assert isinstance(out, FakeTensor) and out.device == 0
    np.testing.assert_allclose(out.data, expected_softmax(x), rtol=1e-5, atol=1e-6)
    assert gpu.launches[0]["pointers"][0] == t.data.ctypes.data                 # zero copy: the tensor itself
    assert out.data.ctypes.data in gpu.launches[-1]["pointers"]                 # written in place
    assert not {"cuMemcpyHtoD", "cuMemcpyDtoH", "cuStreamSynchronize", "cuCtxSynchronize"} & set(gpu.names())
    assert {launch["stream"] for launch in gpu.launches} == {0x5000}            # torch's current stream
    assert torch.log == [("empty", "cuda:0", 0x5000)]
    assert gpu.names().count("cuMemAlloc") == len(k.lower(x).stages["simt"].scratch)   # scratch only


def test_results_go_into_device_outs_in_place_with_no_allocation_or_synchronization(gpu, torch):
    """``out=`` of device tensors: the kernel writes them directly, on the caller's stream; a call that
    allocates nothing and never waits for the device can be captured in a CUDA graph."""
    x = rows(4, 64)
    k = compiled(gpu, softmax, x)
    t = FakeTensor(x.copy(), gpu)
    k(t)                                              # the first call makes the split's scratch
    gpu.calls.clear()
    torch.log.clear()
    out = FakeTensor(np.full((4, 64), np.nan, np.float32), gpu)
    assert k(t, out=out) is out
    np.testing.assert_allclose(out.data, expected_softmax(x), rtol=1e-5, atol=1e-6)
    assert out.data.ctypes.data in gpu.launches[-1]["pointers"]
    assert not {"cuMemAlloc", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuStreamSynchronize", "cuCtxSynchronize"} & set(
        gpu.names())
    assert torch.log == []                             # nothing allocated through the library either


def test_numpy_outs_on_the_cuda_backend_get_the_results_copied_back(gpu):
    x = rows(4, 64)
    k = compiled(gpu, softmax, x)
    out = np.full((4, 64), np.nan, np.float32)
    assert k(x, out=out) is out
    np.testing.assert_allclose(out, expected_softmax(x), rtol=1e-5, atol=1e-6)


def test_a_strided_device_out_is_refused_before_any_launch(gpu, torch):
    x = rows(4, 64)
    k = compiled(gpu, softmax, x)
    wide = np.zeros((4, 128), np.float32)
    strided = FakeTensor(wide[:, ::2], gpu, base=wide)
    with pytest.raises(ArgumentError, match="strided view of device memory"):
        k(FakeTensor(x.copy(), gpu), out=strided)
    assert not gpu.launches


@pytest.mark.parametrize("how", ["torch stream", "int", "redfuser Stream", "__cuda_stream__"])
def test_a_user_given_stream_is_honoured(gpu, torch, how):
    x = rows(4, 64)
    k = compiled(gpu, softmax, x)
    given = {"torch stream": torch.cuda.Stream(0x6100), "int": 0x6100,
             "redfuser Stream": Stream(real_driver.CUstream(0x6100)),
             "__cuda_stream__": types.SimpleNamespace(__cuda_stream__=lambda: (0, 0x6100))}[how]
    out = k(FakeTensor(x.copy(), gpu), stream=given)
    np.testing.assert_allclose(out.data, expected_softmax(x), rtol=1e-5, atol=1e-6)
    assert {launch["stream"] for launch in gpu.launches} == {0x6100}
    assert torch.log == [("empty", "cuda:0", 0x6100)]                           # allocated under that stream
    assert torch.cuda.current.cuda_stream == 0x5000                             # and torch's current restored


def test_stream_arguments_that_are_not_streams_are_refused():
    assert stream_handle(types.SimpleNamespace(ptr=0x42)) == 0x42               # a cupy stream
    assert stream_handle(real_driver.CUstream(9)) == 9
    with pytest.raises(ArgumentError, match="stream must be a CUDA stream"):
        stream_handle("default")
    with pytest.raises(ArgumentError, match="stream must be a CUDA stream"):
        stream_handle(True)


def test_a_strided_device_input_is_read_in_place_with_its_strides(gpu, torch):
    x = rows(64, 4)
    k = compiled(gpu, softmax, x.T)                                             # specialized on the view
    t = FakeTensor(x.copy(), gpu).T                                             # a transposed view
    out = k(t, stream=0x6200)
    np.testing.assert_allclose(out.data, expected_softmax(x.T), rtol=1e-5, atol=1e-6)
    assert gpu.launches[0]["pointers"][0] == t.data.ctypes.data                 # no copy
    assert "contiguous" not in [entry[0] for entry in torch.log]
    assert "cuMemcpyDtoDAsync" not in gpu.names()


class Strided:
    """A device array of a library RedFuser knows nothing of, as a view of `data` (any strides)."""

    __module__ = "somelib"

    def __init__(self, gpu: FakeGpu, data: np.ndarray, view: np.ndarray):
        gpu.own(data)
        self.view = view
        self.__cuda_array_interface__ = {"shape": view.shape, "typestr": view.dtype.str, "version": 3,
                                         "data": (view.ctypes.data, False), "strides": view.strides}


def test_negative_and_zero_strides_of_any_library_are_read_in_place(gpu):
    data = rows(64, 8)
    for view in (data[::-1, -2::-2], np.broadcast_to(data[4], (64, 8))):   # lowest elements 16-byte aligned
        k = compiled(gpu, softmax, view)
        out = k(Strided(gpu, data, view))
        np.testing.assert_allclose(out, expected_softmax(view), rtol=1e-5, atol=1e-6)
        lowest = min(view.ctypes.data + sum((n - 1) * s for n, s in zip(view.shape, view.strides) if s < 0),
                     view.ctypes.data)
        assert gpu.launches[-1]["pointers"][0] == lowest                          # the memory itself
    assert "cuMemcpyDtoDAsync" not in gpu.names()


def test_a_device_input_not_aligned_for_vector_loads_is_copied_to_aligned_memory(gpu):
    data = rows(4 * 64 + 1)
    view = data[1:].reshape(4, 64)                                              # 4 bytes past an aligned start
    k = compiled(gpu, softmax, view)
    out = k(Strided(gpu, data, view))
    np.testing.assert_allclose(out, expected_softmax(view), rtol=1e-5, atol=1e-6)
    copies = [args for name, args in gpu.calls if name == "cuMemcpyDtoDAsync"]
    assert len(copies) == 1 and copies[0][1] == view.ctypes.data and copies[0][2] == view.nbytes
    assert gpu.launches[0]["pointers"][0] == copies[0][0] != view.ctypes.data


def test_device_ordinals_are_checked_and_the_callers_device_used(gpu, torch):
    x = rows(4, 64)
    k = compiled(gpu, lambda a, b: rf.sum(a * b, axis=-1), x, x)
    with pytest.raises(ArgumentError, match="different devices .*cuda:0.*cuda:1"):
        k(FakeTensor(x.copy(), gpu, 0), FakeTensor(x.copy(), gpu, 1))
    gpu.current = real_driver.CUcontext(0x100)                                  # torch's device-0 context
    out = k(FakeTensor(x.copy(), gpu, 1), FakeTensor(x.copy(), gpu, 1))
    assert out.device == 1 and torch.log[-1] == ("empty", "cuda:1", 0x5000)
    np.testing.assert_allclose(out.data, (x * x).sum(-1), rtol=1e-5)
    assert ("cuDeviceGet", (1,)) in gpu.calls
    assert [int(a[0]) for n, a in gpu.calls if n == "cuCtxSetCurrent"][-1] == 0x100   # restored afterwards


def test_host_inputs_beside_device_ones_are_copied_and_freed_after_the_stream_finished(gpu, torch):
    x, y = rows(4, 64), rows(4, 64, seed=1)
    k = compiled(gpu, lambda a, b: rf.sum(a * b, axis=-1), x, y)
    out = k(FakeTensor(x.copy(), gpu), y)
    np.testing.assert_allclose(out.data, (x * y).sum(-1), rtol=1e-5)
    names = gpu.names()
    assert names.count("cuMemcpyHtoD") == 1
    assert names.index("cuLaunchKernel") < names.index("cuStreamSynchronize") < names.index("cuMemFree")


def test_device_arrays_of_a_library_redfuser_cannot_allocate_in_give_numpy_outputs(gpu):
    class Foreign:
        __module__ = "somelib"

        def __init__(self, data):
            self.data = data
            gpu.own(data)
            self.__cuda_array_interface__ = {"shape": data.shape, "typestr": "<f4", "version": 3,
                                             "data": (data.ctypes.data, False), "strides": None}
    x = rows(4, 64)
    k = compiled(gpu, softmax, x)
    out = k(Foreign(x.copy()))
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, expected_softmax(x), rtol=1e-5, atol=1e-6)
    names = gpu.names()
    assert names.index("cuStreamSynchronize") < names.index("cuMemcpyDtoH")
    assert names.count("cuMemFree") == 1                                        # the numpy output's buffer


def test_a_shape_polymorphic_kernel_launches_with_its_lengths_as_parameters(gpu, torch):
    """One compile serves every length: the grid and the run-time extents are computed per call from the
    arguments' shapes and passed as kernel parameters; device outputs are allocated at the call's shape."""
    k = rf.kernel(softmax, backend="cuda", dynamic=True)
    gpu.program(k.lower(rows(3, 70)))
    for shape in ((3, 70), (40, 130), (2, 5)):
        x = rows(*shape, seed=shape[0])
        on_host = k(x)
        np.testing.assert_allclose(on_host, expected_softmax(x), rtol=1e-5, atol=1e-6)
        on_device = k(FakeTensor(x.copy(), gpu))
        np.testing.assert_allclose(on_device.data, expected_softmax(x), rtol=1e-5, atol=1e-6)
    assert k.cache_info().misses == 1
    grids = [launch["grid"][0] for launch in gpu.launches]
    assert grids[0] == grids[1] != grids[2]           # the 40-row call has more programs than the 3-row one


def test_a_polymorphic_split_reduction_sizes_its_scratch_per_call(gpu, torch):
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 1, 1, 16)).astype(np.float32)
    k = rf.kernel(attention, backend="cuda", dynamic={"k": (-2,), "v": (-2,)})
    kv = rng.standard_normal((1, 1, 1000, 16)).astype(np.float32)
    gpu.program(k.lower(q, kv, kv))
    for n in (1000, 333, 2):
        kv = rng.standard_normal((1, 1, n, 16)).astype(np.float32)
        out = k(FakeTensor(q.copy(), gpu), FakeTensor(kv.copy(), gpu), FakeTensor(kv.copy(), gpu))
        np.testing.assert_allclose(out.data, attention(q, kv, kv), rtol=1e-4, atol=1e-5)
    assert k.cache_info().misses == 1


def test_a_kernel_past_48_kib_of_shared_memory_takes_it_from_the_launch(gpu):
    """Head-256 f16 attention on Hopper keeps its dots on wgmma with 56 KiB of operand tiles (a kernel may
    declare 48 KiB statically): the kernel addresses them in the launch's dynamic shared memory, the launch
    passes that many bytes, and the runtime raises the kernel's limit first. The results are the kernel's
    (the fake driver simulates it) and equal the mma.sync kernel's, which needs no dynamic shared memory."""
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 1, 128, 256)).astype(np.float16) for _ in range(3))
    kernel = rf.kernel(flash_attention_f16, backend="cuda")
    lowered = kernel.lower(q, k, v)
    gpu.program(lowered)
    (big,) = [s for s in lowered.stages["simt"].kernels if s.dynamic_shared]
    assert big.shared_bytes > 48 * 1024 and any(isinstance(s, Wgmma) for s in walk_stmts(big.body))
    out = kernel(q, k, v)
    launch = next(entry for entry in gpu.launches if entry["entry"] == big.name)
    assert launch["shared"] == big.shared_bytes
    raised = [args for name, args in gpu.calls if name == "cuFuncSetAttribute"]
    assert [args[1:] for args in raised] == [
        (real_driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, big.shared_bytes)]
    on_mma = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90")
    assert not any(s.dynamic_shared for s in on_mma.lower(q, k, v).stages["simt"].kernels)
    np.testing.assert_array_equal(out, on_mma(q, k, v))


def test_a_kernel_copying_operands_by_tma_gets_a_tensor_map_of_each_source_at_every_launch(gpu, torch):
    """On sm_90a (TMA, the default there), f16 attention's Q, K and V tiles are copied by the tensor memory
    accelerator: every launch passes one map a source after the kernel's parameters (its address, its dims
    innermost first, a 128-byte swizzle, boxes of 64 columns), encoded once per buffer address (a second call
    on the same tensors asks the driver for none); the results equal the threads-staged kernel's."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 2, 128, 64)).astype(np.float16) for _ in range(3))
    kernel = rf.kernel(flash_attention_f16, backend="cuda", sm="sm_90a")
    lowered = kernel.lower(q, k, v)
    gpu.program(lowered)
    simt = lowered.stages["simt"].kernels[0]
    assert tensor_map_sources(simt) == ["q", "k", "v"] and any(isinstance(s, TmaLoad) for s in walk_stmts(simt.body))
    tensors = [FakeTensor(a.copy(), gpu) for a in (q, k, v)]
    for _ in range(2):
        out = kernel(*tensors).data
        assert len(gpu.tensor_maps) == 3 and len(gpu.launches[-1]["maps"]) == 3   # one kernel, its epilogue in it
    assert [m[2] for m in gpu.tensor_maps] == [t.data.ctypes.data for t in tensors]
    other = FakeTensor(q.copy(), gpu)                 # another buffer: its own map
    kernel(other, tensors[1], tensors[2])
    assert len(gpu.tensor_maps) == 4 and gpu.tensor_maps[-1][2] == other.data.ctypes.data
    dtype, rank, _, dims, strides, box, swizzle, fill = gpu.tensor_maps[0]
    assert (dtype, rank, dims, strides) == ("CU_TENSOR_MAP_DATA_TYPE_FLOAT16", 4, [64, 128, 2, 1],
                                            [128, 128 * 128, 2 * 128 * 128])
    assert box[0] == 64 and box[2:] == [1, 1] and swizzle == "CU_TENSOR_MAP_SWIZZLE_128B"
    assert fill == "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE"
    staged = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a", tma=False)
    np.testing.assert_array_equal(out, staged(q, k, v))


def test_a_shape_polymorphic_tma_kernel_gets_maps_of_each_calls_lengths(gpu, torch):
    """A kernel compiled once for every length (``dynamic=True``) copies K and V by TMA in its loop of whole key
    blocks: each call's maps carry that call's dims (the kernel's parameters at the launch's lengths), and
    the results equal the threads-staged kernel's at each length."""
    rng = np.random.default_rng(9)
    kernel = rf.kernel(flash_attention_f16, backend="cuda", sm="sm_90a", dynamic=True)
    staged = rf.kernel(flash_attention_f16, backend="simulate", sm="sm_90a", dynamic=True, tma=False)
    for n in (192, 130):
        q, k, v = (rng.standard_normal((1, 2, n, 64)).astype(np.float16) for _ in range(3))
        gpu.program(kernel.lower(q, k, v))
        before = len(gpu.tensor_maps)
        out = kernel(*[FakeTensor(a.copy(), gpu) for a in (q, k, v)]).data
        dims = [m[3] for m in gpu.tensor_maps[before:]]
        assert dims == [[64, n, 2, 1]] * 2                                  # K's and V's, at this call's length
        np.testing.assert_array_equal(out, staged(q, k, v))
    assert kernel.cache_info().misses == 1
    # a length's kernels and their specs are kept with its program, the last 64 lengths: decoding through
    # thousands of lengths does not keep thousands of kernels
    (_, program), = kernel._cache.values()
    for n in range(300, 400):
        at, _ = program._program([(1, 2, n, 64)] * 3)
        for simt in at.kernels:
            program._tensor_maps(simt)
    assert len(program._maps) <= 64 * len(at.kernels)


def test_split_reduction_scratch_is_kept_per_stream(gpu, torch):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, 1, 16)).astype(np.float32)
    kv = rng.standard_normal((1, 1, 1024, 16)).astype(np.float32)
    k = compiled(gpu, attention, q, kv, kv)
    program = k.lower(q, kv, kv).stages["simt"]
    assert program.scratch and len(program.kernels) == 2                       # partial states, then merge
    args = [FakeTensor(a.copy(), gpu) for a in (q, kv, kv)]
    first, second = k(*args), k(*args)
    third = k(*args, stream=0x6300)
    for out in (first, second, third):
        np.testing.assert_allclose(out.data, attention(q, kv, kv), rtol=1e-4, atol=1e-5)
    assert gpu.names().count("cuMemAlloc") == 2 * len(program.scratch)          # once per stream
    assert "cuMemFree" not in gpu.names()
    executable = next(entry[1] for entry in k._cache.values())
    executable.close()
    assert gpu.names().count("cuMemFree") == 2 * len(program.scratch)


def test_float8_and_bfloat16_device_tensors_are_described_through_dlpack():
    class TorchLikeFp8:
        """torch's CAI raises KeyError for float8; its DLPack names the dtype and the device ordinal."""

        def __init__(self, raw: np.ndarray):
            self.raw = raw

        @property
        def __cuda_array_interface__(self):
            raise KeyError("torch.float8_e4m3fn")

        def __dlpack__(self, stream=None):
            assert stream == -1                                   # no producer-side synchronization asked
            capsule = self.raw.__dlpack__()
            arrays._capsule_tensor(capsule).dtype.code = arrays._DL_FLOAT8_E4M3FN
            return capsule

        def __dlpack_device__(self):
            return (CUDA, 1)

    t = TorchLikeFp8(np.zeros((3, 5), np.uint8))
    assert arrays.is_array(t)
    info = arrays.describe(t)
    assert (info.dtype, info.device_id, info.shape, info.on_gpu) == (rf.ir.types.float8_e4m3fn, 1, (3, 5), True)
    assert info.pointer == t.raw.ctypes.data


def test_a_device_array_whose_protocols_fail_is_a_clear_error():
    class RequiresGrad:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad.")

    assert arrays.is_array(RequiresGrad())
    with pytest.raises(ArgumentError, match="requires grad"):
        rf.kernel(softmax, backend="cuda").lower(RequiresGrad())


def test_a_failed_launch_raises_the_drivers_error_and_frees_the_buffers(gpu):
    x = rows(4, 64)
    k = compiled(gpu, softmax, x)
    gpu.cuLaunchKernel = lambda *a: (real_driver.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,)
    with pytest.raises(CudaError, match="cuLaunchKernel failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"):
        k(x)
    scratch = len(k.lower(x).stages["simt"].scratch)                            # kept for the next call
    assert gpu.names().count("cuMemAlloc") == gpu.names().count("cuMemFree") + scratch


def test_host_backends_ignore_the_stream():
    x = rows(4, 64)
    np.testing.assert_allclose(rf.kernel(softmax, backend="interpret")(x, stream=0x1234), expected_softmax(x),
                               rtol=1e-5)


# --- without a GPU -----------------------------------------------------------------------------------

@pytest.fixture
def no_driver(monkeypatch):
    def missing(flags):
        raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search')
    monkeypatch.setattr(cuda_driver, "driver", FakeDriver(cuInit=missing))
    cuda_driver.reset_state()
    yield
    cuda_driver.reset_state()


def test_importing_redfuser_needs_no_driver_and_no_cuda_python():
    code = ("import sys; sys.modules['cuda'] = None; sys.modules['cuda.bindings'] = None\n"
            "import redfuser as rf, redfuser.runtime.cuda_backend, redfuser.runtime.device as d\n"
            "from redfuser import backends\n"
            "print(d.why_no_device()); print(backends.resolve('auto')[0])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["no CUDA driver found (cuda-python is not installed)", "cpu"]


def test_the_cuda_backend_without_a_driver_is_a_clear_error_and_auto_runs_on_cpu(no_driver):
    x = rows(4, 64)
    with pytest.raises(BackendError, match="cannot use the cuda backend: no CUDA driver found"):
        rf.kernel(softmax, backend="cuda")(x)
    assert "mov" in str(rf.kernel(softmax, backend="cuda").lower(x).stages["ptx"])   # compiling needs none
    assert backends.resolve("auto") == ("cpu", "auto: best backend available (cannot use the cuda backend: "
                                                "no CUDA driver found)")
    k = rf.kernel(softmax)
    np.testing.assert_allclose(k(x), expected_softmax(x), rtol=1e-5, atol=1e-6)
    assert k.lower(x).backend == "cpu"


def test_the_demo_says_which_backend_ran_and_why(no_driver, capsys):
    assert cli.main(["demo", "--workload", "softmax"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "backend: cpu (auto: best backend available (cannot use the cuda backend: no CUDA driver found))"
