"""The backends a kernel can run on, and how ``auto`` picks one.

| name        | runs                                                  | status          |
|-------------|-------------------------------------------------------|-----------------|
| `interpret` | the numpy interpreter of the Loop IR (the oracle)     | built           |
| `cpu`       | native code through LLVM (llvmlite)                   | built           |
| `cuda`      | PTX through LLVM's NVPTX backend, on a GPU            | built (needs a device to run) |
| `simulate`  | the SIMT program that becomes PTX, run on the CPU     | built           |

``auto`` picks the best backend that is built and usable here: ``cuda`` with a
device, else ``cpu``, else ``interpret``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

from . import config
from .codegen.native import NativeCode
from .codegen.simt import GpuOptions, SimtProgram
from .codegen.simt.ptx import LlvmModules, PtxProgram, compile_ptx, emit_llvm
from .compiler import (COMMON_STAGES, Lowered, Stage, host_llvm_stage, prefetch_stage, schedule_stage,
                       simt_stage)
from .codegen.simt.wgmma import has_wgmma
from .ir import BackendError, Program, SourceLoc, run_program, verify_program
from .ir.loop.extents import substitute_extents
from .ir.sizes import bind_buffers
from .kernel_options import KernelOptions
from .schedule.k_major import k_major_fp8_operands
from .schedule.options import DEFAULTS, ScheduleOptions, cpu_workers, gpu_workers

Executable = Callable[[list[np.ndarray]], tuple[np.ndarray, ...]]


@dataclass(frozen=True)
class Backend:
    """A way to compile and run kernels: its `stages` (`redfuser.compiler.Stage`, run in order by
    `compiler.lower`), `build` turning the `Lowered` into an executable, where its arrays live (`arrays`:
    ``host`` backends read numpy views of host arrays; ``device`` ones take arrays where they are), its
    schedule defaults and how many programs its target runs at once (`count_workers`), and for a GPU
    backend where its ``sm`` comes from when the kernel does not say (`default_sm`)."""

    name: str
    description: str
    build: Callable[[Lowered], Executable] | None  # None: not built yet
    available: Callable[[], str | None] | None = None  # why it cannot run on this machine (None: it can)
    stages: tuple[Stage, ...] = COMMON_STAGES
    arrays: Literal["host", "device"] = "host"
    schedule: ScheduleOptions | None = None   # None: runs the Loop IR, no schedule
    count_workers: Callable[[KernelOptions], int] = lambda options: 1
    default_sm: Callable[[], str] | None = None   # None: not a GPU backend

    def usable(self) -> str | None:
        """None when this backend can run here, else why not (in words)."""
        if self.build is None:
            return f"the {self.name} backend is not built yet (see the status table in README.md)"
        return self.available() if self.available is not None else None

    def workers(self, options: KernelOptions) -> int:
        """Programs this backend's target runs at once (what the automatic split plans for)."""
        return self.count_workers(options)

    def gpu_options(self, options: KernelOptions) -> GpuOptions | None:
        """The SIMT lowering's options for `options` (None for a backend that does not lower to SIMT)."""
        return None if self.default_sm is None else options.gpu_options(self.default_sm)


# --- the stages that use the runtime's compile cache -----------------------------------------------

def _native_stage(module: object, lowered: Lowered) -> NativeCode:
    """native (cpu): the host module's object code for this CPU (`codegen.native.compile_object`) through
    the compile cache, which serves it without LLVM work on a hit; where it came from goes to
    ``artifacts["compile"]``."""
    from .runtime.cpu_jit import cached_object

    text = str(module)
    obj, lowered.artifacts["compile"] = cached_object(text, {"backend": "cpu"}, lowered.artifacts["host_kernels"])
    return NativeCode(text, obj)


def _gpu_llvm_stage(simt: SimtProgram, lowered: Lowered) -> LlvmModules:
    """llvm (cuda, simulate): each kernel's LLVM module for nvptx64 (`codegen.simt.ptx.emit_llvm`; the kernels
    come verified from the ``simt`` stage), or the text the compile cache (`runtime.ptx_cache`) serves with
    the kernel's PTX, which skips the emission and the ``ptx`` stage's work. What the ``ptx`` stage needs
    beyond the text (LLVM's parse, the served PTX) goes to ``artifacts["pending_ptx"]``."""
    from .runtime import ptx_cache

    modules, lowered.artifacts["pending_ptx"] = emit_llvm(simt, lowered.options.llvm_opt, ptx_cache.lookup)
    return modules


def _ptx_stage(modules: LlvmModules, lowered: Lowered) -> PtxProgram:
    """ptx (cuda, simulate): each kernel's PTX (`codegen.simt.ptx.compile_ptx`): the one the compile cache
    served in the ``llvm`` stage, else LLVM's middle end and code generation, stored in the cache. It takes
    ``artifacts["pending_ptx"]`` away, so the LLVM modules do not outlive the compile."""
    from .runtime import ptx_cache

    pending = lowered.artifacts.pop("pending_ptx")
    return compile_ptx(modules, pending, lowered.options.llvm_opt, ptx_cache.store)


def _target_sm() -> str:
    from .runtime.device import target_sm

    return target_sm()


CPU_STAGES: tuple[Stage, ...] = COMMON_STAGES + (
    Stage("tile", schedule_stage),
    Stage("llvm", host_llvm_stage),
    Stage("native", _native_stage),
)


