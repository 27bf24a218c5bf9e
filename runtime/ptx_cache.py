"""`cached_kernel_ptx`: one SIMT kernel's LLVM IR and PTX served by the compile cache.

The key is the kernel's printed SIMT IR (the last text before emission, so a hit skips the LLVM emission
too), the ``llvm_opt`` level, the target and the versions (RedFuser's source fingerprint covers the
emitter). The GPU backends' ``ptx`` stage (`codegen.simt.ptx.compile_ptx`) takes it as its ``ptx_of``
(`redfuser.backends`).
"""
from __future__ import annotations

import llvmlite

from ..codegen.simt.ptx import kernel_ptx
from ..codegen.timing import timed_part
from ..ir.simt.nodes import SimtKernel
from . import ptx_payload


def cached_kernel_ptx(kernel: SimtKernel, sm: str, opt_level: int | None = None, *,
                      verified: bool = False) -> tuple[str, str]:
    """``(llvm_ir, ptx)`` of `kernel` from the compile cache, made by `kernel_ptx` (`verified` passed on) on a
    miss. The seconds of the key (printing the SIMT IR) go to the parts being recorded as ``cache key``,
    beside `kernel_ptx`'s halves on a miss. An entry read from disk is used only if `ptx_payload.problem`
    finds nothing wrong with it (else it is rebuilt, with a `CacheWarning` at the user's call), so a bad
    one never reaches the driver."""
    from .cache import CacheKey, default_cache

    def make() -> bytes:
        return ptx_payload.encode(*kernel_ptx(kernel, sm, opt_level, verified=verified))

    options = {} if opt_level is None else {"llvm_opt": opt_level}
    with timed_part("cache key"):
        key = CacheKey.build(artifact="llvm+ptx", stage=str(kernel), options=options, target=sm)
    fetched = default_cache().fetch(key, make, {"llvmlite": llvmlite.__version__},
                                    check=lambda payload: ptx_payload.problem(payload, kernel.name, sm),
                                    describe=f"PTX of kernel {kernel.name} for {sm}")
    return ptx_payload.decode(fetched.payload)


__all__ = ["cached_kernel_ptx"]
