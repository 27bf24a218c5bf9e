"""Tile sizes and other knobs of the scheduling pass, with sound defaults per backend.

| option      | meaning                                                         | cpu | gpu |
|-------------|-----------------------------------------------------------------|-----|-----|
| `block_m`   | rows of an output tile (second-to-last tiled axis, query rows)  | 32  | 64  |
| `block_n`   | columns of an output tile; chunk length of a fused loop's axis  | 64  | 64  |
| `block_k`   | chunk length of a reduced axis (``for`` over chunks beyond it)  | 64  | 32  |
| `pow2`      | round tile sizes up to powers of two (masks cover the excess)   | no  | yes |

A kernel option of the same name (``rf.kernel(fn, block_m=32)``) overrides the default.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True, slots=True)
class ScheduleOptions:
    """The knobs `schedule_program` reads (see the module docstring)."""

    block_m: int = 32
    block_n: int = 64
    block_k: int = 64
    pow2: bool = False

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                from ..ir import ArgumentError

                raise ArgumentError(f"tile size {name} must be a positive int, got {value!r}", op="schedule")

    def tile(self, block: int, extent: int) -> int:
        """The tile length covering an axis of `extent` in blocks of `block` (at least 1)."""
        size = max(1, min(block, extent))
        return 1 << (size - 1).bit_length() if self.pow2 else size


DEFAULTS: dict[str, ScheduleOptions] = {
    "cpu": ScheduleOptions(),
    "gpu": ScheduleOptions(block_m=64, block_n=64, block_k=32, pow2=True),
}


def options_for(backend: str, overrides: dict | None = None) -> ScheduleOptions:
    """The defaults of `backend` (``cpu``; ``cuda``/``simulate`` use ``gpu``) with kernel options applied."""
    base = DEFAULTS["cpu" if backend in ("cpu", "interpret") else "gpu"]
    names = {f.name for f in fields(ScheduleOptions)}
    chosen = {k: v for k, v in (overrides or {}).items() if k in names and v is not None}
    return replace(base, **chosen)
