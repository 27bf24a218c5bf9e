"""`Buffer`: a named array of the program, shared by every IR level (a kernel's parameters are these)."""
from __future__ import annotations

from dataclasses import dataclass

from .types import BufferType, DType


@dataclass(frozen=True, slots=True)
class Buffer:
    """A named array of the program: an input, an output or a temporary."""

    name: str
    type: BufferType

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    def __str__(self) -> str:
        return self.name
