"""`CascadeGroup`: what the fusion engine found and did for one cascade (``lowered.groups``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Axis, Compute, OnlineState
from .separability import Decomposition, Refusal


@dataclass
class CascadeGroup:
    """One cascade of reductions over a shared axis.

    `reductions` are the members' names as in the source, in cascade order; `fused`
    is True when at least two of them run in one pass; `reason` says, in words,
    why some (or all) did not; `decompositions` gives each member's G, H, rescale
    and deferred factors (or its refusal).
    """

    reductions: tuple[str, ...]
    axis: Axis
    axis_description: str
    fused: bool = False
    reason: str | None = None
    decompositions: dict[str, Decomposition | Refusal] = field(default_factory=dict)
    fused_members: tuple[str, ...] = ()
    locals: tuple[str, ...] = ()
    states: tuple[OnlineState, ...] = ()
    epilogue: tuple[Compute, ...] = ()
    notes: tuple[str, ...] = ()
    state_of: dict[tuple[str, int], str] = field(default_factory=dict)  # (member, accumulator #) -> state

    def __repr__(self) -> str:
        return (f"CascadeGroup(reductions={self.reductions}, axis={self.axis.name}<{self.axis.extent}, "
                f"fused={self.fused}, reason={self.reason!r})")
