"""`KernelOptions`: the options `rf.kernel` takes, typed, with their defaults, meanings and checks.

``rf.kernel(fn, block_m=64)`` builds ``KernelOptions(block_m=64)`` (or takes ``options=rf.KernelOptions(...)``).
A bad value is refused when the options are made, naming the option (and, through `KernelOptions.given`,
the user's line), not after a trace and a fusion on the first call. The later stages take what they read
from it: `schedule_options` (tile sizes, `schedule/options.py`), `gpu_options` (the SIMT lowering,
`codegen/simt/options.py`) and `llvm_opt` (the middle end before NVPTX code generation). Autotuning's
candidates are ``dataclasses.replace(options, ...)``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Callable

from .codegen.nvptx import SM_MIN_PTX
from .codegen.simt.options import GpuOptions
from .ir import ArgumentError, SourceLoc
from .schedule.options import ScheduleOptions, with_overrides


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bool(value: object) -> str | None:
    return None if isinstance(value, bool) else "True or False"


MAX_THREADS = 4096
"""The most worker threads `num_threads` may ask for (more than the cores of any host today; each thread
takes its own stack, and a million of them ended in threading's bare RuntimeError)."""


def _int_at_least(low: int, optional: bool, high: int | None = None) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        if value is None and optional:
            return None
        if _is_int(value) and value >= low and (high is None or value <= high):
            return None
        return ("None or " if optional else "") + (f"an int >= {low}" if high is None else f"an int {low}..{high}")

    return check


def _one_of(allowed: tuple[object, ...]) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        if any(value is a or (_is_int(value) and _is_int(a) and value == a) for a in allowed):
            return None
        names = [repr(a) for a in allowed]
        return ", ".join(names[:-1]) + " or " + names[-1] if len(names) < 6 else f"{names[0]} or {names[1]} to {names[-1]}"

    return check


def _sm(value: object) -> str | None:
    if value is None or (isinstance(value, str) and value in SM_MIN_PTX):
        return None
    return "None or a GPU target among " + ", ".join(SM_MIN_PTX)


def _option(default: object, meaning: str, check: Callable[[object], str | None]):
    """A field of `KernelOptions`: its default, what it means, and its check (None: good; else what is expected)."""
    return field(default=default, metadata={"meaning": meaning, "check": check})


@dataclass(frozen=True)
class KernelOptions:
    """How a kernel is compiled (each field's meaning: ``KernelOptions.meanings()``); checked when made."""

    fuse: bool = _option(True, "run the fusion engine (False: every reduction is its own pass)", _bool)
    interpret_chunk: int = _option(64, "chunk length the interpret backend runs fused loops with",
                                   _int_at_least(1, optional=False))
    block_m: int | None = _option(None, "tile rows (query rows); None: the backend's default (cpu 32; gpu: "
                                        "schedule/options.py)", _int_at_least(1, optional=True))
    block_n: int | None = _option(None, "tile columns / chunk of a fused loop's axis; None: default (64)",
                                  _int_at_least(1, optional=True))
    block_k: int | None = _option(None, "chunk of a reduced axis; None: default (cpu 64; gpu 128 for 16-bit "
                                        "dots, else 64)", _int_at_least(1, optional=True))
    whole_max: int | None = _option(None, "longest state axis a fused loop with a dot keeps whole (attention's "
                                          "head dimension); longer ones are tiled across the grid by block_n; "
                                          "None: the backend's (cpu 512, gpu 256; schedule/options.py)", _int_at_least(1, optional=True))
    num_threads: int = _option(0, "cpu: worker threads splitting the grid; 0: one per core",
                               _int_at_least(0, optional=False, high=MAX_THREADS))
    split: int | None = _option(None, "slices of a fused loop's axis across programs (flash decoding); None: "
                                      "automatic", _int_at_least(1, optional=True))
    num_warps: int | None = _option(None, "cuda/simulate: warps per block; None: codegen/simt/plan.py (4, up to "
                                          "16 a big tile)", _one_of((None, 1, 2, 4, 8, 16)))
    min_blocks_per_sm: int | None = _option(None, "cuda/simulate: build for this many blocks an SM (.minnctapersm; "
                                                  "caps registers)", _one_of((None,) + tuple(range(1, 33))))
    sm: str | None = _option(None, "cuda/simulate: GPU target such as 'sm_80'; None: the device's, else sm_90", _sm)
    autotune: bool = _option(False, "cpu/cuda: time a few tile sizes, warps and splits on first call "
                                    "(runtime/autotune.py); REDFUSER_AUTOTUNE=1 turns it on for every kernel at "
                                    "call time without changing this option", _bool)
    skip_masked: bool | None = _option(None, "skip key blocks a causal-style mask hides: None, the backend's "
                                              "default (cpu: where a scan shows it exact for the call's values); "
                                              "True, always (exact for finite values); False, never "
                                              "(schedule/masked.py)", _one_of((None, True, False)))
    tma: bool = _option(True, "cuda/simulate on sm_90a: load wgmma operand tiles with the tensor memory "
                              "accelerator where it can (codegen/simt/tma.py); False: the threads stage them", _bool)
    tma_stages: int = _option(2, "cuda/simulate on sm_90a: tiles a TMA staging point in a loop cycles through "
                                 "(1, 2 or 4); with more than one, each iteration issues the next one's copies "
                                 "before waiting for its own; one where the extra tiles would fit fewer blocks an "
                                 "SM (codegen/simt/tma.py)", _one_of((1, 2, 4)))
    fast_exp: bool = _option(False, "cpu/cuda/simulate: f32 exp as exp2(x * log2 e), one ex2.approx.ftz on a GPU "
                                    "(FlashAttention's numerics: relative error up to 2**-22 + 1.5 |x| 2**-24, "
                                    "results below 2**-126 flushed to 0); False: numpy's accuracy (about 2 ulp)",
                             _bool)
    shifted_exp: bool | None = _option(None, "f32 exp(x - max) (a softmax's, an online softmax's rescale) by an "
                                              "exp of arguments at most 0: one ex2.approx(x * log2 e) on a GPU, "
                                              "a shorter scaling on the cpu; within the tolerance rule, "
                                              "subnormals kept (schedule/shifted_exp.py); None: the default "
                                              "(on); False: every exp accurate", _one_of((None, True, False)))
    prefetch: bool = _option(False, "cuda/simulate: load tensor-core operands a loop iteration ahead "
                                    "(schedule/prefetch.py)", _bool)
    llvm_opt: int | None = _option(None, "cuda/simulate: None, RedFuser's middle end; 1-3, LLVM's O1-O3 "
                                         "(codegen/nvptx.py)", _one_of((None, 1, 2, 3)))

    def __post_init__(self) -> None:
        self._check(None)

    def _check(self, loc: SourceLoc | None) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            expected = f.metadata["check"](value)
            if expected is not None:
                raise ArgumentError(f"option {f.name} must be {expected}, got {value!r}", op="kernel", loc=loc)

    @classmethod
    def given(cls, given: Mapping[str, object], loc: SourceLoc | None = None) -> KernelOptions:
        """The options with `given` ones applied over the defaults; `ArgumentError` at `loc` naming the first
        unknown option or bad value."""
        unknown = sorted(set(given) - set(cls.names()))
        if unknown:
            raise ArgumentError(f"unknown option(s) {', '.join(unknown)}; known options: "
                                f"{', '.join(sorted(cls.names()))}", op="kernel", loc=loc)
        for name, value in given.items():   # checked here to point at `loc`; __post_init__ checks again
            expected = cls.__dataclass_fields__[name].metadata["check"](value)
            if expected is not None:
                raise ArgumentError(f"option {name} must be {expected}, got {value!r}", op="kernel", loc=loc)
        return cls(**given)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every option's name, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def meanings(cls) -> dict[str, str]:
        """What each option means, by name."""
        return {f.name: f.metadata["meaning"] for f in fields(cls)}

    def as_dict(self) -> dict[str, object]:
        """Every option by name (what the autotuner's key and the compile caches record)."""
        return asdict(self)

    def schedule_options(self, defaults: ScheduleOptions, workers: Callable[[], int]) -> ScheduleOptions:
        """The scheduling pass's options: a backend's `defaults` with the tile options set here applied, and
        `workers()` (programs the target runs at once: `redfuser.backends`)."""
        return with_overrides(defaults, self.as_dict(), workers)

    def gpu_options(self, default_sm: Callable[[], str]) -> GpuOptions:
        """The SIMT lowering's options: ``sm`` (None: `default_sm()`, the device's or sm_90), ``num_warps``,
        ``min_blocks_per_sm``, ``tma``, ``tma_stages``."""
        return GpuOptions(sm=self.sm or default_sm(), num_warps=self.num_warps,
                          min_blocks_per_sm=self.min_blocks_per_sm, tma=self.tma, tma_stages=self.tma_stages)


DEFAULT_OPTIONS = KernelOptions()
"""Every option at its default value."""
