"""Tile IR -> SIMT IR: layouts, layout conversions, reductions, tensor cores (ARCHITECTURE.md section 6).

`lower_to_simt(tile_program, GpuOptions(sm=..., num_warps=...))` gives a
`SimtProgram`: one verified `SimtKernel` per Tile IR kernel, the very program
the simulator runs (``backend="simulate"``) and `codegen.simt_to_llvm` compiles
to PTX (``backend="cuda"``). One rule per Tile IR op, in tables (`context.py`);
layouts in `layouts.py`; see `docs/gpu-backend.md` for the design.
"""
from .kernel import SimtProgram, lower_kernel, lower_to_simt
from .narrow import narrow_dot_operands
from .options import GpuOptions

__all__ = ["GpuOptions", "SimtProgram", "lower_kernel", "lower_to_simt", "narrow_dot_operands"]
