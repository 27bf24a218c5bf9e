"""Host LLVM IR -> optimized native code for this CPU (the ``cpu`` backend's ``native`` stage).

- `host_target()`: the LLVM target machine for this CPU (its name and features,
  so AVX2/AVX-512 code is generated), O3, PIC and LLVM's JIT code model (what
  `runtime.cpu_jit` links in memory);
- `optimize(module)`: LLVM's O3 pipeline (loop and SLP vectorizers on);
  `optimized(text)` runs it and verifies the result, falling back to O3 without
  the SLP vectorizer where LLVM made invalid IR, and writes one-lane masked
  stores as scalar stores (`one_lane_stores.py`: an LLVM 22.1 x86 bug);
  `optimized_ir(text)` shows what it made of a module;
- `compile_object(text)`: verified, optimized, emitted as an ELF object (bytes),
  compiled again without AVX512DQ where LLVM 22.1 encoded a sign-bit mask of
  a register VEX cannot name (`movmsk_registers.py`); `assembly(text)` the same
  code as assembly text;
- `NativeCode`: what the stage keeps, an object's bytes with the module they were
  compiled from; printed, it is the assembly (made when printed: the object is
  what runs, and the compile cache may have served it without any LLVM work).

The compile cache around `compile_object` belongs to the runtime (`runtime.cpu_jit.cached_object`).
"""
from __future__ import annotations

import ctypes
import functools
import platform
from dataclasses import dataclass, field

import llvmlite.binding as llvm

from ..ir.errors import InternalError
from .llvm_utils import initialize_native, parse_and_verify
from .movmsk_registers import may_hold_movmsk, misencoded_movmsk
from .one_lane_stores import scalarize_one_lane_masked_stores


@dataclass(frozen=True)
class HostTarget:
    """This machine as LLVM sees it."""

    triple: str
    cpu: str
    features: str
    machine: llvm.TargetMachine
    amx: bool = False       # AMX-BF16 tiles usable by this process (`amx_permitted`)

    @property
    def description(self) -> str:
        return f"{self.triple} cpu={self.cpu}" + (" amx" if self.amx else "")

    @property
    def key(self) -> str:
        """The target part of a compile-cache key: triple, CPU, features and whether AMX code may run (an
        object with tile instructions faults in a process Linux has not granted them)."""
        return f"{self.triple}:{self.cpu}:{self.features}" + (":amx" if self.amx else "")


_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


def amx_permitted(features: str) -> bool:
    """Whether this process may run AMX-BF16 code (`host/amx.py`): LLVM sees ``amx-tile`` and ``amx-bf16`` on
    the host, and Linux grants the process the tile data state (``arch_prctl(ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA)``, asked once: the kernel refuses tile instructions in a process that has not)."""
    if not {"+amx-tile", "+amx-bf16"} <= set(features.split(",")) or platform.system() != "Linux" \
            or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def jit_machine(triple: str, cpu: str, features: str) -> llvm.TargetMachine:
    """A new target machine for `triple`/`cpu`/`features`: O3, PIC, LLVM's JIT code model."""
    return llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=3, reloc="pic", codemodel="jitdefault", jit=True)


FULL_WIDTH_VECTORS = ",-prefer-256-bit"
"""Added to the features of an AVX-512 host: LLVM's tuning for most AVX-512 cores (``prefer-256-bit``) has
its vectorizers make 256-bit loops, for fear of the frequency drop 512-bit instructions once caused. The
GEMM core's micro-kernel (`host/gemm.py`) builds 512-bit FMAs itself, so a kernel pays for them anyway,
and its elementwise loops (the exps, the scale, the row reductions) ran at half width beside them.
Interleaved in one process on the 2-core AVX-512 host (2 threads): attention [1,8,2048,64] 34.5 -> 31.0
ms, causal 23.2 -> 20.8, softmax 1024x16384 12.4 -> 10.8, log-softmax 4096x4096 18.0 -> 16.2,
cross-entropy 2048x32000 16.4 -> 12.8; RMSNorm and layer norm + GEMM within noise."""


@functools.cache
def host_target() -> HostTarget:
    """The target machine of this CPU (O3, JIT code model; full-width vectors on AVX-512:
    `FULL_WIDTH_VECTORS`)."""
    initialize_native()
    triple = llvm.get_process_triple()
    cpu = llvm.get_host_cpu_name()
    features = llvm.get_host_cpu_features().flatten()
    if "+avx512f" in features.split(","):
        features += FULL_WIDTH_VECTORS
    return HostTarget(triple, cpu, features, jit_machine(triple, cpu, features), amx_permitted(features))


