"""The compiler's stages, in order. Reading `lower` and the stage lists explains the compiler.

    stage       what it makes                                         backends
    traced      the Python body on tracers -> Loop IR, one loop       all
                nest per op
    fused       inline, CSE, cascade analysis, the fusion theorem     all (option fuse)
    sized       probe lengths -> run-time extents, after checking     all (shape-polymorphic
                that the program does not depend on them              kernels only)
    tile        Loop IR -> Tile IR (grid of programs over tiles)      cpu, cuda, simulate
    llvm        Tile IR -> LLVM IR (host)                             cpu
    native      LLVM IR -> this CPU's object code (compile cache;     cpu
                printed as assembly)
    prefetched  tensor-core operand tiles loaded a loop iteration     cuda, simulate (option prefetch)
                ahead
    simt        Tile IR -> SIMT IR (threads, layouts, mma)            cuda, simulate
    llvm        SIMT IR -> LLVM IR for nvptx64 (compile cache: a      cuda, simulate
                hit serves the text with its PTX, emitting nothing)
    ptx         LLVM IR -> PTX (only the kernels the cache did not    cuda, simulate
                serve; no GPU needed)

Each backend (`redfuser.backends.BACKENDS`) carries its list of `Stage`s: a name and a function; `lower`
runs them in order, each on what the one before made, and keeps what each makes. A stage has one name
for everything: its entry in `Lowered.stages` (printed as ``=== name ===``, dumped as ``NN-name.txt``),
its line in `Lowered.timings` and in `Lowered.parts`. Every stage's IR is verified when produced and
kept, so a person can print any of them (``REDFUSER_DUMP_DIR`` writes them all to disk). Where some
stages' time went (for ``simt`` planning, emission, clean-up, barriers, verifier; for the GPU's ``llvm``
the cache key and the LLVM emission; for ``ptx`` LLVM to PTX) is recorded in `Lowered.parts` (``python -m
redfuser explain --stages`` prints both; `codegen.timing`); the cyclic garbage collector is paused while
compiling. The stages that need the runtime's compile cache (``native``, the GPU's ``llvm`` and ``ptx``)
are supplied by the backend table; this module imports no runtime.
"""
from __future__ import annotations

import contextvars
import gc
import os
import threading
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Protocol

from llvmlite import ir as llvm_ir

from . import config
from .ir import Program, verify_program
from .ir.loop.extents import substitute_extents
from .ir.sizes import SymbolicDecision
from .ir.tile.nodes import TileProgram
from .ir.source import SourceLoc, warn_at_user
from .fusion import fuse
from .kernel_options import KernelOptions
from .probes import CallTooShort, ProbeRead, ProbeReads, noting_probe_reads
from .shapes import ShapePlan
from .trace import ArgSpec, Traced, kernel_name, trace
from .schedule import ScheduleOptions, schedule_program
from .schedule.prefetch import prefetch_operands
from .codegen.host import build_host_module
from .codegen.simt import GpuOptions, SimtProgram, lower_to_simt
from .codegen.simt.plan import choose_warps
from .codegen.timing import recording_parts, timed


@dataclass(frozen=True)
class Stage:
    """One named step of a backend's pipeline: ``run(ir, lowered)`` takes what the stage before made (the
    Python function, for the first) and returns what it makes, kept as ``lowered.stages[name]`` and timed
    as ``lowered.timings[name]``. `applies(lowered)`: whether it runs for this compile (its options, whether
    it is shape-polymorphic; default: always)."""

    name: str
    run: Callable[[Any, "Lowered"], Any]
    applies: Callable[["Lowered"], bool] = lambda lowered: True


class Pipeline(Protocol):
    """What `lower` needs of a backend (`redfuser.backends.Backend`)."""

    name: str
    stages: tuple[Stage, ...]
    schedule: ScheduleOptions | None

    def workers(self, options: KernelOptions) -> int: ...

    def gpu_options(self, options: KernelOptions) -> GpuOptions | None: ...


