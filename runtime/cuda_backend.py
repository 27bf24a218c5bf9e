"""The ``cuda`` backend's executable: load the PTX, take the arguments where they live, launch every kernel.

The PTX comes from the ``ptx`` stage (`codegen.simt.ptx.compile_ptx`, each kernel
served by the compile cache: `runtime.ptx_cache`). `CudaProgram` runs it; modules
are loaded once per context (`cuda_driver.load_module` caches them).

Arguments (the rules in full: docs/gpu-backend.md, "Arrays and streams"): host
arrays only are copied in and out, synchronously; device arrays (DLPack,
``__cuda_array_interface__``) are read in place on their one device, with their
strides (a kernel is specialized on them), except that one whose lowest element is
not 16-byte aligned (the vector loads' alignment) is first copied, the memory it
spans and no more, into aligned memory; outputs are the caller's type on that device,
and the work is queued on the call's ``stream=`` (default: torch's or cupy's
current stream) without waiting. Scratch buffers (split reductions' partial
states) are kept per (device, stream). Every driver call is checked (`CudaError`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..codegen.simt import SimtProgram
from ..codegen.simt.ptx import PtxProgram
from ..codegen.simt.run import program_at
from ..ir.buffer import Buffer
from ..ir.sizes import bind_buffers
from ..ir.array_memory import memory_of
from ..ir.errors import ArgumentError, BackendError
from ..ir.types import BufferType
from . import arrays as arrays_rt
from .arrays import ArrayInfo
from .cuda_driver import DeviceAddress
from .tensor_maps import encode, tensor_map_specs


# --- streams ---------------------------------------------------------------------------------------

def stream_handle(stream: object) -> int:
    """The raw ``CUstream`` of a user-given stream (see the module docstring); `ArgumentError` otherwise."""
    from .cuda_memory import Stream

    if isinstance(stream, Stream):
        return int(stream.handle)
    if isinstance(stream, (int, np.integer)) and not isinstance(stream, bool):
        return int(stream)
    if hasattr(stream, "__cuda_stream__"):             # the CUDA Python stream protocol: (version, handle)
        return int(stream.__cuda_stream__()[1])
    for attribute in ("cuda_stream", "ptr"):           # torch.cuda.Stream, cupy.cuda.Stream
        value = getattr(stream, attribute, None)
        if isinstance(value, (int, np.integer)):
            return int(value)
    if type(stream).__name__ == "CUstream":            # cuda.bindings.driver.CUstream
        return int(stream)
    raise ArgumentError(f"stream must be a CUDA stream (an int handle, a torch or cupy stream, a "
                        f"redfuser Stream or an object with __cuda_stream__), got {type(stream).__name__}")


def _library_stream(library: str, stream: object | None, handle: int | None, device: int):
    """The caller library's stream object for `stream` (None: its current stream), or None."""
    if library == "torch":
        import torch

        if stream is not None and isinstance(stream, torch.cuda.Stream):
            return stream
        if handle is None:
            return torch.cuda.current_stream(device)
        return torch.cuda.ExternalStream(handle, device=device)
    if library == "cupy":
        import cupy

        if stream is not None and isinstance(stream, cupy.cuda.Stream):
            return stream
        with cupy.cuda.Device(device):
            return cupy.cuda.get_current_stream() if handle is None else cupy.cuda.ExternalStream(handle, device)
    return None


def _using(library: str, library_stream: object):
    """A context in which the caller's library allocates and copies on `library_stream`."""
    if library_stream is None:
        return contextlib.nullcontext()
    if library == "torch":
        import torch

        return torch.cuda.stream(library_stream)
    return library_stream   # a cupy stream is a context manager making itself current


def _library_handle(library: str, library_stream: object) -> int:
    return int(library_stream.cuda_stream if library == "torch" else library_stream.ptr)


# --- device placement ------------------------------------------------------------------------------

@dataclass(eq=False)
class _Pointer(DeviceAddress):
    """A device address the caller owns, passed to a kernel as is."""

    ptr: int


def _device_of(info: ArrayInfo, name: str) -> int | None:
    """The ordinal of the device `info` lives on (asked of the driver when the protocol did not say)."""
    if info.device_id >= 0:
        return info.device_id
    if not info.pointer:
        return None                                      # empty array: no memory, any device will do
    from .cuda_driver import call, driver

    try:
        return int(call("cuPointerGetAttribute",
                        driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, info.pointer))
    except BackendError as err:
        raise ArgumentError(f"{name} has a device pointer the CUDA driver does not know ({err})") from None


