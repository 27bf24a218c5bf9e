"""The options `rf.kernel` takes: their defaults, and the check each value gets when the kernel is made.

A bad value is refused by `rf.kernel(...)` itself, naming the option and the user's line, not after a
trace and a fusion on the first call. The later stages read the same names (`schedule/options.py` for
tile sizes, `codegen/simt/options.py` for the GPU lowering), whose own checks stay as a second line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .ir import ArgumentError, SourceLoc


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bool(value: object) -> str | None:
    return None if isinstance(value, bool) else "True or False"


def _int_at_least(low: int, optional: bool) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        if value is None and optional:
            return None
        if _is_int(value) and value >= low:
            return None
        return ("None or " if optional else "") + f"an int >= {low}"

    return check


def _one_of(allowed: tuple[object, ...]) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        if any(value is a or (_is_int(value) and _is_int(a) and value == a) for a in allowed):
            return None
        names = [repr(a) for a in allowed]
        return ", ".join(names[:-1]) + " or " + names[-1] if len(names) < 6 else f"{names[0]} or {names[1]} to {names[-1]}"

    return check


def _sm(value: object) -> str | None:
    from .codegen.nvptx import SM_MIN_PTX

    if value is None or (isinstance(value, str) and value in SM_MIN_PTX):
        return None
    return "None or a GPU target among " + ", ".join(SM_MIN_PTX)


@dataclass(frozen=True)
class Option:
    """One kernel option: its default, what it means, and its check (None: good; else what is expected)."""

    default: object
    meaning: str
    check: Callable[[object], str | None]


OPTIONS: dict[str, Option] = {
    "fuse": Option(True, "run the fusion engine (False: every reduction is its own pass)", _bool),
    "interpret_chunk": Option(64, "chunk length the interpret backend runs fused loops with",
                              _int_at_least(1, optional=False)),
    "block_m": Option(None, "tile rows (query rows); None: the backend's default (cpu 32; gpu: "
                            "schedule/options.py)", _int_at_least(1, optional=True)),
    "block_n": Option(None, "tile columns / chunk of a fused loop's axis; None: default (64)",
                      _int_at_least(1, optional=True)),
    "block_k": Option(None, "chunk of a reduced axis; None: default (cpu 64; gpu 128 for 16-bit dots, else 64)",
                      _int_at_least(1, optional=True)),
    "num_threads": Option(0, "cpu: worker threads splitting the grid; 0: one per core",
                          _int_at_least(0, optional=False)),
    "split": Option(None, "slices of a fused loop's axis across programs (flash decoding); None: automatic",
                    _int_at_least(1, optional=True)),
    "num_warps": Option(None, "cuda/simulate: warps per block; None: codegen/simt/plan.py (4, up to 16 a big "
                              "tile)", _one_of((None, 1, 2, 4, 8, 16))),
    "min_blocks_per_sm": Option(None, "cuda/simulate: build for this many blocks an SM (.minnctapersm; caps "
                                      "registers)", _one_of((None,) + tuple(range(1, 33)))),
    "sm": Option(None, "cuda/simulate: GPU target such as 'sm_80'; None: the device's, else sm_90", _sm),
    "autotune": Option(False, "cpu/cuda: time a few tile sizes, warps and splits on first call "
                              "(runtime/autotune.py)", _bool),
    "skip_masked": Option(False, "skip key blocks a causal-style mask hides (exact for finite values; "
                                 "schedule/masked.py)", _bool),
    "prefetch": Option(False, "cuda/simulate: load tensor-core operands a loop iteration ahead "
                              "(schedule/prefetch.py)", _bool),
    "llvm_opt": Option(None, "cuda/simulate: None, RedFuser's middle end; 1-3, LLVM's O1-O3 (codegen/nvptx.py)",
                       _one_of((None, 1, 2, 3))),
}

KNOWN_OPTIONS: dict[str, object] = {name: o.default for name, o in OPTIONS.items()}
"""Every option with its default value."""


def checked_options(given: dict[str, object], loc: SourceLoc | None = None) -> dict[str, object]:
    """Every option, `given` ones checked and applied over the defaults; `ArgumentError` naming the first
    unknown option or bad value."""
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise ArgumentError(f"unknown option(s) {', '.join(unknown)}; known options: {', '.join(sorted(OPTIONS))}",
                            op="kernel", loc=loc)
    for name, value in given.items():
        expected = OPTIONS[name].check(value)
        if expected is not None:
            raise ArgumentError(f"option {name} must be {expected}, got {value!r}", op="kernel", loc=loc)
    return {**KNOWN_OPTIONS, **given}
