"""The scheduling pass: Loop IR -> Tile IR (ARCHITECTURE.md sections 3 and 6).

`schedule_program(program, options)` tiles every loop nest and fused loop of a
verified Loop IR program into kernels; `options_for(backend, kernel_options)`
gives the tile sizes a backend uses.
"""
from .options import DEFAULTS, ScheduleOptions, options_for
from .program import group_statements, schedule_program

__all__ = ["DEFAULTS", "ScheduleOptions", "options_for", "schedule_program", "group_statements"]
