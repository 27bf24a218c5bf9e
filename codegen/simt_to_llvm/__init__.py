"""SIMT IR -> LLVM IR for ``nvptx64-nvidia-cuda`` -> PTX (ARCHITECTURE.md sections 3 and 6).

`emit_module(kernel)` builds a verified module (`codegen.llvm_text`: llvmlite's builder interface,
printed straight to LLVM IR text) with one ``ptx_kernel``
from a `SimtKernel` (an environment walker with one rule per statement type, over
the `codegen.nvvm`/`codegen.nvvm_mma` helpers and the dtype layer `codegen.llvm_dtypes`,
target `NVPTX`); `compile_simt(kernel, sm)` goes on
to PTX through `codegen.nvptx.compile_module`. Nothing here needs a GPU.
"""
from .emitter import LlvmOptions
from .kernel import RULES, compile_simt, emit_module, emit_parsed, emit_text

__all__ = ["emit_module", "emit_parsed", "emit_text", "compile_simt", "LlvmOptions", "RULES"]
