"""The knobs of the Tile IR -> SIMT IR lowering.

| option          | meaning                                                                 | default |
|-----------------|-------------------------------------------------------------------------|---------|
| `sm`            | the GPU generation lowered for: tensor-core FP8 and f8 conversions need | sm_90   |
|                 | sm_89+, so the SIMT program (not only the PTX) depends on it; `sm_90a`    |         |
|                 | puts tensor-core dots on Hopper's wgmma (`wgmma.py`)                      |         |
| `num_warps`     | warps per block (fewer when a kernel's tiles are small); None: 4, or for | None    |
|                 | a kernel without products or loops enough that a thread holds at most    |         |
|                 | `plan.ELEMENTS_PER_THREAD` of its largest tile (up to 16)                |         |
| `min_blocks_per_sm` | blocks an SM the kernel is built for: ptxas caps registers at what   | None    |
|                 | that many blocks leave a thread (CUDA's ``__launch_bounds__``; spills    |         |
|                 | possible); None: ptxas's choice                                          |         |
| `tma`           | on ``sm_90a``, wgmma operand tiles loaded by the tensor memory          | True    |
|                 | accelerator (a box copy into the swizzled tile, completed on an          |         |
|                 | mbarrier) where the operand is a plain load of a dense buffer's rows     |         |
|                 | (`tma.py`); else (and with False) the threads load and stage them        |         |
| `tma_stages`    | tiles a TMA staging point in a loop cycles through (1, 2 or 4): with more| 2       |
|                 | than one, each iteration issues the next one's copies before it waits   |         |
|                 | for its own (a ring); the lowering drops to one where the extra tiles    |         |
|                 | would fit fewer blocks an SM (`kernel.py`)                               |         |
"""
from __future__ import annotations

from dataclasses import dataclass

from ...ir.errors import ArgumentError
from ..nvptx import sm_number


@dataclass(frozen=True, slots=True)
class GpuOptions:
    """See the module docstring."""

    sm: str = "sm_90"
    num_warps: int | None = None
    min_blocks_per_sm: int | None = None
    tma: bool = True
    tma_stages: int = 2

    def __post_init__(self) -> None:
        sm_number(self.sm)   # BackendError on an unknown target
        if self.num_warps not in (None, 1, 2, 4, 8, 16):
            raise ArgumentError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps!r}", op="kernel")
        blocks = self.min_blocks_per_sm
        if blocks is not None and (isinstance(blocks, bool) or not isinstance(blocks, int) or not 1 <= blocks <= 32):
            raise ArgumentError(f"min_blocks_per_sm must be None or an int from 1 to 32, got {blocks!r}", op="kernel")
        if isinstance(self.tma_stages, bool) or self.tma_stages not in (1, 2, 4):
            raise ArgumentError(f"tma_stages must be 1, 2 or 4, got {self.tma_stages!r}", op="kernel")

    @property
    def sm_number(self) -> int:
        return sm_number(self.sm)
