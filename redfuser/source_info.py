"""Finding the user's source line for a traced op (the first frame outside RedFuser).

The helpers live in `redfuser.ir.source` (so `runtime` can use them without
importing this package); this module keeps the names where the tracer and the
ops have always imported them from.
"""
from __future__ import annotations

from .ir.source import UNKNOWN, SourceLoc, is_internal, user_frame, user_loc

__all__ = ["UNKNOWN", "SourceLoc", "is_internal", "user_frame", "user_loc"]
