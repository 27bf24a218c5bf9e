"""A `SimtProgram` through LLVM (nvptx64) to PTX, one module per kernel; kept for ``stages["llvm"]``/``["ptx"]``.

`compile_ptx(p, opt_level, ptx_of)` (the GPU backends' ``ptx`` stage) turns each
kernel into its verified LLVM module's text (`codegen.simt_to_llvm.emit_parsed`)
and PTX with `ptx_of` (default: `kernel_ptx`, emission then
`codegen.nvptx.compile_module`; the backend table passes one served by the
runtime's compile cache, which skips both on a hit). Nothing here needs a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...ir.errors import InternalError
from ..nvptx import compile_module, entry_names
from ..timing import timed_part
from ..simt_to_llvm import emit_parsed
from ...ir.simt.nodes import SimtKernel
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


KernelPtxOf = Callable[[SimtKernel, str, "int | None"], tuple[str, str]]
"""``ptx_of(kernel, sm, opt_level)``: ``(llvm_ir, ptx)`` of one kernel (`kernel_ptx`, or one through a cache)."""


def kernel_ptx(kernel: SimtKernel, sm: str, opt_level: int | None = None, *, verified: bool = False) -> tuple[str, str]:
    """``(llvm_ir, ptx)`` of one kernel: its emitted (LLVM-verified) module's text, compiled for `sm` with
    the middle end `opt_level` picks (`codegen.nvptx.compile_module`, from the parse the emission's check
    made). `verified`: the kernel comes from a stage that verified it (`lower_to_simt`), so the SIMT
    verifier does not run again. The seconds of each half go to the parts being recorded
    (`codegen.timing`): ``llvm ir`` (the emission, with LLVM's parse and verifier) and ``llvm -> ptx``
    (LLVM's middle end and code generation)."""
    with timed_part("llvm ir"):
        text, parsed = emit_parsed(kernel, verify=not verified)
    with timed_part("llvm -> ptx"):
        ptx = compile_module(text, sm, opt_level=opt_level, parsed=parsed).ptx
    return text, ptx


def compile_ptx(p: SimtProgram, opt_level: int | None = None,
                ptx_of: KernelPtxOf | None = None) -> tuple[LlvmModules, PtxProgram]:
    """The ``(llvm, ptx)`` stages of `p`, a program `lower_to_simt` made and verified; `opt_level` is the
    ``llvm_opt`` kernel option (None: RedFuser's middle end, `codegen.nvptx.GPU_PASSES`; 1-3: LLVM's
    O1-O3); `ptx_of` as for `program_ptx` (default: `kernel_ptx` of a verified kernel)."""
    ptx = program_ptx(p, lambda k, sm: (ptx_of or _verified_kernel_ptx)(k, sm, opt_level))
    return ptx.llvm(), ptx


def _verified_kernel_ptx(kernel: SimtKernel, sm: str, opt_level: int | None) -> tuple[str, str]:
    return kernel_ptx(kernel, sm, opt_level, verified=True)


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