def optimize(module: llvm.ModuleRef, slp: bool = True) -> llvm.ModuleRef:
    """Run O3 (with loop vectorization, and SLP vectorization where `slp`) on `module`, in place."""
    target = host_target()
    module.triple = target.triple
    layout = target.machine.target_data  # keep the object alive while reading its text
    module.data_layout = str(layout)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = slp
    pto.loop_unrolling = True
    builder = llvm.create_pass_builder(target.machine, pto)
    builder.getModulePassManager().run(module, builder)
    return module


PIPELINES = (True, False)
"""SLP vectorization on, then off: the pipelines `optimized` tries, in order."""


def optimized(text: str) -> llvm.ModuleRef:
    """`text` parsed, verified and optimized, and verified again.

    LLVM's optimizer can itself produce invalid IR: LLVM 22.1's O3 with the loop and SLP vectorizers
    and unrolling all on turned a fused bf16 attention-like kernel into IR whose uses are not dominated
    by their definitions (the fuzzer's long campaign, seed 1 example 13862), and emitting an object
    from it aborts the process inside the code generator. So the optimized module is verified before
    anything is emitted, and where it is invalid the module is optimized again from its text without
    the SLP vectorizer. A module no pipeline keeps valid is an internal error, never a crash.
    """
    problems = []
    for slp in PIPELINES:
        module = optimize(parse_and_verify(text, pass_name="cpu_jit"), slp=slp)
        try:
            module.verify()
        except RuntimeError as err:
            problems.append(f"slp={slp}: {str(err).splitlines()[0]}")
            continue
        # LLVM 22.1's x86 back end widens one-lane masked stores of truncated vectors (one_lane_stores.py).
        fixed, rewritten = scalarize_one_lane_masked_stores(str(module))
        return parse_and_verify(fixed, pass_name="one_lane_stores") if rewritten else module
    raise InternalError("LLVM's optimizer made invalid IR from a valid host module (" + "; ".join(problems) + ")")


def optimized_ir(text: str) -> str:
    """The O3-optimized form of a host module (for inspecting vectorization)."""
    return str(optimized(text))


def assembly(text: str) -> str:
    """The native assembly of a host module (of the code `compile_object` gives it)."""
    for machine in _machines():
        asm = machine.emit_assembly(optimized(text))
        if not misencoded_movmsk(asm):
            return asm
    return asm


def compile_object(text: str) -> bytes:
    """Verified, optimized (and verified again: `optimized`) native object code of a host module; where the
    host's code holds a VEX ``movmsk`` of xmm16-31 (`movmsk_registers`: an LLVM 22.1 bug, the instruction
    reads another register), the module compiled again without AVX512DQ, and an `InternalError` where that
    still holds one."""
    bad: list[str] = []
    for machine in _machines():
        obj = machine.emit_object(optimized(text))
        if not may_hold_movmsk(obj):
            return obj
        bad = misencoded_movmsk(machine.emit_assembly(optimized(text)))
        if not bad:
            return obj
    raise InternalError("LLVM's x86 back end encoded a sign-bit mask of a register VEX cannot name ("
                        + "; ".join(bad[:3]) + "), with and without AVX512DQ (codegen/movmsk_registers.py)")


def _machines() -> list[llvm.TargetMachine]:
    """The host's target machine, then (where the host has AVX512DQ) one without it: `movmsk_registers`."""
    target = host_target()
    features = target.features.split(",")
    if "+avx512dq" not in features:
        return [target.machine]
    return [target.machine, _without_dq(target.triple, target.cpu, target.features)]


@functools.cache
def _without_dq(triple: str, cpu: str, features: str) -> llvm.TargetMachine:
    """`jit_machine` without AVX512DQ (so no ``vpmovd2m``/``vpmovq2m`` for the EVEX pass to fold)."""
    return jit_machine(triple, cpu, ",".join("-avx512dq" if f == "+avx512dq" else f for f in features.split(",")))


@dataclass(frozen=True)
class NativeCode:
    """The ``native`` stage: `obj`, this CPU's object code of the host module `llvm_ir`. ``str()`` is its
    assembly."""

    llvm_ir: str = field(repr=False)
    obj: bytes = field(repr=False)

    def __str__(self) -> str:
        return assembly(self.llvm_ir).rstrip("\n")


__all__ = ["HostTarget", "NativeCode", "assembly", "compile_object", "host_target", "jit_machine", "optimize",
           "optimized_ir"]
