"""The SIMT simulator (the ``simulate`` backend): runs the very SIMT program that becomes PTX on numpy.

Lock-step over the threads of a block (registers are numpy arrays with one row
per thread), block by block over the grid. It emulates barriers, warp shuffles
and the mma fragment layouts exactly as the PTX ISA defines them, poisons shared
memory with NaN, and raises `SimulationError` on out-of-bounds and misaligned
accesses, shared/global races within a barrier interval (a missing barrier),
reads of uninitialized shared memory, and barriers or warp-collective ops
under divergent control flow.
"""
from .machine import RULES, simulate
from .state import SimOptions

__all__ = ["simulate", "SimOptions", "RULES"]
