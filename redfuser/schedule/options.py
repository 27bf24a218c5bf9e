"""Tile sizes and other knobs of the scheduling pass, with sound defaults per backend.

| option      | meaning                                                         | cpu | gpu |
|-------------|-----------------------------------------------------------------|-----|-----|
| `block_m`   | rows of an output tile (second-to-last tiled axis, query rows)  | 32  | 64  |
| `block_n`   | columns of an output tile; chunk length of a fused loop's axis  | 64  | 64  |
| `block_k`   | chunk length of a reduced axis (``for`` over chunks beyond it)  | 64  | 32  |
| `pow2`      | round tile sizes up to powers of two (masks cover the excess)   | no  | yes |
| `split`     | slices of a fused loop's axis run by separate programs (flash   | auto| auto|
|             | decoding); None: automatic (`split.auto_split`), 1: never       |     |     |
| `workers`   | programs the target runs at once, for the automatic split       | cores | SMs |
| `skip_masked` | stop a fused loop after the last chunk its rows' mask lets    | no  | no  |
|             | through (causal attention; `masked.py`: exact for finite values)|     |     |

A kernel option of the same name (``rf.kernel(fn, block_m=32)``) overrides the default.
`workers` comes from the machine: the ``num_threads`` option or the core count on
the CPU; the device's SM count for GPU schedules, or 132 (an H200) when no device
is present to ask.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True, slots=True)
class ScheduleOptions:
    """The knobs `schedule_program` reads (see the module docstring)."""

    block_m: int = 32
    block_n: int = 64
    block_k: int = 64
    pow2: bool = False
    split: int | None = None
    workers: int = 1
    skip_masked: bool = False

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k", "workers") + (("split",) if self.split is not None else ()):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                from ..ir import ArgumentError

                raise ArgumentError(f"{name} must be a positive int, got {value!r}", op="schedule")

    def tile(self, block: int, extent: int) -> int:
        """The tile length covering an axis of `extent` in blocks of `block` (at least 1)."""
        size = max(1, min(block, extent))
        return 1 << (size - 1).bit_length() if self.pow2 else size


DEFAULTS: dict[str, ScheduleOptions] = {
    "cpu": ScheduleOptions(),
    "gpu": ScheduleOptions(block_m=64, block_n=64, block_k=32, pow2=True),
}


WHOLE_MAX = 128
"""A state axis that is neither the fused axis nor shared by every state (GEMM's output columns,
attention's head dimension) stays whole in the tile up to this extent (and ``block_n``); a longer
one is tiled by ``block_n`` across an extra grid dimension (see `layout.py`)."""


GPU_PLANNING_SMS = 132
"""SMs a GPU schedule plans for when no device can be asked (an H200)."""


def gpu_workers() -> int:
    """The SM count of device 0, or `GPU_PLANNING_SMS` without a usable device."""
    try:
        from ..runtime.device import device_available, device_info

        if device_available():
            return max(1, int(device_info(0).sm_count))
    except Exception:  # no driver, a broken install: plan for the default GPU
        pass
    return GPU_PLANNING_SMS


def options_for(backend: str, overrides: dict | None = None) -> ScheduleOptions:
    """The defaults of `backend` (``cpu``; ``cuda``/``simulate`` use ``gpu``) with kernel options applied."""
    cpu = backend in ("cpu", "interpret")
    base = DEFAULTS["cpu" if cpu else "gpu"]
    names = {f.name for f in fields(ScheduleOptions)}
    chosen = {k: v for k, v in (overrides or {}).items() if k in names and v is not None}
    if "workers" not in chosen:
        threads = int((overrides or {}).get("num_threads") or 0)
        chosen["workers"] = (threads or os.cpu_count() or 1) if cpu else gpu_workers()
    return replace(base, **chosen)
