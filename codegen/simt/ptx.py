"""A `SimtProgram` through LLVM (nvptx64) to PTX, one module per kernel; kept for ``stages["llvm"]``/``["ptx"]``.

`program_ptx(p, ptx_of)` emits each kernel's verified LLVM module
(`codegen.simt_to_llvm.emit_text`) and turns its text into PTX with `ptx_of`
(default: `codegen.nvptx.compile_module`; the runtime passes a cached one).
Nothing here needs a GPU.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from ...ir.errors import InternalError
from ..nvptx import compile_module
from ..simt_to_llvm import emit_text
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


def _compile(text: str, sm: str) -> str:
    return compile_module(text, sm).ptx


def program_ptx(p: SimtProgram, ptx_of: Callable[[str, str], str] | None = None) -> PtxProgram:
    """Every kernel of `p` as LLVM IR and PTX for ``p.sm``."""
    compile_text = ptx_of or _compile
    kernels = []
    for k in p.kernels:
        text = emit_text(k)
        ptx = compile_text(text, p.sm)
        entries = re.findall(r"^(?:\.(?:visible|weak)\s+)?\.entry\s+([\w$]+)", ptx, flags=re.MULTILINE)
        if len(entries) != 1:
            raise InternalError(f"kernel {k.name}: PTX with entries {entries}", pass_name="nvptx")
        kernels.append(KernelPtx(k.name, entries[0], text, ptx))
    return PtxProgram(p.sm, tuple(kernels))
