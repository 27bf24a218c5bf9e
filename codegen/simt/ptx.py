"""A `SimtProgram` through LLVM (nvptx64) to PTX, one module per kernel: the GPU backends' ``llvm`` and ``ptx``
stages (kept as ``stages["llvm"]`` and ``stages["ptx"]``).

`emit_llvm(p, lookup)` (the ``llvm`` stage) turns each kernel into its verified
LLVM module's text (`codegen.simt_to_llvm.emit_parsed`), unless `lookup` (the
runtime's compile cache) has the kernel's LLVM IR and PTX already, which skips
the emission here and the compile in the next stage. `compile_ptx(llvm, pending,
opt_level, store)` (the ``ptx`` stage) compiles the modules that were emitted
(`codegen.nvptx.compile_module`, from the parse the emission's check made) and
hands their PTX to `store`; the ones the cache served keep their PTX. Nothing
here needs a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from llvmlite import binding as llvm

from ...ir.errors import InternalError
from ..nvptx import compile_module, entry_names
from ..timing import timed_part
from ..simt_to_llvm import emit_parsed
from ...ir.simt.nodes import SimtKernel
from .kernel import SimtProgram


@dataclass(frozen=True)
class KernelLlvm:
    """One kernel's LLVM IR, as emitted and verified."""

    name: str
    llvm_ir: str


@dataclass(frozen=True)
class LlvmModules:
    """The LLVM IR of every kernel of a program, for one `sm`, in launch order (the ``llvm`` stage)."""

    sm: str
    kernels: tuple[KernelLlvm, ...]

    def __str__(self) -> str:
        return "\n".join(f"; ===== kernel {k.name} =====\n{k.llvm_ir}" for k in self.kernels)


@dataclass(frozen=True)
class KernelPtx:
    """One kernel's LLVM IR (as emitted, verified) and PTX; `entry` is its ``.entry`` name in the PTX."""

    name: str
    entry: str
    llvm_ir: str
    ptx: str


@dataclass(frozen=True)
class PtxProgram:
    """The PTX of every kernel of a program, for one `sm`, in launch order (the ``ptx`` stage)."""

    sm: str
    kernels: tuple[KernelPtx, ...]

    def __str__(self) -> str:
        return "\n".join(f"// ===== kernel {k.name} ({self.sm}) =====\n{k.ptx}" for k in self.kernels)


@dataclass(frozen=True, eq=False)
class PendingPtx:
    """How one kernel's PTX is to be had, from the ``llvm`` stage to the ``ptx`` stage (not kept: it holds
    LLVM's module): the PTX the cache served with the LLVM IR (`ptx`), or LLVM's parse of the emitted text
    (`parsed`, made by the emission's check; the compile changes it in place) and the cache's `handle` to
    store the PTX under."""

    ptx: str | None = None
    parsed: llvm.ModuleRef | None = None
    handle: object = None


Lookup = Callable[[SimtKernel, str, "int | None"], "tuple[object, tuple[str, str] | None]"]
"""``lookup(kernel, sm, opt_level)``: a cache's handle for `kernel`'s entry, and the entry's ``(llvm_ir, ptx)``
when it is stored already (None: a miss)."""

Store = Callable[[object, str, Callable[[], str]], str]
"""``store(handle, llvm_ir, compile)``: the PTX of an entry `Lookup` missed: ``compile()``'s, stored under
`handle` with `llvm_ir` (or the one another process stored there meanwhile)."""


def emit_llvm(p: SimtProgram, opt_level: int | None = None,
              lookup: Lookup | None = None) -> tuple[LlvmModules, tuple[PendingPtx, ...]]:
    """The ``llvm`` stage of `p`, a program `lower_to_simt` made and verified (so the SIMT verifier does not
    run again), and what the ``ptx`` stage needs beyond its text. `lookup` (default: none) may serve a
    kernel's LLVM IR with its PTX for `opt_level`, the ``llvm_opt`` option that PTX was compiled with. The
    seconds of the emission go to the parts being recorded (`codegen.timing`) as ``llvm ir`` (the emission,
    with LLVM's parse and verifier)."""
    kernels, pending = [], []
    for k in p.kernels:
        handle, served = lookup(k, p.sm, opt_level) if lookup is not None else (None, None)
        if served is not None:
            kernels.append(KernelLlvm(k.name, served[0]))
            pending.append(PendingPtx(ptx=served[1]))
            continue
        with timed_part("llvm ir"):
            text, parsed = emit_parsed(k, verify=False)
        kernels.append(KernelLlvm(k.name, text))
        pending.append(PendingPtx(parsed=parsed, handle=handle))
    return LlvmModules(p.sm, tuple(kernels)), tuple(pending)


def compile_ptx(modules: LlvmModules, pending: tuple[PendingPtx, ...], opt_level: int | None = None,
                store: Store | None = None) -> PtxProgram:
    """The ``ptx`` stage: every kernel of `modules` (with `pending`, as `emit_llvm` made them) as PTX for
    ``modules.sm``. A module the cache did not serve is compiled with the middle end `opt_level` picks (the
    ``llvm_opt`` kernel option: None runs RedFuser's, `codegen.nvptx.GPU_PASSES`; 1-3 LLVM's O1-O3) and
    handed to `store` (default: none). The seconds of LLVM's middle end and code generation go to the
    parts being recorded as ``llvm -> ptx``."""
    kernels = []
    for k, todo in zip(modules.kernels, pending, strict=True):
        ptx = todo.ptx
        if ptx is None:
            def compile_kernel(k: KernelLlvm = k, parsed: llvm.ModuleRef | None = todo.parsed) -> str:
                with timed_part("llvm -> ptx"):
                    return compile_module(k.llvm_ir, modules.sm, opt_level=opt_level, parsed=parsed).ptx
            ptx = compile_kernel() if store is None else store(todo.handle, k.llvm_ir, compile_kernel)
        entries = entry_names(ptx)
        if len(entries) != 1:
            raise InternalError(f"kernel {k.name}: PTX with entries {entries}", pass_name="nvptx")
        kernels.append(KernelPtx(k.name, entries[0], k.llvm_ir, ptx))
    return PtxProgram(modules.sm, tuple(kernels))