def _k_major_stage(program: Program, lowered: Lowered) -> Program:
    """k_major (sm_90a with TMA): e4m3 inputs a fused loop contracts along their rows read from a K-major copy
    (`redfuser.schedule.k_major`)."""
    lowered.program = verify_program(k_major_fp8_operands(program), pass_name="k_major")
    return lowered.program


def _has_tma(lowered: Lowered) -> bool:
    return lowered.gpu is not None and has_wgmma(lowered.gpu.sm) and lowered.gpu.tma


GPU_STAGES: tuple[Stage, ...] = COMMON_STAGES + (
    Stage("k_major", _k_major_stage, applies=_has_tma),
    Stage("tile", schedule_stage),
    Stage("prefetched", prefetch_stage, applies=lambda lowered: lowered.options.prefetch),
    Stage("simt", simt_stage),
    Stage("llvm", _gpu_llvm_stage),
    Stage("ptx", _ptx_stage),
)


# --- building executables --------------------------------------------------------------------------

def _build_interpret(lowered: Lowered) -> Executable:
    program = lowered.program
    chunk = lowered.options.interpret_chunk
    if lowered.shapes is None:
        return lambda arrays: run_program(program, arrays, chunk=chunk)
    # a shape class: the Loop IR traced at the probes, instantiated at each call's lengths
    probed, probes = lowered.artifacts["probed"], dict(lowered.shapes.symbols)
    made: dict[tuple, object] = {}

    def run(arrays: list[np.ndarray]) -> tuple[np.ndarray, ...]:
        values = bind_buffers(program.inputs, arrays)
        key = tuple(sorted(values.items()))
        if key not in made:
            if len(made) >= 64:
                made.clear()
            made[key] = substitute_extents(probed, {probes[name]: n for name, n in values.items()})
        return run_program(made[key], arrays, chunk=chunk)

    return run


def _build_cpu(lowered: Lowered) -> Executable:
    from .runtime.cpu_jit import CpuProgram, JitLibrary

    library = JitLibrary(lowered.stages["native"].obj)
    return CpuProgram(lowered.stages["tile"], lowered.artifacts["host_kernels"], library, lowered.options.num_threads)


def _build_simulate(lowered: Lowered) -> Executable:
    from .codegen.simt.run import simulate_program

    program = lowered.stages["simt"]
    return lambda arrays: simulate_program(program, arrays)


def _build_cuda(lowered: Lowered) -> Executable:
    from .runtime.cuda_backend import CudaProgram

    return CudaProgram(lowered.stages["simt"], lowered.stages["ptx"])


def _cuda_available() -> str | None:
    from .runtime.device import device_available, why_no_device

    return None if device_available() else f"cannot use the cuda backend: {why_no_device()}"


def _cpu_workers(options: KernelOptions) -> int:
    return cpu_workers(options.num_threads)


def _gpu_workers(options: KernelOptions) -> int:
    return gpu_workers()


BACKENDS: dict[str, Backend] = {
    "interpret": Backend("interpret", "numpy interpreter of the Loop IR", _build_interpret),
    "cpu": Backend("cpu", "native CPU code through LLVM", _build_cpu, stages=CPU_STAGES, schedule=DEFAULTS["cpu"],
                   count_workers=_cpu_workers),
    "cuda": Backend("cuda", "PTX on an NVIDIA GPU", _build_cuda, _cuda_available, stages=GPU_STAGES, arrays="device",
                    schedule=DEFAULTS["gpu"], count_workers=_gpu_workers, default_sm=_target_sm),
    "simulate": Backend("simulate", "SIMT simulator of the GPU program", _build_simulate, stages=GPU_STAGES,
                        schedule=DEFAULTS["gpu"], count_workers=_gpu_workers, default_sm=_target_sm),
}
AUTO_ORDER = ("cuda", "cpu", "interpret")


def check_name(name: object, loc: SourceLoc | None = None) -> str:
    """`name` lower-cased when it names a backend (or ``auto``); `BackendError` otherwise."""
    if not isinstance(name, str) or name.lower() not in config.BACKENDS:
        raise BackendError(f"unknown backend {name!r}; choose one of {', '.join(config.BACKENDS)}", op="kernel",
                           loc=loc)
    return name.lower()


def resolve(name: str | None, *, to_run: bool = True) -> tuple[str, str]:
    """The backend to use for `name` (None: ``REDFUSER_BACKEND``), and why it was chosen.

    With ``to_run=False`` (compiling only, e.g. `Kernel.lower`) a named backend that is
    built is accepted even where it cannot run: compiling for ``cuda`` needs no GPU.
    """
    if name is None:
        requested = config.default_backend()
        if requested not in config.BACKENDS:
            raise BackendError(f"REDFUSER_BACKEND={requested!r} is not a backend; set it to one of "
                               f"{', '.join(config.BACKENDS)} (or unset it for auto)")
    else:
        requested = check_name(name)
    if requested != "auto":
        backend = BACKENDS[requested]
        why_not = backend.usable() if to_run or backend.build is None else None
        if why_not:
            raise BackendError(why_not)
        return requested, "requested"
    skipped = []
    for candidate in AUTO_ORDER:
        why_not = BACKENDS[candidate].usable()
        if why_not is None:
            reason = "auto: best backend available" + (f" ({'; '.join(skipped)})" if skipped else "")
            return candidate, reason
        skipped.append(why_not)
    raise BackendError("no backend is usable: " + "; ".join(skipped))