def _common_device(infos: Sequence[tuple[str, ArrayInfo]]) -> int:
    devices = {}
    for name, info in infos:
        device = _device_of(info, name)
        if device is not None:
            devices.setdefault(device, name)
    if len(devices) > 1:
        where = ", ".join(f"{name} on cuda:{device}" for device, name in sorted(devices.items()))
        raise ArgumentError(f"the device arrays are on different devices ({where}); move them to one device")
    return next(iter(devices), 0)


VECTOR_ALIGNMENT = 16
"""Bytes the generated code assumes an input's lowest element is aligned to (16-byte vector loads; `codegen.simt.memory`)."""


def _host_memory(a: object, b, name: str) -> np.ndarray:
    """The memory of host argument `a` as the kernel addresses it (`ir.array_memory`), contiguous for a copy."""
    return np.ascontiguousarray(memory_of(arrays_rt.host_array(a, name), b.type))


def _lowest_address(info: ArrayInfo, b) -> int:
    """The address of a device argument's lowest element (its first one unless strides are negative)."""
    return info.pointer - b.type.base_offset * b.dtype.itemsize


def _nbytes(buffer) -> int:
    return buffer.type.span * buffer.dtype.itemsize


@contextlib.contextmanager
def _keeping_current_context():
    """Restore the thread's current CUDA context afterwards (torch reads its current device from it)."""
    from .cuda_driver import call

    previous = call("cuCtxGetCurrent")
    try:
        yield
    finally:
        if previous is not None and int(previous) != 0:
            call("cuCtxSetCurrent", previous)


# --- the program ---------------------------------------------------------------------------------

ENCODED_MAPS = 256
"""Encoded tensor maps a program keeps (`CudaProgram._encoded`); a map is 128 bytes."""


