"""`TargetCaps`: what a target's hardware has for the dtype conversions, as data the cast ladder reads.

The host (x86/ARM through LLVM's native backend) and NVPTX emit the same numpy ``astype`` semantics;
they differ only in which conversions are one instruction and which are integer code, and in where a
cast from a wide type to a narrow one gets its single rounding. Each difference is one field here, so
`codegen.llvm_dtypes.casts` is one ladder with capability-dependent steps, never a test of a backend's
name.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TargetCaps:
    """The conversion instructions a target has.

    - `f32_to_bf16_instruction`: ``fptrunc float to bfloat`` is one instruction (PTX ``cvt.rn.bf16.f32``);
      without it, round to nearest even with integer operations on the bits.
    - `f32_to_e4m3_instruction`: ``llvm.nvvm.ff.to.e4m3x2.rn`` (PTX ``cvt.rn.satfinite.e4m3x2.f32``);
      without it, integer rounding with saturation to +-448 (NaN stays NaN).
    - `half_to_int_instruction`: ``llvm.fptosi.sat`` straight from ``half``; without it, widen to f32
      first (exact), then convert.
    - `narrows_wide_sources`: a cast from f64 or an integer to f16/bf16/e4m3 takes its one rounding here
      (through f64 and f32 rounded to odd, as numpy rounds once); when False, the lowering before the
      emitter has done that, and what arrives converts directly.
    """

    name: str
    f32_to_bf16_instruction: bool
    f32_to_e4m3_instruction: bool
    half_to_int_instruction: bool
    narrows_wide_sources: bool


HOST = TargetCaps("host", f32_to_bf16_instruction=False, f32_to_e4m3_instruction=False,
                  half_to_int_instruction=False, narrows_wide_sources=True)
"""The CPU: no bf16/e4m3 conversion instructions we can count on, no half arithmetic; and the JIT cannot
resolve ``__truncdfhf2``, the library call behind ``fptrunc double to half``, so wide sources are narrowed
in the emitted code."""

NVPTX = TargetCaps("nvptx", f32_to_bf16_instruction=True, f32_to_e4m3_instruction=True,
                   half_to_int_instruction=True, narrows_wide_sources=False)
"""NVIDIA GPUs from sm_80. The SIMT lowering (`codegen.simt.elementwise`) rounds wide sources to odd f32
before the emitter, and on sm_80/86, which lack the e4m3 ``cvt``, converts to e4m3 with integer code in
the SIMT IR itself: the casts that reach the emitter are the ones these instructions serve."""

__all__ = ["TargetCaps", "HOST", "NVPTX"]
