"""`simulate_program`: run a `SimtProgram` on numpy arrays with the SIMT simulator (the ``simulate`` backend).

Kernels run in order over one set of global buffers: inputs copied in,
outputs and scratch poisoned (NaN for floats) so a value nobody wrote shows. The
simulator checks bounds, alignment, races and divergence as it goes
(`codegen.simulator.SimOptions`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from ...ir.array_memory import memory_of
from ...ir.buffer import Buffer
from ...ir.simt.nodes import SimtKernel
from ...ir.types import BufferType
from ...ir.sizes import bind_buffers, concrete, evaluate
from ..simulator import SimOptions, simulate
from .kernel import SimtProgram


def _poison(buffer) -> np.ndarray:
    dtype = buffer.dtype
    fill = np.nan if dtype.is_float else 0
    return np.full(buffer.type.size, fill).astype(dtype.numpy)


def at_lengths(k: SimtKernel, values: dict[str, int]) -> tuple[SimtKernel, dict[str, np.ndarray]]:
    """A shape-polymorphic kernel for one launch: its grid and its buffers' shapes evaluated, and its size
    parameters' values (`SimtKernel.sizes`) by register name."""
    if not values:
        return k, {}
    scalars = {p.name: p for p in k.scalars}
    bound = {name: scalars[name].dtype.numpy.type(evaluate(size, values)) for name, size in k.sizes}
    params = tuple(_at(p, values) if isinstance(p, Buffer) else p for p in k.params)
    return replace(k, grid=tuple(evaluate(g, values) for g in k.grid), params=params), bound


def _at(b: Buffer, values: dict[str, int]) -> Buffer:
    return Buffer(b.name, BufferType(b.dtype, concrete(b.shape, values), b.type.strides)) if values else b


def program_at(p: SimtProgram, values: dict[str, int]) -> tuple[SimtProgram, tuple[dict, ...]]:
    """A shape-polymorphic program for one call (`values`: each symbol's length): its buffers' shapes and its
    kernels' grids evaluated (`at_lengths`), with each kernel's size parameters' values, in launch order;
    `p` itself and no parameters for a program of static shapes."""
    if not values:
        return p, tuple({} for _ in p.kernels)
    launches = [at_lengths(k, values) for k in p.kernels]
    made = replace(p, inputs=tuple(_at(b, values) for b in p.inputs), outputs=tuple(_at(b, values) for b in p.outputs),
                   scratch=tuple(_at(b, values) for b in p.scratch), kernels=tuple(k for k, _ in launches))
    return made, tuple(sizes for _, sizes in launches)


def simulate_program(p: SimtProgram, arrays: Sequence[np.ndarray], options: SimOptions = SimOptions()
                     ) -> tuple[np.ndarray, ...]:
    """`p`'s outputs for `arrays` (one per input, in order), computed by the simulator; a shape-polymorphic
    program's run-time extents come from the inputs' shapes."""
    p, sizes = program_at(p, bind_buffers(p.inputs, arrays))
    buffers: dict[str, np.ndarray] = {}
    for b, a in zip(p.inputs, arrays):
        buffers[b.name] = memory_of(a, b.type)   # a view's own memory (ir/array_memory.py)
    for b in p.outputs + p.scratch:
        buffers[b.name] = _poison(b)
    for k, scalars in zip(p.kernels, sizes):
        done = simulate(k, {buf.name: buffers[buf.name] for buf in k.buffers} | scalars, options=options,
                        verify=False)
        buffers.update({name: array.reshape(-1) for name, array in done.items()})
    return tuple(buffers[b.name].reshape(b.shape).copy() for b in p.outputs)
