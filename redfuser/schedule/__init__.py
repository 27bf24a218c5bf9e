"""The scheduling pass: Loop IR -> Tile IR (ARCHITECTURE.md sections 3 and 6).

`schedule_program(program, options)` tiles every loop nest and fused loop of a
verified Loop IR program into kernels. A kernel's options come from
`KernelOptions.schedule_options` over its backend's `DEFAULTS` entry (`with_overrides`);
`options_for("cpu" | "gpu", overrides)` is the same for tests and scripts.
"""
from .options import DEFAULTS, ScheduleOptions, options_for, with_overrides
from .program import group_statements, schedule_program

__all__ = ["DEFAULTS", "ScheduleOptions", "options_for", "with_overrides", "schedule_program", "group_statements"]
