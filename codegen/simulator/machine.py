"""`simulate`: run a `SimtKernel` on numpy arrays, block after block, threads lock-step.

Arguments bind to the kernel's params in order (or by name): a numpy array of
the buffer's size for each global buffer (copied, never modified), a Python or
numpy scalar for each scalar param. The result maps every buffer name to its
contents after the launch, in the buffer's shape.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ...ir.errors import BackendError, SimulationError
from ...ir.buffer import Buffer
from ...ir.simt.nodes import SimtKernel
from ...ir.simt.verifier import verify_simt_kernel
from . import arith, control, memory, tma, warp, wgmma
from .state import Block, Launch, SimOptions

RULES = {**arith.RULES, **memory.RULES, **warp.RULES, **wgmma.RULES, **tma.RULES, **control.RULES}


def _bind(kernel: SimtKernel, args: Sequence[object] | Mapping[str, object]) -> dict[str, object]:
    names = [p.name for p in kernel.params]
    if isinstance(args, Mapping):
        missing = [n for n in names if n not in args]
        extra = [n for n in args if n not in names]
        if missing or extra:
            raise SimulationError("argument", f"missing {missing}, unknown {extra}", kernel=kernel.name)
        return dict(args)
    if len(args) != len(names):
        raise SimulationError("argument", f"{len(args)} arguments for params {names}", kernel=kernel.name)
    return dict(zip(names, args))


SPAN_LIMIT_BYTES = 1 << 31
"""The most memory one buffer may span: the simulator copies a strided view's whole span (a 4-element view
``m[::2**31]`` of a memory map spans 24 GiB; copying it ended in a bare `MemoryError`)."""


def _buffer(p: Buffer, value: object, kernel: str) -> np.ndarray:
    if p.type.span * p.dtype.numpy.itemsize > SPAN_LIMIT_BYTES:
        raise BackendError(f"simulate: {p.name} spans {p.type.span * p.dtype.numpy.itemsize / 2**30:.1f} GiB of "
                           f"memory ({p.type}); the simulator copies the memory a buffer spans, at most "
                           f"{SPAN_LIMIT_BYTES >> 30} GiB: run it on cpu, or pass a compact copy")
    arr = np.array(value, dtype=p.dtype.numpy, copy=True).reshape(-1)
    if arr.size != p.type.span:   # a strided view's memory: its span (its size when dense)
        raise SimulationError("argument", f"{p.name} wants {p.type.span} elements ({p.type}), got {arr.size}",
                              kernel=kernel)
    return arr


def simulate(kernel: SimtKernel, args: Sequence[object] | Mapping[str, object], *,
             options: SimOptions = SimOptions(), verify: bool = True) -> dict[str, np.ndarray]:
    """Run `kernel` over its whole grid; return every global buffer's final contents by name.

    Raises `SimulationError` on an out-of-bounds or misaligned access, a race on
    shared or global memory, a read of uninitialized shared memory, a barrier or
    warp-collective op under divergent control flow (see `SimOptions`).
    """
    if verify:
        verify_simt_kernel(kernel, "simulate")
    bound = _bind(kernel, args)
    globals_ = {p.name: _buffer(p, bound[p.name], kernel.name) for p in kernel.buffers}
    launch = Launch(kernel, globals_, options)
    scalars = {p.name: np.asarray(bound[p.name]).astype(p.dtype.numpy) for p in kernel.scalars}
    with np.errstate(all="ignore"):
        for linear in range(kernel.num_blocks):
            block = Block(launch, linear, RULES)
            for p in kernel.scalars:
                block.set(p, scalars[p.name])
            block.run(kernel.body)
    # a strided input comes back as the flat memory it was passed as (ir/array_memory.py)
    return {p.name: globals_[p.name].reshape(p.shape) if p.type.strides is None else globals_[p.name]
            for p in kernel.buffers}