@dataclass
class Lowered:
    """Everything the compiler produced for one specialization of a kernel.

    `stages` maps each stage's name, in pipeline order, to what it made (printable IR objects);
    `program` is the Loop IR the backends start from (fused where fusion applies);
    `groups` lists the cascades the fusion engine found (see `redfuser.fusion`);
    `timings` the seconds each stage took (under the same names), `parts` where some of it went.
    """

    name: str
    specs: tuple[ArgSpec, ...]
    backend: str
    options: KernelOptions
    stages: dict[str, object] = field(default_factory=dict)
    program: Program | None = None
    groups: list = field(default_factory=list)
    artifacts: dict[str, object] = field(default_factory=dict)  # backend products (calling conventions, ...)
    timings: dict[str, float] = field(default_factory=dict)     # seconds per stage, in pipeline order
    # where some stages' time went: stage -> part -> seconds (inside the stage's own time, not added to it)
    parts: dict[str, dict[str, float]] = field(default_factory=dict)
    pipeline: Pipeline | None = field(default=None, repr=False, compare=False)   # the backend compiled for
    gpu: GpuOptions | None = None   # the GPU lowering's options (cuda, simulate)
    # a shape-polymorphic compile's shape class (`redfuser.shapes.ShapePlan`); `specs` are then its probes
    shapes: ShapePlan | None = None
    source: Callable | None = field(default=None, repr=False, compare=False)     # the kernel's function

    def timed(self, stage: str) -> AbstractContextManager[None]:
        """Add the wall time of the ``with`` body to ``timings[stage]``."""
        return timed(self.timings, stage)

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

    @property
    def specialization(self) -> str:
        """A short name of this compile among the kernel's others: a digest of its backend, options and traced
        program (two closures named alike, an exact shape and its shape class, differ in it)."""
        import hashlib

        text = f"{self.backend}\n{self.options}\n{self.stages.get('traced', '')}"
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def dump(self, folder: Path) -> None:
        """Write each stage's text to ``folder/NN-name.txt``."""
        folder.mkdir(parents=True, exist_ok=True)
        for n, (name, ir) in enumerate(self.stages.items()):
            (folder / f"{n:02d}-{name}.txt").write_text(f"{ir}\n")


# --- the stages every backend shares, and those without the runtime --------------------------------

AFTER_TRACE: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("after_trace", default=None)
"""Called right after each trace of a compile (a shape class traces twice), in the compiling thread, also where the
trace raised (`Kernel` notes the captured values there, as the trace left them: noted again after the whole
compile, another thread's change to a captured list during its LLVM work was taken as traced and never seen)."""


def _trace_noted(fn: Callable, specs: tuple[ArgSpec, ...]) -> Traced:
    """`trace`, then (also where it raises) `AFTER_TRACE`'s call: the captured values as this trace left them."""
    try:
        return trace(fn, specs)
    finally:
        after = AFTER_TRACE.get()
        if after is not None:
            after()


def trace_stage(fn: Callable, lowered: Lowered) -> Program:
    """traced: the Python function on tracers -> verified Loop IR (for a shape class, noting the probe
    lengths the body reads as numbers: `redfuser.probes`)."""
    plan = lowered.shapes
    lengths = {probe: n for (_, probe), n in zip(plan.symbols, plan.values)} if plan is not None else {}
    with noting_probe_reads(stop=True, lengths=lengths) if plan is not None else nullcontext(ProbeReads()) as reads:
        try:
            traced = _trace_noted(fn, lowered.specs)
        except CallTooShort as short:  # (below what the class needs, or a loop over the length: the kernel decides)
            raise _call_too_short(plan, short) from None
        except ProbeRead as read:      # (its symbols stay static: the rest of the trace is not needed)
            raise _lengths_read(plan, read.probes, read.where) from None
    lowered.artifacts["probe_reads"] = reads
    lowered.artifacts["length_needs"] = traced.length_needs
    lowered.artifacts["updated_inputs"] = traced.updated_inputs
    lowered.artifacts["returns_sequence"] = traced.returns_sequence     # (`Kernel`: the call's value)
    lowered.program = verify_program(traced.program, pass_name="trace")
    return lowered.program


def _lengths_read(plan: ShapePlan, probes: set[int] | frozenset[int],
                  where: dict[int, SourceLoc]) -> SymbolicDecision:
    """The decision that keeps static the symbols whose probes the body read as numbers (`redfuser.probes`),
    naming the user's line of each read (`where`: probe -> where it was first read)."""
    names = frozenset(name for name, probe in plan.symbols if probe in probes)
    lines = sorted({f"{where[probe].short()}: {where[probe].text.strip()}" for name, probe in plan.symbols
                    if probe in probes and probe in where and where[probe].line > 0})
    at = f" (at {'; '.join(lines)})" if lines else ""
    return SymbolicDecision(f"the body uses the length {', '.join(sorted(names))} as a number{at}", names)


