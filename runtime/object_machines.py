"""The host machines whose object code `runtime.object_check` can vouch for, and the relocations it accepts.

A relocation type is accepted when the host backend emits it and MCJIT's
RuntimeDyldELF applies it safely wherever the JIT places the sections. Which
ones the backend emits (`codegen.native.host_target`: PIC, LLVM's JIT code model, O3),
surveyed over every kernel the test suite compiles (318 modules, LLVM 22):

- x86-64 (host CPU, ``znver4``): only ``GOTPC64``, ``GOTOFF64`` and ``GOT64``;
  LLVM's JIT code model on x86-64 is the large one, because the JIT may place
  code, constants and the GOT more than 2 GiB apart;
- AArch64 (the same modules cross-compiled for ``generic``, ``neoverse-v2`` and
  ``apple-m1``, JIT and large code models alike): only ``ADR_PREL_PG_HI21``,
  ``LDST128_ABS_LO12_NC`` and ``CALL26``.

Each table adds the siblings the same backend uses for the same kind of code
(64-bit absolute and PC-relative words, the other GOT forms, the other
load/store widths, the large code model's ``MOVW_UABS`` sequence on AArch64)
and nothing with a narrow range that the JIT cannot promise: 32-bit absolute or
PC-relative types on x86-64 (RuntimeDyld asserts, aborting the process, or
truncates when the target is more than 2 GiB away), and AArch64's 19-/21-bit
literal, branch and ``ADR`` forms and 32-bit data words. ``ADR_PREL_PG_HI21``
(±4 GiB) is accepted only against symbols defined in the object itself: llvmlite
places one object's sections in one block, but an outside symbol (libc's) can be
anywhere. TLS, ``NONE`` and 8/16-bit types are never accepted (our code has no
thread-locals). Branches to outside functions (``CALL26``/``JUMP26``) go through
stubs RuntimeDyld makes next to the code, so they always reach.

Other machines have no table (`machine_of_triple` returns None): without a
survey of what their backend emits and how RuntimeDyld treats it, nothing from
disk is linked there; `cpu_jit.cached_object` then caches host objects in
memory only (one compile per process).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["AARCH64", "AARCH64_BE", "MACHINES", "Machine", "X86_64", "machine_of_triple"]


@dataclass(frozen=True)
class Machine:
    """What a host object for one machine looks like: its ELF ids and the relocations MCJIT may apply."""

    name: str
    e_machine: int
    little_endian: bool
    relocations: Mapping[int, int]          # relocation type -> bytes it patches at r_offset
    got_base: frozenset[int] = frozenset()  # types whose symbol is ignored (they address the JIT's own GOT)
    near_only: frozenset[int] = frozenset()  # types that must refer to a symbol defined in the object
    linker_symbols: frozenset[str] = field(default_factory=frozenset)  # undefined names the JIT linker defines


X86_64 = Machine("x86-64", 62, True, {
    1: 8,    # R_X86_64_64
    24: 8,   # R_X86_64_PC64
    25: 8,   # R_X86_64_GOTOFF64   (emitted)
    27: 8,   # R_X86_64_GOT64      (emitted: memcpy, memset)
    29: 8,   # R_X86_64_GOTPC64    (emitted)
}, got_base=frozenset({29}), linker_symbols=frozenset({"_GLOBAL_OFFSET_TABLE_"}))

_AARCH64_RELOCATIONS = {
    257: 8,  # R_AARCH64_ABS64
    260: 8,  # R_AARCH64_PREL64
    264: 4,  # R_AARCH64_MOVW_UABS_G0_NC  (large code model)
    266: 4,  # R_AARCH64_MOVW_UABS_G1_NC
    268: 4,  # R_AARCH64_MOVW_UABS_G2_NC
    269: 4,  # R_AARCH64_MOVW_UABS_G3
    275: 4,  # R_AARCH64_ADR_PREL_PG_HI21 (emitted)
    277: 4,  # R_AARCH64_ADD_ABS_LO12_NC
    278: 4,  # R_AARCH64_LDST8_ABS_LO12_NC
    282: 4,  # R_AARCH64_JUMP26
    283: 4,  # R_AARCH64_CALL26           (emitted: memcpy, memset)
    284: 4,  # R_AARCH64_LDST16_ABS_LO12_NC
    285: 4,  # R_AARCH64_LDST32_ABS_LO12_NC
    286: 4,  # R_AARCH64_LDST64_ABS_LO12_NC
    299: 4,  # R_AARCH64_LDST128_ABS_LO12_NC (emitted)
    311: 4,  # R_AARCH64_ADR_GOT_PAGE
    312: 4,  # R_AARCH64_LD64_GOT_LO12_NC
}
AARCH64 = Machine("aarch64", 183, True, _AARCH64_RELOCATIONS, near_only=frozenset({275}))
AARCH64_BE = Machine("aarch64_be", 183, False, _AARCH64_RELOCATIONS, near_only=frozenset({275}))

MACHINES: dict[str, Machine] = {"x86_64": X86_64, "amd64": X86_64, "aarch64": AARCH64, "arm64": AARCH64,
                                "aarch64_be": AARCH64_BE}
"""LLVM triple architecture -> its `Machine`; an architecture not listed has no load check."""


def machine_of_triple(triple: str) -> Machine | None:
    """The `Machine` of an LLVM target triple (``x86_64-unknown-linux-gnu``), None for one without a table."""
    return MACHINES.get(triple.split("-", 1)[0].lower())
