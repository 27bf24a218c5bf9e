"""Host (CPU) code generation: Tile IR -> LLVM IR built with llvmlite.

`build_host_module(tile_program)` gives a verified `llvmlite.ir.Module` with one
function per kernel plus each kernel's calling convention (`KernelABI`). One rule
per Tile IR op: inline elementwise rules in `rules.py`, loop-owning ops in
`stmts.py` (both tables handed to the `KernelEmitter` of `emitter.py` by
`module.py`), what is kept in memory in `plan.py`, f32 exp/log in `mathlib.py`;
dtypes' LLVM types and casts come from `codegen.llvm_dtypes` (`HOST`).
"""
from .module import KernelABI, build_host_module

__all__ = ["KernelABI", "build_host_module"]