class ShortCall(SymbolicDecision):
    """The class's trace indexed past the call's own length (`redfuser.probes.CallTooShort`): `needs`, each
    symbol -> the least length the trace needed. A fact about this call (below the class's guard, it is
    compiled exactly and fails as numpy does) unless the need grows with the length, as a loop over it
    does; `Kernel._polymorphic` tells the two apart."""

    def __init__(self, message: str, symbols: frozenset[str], needs: dict[str, int]) -> None:
        super().__init__(message, symbols)
        self.needs = needs


def _call_too_short(plan: ShapePlan, short: CallTooShort) -> ShortCall:
    """`short` in the class's symbols."""
    needs = {name: short.needs[probe] for name, probe in plan.symbols if probe in short.needs}
    read = _lengths_read(plan, short.probes, short.where)
    return ShortCall(f"{read} (an index follows it past each call's own length, as a loop over it does)",
                     read.symbols, needs)


def fuse_stage(program: Program, lowered: Lowered) -> Program:
    """fused: inline, CSE, cascades, the fusion theorem (`redfuser.fusion`)."""
    lowered.program, lowered.groups = fuse(program)
    return lowered.program


def schedule_stage(program: Program, lowered: Lowered) -> TileProgram:
    """tile: Loop IR -> Tile IR with the backend's defaults and the kernel's tile options."""
    backend, options = lowered.pipeline, lowered.options
    return schedule_program(program, options.schedule_options(backend.schedule, lambda: backend.workers(options)))


def host_llvm_stage(tile: TileProgram, lowered: Lowered) -> llvm_ir.Module:
    """llvm (cpu): Tile IR -> the host LLVM module; its kernels' calling conventions go to
    ``artifacts["host_kernels"]``."""
    module, lowered.artifacts["host_kernels"] = build_host_module(tile)
    return module


def prefetch_stage(tile: TileProgram, lowered: Lowered) -> TileProgram:
    """prefetched (option ``prefetch``): operand loads a loop iteration ahead, within the register budget of
    each kernel's block (its warps as the SIMT lowering will choose them, a plain count per kernel)."""
    threads = {k.name: 32 * choose_warps(k, lowered.gpu) for k in tile.kernels}
    return prefetch_operands(tile, threads)


def simt_stage(tile: TileProgram, lowered: Lowered) -> SimtProgram:
    """simt: Tile IR -> verified SIMT IR for the kernel's GPU options."""
    return lower_to_simt(tile, lowered.gpu)


def sized_stage(program: Program, lowered: Lowered) -> Program:
    """sized (shape-polymorphic kernels): the program traced at `redfuser.shapes.PROBES` with each probe
    replaced by its symbol (a `redfuser.ir.sizes.Sym`), once the program traced and fused at the other
    probes has proven equal to this one up to the probes: nothing in it depends on a symbolic length's
    value. `SymbolicDecision` when it does (the kernel then compiles the call's exact shapes). The probe
    program stays in ``artifacts["probed"]`` (the ``interpret`` backend instantiates it per call), the
    least length each symbol needs in ``artifacts["guards"]`` (from the trace's length checks: an int
    index or a top-k's k; a call below them is compiled for its exact shapes, and fails as numpy does)."""
    plan = lowered.shapes
    assert plan is not None and lowered.source is not None
    reads = lowered.artifacts.get("probe_reads", ProbeReads())
    decision = _lengths_read(plan, reads, reads.where)
    if decision.symbols:
        raise decision

    def same_at(specs: tuple[ArgSpec, ...], probes: dict[int, int]) -> bool:
        with noting_probe_reads():      # traced as the first was (its constants of lengths are alike)
            other = _trace_noted(lowered.source, specs).program
        if lowered.options.fuse:
            other, _ = fuse(other)
        return substitute_extents(program, probes) == other

    if not same_at(plan.check_specs, plan.probe_to_check):
        swaps = plan.probe_to_check
        names = frozenset(name for name, probe in plan.symbols
                          if not same_at(plan.only(name), {probe: swaps[probe]}))
        raise SymbolicDecision(f"the program depends on the value of {', '.join(sorted(names)) or 'its lengths'} "
                               "(a length used as a number, or a fusion constant such as 1/n)", names)
    lowered.artifacts["probed"] = program
    lowered.program = verify_program(substitute_extents(program, plan.probe_to_symbol), pass_name="sized")
    lowered.groups = [substitute_extents(g, plan.probe_to_symbol) for g in lowered.groups]   # for `explain`
    guards: dict[str, int] = {}
    for name, probe in plan.symbols:
        least = [n for length, n in lowered.artifacts.get("length_needs", []) if length == probe]
        if least:
            guards[name] = max(least)
    lowered.artifacts["guards"] = guards
    return lowered.program


