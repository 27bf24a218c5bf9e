"""A work-around for an x86 code-generation bug of LLVM 22.1: sign-bit masks read from the wrong register.

On an AVX-512 host (DQ and BW), the back end moves a vector's sign bits to a general register as two EVEX
instructions, ``vpmovd2m %xmm24, %k1`` then ``kmovd %k1, %edx``. LLVM 22's EVEX compression pass, which runs
after register allocation, folds such a pair into the one VEX instruction ``vmovmskps %xmm24, %edx`` (and
``vpmovb2m``/``vpmovw2m``/``vpmovq2m`` likewise into ``vpmovmskb``/``vmovmskpd``) without checking the register:
VEX encodes only xmm0-15, and the object holds ``vmovmskps %xmm8, %edx``, the sign bits of whatever xmm8 holds
(llvm-project issue 191304). Found by a helper porting a training loss: the SLP vectorizer turned four rows of a
label gather's ``labels % 33`` fix-up into such a sign test, the register allocator happened to use xmm24, and
rows 3-6 of 7 read column 32 for every label (1-2% off the loss, only on ``cpu``, only with AVX-512). The
assembly text shows the register LLVM meant, so it tells such an instruction apart.

`may_hold_movmsk` looks for a VEX ``movmsk`` opcode in the object's bytes (cheap; false positives only cost the
next step), `misencoded_movmsk` for one with xmm/ymm16-31 in the assembly of the same module.
`runtime`'s compile (`codegen.native.compile_object`) then compiles the module again without AVX512DQ (no
``vpmovd2m``/``vpmovq2m`` at all), and refuses it (an internal error, never a wrong result) if a misencoded
byte or word form is still there.
"""
from __future__ import annotations

import re

_VEX_MOVMSK = re.compile(
    # 2-byte VEX (C5, register operands 0-7 after the prefix's R bit) and 3-byte VEX (C4, map 0F, W0, vvvv 1111)
    # with opcode 50 (vmovmskps/pd) or D7 (vpmovmskb), 128 or 256 bits, no prefix or 66
    rb"\xc5[\x78\x79\x7c\x7d\xf8\xf9\xfc\xfd][\x50\xd7]"
    rb"|\xc4[\x01\x21\x41\x61\x81\xa1\xc1\xe1][\x78\x79\x7c\x7d][\x50\xd7]")

_MISENCODED = re.compile(r"\bv(?:movmskp[sd]|pmovmskb)\s+%[xy]mm(?:1[6-9]|2\d|3[01])\b")


def may_hold_movmsk(obj: bytes) -> bool:
    """Whether object code `obj` may hold a VEX ``vmovmskps``/``vmovmskpd``/``vpmovmskb`` (a byte pattern: it can
    also match data or the middle of another instruction)."""
    return _VEX_MOVMSK.search(obj) is not None


def misencoded_movmsk(assembly: str) -> list[str]:
    """The lines of `assembly` that are a VEX ``movmsk`` of xmm/ymm16-31, which its encoding cannot name."""
    return [line.strip() for line in assembly.splitlines() if _MISENCODED.search(line)]


__all__ = ["may_hold_movmsk", "misencoded_movmsk"]
