"""One SIMT kernel's LLVM IR and PTX in the compile cache: `lookup` and `store`, the GPU backends' ``llvm`` and
``ptx`` stages' cache (`codegen.simt.ptx.emit_llvm` and `compile_ptx`, wired in `redfuser.backends`).

The key is the kernel's printed SIMT IR (the last text before emission, so a hit skips the LLVM emission
too), the ``llvm_opt`` level, the target and the versions (RedFuser's source fingerprint covers the
emitter). `lookup` is the first half of `CompileCache.fetch`, in the ``llvm`` stage; `store`, for a
kernel it missed, the second half (`CompileCache.fill`), in the ``ptx`` stage: the cache's statistics,
checks and warnings are those of one fetch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import llvmlite

from ..codegen.timing import timed_part
from ..ir.simt.nodes import SimtKernel
from . import ptx_payload
from .cache import CacheKey, CompileCache, default_cache


@dataclass(frozen=True)
class Entry:
    """Where one kernel's LLVM IR and PTX go in the compile cache (`lookup`'s handle for `store`)."""

    cache: CompileCache
    key: CacheKey
    kernel: str
    sm: str

    def check(self, payload: bytes) -> str | None:
        """Why a payload read from disk is not this kernel's (`ptx_payload.problem`), or None."""
        return ptx_payload.problem(payload, self.kernel, self.sm)

    @property
    def describe(self) -> str:
        return f"PTX of kernel {self.kernel} for {self.sm}"


def lookup(kernel: SimtKernel, sm: str, opt_level: int | None = None) -> tuple[Entry, tuple[str, str] | None]:
    """`kernel`'s cache entry, and its ``(llvm_ir, ptx)`` when the cache has it. The seconds of the key
    (printing the SIMT IR) go to the parts being recorded as ``cache key``. An entry read from disk is used
    only if `ptx_payload.problem` finds nothing wrong with it (else it reads as a miss, with a
    `CacheWarning` at the user's call, and `store` rebuilds it), so a bad one never reaches the driver or
    a printed stage."""
    options = {} if opt_level is None else {"llvm_opt": opt_level}
    with timed_part("cache key"):
        key = CacheKey.build(artifact="llvm+ptx", stage=str(kernel), options=options, target=sm)
    entry = Entry(default_cache(), key, kernel.name, sm)
    payload = entry.cache.get(key, check=entry.check, describe=entry.describe)
    return entry, None if payload is None else ptx_payload.decode(payload)


def store(entry: Entry, llvm_ir: str, make_ptx: Callable[[], str]) -> str:
    """The PTX of an `entry` that `lookup` missed: ``make_ptx()``'s, stored with `llvm_ir`, or the PTX
    another process stored there meanwhile."""
    fetched = entry.cache.fill(entry.key, lambda: ptx_payload.encode(llvm_ir, make_ptx()),
                               {"llvmlite": llvmlite.__version__}, check=entry.check, describe=entry.describe)
    return ptx_payload.decode(fetched.payload)[1]


__all__ = ["Entry", "lookup", "store"]
