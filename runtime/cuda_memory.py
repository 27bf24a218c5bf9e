"""Device memory and streams on the CUDA driver: plain ``cuMemAlloc`` buffers (never managed memory).

Every call goes through `cuda_driver.call`, so failures raise `CudaError`, and
without a device the first allocation raises `BackendError` saying why.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.errors import BackendError
from . import cuda_driver
from .cuda_driver import Context, DeviceAddress, call, primary_context


@dataclass(eq=False)
class Stream:
    """A non-blocking stream of the current context."""

    handle: object

    @classmethod
    def create(cls, context: Context | None = None) -> "Stream":
        (context or primary_context()).make_current()
        return cls(call("cuStreamCreate", cuda_driver.driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value))

    def synchronize(self) -> None:
        """Wait for everything queued on this stream."""
        call("cuStreamSynchronize", self.handle)

    def destroy(self) -> None:
        """Destroy the stream (queued work still completes)."""
        call("cuStreamDestroy", self.handle)


@dataclass(eq=False)
class DeviceBuffer(DeviceAddress):
    """`nbytes` of device memory from ``cuMemAlloc`` (never managed memory); free it or use ``with``."""

    ptr: int
    nbytes: int
    context: Context

    @classmethod
    def alloc(cls, nbytes: int, context: Context | None = None) -> "DeviceBuffer":
        ctx = context or primary_context()
        ctx.make_current()
        return cls(int(call("cuMemAlloc", max(1, int(nbytes)))), int(nbytes), ctx)

    @classmethod
    def from_numpy(cls, array: np.ndarray, context: Context | None = None) -> "DeviceBuffer":
        """A new buffer holding a copy of `array`."""
        buffer = cls.alloc(array.nbytes, context)
        buffer.copy_from(array)
        return buffer

    def copy_from(self, array: np.ndarray, stream: Stream | None = None) -> None:
        """Host -> device copy of `array` (made C-contiguous) into the start of this buffer."""
        host = np.ascontiguousarray(array)
        self._fits(host.nbytes)
        if stream is None:
            call("cuMemcpyHtoD", self.ptr, host.ctypes.data, host.nbytes)
        else:
            call("cuMemcpyHtoDAsync", self.ptr, host.ctypes.data, host.nbytes, stream.handle)
            stream.synchronize()  # `host` may be a temporary copy: it must outlive the transfer

    def copy_from_device(self, address: int, nbytes: int, stream: Stream) -> None:
        """Device -> device copy of `nbytes` at `address` into the start of this buffer, queued on `stream`
        (kernels queued after it on the stream see the copy)."""
        self._fits(nbytes)
        call("cuMemcpyDtoDAsync", self.ptr, int(address), int(nbytes), stream.handle)

    def copy_to(self, out: np.ndarray, stream: Stream | None = None) -> np.ndarray:
        """Device -> host copy into the C-contiguous array `out` (returned)."""
        if not out.flags.c_contiguous:
            raise BackendError("copy_to needs a C-contiguous output array")
        self._fits(out.nbytes)
        if stream is None:
            call("cuMemcpyDtoH", out.ctypes.data, self.ptr, out.nbytes)
        else:
            call("cuMemcpyDtoHAsync", out.ctypes.data, self.ptr, out.nbytes, stream.handle)
            stream.synchronize()
        return out

    def to_numpy(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A new host array of `shape`/`dtype` with this buffer's first bytes."""
        return self.copy_to(np.empty(shape, dtype))

    def free(self) -> None:
        """Release the memory (idempotent)."""
        if self.ptr:
            self.context.make_current()
            call("cuMemFree", self.ptr)
            self.ptr = 0

    def _fits(self, nbytes: int) -> None:
        if nbytes > self.nbytes:
            raise BackendError(f"copy of {nbytes} B into a device buffer of {self.nbytes} B")

    def __enter__(self) -> "DeviceBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()
