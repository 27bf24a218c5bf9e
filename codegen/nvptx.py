"""LLVM module -> PTX through llvmlite's NVPTX backend (LLVM 22 in llvmlite 0.50). Needs no GPU.

    module = new_module("attention")          # triple nvptx64-nvidia-cuda + its data layout
    ... build kernels with codegen.nvvm / codegen.nvvm_mma ...
    ptx = compile_to_ptx(module, "sm_90")     # parse, verify, check targets, O3, emit

The target machine is ``nvptx64-nvidia-cuda`` with CPU ``sm_XX`` and feature
``+ptxNN`` (the PTX ISA version; LLVM ignores unknown ones with a warning and
*aborts the process* on a version too old for the sm, so both are checked
against `SM_MIN_PTX`/`PTX_VERSIONS` here first). Kernels are functions with the
``ptx_kernel`` calling convention. The middle end is a short pipeline of our own
(`GPU_PASSES`; LLVM's O1/O3 on request), with two searches turned off
(`GPU_PIPELINE_OPTIONS`); code generation is always O3.
"""
from __future__ import annotations

import functools
import os
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir

from ..ir.errors import BackendError, InternalError
from .nvvm import INTRINSIC_REQUIREMENTS

TRIPLE = "nvptx64-nvidia-cuda"

# Minimum PTX ISA version (x10) for each sm LLVM 22 and CUDA 13 both know (PTX ISA "Target ISA notes").
SM_MIN_PTX: dict[str, int] = {
    "sm_75": 63, "sm_80": 70, "sm_86": 71, "sm_87": 74, "sm_89": 78, "sm_90": 78, "sm_90a": 80,
    "sm_100": 86, "sm_100a": 86, "sm_120": 87, "sm_120a": 87,
}
# PTX ISA versions LLVM 22 accepts as ``+ptxNN`` features.
PTX_VERSIONS = frozenset({63, 64, 65, 70, 71, 72, 73, 74, 75, 76, 77, 78, 80, 81, 82, 83, 84, 85, 86, 87, 88, 90})
# Default ISA floor: 8.4 (CUDA 12.4 drivers, R550+, which every Hopper H200 driver is) is the first with
# FP8 mma.sync m16n8k32, so one default serves f16, bf16 and fp8 kernels.
DEFAULT_PTX_FLOOR = 84


GPU_PASSES: tuple[str, ...] = (
    "post_order_function_attributes", "instruction_combine", "simplify_cfg", "aggressive_dce")
"""The middle end a GPU module gets by default (``compile_module(..., opt_level=None)``): llvmlite's
pass-manager methods ``add_<name>_pass``, in order. SIMT IR arrives scheduled -- tiles, loops, hoisted
loads and vector widths chosen, values loaded once -- and the code generator (O3) runs its own CSE,
GVN, strength reduction, load/store vectorizing and machine LICM, then ptxas optimizes again. What the
middle end still adds: the function attributes that mark a never-stored ``noalias`` buffer
``readonly`` (so its loads become ``ld.global.nc``), and InstCombine's folding of the emitter's
plumbing (vector packs and extracts, index arithmetic, masks), without which code generation is slower
and registers go up. It costs a fraction of LLVM's O1 for about the same code (docs/gpu-backend.md,
"Why these defaults"). What O1's other passes found for us, the emitter and scheduler now state: the
alignment of shared accesses (``ld.shared.v4``, `simt_to_llvm.memory`) and a split loop's bounds
(`schedule.split`: no masks when the axis is whole chunks). ``opt_level=1`` to ``3`` (the ``llvm_opt``
kernel option) runs LLVM's O1-O3 module pipeline instead; `benchmarks/gpu_check.py` times both on a device."""

# LLVM command-line options in force while a GPU module is optimized and emitted, LLVM's defaults restored
# after (they are process-wide: the CPU backend, or numba in the same process, keep theirs). Each only
# stops a search that finds nothing in SIMT IR; the corpus and benchmark kernels' PTX is byte-identical:
# - LICM's scalar promotion looks for memory a loop could keep in a register; SIMT IR carries its loop
#   state in registers already, yet the MemorySSA walk over an attention loop's ~150 shared-memory
#   accesses was 60% of the O3 pipeline;
# - the code generator's two GVN runs looked for redundant loads through memory dependence; the SIMT
#   lowering loads each value once, and the search was half of a causal attention kernel's code generation.
# One changes the code: the code generator's loop strength reduction rewrites a loop's address arithmetic
#   into pointer increments. The SIMT lowering already hoists what a loop does not change, and ptxas
#   strength-reduces again; without it code generation is faster, SASS the same within 1% and the "bf16"
#   attention kernel stops spilling (measurements: docs/gpu-backend.md, "Why these defaults").
GPU_PIPELINE_OPTIONS: dict[str, tuple[str, str]] = {   # name: (while compiling for the GPU, LLVM's default)
    "licm-mssa-max-acc-promotion": ("0", "250"),
    "enable-gvn-memdep": ("false", "true"),
    "disable-lsr": ("true", "false"),
}
_options_lock = threading.Lock()


