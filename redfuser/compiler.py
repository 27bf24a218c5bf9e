"""The compiler's stages, in order. Reading `lower` explains the compiler.

    stage      what it does                                                  kept as
    trace      the Python body on tracers -> Loop IR, one loop nest per op   "traced"
    fuse       inline, CSE, cascade analysis, the fusion theorem             "fused"
    schedule   Loop IR -> Tile IR (grid of programs over tiles; GPU, with    "tile"     (cpu, cuda, simulate)
               `prefetch`: operand tiles loaded one loop iteration ahead)
    codegen    cpu: Tile IR -> LLVM IR (host)                                "llvm"
               cuda, simulate: Tile IR -> SIMT IR (threads, layouts, mma)    "simt"
                 -> LLVM IR (nvptx64) -> PTX (no GPU needed)                 "llvm", "ptx"

Every stage's IR is verified when produced and kept in `Lowered.stages`, so a
person can print any of them (``REDFUSER_DUMP_DIR`` writes them all to disk).
Each stage's wall time is kept in `Lowered.timings`, and where the ``simt`` and
``ptx`` stages' went (planning, emission, clean-up, barriers, verifier; cache
key, LLVM emission, LLVM to PTX) in `Lowered.parts` (``python -m redfuser
explain --stages`` prints both); the cyclic garbage collector is paused while
compiling.
"""
from __future__ import annotations

import gc
import threading
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import config
from .ir import ArgumentError, Program, verify_program
from .ir.source import warn_at_user
from .fusion import fuse
from .trace import ArgSpec, trace
from .schedule import options_for, schedule_program
from .schedule.prefetch import prefetch_operands
from .codegen.host import build_host_module
from .codegen.simt import GpuOptions, lower_to_simt
from .codegen.simt.plan import choose_warps
from .codegen.timing import timed_part
from .runtime.cuda_backend import compile_ptx


def gpu_options(options: dict) -> GpuOptions:
    """The SIMT lowering's options from a kernel's: ``sm`` (default: the device's, else sm_90), ``num_warps``,
    ``min_blocks_per_sm``."""
    from .runtime.device import target_sm

    warps = options.get("num_warps")
    return GpuOptions(sm=options.get("sm") or target_sm(), num_warps=None if warps is None else int(warps),
                      min_blocks_per_sm=options.get("min_blocks_per_sm"))


def llvm_opt_level(options: dict) -> int | None:
    """The ``llvm_opt`` kernel option: None runs RedFuser's own short middle end before NVPTX code
    generation (`codegen.nvptx.GPU_PASSES`), 1, 2 or 3 LLVM's O1-O3 pipeline instead."""
    level = options.get("llvm_opt")
    if level is not None and (isinstance(level, bool) or level not in (1, 2, 3)):
        raise ArgumentError(f"llvm_opt must be None, 1, 2 or 3, got {level!r}", op="kernel")
    return level


@dataclass
class Lowered:
    """Everything the compiler produced for one specialization of a kernel.

    `stages` maps stage names, in pipeline order, to printable IR objects;
    `program` is the Loop IR the backends start from (fused where fusion applies);
    `groups` lists the cascades the fusion engine found (see `redfuser.fusion`).
    """

    name: str
    specs: tuple[ArgSpec, ...]
    backend: str
    options: dict
    stages: dict[str, object] = field(default_factory=dict)
    program: Program | None = None
    groups: list = field(default_factory=list)
    artifacts: dict[str, object] = field(default_factory=dict)  # backend products (compiled code, ...)
    timings: dict[str, float] = field(default_factory=dict)     # seconds per stage, in pipeline order
    # where some stages' time went: stage -> part -> seconds (inside the stage's own time, not added to it)
    parts: dict[str, dict[str, float]] = field(default_factory=dict)

    def timed(self, stage: str) -> AbstractContextManager[None]:
        """Add the wall time of the ``with`` body to ``timings[stage]``."""
        return timed_part(self.timings, stage)

    def timing_table(self) -> str:
        """The stages' wall times, one line each (with the parts of those that record them, indented),
        and their total (milliseconds)."""
        lines = []
        for name, s in self.timings.items():
            lines.append(f"  {name:<13} {1e3 * s:9.1f} ms")
            lines += [f"    {part:<11} {1e3 * t:9.1f} ms" for part, t in self.parts.get(name, {}).items()]
        lines.append(f"  {'total':<13} {1e3 * sum(self.timings.values()):9.1f} ms")
        return "compile time per stage:\n" + "\n".join(lines)

    def __str__(self) -> str:
        return "\n\n".join(f"=== {name} ===\n{ir}" for name, ir in self.stages.items())

    def dump(self, folder: Path) -> None:
        """Write each stage's text to ``folder/NN-stage.txt``."""
        folder.mkdir(parents=True, exist_ok=True)
        for n, (name, ir) in enumerate(self.stages.items()):
            (folder / f"{n:02d}-{name}.txt").write_text(f"{ir}\n")


_gc_lock = threading.Lock()
_gc_pausers = 0          # compiles running now that paused the cyclic garbage collector
_gc_was_enabled = False


@contextmanager
def _gc_paused():
    """The cyclic garbage collector off for the ``with`` body (restored after the last of nested or
    concurrent compiles). A compile allocates millions of short-lived objects (IR nodes, llvmlite
    values) that are nearly all alive until it ends; the collector's full passes over them took
    about half of a big kernel's compile time and found nothing to free. Reference counting still
    frees what it can; what cycles remain are collected once the collector is back on."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


def lower(fn: Callable, specs: tuple[ArgSpec, ...], backend: str, options: dict) -> Lowered:
    """Run the compiler's stages on `fn` specialized to `specs`; keep every stage."""
    with _gc_paused():
        return _lower(fn, specs, backend, options)


def _lower(fn: Callable, specs: tuple[ArgSpec, ...], backend: str, options: dict) -> Lowered:
    out = Lowered(getattr(fn, "__name__", "kernel"), specs, backend, dict(options))
    with out.timed("trace"):
        program = verify_program(trace(fn, specs), pass_name="trace")
    out.stages["traced"] = program
    out.program = program
    if options.get("fuse", True):
        with out.timed("fuse"):
            program, out.groups = fuse(program)
        out.stages["fused"] = program
        out.program = program
    if backend == "cpu":
        with out.timed("schedule"):
            out.stages["tile"] = schedule_program(out.program, options_for(backend, options))
        with out.timed("llvm"):
            out.stages["llvm"], out.artifacts["host_kernels"] = build_host_module(out.stages["tile"])
    elif backend in ("cuda", "simulate"):
        opt_level = llvm_opt_level(options)
        gpu = gpu_options(options)
        with out.timed("schedule"):
            tile = schedule_program(out.program, options_for(backend, options))
            if options.get("prefetch"):
                tile = prefetch_operands(tile, lambda k: 32 * choose_warps(k, gpu))
            out.stages["tile"] = tile
        with out.timed("simt"):
            out.stages["simt"] = lower_to_simt(out.stages["tile"], gpu, out.parts.setdefault("simt", {}))
        with out.timed("ptx"):
            out.stages["llvm"], out.stages["ptx"] = compile_ptx(out.stages["simt"], opt_level,
                                                                out.parts.setdefault("ptx", {}))
    dump = config.dump_dir()
    if dump is not None:
        try:
            out.dump(dump / out.name)
        except OSError as err:   # the stages are for reading; a folder that cannot take them is not fatal
            warn_at_user(f"REDFUSER_DUMP_DIR={str(dump)!r}: cannot write {out.name}'s stages ({err})",
                         RuntimeWarning)
    return out
