"""Source locations: where in the user's program an IR node came from."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SourceLoc:
    """A user's file, line and the text of that line (for error messages and printers)."""

    file: str
    line: int
    text: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def short(self) -> str:
        """``name.py:12``: the file's base name and line, for printed IR."""
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"


UNKNOWN = SourceLoc("<unknown>", 0, "")
