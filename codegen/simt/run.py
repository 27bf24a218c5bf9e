"""`simulate_program`: run a `SimtProgram` on numpy arrays with the SIMT simulator (the ``simulate`` backend).

Kernels run in order over one set of global buffers: inputs copied in,
outputs and scratch poisoned (NaN for floats) so a value nobody wrote shows. The
simulator checks bounds, alignment, races and divergence as it goes
(`codegen.simulator.SimOptions`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ...ir.array_memory import memory_of
from ..simulator import SimOptions, simulate
from .kernel import SimtProgram


def _poison(buffer) -> np.ndarray:
    dtype = buffer.dtype
    fill = np.nan if dtype.is_float else 0
    return np.full(buffer.type.size, fill).astype(dtype.numpy)


def simulate_program(p: SimtProgram, arrays: Sequence[np.ndarray], options: SimOptions = SimOptions()
                     ) -> tuple[np.ndarray, ...]:
    """`p`'s outputs for `arrays` (one per input, in order), computed by the simulator."""
    buffers: dict[str, np.ndarray] = {}
    for b, a in zip(p.inputs, arrays):
        buffers[b.name] = memory_of(a, b.type)   # a view's own memory (ir/array_memory.py)
    for b in p.outputs + p.scratch:
        buffers[b.name] = _poison(b)
    for k in p.kernels:
        done = simulate(k, {buf.name: buffers[buf.name] for buf in k.buffers}, options=options, verify=False)
        buffers.update({name: array.reshape(-1) for name, array in done.items()})
    return tuple(buffers[b.name].reshape(b.shape).copy() for b in p.outputs)