COMMON_STAGES: tuple[Stage, ...] = (
    Stage("traced", trace_stage),
    Stage("fused", fuse_stage, applies=lambda lowered: lowered.options.fuse),
    Stage("sized", sized_stage, applies=lambda lowered: lowered.shapes is not None),
)
"""traced, fused and (for a shape-polymorphic kernel) sized: what every backend starts with."""


# --- running them ---------------------------------------------------------------------------------

_gc_lock = threading.Lock()
_gc_pausers = 0          # compiles running now that paused the cyclic garbage collector
_gc_was_enabled = False


def _gc_after_fork() -> None:
    """In a child of ``os.fork()`` taken while another thread compiled: that compile never ends there, so the
    collector it paused is back on as it was, and the lock is free."""
    global _gc_lock, _gc_pausers
    _gc_lock = threading.Lock()
    if _gc_pausers:
        _gc_pausers = 0
        if _gc_was_enabled:
            gc.enable()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_gc_after_fork)


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


def lower(fn: Callable, specs: tuple[ArgSpec, ...], backend: Pipeline, options: KernelOptions,
          shapes: ShapePlan | None = None) -> Lowered:
    """Run `backend`'s stages on `fn` specialized to `specs`, or with `shapes` to a shape class (`specs`
    are then its probes, `redfuser.shapes`); keep every stage."""
    with _gc_paused():
        return _lower(fn, specs, backend, options, shapes)


SMALLER_TILES: tuple[dict[str, int], ...] = ({"block_n": 4096}, {"block_n": 1024}, {"block_m": 16, "block_n": 64},
                                             {"block_m": 16, "block_n": 64, "block_k": 16})
"""Tiles a GPU compile tries in turn, as if the user had given them, where its default tiles need more shared
memory than the target has (`SharedMemoryExceeded`): f16 RMSNorm of 16384-element rows took whole rows whose
f32 weight row is converted through 64 KiB of shared memory (48 KiB on sm_80/sm_90), an f16 linear
cross-entropy of 4096 rows 147-279 KiB; an int64 ``a @ b`` of 64x64x64 (no tensor cores: its operand tiles go
through shared memory at 8 bytes an element) 512 KiB, 128 KiB with 16-row tiles, and fits with 16-deep ones.
A kernel the user gave a tile keeps it and the error."""


def _lower(fn: Callable, specs: tuple[ArgSpec, ...], backend: Pipeline, options: KernelOptions,
           shapes: ShapePlan | None) -> Lowered:
    from .codegen.simt.kernel import SharedMemoryExceeded

    try:
        return _run_stages(fn, specs, backend, options, shapes)
    except SharedMemoryExceeded:
        if backend.gpu_options(options) is None or any(
                getattr(options, name) is not None for name in ("block_m", "block_n", "block_k")):
            raise
        for tiles in SMALLER_TILES:
            try:
                return _run_stages(fn, specs, backend, replace(options, **tiles), shapes)
            except SharedMemoryExceeded:
                continue
        raise


def _run_stages(fn: Callable, specs: tuple[ArgSpec, ...], backend: Pipeline, options: KernelOptions,
                shapes: ShapePlan | None) -> Lowered:
    out = Lowered(kernel_name(fn), specs, backend.name, options, pipeline=backend,
                  gpu=backend.gpu_options(options), shapes=shapes, source=fn)
    made: Any = fn
    for stage in backend.stages:
        if not stage.applies(out):
            continue
        with out.timed(stage.name), recording_parts({}) as parts:
            made = stage.run(made, out)
        if parts:
            out.parts[stage.name] = parts
        out.stages[stage.name] = made
    dump = config.dump_dir()
    if dump is not None:
        try:
            out.dump(dump / out.name / out.specialization)   # (one folder a compile: none mixes with another)
        except OSError as err:   # the stages are for reading; a folder that cannot take them is not fatal
            warn_at_user(f"REDFUSER_DUMP_DIR={str(dump)!r}: cannot write {out.name}'s stages ({err})",
                         RuntimeWarning)
    return out