@contextmanager
def _gpu_pipeline_options():
    """`GPU_PIPELINE_OPTIONS` in force for the ``with`` body (one GPU compile at a time runs under them)."""
    with _options_lock:
        for name, (value, _) in GPU_PIPELINE_OPTIONS.items():
            llvm.set_option("redfuser", f"-{name}={value}")
        try:
            yield
        finally:
            for name, (_, default) in GPU_PIPELINE_OPTIONS.items():
                llvm.set_option("redfuser", f"-{name}={default}")


def _options_after_fork() -> None:
    """In a child of ``os.fork()`` taken while another thread compiled for the GPU: that compile never ends
    there, so LLVM's defaults are back and the lock is free."""
    global _options_lock
    held = _options_lock.locked()
    _options_lock = threading.Lock()
    if held:
        for name, (_, default) in GPU_PIPELINE_OPTIONS.items():
            llvm.set_option("redfuser", f"-{name}={default}")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_options_after_fork)


@dataclass(frozen=True, slots=True)
class PtxArtifact:
    """One module through the NVPTX backend: every stage's text (the optimized IR only when asked for:
    printing it costs a few milliseconds of every compile)."""

    sm: str
    ptx_version: int
    llvm_ir: str               # the module as given (verified)
    optimized_ir: str | None   # after the middle end, with ``compile_module(..., keep_optimized=True)``
    ptx: str
    kernels: tuple[str, ...]  # the ``.entry`` names, in PTX order


def sm_number(sm: str) -> int:
    """90 for ``sm_90`` / ``sm_90a``; raises `BackendError` on an sm we do not support."""
    if sm not in SM_MIN_PTX:
        raise BackendError(f"unsupported GPU target {sm!r}; choose one of {', '.join(SM_MIN_PTX)}")
    return int(sm[3:].rstrip("a"))


def default_ptx_version(sm: str) -> int:
    """The PTX ISA version (x10) we emit for `sm` unless told otherwise."""
    sm_number(sm)
    return max(SM_MIN_PTX[sm], DEFAULT_PTX_FLOOR)


@functools.cache
def _initialized() -> bool:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return True


@functools.cache
def target_machine(sm: str, ptx_version: int, opt_level: int = 3) -> llvm.TargetMachine:
    """The (cached) NVPTX target machine for `sm` and PTX ISA `ptx_version` (e.g. 84 for 8.4)."""
    sm_number(sm)
    if ptx_version not in PTX_VERSIONS:
        raise BackendError(f"PTX ISA {ptx_version / 10:.1f} is not one LLVM 22 knows; "
                           f"choose one of {', '.join(str(v) for v in sorted(PTX_VERSIONS))}")
    if ptx_version < SM_MIN_PTX[sm]:
        raise BackendError(f"{sm} needs PTX ISA {SM_MIN_PTX[sm] / 10:.1f} or later, asked for {ptx_version / 10:.1f}")
    _initialized()
    target = llvm.Target.from_triple(TRIPLE)
    return target.create_target_machine(cpu=sm, features=f"+ptx{ptx_version}", opt=opt_level,
                                        reloc="default", codemodel="default")


@functools.cache
def data_layout() -> str:
    """The nvptx64 data layout string (64-bit generic pointers, 32-bit shared pointers per LLVM's choice)."""
    return str(target_machine("sm_80", 70).target_data)


def new_module(name: str, kind: type = ir.Module):
    """An empty module set up for ``nvptx64-nvidia-cuda``: an `llvmlite.ir.Module`, or another `kind` with
    its interface (`codegen.llvm_text.TextModule`)."""
    module = kind(name)
    module.triple = TRIPLE
    module.data_layout = data_layout()
    return module


def parse_and_verify(text: str, *, pass_name: str = "nvptx") -> llvm.ModuleRef:
    """Parse LLVM IR text and run LLVM's verifier; `InternalError` with LLVM's message otherwise. The parse
    can be handed to `compile_module` with the same text (``parsed=``) so it is not parsed twice."""
    return _parse_and_verify(text, pass_name)


def _parse_and_verify(text: str, pass_name: str) -> llvm.ModuleRef:
    try:
        mod = llvm.parse_assembly(text)
    except RuntimeError as exc:
        raise InternalError(f"LLVM could not parse the module: {exc}", pass_name=pass_name,
                            context=_excerpt(text, str(exc))) from None
    try:
        mod.verify()
    except RuntimeError as exc:
        raise InternalError(f"LLVM verifier: {exc}", pass_name=pass_name) from None
    return mod