class CudaProgram:
    """A compiled program; call it with one array per input (and optionally ``stream=``), get the outputs."""

    def __init__(self, simt: SimtProgram, ptx: PtxProgram) -> None:
        self.simt, self.ptx = simt, ptx
        self._functions: dict[int, list] = {}               # device -> its loaded kernels, in launch order
        # (device, stream, scratch lengths) -> scratch buffers by name
        self._workspaces: dict[tuple, dict] = {}
        self._symbolic = any(not isinstance(n, int) for b in simt.inputs for n in b.shape)
        self._at: dict[tuple, tuple] = {}   # a shape-polymorphic program's lengths -> `program_at` for them
        self._maps: dict[int, tuple] = {}    # id(kernel) -> (kernel, its tensor map specs); the kernel kept alive
        self._maps_at: dict[tuple, object] = {}   # (spec, address) -> its encoded tensor map (`_encoded`)

    def _kernels(self, context) -> list:
        from .cuda_driver import load_module

        functions = self._functions.get(context.device_index)
        if functions is None:
            functions = [load_module(k.ptx, context).function(k.entry) for k in self.ptx.kernels]
            self._functions[context.device_index] = functions
        return functions

    def _scratch(self, p: SimtProgram, context, handle: int) -> dict:
        from .cuda_memory import DeviceBuffer

        key = (context.device_index, handle, tuple(b.shape for b in p.scratch))
        workspace = self._workspaces.get(key)
        if workspace is None:
            workspace = {b.name: DeviceBuffer.alloc(_nbytes(b), context) for b in p.scratch}
            self._workspaces[key] = workspace
        return workspace

    def _program(self, shapes: list[tuple[int, ...]]) -> tuple[SimtProgram, tuple[dict, ...]]:
        """The program for arguments of `shapes`: itself, or for a shape-polymorphic one `program_at` their
        lengths (made once per lengths, the last 64 kept)."""
        if not self._symbolic:
            return self.simt, tuple({} for _ in self.simt.kernels)
        try:
            values = bind_buffers(self.simt.inputs, shapes)
        except ValueError as err:
            raise ArgumentError(f"arguments of shapes {shapes} for {self.simt.name}: {err}") from None
        key = tuple(sorted(values.items()))
        found = self._at.get(key)
        if found is None:
            if len(self._at) >= 64:
                self._at.clear()
                self._maps.clear()     # (the specs of those programs' kernels: each length's are its own)
            found = self._at[key] = program_at(self.simt, values)
        return found

    def _encoded(self, spec, address: int):
        """`encode` of `spec` at `address`, remembered: calls on the same buffers (a model's weights, a KV
        cache, preallocated inputs) reuse their maps instead of asking the driver again (the last
        `ENCODED_MAPS` kept)."""
        key = (spec, address)
        found = self._maps_at.get(key)
        if found is None:
            if len(self._maps_at) >= ENCODED_MAPS:
                self._maps_at.clear()
            found = self._maps_at[key] = encode(spec, address)
        return found

    def _tensor_maps(self, kernel) -> list:
        """`tensor_map_specs` of `kernel`, derived once (a shape-polymorphic program's kernels at each length
        are kernels of their own, dropped with `_program`'s)."""
        found = self._maps.get(id(kernel))
        if found is None:
            found = self._maps[id(kernel)] = (kernel, tensor_map_specs(kernel))
        return found[1]

    def close(self) -> None:
        """Free the scratch buffers kept between calls (the next call allocates them again)."""
        workspaces, self._workspaces = self._workspaces, {}
        for workspace in workspaces.values():
            for buffer in workspace.values():
                buffer.free()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown or a driver already gone: nothing left to free
            pass

    def _launch(self, p: SimtProgram, sizes: tuple[dict, ...], context, pointers: dict, stream) -> None:
        for kernel, scalars, function in zip(p.kernels, sizes, self._kernels(context)):
            args = [pointers[q.name] if isinstance(q, Buffer) else scalars[q.name] for q in kernel.params]
            # a TMA source's tensor map, after the kernel's own parameters (`tensor_map_sources`' order)
            args += [self._encoded(spec, pointers[spec.buffer].ptr) for spec in self._tensor_maps(kernel)]
            function.launch(grid=kernel.grid, block=(kernel.threads,), args=args, stream=stream,
                            shared_bytes=kernel.shared_bytes if kernel.dynamic_shared else 0)

    def __call__(self, arrays: Sequence[object], stream: object | None = None,
                 outputs: Sequence[object] | None = None) -> tuple:
        """The results for `arrays` (numpy, torch, cupy; see docs/gpu-backend.md, "Arrays and streams"). With
        `outputs` (one array per result, checked by `redfuser.outputs`) the results are written there: a
        device one in place (contiguous, on the arguments' device), a host one copied back."""
        p = self.simt
        if len(arrays) != len(p.inputs):
            raise ArgumentError(f"{p.name} takes {len(p.inputs)} array(s), got {len(arrays)}")
        infos = [(f"argument {b.name!r}", arrays_rt.describe(a, f"argument {b.name!r}"))
                 for b, a in zip(p.inputs, arrays)]
        p, sizes = self._program([tuple(info.shape) for _, info in infos])
        outs = [(f"out {b.name!r}", arrays_rt.describe(o, f"out {b.name!r}"), o)
                for b, o in zip(p.outputs, outputs)] if outputs is not None else None
        with _keeping_current_context():
            if any(info.on_gpu for _, info in infos) or any(info.on_gpu for _, info, _ in outs or ()):
                return self._run_on_device(p, sizes, arrays, infos, stream, outs)
            results = self._run_from_host(p, sizes, arrays, infos, stream)
        if outs is not None:
            for (_, _, o), r in zip(outs, results):
                np.copyto(arrays_rt.host_array(o, "out"), arrays_rt.host_array(r), casting="no")
            return tuple(o for _, _, o in outs)
        return results

    def _run_from_host(self, p: SimtProgram, sizes: tuple[dict, ...], arrays: Sequence[object], infos: list,
                       stream: object | None) -> tuple:
        from .cuda_driver import driver, primary_context
        from .cuda_memory import DeviceBuffer, Stream

        context = primary_context(0)
        handle = 0 if stream is None else stream_handle(stream)
        on = None if stream is None else Stream(driver.CUstream(handle))
        library = next((info.library for _, info in infos if info.library != "numpy"), "numpy")
        owned: list[DeviceBuffer] = []
        try:
            pointers: dict[str, object] = {}
            for b, a, (name, _) in zip(p.inputs, arrays, infos):
                host = _host_memory(a, b, name)
                owned.append(DeviceBuffer.alloc(host.nbytes, context))
                owned[-1].copy_from(host)
                pointers[b.name] = owned[-1]
            for b in p.outputs:
                owned.append(DeviceBuffer.alloc(_nbytes(b), context))
                pointers[b.name] = owned[-1]
            pointers.update(self._scratch(p, context, handle))
            self._launch(p, sizes, context, pointers, on)
            if on is None:
                context.synchronize()
            results = tuple(pointers[b.name].copy_to(np.empty(b.shape, b.dtype.numpy), on) for b in p.outputs)
            return tuple(arrays_rt.as_caller_type(r, library) for r in results)
        finally:
            for buffer in owned:
                buffer.free()

    def _run_on_device(self, p: SimtProgram, sizes: tuple[dict, ...], arrays: Sequence[object], infos: list,
                       stream: object | None, outs: list | None = None) -> tuple:
        from .cuda_driver import driver, primary_context
        from .cuda_memory import DeviceBuffer, Stream

        on_gpu = [(name, info) for name, info in infos if info.on_gpu]
        on_gpu += [(name, info) for name, info, _ in outs or () if info.on_gpu]
        device = _common_device(on_gpu)
        library = on_gpu[0][1].library
        context = primary_context(device)
        given = None if stream is None else stream_handle(stream)
        library_stream = _library_stream(library, stream, given, device)
        handle = given if given is not None else (
            _library_handle(library, library_stream) if library_stream is not None else 0)
        on = Stream(driver.CUstream(handle))
        owned: list[DeviceBuffer] = []        # RedFuser's temporaries: freed after the stream has finished
        outputs: list[object] = []
        launched = False
        try:
            pointers: dict[str, object] = {}
            with _using(library, library_stream):
                for b, a, (name, info) in zip(p.inputs, arrays, infos):
                    strides = arrays_rt.specialized_strides(info)
                    if (info.dtype, tuple(info.shape), strides) != (b.dtype, tuple(b.shape), b.type.strides):
                        raise ArgumentError(f"{name} is {BufferType(info.dtype, info.shape, strides)}; the kernel "
                                            f"was compiled for {b.type}")
                    if not info.on_gpu:
                        host = _host_memory(a, b, name)
                        owned.append(DeviceBuffer.alloc(host.nbytes, context))
                        owned[-1].copy_from(host)     # synchronous: complete before the kernels start
                        pointers[b.name] = owned[-1]
                        continue
                    lowest = _lowest_address(info, b)
                    if lowest % VECTOR_ALIGNMENT:     # e.g. x[1:] of a 1-d tensor: copy what it spans
                        owned.append(DeviceBuffer.alloc(_nbytes(b), context))
                        owned[-1].copy_from_device(lowest, _nbytes(b), on)
                        pointers[b.name] = owned[-1]
                        continue
                    pointers[b.name] = _Pointer(lowest)
                for i, b in enumerate(p.outputs):
                    if outs is not None:
                        name, out_info, out = outs[i]
                        if out_info.on_gpu and not out_info.contiguous:
                            raise ArgumentError(f"{name} is a strided view of device memory; the kernel writes "
                                                "contiguous results (pass a contiguous tensor)")
                    else:
                        out = arrays_rt.new_like(library, b.shape, b.dtype, device, on_gpu=True)
                        out_info = arrays_rt.describe(out, f"output {b.name!r}")
                    if out_info.on_gpu and out_info.contiguous and out_info.dtype == b.dtype:
                        pointers[b.name] = _Pointer(out_info.pointer)
                    else:                             # a library RedFuser cannot allocate in: numpy comes back
                        owned.append(DeviceBuffer.alloc(_nbytes(b), context))
                        pointers[b.name] = owned[-1]
                        out = None
                    outputs.append(out)
            pointers.update(self._scratch(p, context, handle))
            launched = True
            self._launch(p, sizes, context, pointers, on)
            if not owned:
                return tuple(outputs)         # asynchronous, ordered on the stream like the library's own ops
            on.synchronize()
            if outs is not None:              # host outs (and only those) have a buffer of RedFuser's
                for b, (_, _, given), out in zip(p.outputs, outs, outputs):
                    if out is None:
                        result = pointers[b.name].copy_to(np.empty(b.shape, b.dtype.numpy))
                        np.copyto(arrays_rt.host_array(given, "out"), result, casting="no")
                return tuple(given for _, _, given in outs)
            return tuple(out if out is not None else pointers[b.name].copy_to(np.empty(b.shape, b.dtype.numpy))
                         for b, out in zip(p.outputs, outputs))
        finally:
            if owned and launched:
                with contextlib.suppress(BackendError):
                    on.synchronize()          # never free memory a queued kernel may still read
            for buffer in owned:
                buffer.free()
