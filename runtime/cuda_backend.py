"""The ``cuda`` backend's executable: load the PTX, copy numpy arrays in, launch every kernel, copy results out.

`compile_ptx(simt_program)` gives the program's LLVM IR and PTX (no GPU needed)
with each kernel's PTX served by the compile cache (keyed by the LLVM IR text,
the target and the versions). `CudaProgram` runs it on device 0: modules are
loaded once per context (`cuda_driver.load_module` caches them), inputs are
copied to fresh device buffers, outputs and scratch are allocated, the kernels
launch in order on the default stream with ``grid`` blocks of ``warps * 32``
threads, and the outputs come back as numpy arrays. Device arrays in and out
(DLPack, ``__cuda_array_interface__``) and streams are the runtime issue's.
"""
from __future__ import annotations

from typing import Sequence

import llvmlite
import numpy as np

from ..codegen.nvptx import compile_module
from ..codegen.simt import SimtProgram
from ..codegen.simt.ptx import LlvmModules, PtxProgram, program_ptx


def _cached_ptx(text: str, sm: str) -> str:
    from .cache import CacheKey, default_cache

    key = CacheKey.build(artifact="ptx", stage=text, options={}, target=sm)
    fetched = default_cache().fetch(key, lambda: compile_module(text, sm).ptx.encode(),
                                    {"llvmlite": llvmlite.__version__})
    return fetched.payload.decode()


def compile_ptx(program: SimtProgram) -> tuple[LlvmModules, PtxProgram]:
    """``(llvm, ptx)`` stages of `program` (see the module docstring)."""
    ptx = program_ptx(program, _cached_ptx)
    return ptx.llvm(), ptx


class CudaProgram:
    """A compiled program on device 0; call it with numpy arrays (one per input), get the outputs."""

    def __init__(self, simt: SimtProgram, ptx: PtxProgram) -> None:
        self.simt, self.ptx = simt, ptx
        self._functions: list | None = None

    def _kernels(self) -> list:
        from .cuda_driver import load_module

        if self._functions is None:
            self._functions = [load_module(k.ptx).function(k.entry) for k in self.ptx.kernels]
        return self._functions

    def __call__(self, arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        from .cuda_driver import primary_context
        from .cuda_memory import DeviceBuffer

        context = primary_context()
        p = self.simt
        buffers: dict[str, DeviceBuffer] = {}
        try:
            for b, a in zip(p.inputs, arrays):
                buffers[b.name] = DeviceBuffer.from_numpy(np.ascontiguousarray(np.asarray(a), dtype=b.dtype.numpy),
                                                          context)
            for b in p.outputs + p.scratch:
                buffers[b.name] = DeviceBuffer.alloc(b.type.size * b.dtype.itemsize, context)
            for kernel, function in zip(p.kernels, self._kernels()):
                function.launch(grid=kernel.grid, block=(kernel.threads,),
                                args=[buffers[buf.name] for buf in kernel.buffers])
            context.synchronize()
            return tuple(buffers[b.name].to_numpy(b.shape, b.dtype.numpy) for b in p.outputs)
        finally:
            for buffer in buffers.values():
                buffer.free()