def check_intrinsics(mod: llvm.ModuleRef, sm: str, ptx_version: int) -> None:
    """`BackendError` for an NVVM intrinsic the target lacks (LLVM would abort the process instead)."""
    have = sm_number(sm)
    for fn in mod.functions:
        if not (fn.is_declaration and fn.name.startswith("llvm.nvvm.")):
            continue
        for prefix, (min_sm, min_ptx) in INTRINSIC_REQUIREMENTS.items():
            if fn.name.startswith(prefix) and (have < min_sm or ptx_version < min_ptx):
                raise BackendError(f"{fn.name} needs sm_{min_sm}+ and PTX ISA {min_ptx / 10:.1f}+; "
                                   f"the target is {sm} with PTX ISA {ptx_version / 10:.1f}")


def compile_module(module: ir.Module | str, sm: str = "sm_90", *, ptx_version: int | None = None,
                   opt_level: int | None = None, keep_optimized: bool = False,
                   parsed: llvm.ModuleRef | None = None) -> PtxArtifact:
    """`module` (an `llvmlite.ir.Module` or LLVM IR text) to PTX for `sm`, keeping every stage's text.
    `opt_level`: None runs `GPU_PASSES`, 1-3 LLVM's O1-O3 pipeline, 0 nothing (and code generation O0).
    `parsed`: `module`'s text already parsed and verified (`parse_and_verify`), used (and changed in place
    by the middle end) instead of parsing it again."""
    version = default_ptx_version(sm) if ptx_version is None else ptx_version
    machine = target_machine(sm, version, 0 if opt_level == 0 else 3)   # code generation: O3 (or none)
    text = str(module)
    mod = parsed if parsed is not None else parse_and_verify(text)
    if mod.triple not in ("", TRIPLE, "unknown-unknown-unknown"):
        raise InternalError(f"module targets {mod.triple!r}, not {TRIPLE}", pass_name="nvptx")
    mod.triple = TRIPLE
    mod.data_layout = data_layout()
    check_intrinsics(mod, sm, version)
    with _gpu_pipeline_options():   # the pipeline reads them when its tuning options are made
        if opt_level != 0:
            _optimize(mod, machine, opt_level)
            try:   # LLVM's middle end can make invalid IR (codegen.native.optimized), and emitting it aborts
                mod.verify()
            except RuntimeError as exc:
                raise InternalError(f"LLVM's optimizer made invalid IR: {exc}", pass_name="nvptx") from None
        optimized = str(mod) if keep_optimized else None   # before code generation rewrites it
        ptx = machine.emit_assembly(mod)
    kernels = entry_names(ptx)
    if not kernels:
        raise InternalError("the module has no kernel: give the entry function calling_convention='ptx_kernel' "
                            "(codegen.nvvm.define_kernel)", pass_name="nvptx")
    return PtxArtifact(sm, version, text, optimized, ptx, kernels)


def entry_names(ptx: str) -> tuple[str, ...]:
    """The ``.entry`` (kernel) names of a PTX text, in order."""
    return tuple(re.findall(r"^(?:\.(?:visible|weak)\s+)?\.entry\s+([\w$]+)", ptx, flags=re.M))


def _optimize(mod: llvm.ModuleRef, machine: llvm.TargetMachine, opt_level: int | None) -> None:
    """Run the middle end on `mod` in place (`GPU_PASSES`, or LLVM's O`opt_level`), then LLVM's verifier."""
    tuning = llvm.create_pipeline_tuning_options(speed_level=opt_level or 1)
    builder = llvm.create_pass_builder(machine, tuning)
    if opt_level is None:
        manager = llvm.create_new_module_pass_manager()
        for name in GPU_PASSES:
            getattr(manager, f"add_{name}_pass")()
    else:
        manager = builder.getModulePassManager()
    manager.run(mod, builder)
    try:
        mod.verify()
    except RuntimeError as exc:  # an LLVM bug, but say so rather than emit bad PTX
        raise InternalError(f"LLVM verifier after the middle end ({opt_level or 'GPU_PASSES'}): {exc}",
                            pass_name="nvptx") from None


def compile_to_ptx(module: ir.Module | str, sm: str = "sm_90", *, ptx_version: int | None = None,
                   opt_level: int | None = None) -> str:
    """The PTX text of `module` for `sm` (see `compile_module`)."""
    return compile_module(module, sm, ptx_version=ptx_version, opt_level=opt_level).ptx


def _excerpt(text: str, message: str, radius: int = 3) -> str:
    """The numbered lines around the ``<string>:LINE:COL`` LLVM names in `message`."""
    found = re.search(r"<string>:(\d+):", message)
    if not found:
        return ""
    line = int(found.group(1))
    lines = text.splitlines()
    lo, hi = max(1, line - radius), min(len(lines), line + radius)
    return "\n".join(f"{'>' if n == line else ' '}{n:4d}  {lines[n - 1]}" for n in range(lo, hi + 1))
