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
from typing import Callable

import numpy as np

from . import config
from .compiler import Lowered
from .ir import BackendError, SourceLoc, run_program

Executable = Callable[[list[np.ndarray]], tuple[np.ndarray, ...]]


@dataclass(frozen=True)
class Backend:
    """A way to run lowered kernels. `build` turns a `Lowered` into an executable."""

    name: str
    description: str
    build: Callable[[Lowered], Executable] | None  # None: not built yet
    available: Callable[[], str | None] | None = None  # why it cannot run on this machine (None: it can)

    def usable(self) -> str | None:
        """None when this backend can run here, else why not (in words)."""
        if self.build is None:
            return f"the {self.name} backend is not built yet (see the status table in README.md)"
        return self.available() if self.available is not None else None


def _build_interpret(lowered: Lowered) -> Executable:
    program = lowered.program
    chunk = int(lowered.options.get("interpret_chunk", 64))
    return lambda arrays: run_program(program, arrays, chunk=chunk)


def _build_cpu(lowered: Lowered) -> Executable:
    from .runtime.cpu_jit import CpuProgram, compile_cached

    library, info = compile_cached(str(lowered.stages["llvm"]), {"backend": "cpu"}, lowered.artifacts["host_kernels"])
    lowered.artifacts["compile"] = info
    threads = int(lowered.options.get("num_threads") or 0)
    return CpuProgram(lowered.stages["tile"], lowered.artifacts["host_kernels"], library, threads)


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


BACKENDS: dict[str, Backend] = {
    "interpret": Backend("interpret", "numpy interpreter of the Loop IR", _build_interpret),
    "cpu": Backend("cpu", "native CPU code through LLVM", _build_cpu),
    "cuda": Backend("cuda", "PTX on an NVIDIA GPU", _build_cuda, _cuda_available),
    "simulate": Backend("simulate", "SIMT simulator of the GPU program", _build_simulate),
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
