"""A `SimtProgram` through LLVM (nvptx64) to PTX, one module per kernel; kept for ``stages["llvm"]``/``["ptx"]``.

`program_ptx(p, ptx_of)` turns each kernel into its verified LLVM module's text
(`codegen.simt_to_llvm.emit_text`) and PTX with `ptx_of` (default: `kernel_ptx`,
emission then `codegen.nvptx.compile_module`; the runtime passes one served by
the compile cache, which skips both on a hit). Nothing here needs a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...ir.errors import InternalError
from ..nvptx import compile_module, entry_names
from ..timing import timed_part
from ..simt_to_llvm import emit_text
from ...ir.simt import SimtKernel
from .kernel import SimtProgram


@dataclass(frozen=True)
class KernelPtx:
    """One kernel's LLVM IR (as emitted, verified) and PTX; `entry` is its ``.entry`` name in the PTX."""

    name: str
    entry: str
    llvm_ir: str
    ptx: str


@dataclass(frozen=True)
class PtxProgram:
    """The PTX of every kernel of a program, for one `sm`, in launch order."""

    sm: str
    kernels: tuple[KernelPtx, ...]

    def __str__(self) -> str:
        return "\n".join(f"// ===== kernel {k.name} ({self.sm}) =====\n{k.ptx}" for k in self.kernels)

    def llvm(self) -> LlvmModules:
        return LlvmModules(self.kernels)


@dataclass(frozen=True)
class LlvmModules:
    """The LLVM IR of every kernel (printable stage)."""

    kernels: tuple[KernelPtx, ...]

    def __str__(self) -> str:
        return "\n".join(f"; ===== kernel {k.name} =====\n{k.llvm_ir}" for k in self.kernels)


def kernel_ptx(kernel: SimtKernel, sm: str, opt_level: int | None = None,
               parts: dict[str, float] | None = None) -> tuple[str, str]:
    """``(llvm_ir, ptx)`` of one kernel: its emitted (LLVM-verified) module's text, compiled for `sm` with
    the middle end `opt_level` picks (`codegen.nvptx.compile_module`; a kernel `lower_to_simt` made is not
    checked twice: the SIMT verifier remembers what passed). With `parts`, adds the seconds of each half
    to ``parts["llvm ir"]`` (the emission, with LLVM's parse and verifier) and ``parts["llvm -> ptx"]``
    (LLVM's middle end and code generation)."""
    with timed_part(parts, "llvm ir"):
        text = emit_text(kernel)
    with timed_part(parts, "llvm -> ptx"):
        ptx = compile_module(text, sm, opt_level=opt_level).ptx
    return text, ptx


def program_ptx(p: SimtProgram, ptx_of: Callable[[SimtKernel, str], tuple[str, str]] | None = None) -> PtxProgram:
    """Every kernel of `p` as LLVM IR and PTX for ``p.sm``; `ptx_of(kernel, sm)` gives ``(llvm_ir, ptx)``."""
    compile_kernel = ptx_of or kernel_ptx
    kernels = []
    for k in p.kernels:
        text, ptx = compile_kernel(k, p.sm)
        entries = entry_names(ptx)
        if len(entries) != 1:
            raise InternalError(f"kernel {k.name}: PTX with entries {entries}", pass_name="nvptx")
        kernels.append(KernelPtx(k.name, entries[0], text, ptx))
    return PtxProgram(p.sm, tuple(kernels))
