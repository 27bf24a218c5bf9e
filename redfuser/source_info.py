"""Finding the user's source line for a traced op (the first frame outside RedFuser)."""
from __future__ import annotations

import functools
import linecache
import os
import sys
from types import FrameType

from .ir.source import UNKNOWN, SourceLoc

_PKG_ROOT = os.path.dirname(os.path.abspath(__file__))
# ir/, codegen/ and runtime/ live beside redfuser/ in a source checkout and inside it
# when installed; frames from any of them are RedFuser's, not the user's.
_OWN_DIRS = tuple(
    os.path.join(root, "") for root in {_PKG_ROOT, *(os.path.join(os.path.dirname(_PKG_ROOT), d) for d in ("ir", "codegen", "runtime"))}
)


# Kernels written inside the package (the reference workloads, the fuzzer's programs)
# are user code: their lines are the ones errors and printed IR should point at.
_USER_LEVEL = (os.path.join(_PKG_ROOT, "workloads.py"), os.path.join(_PKG_ROOT, "testing", ""))


@functools.lru_cache(maxsize=4096)
def is_internal(filename: str) -> bool:
    """True for files of RedFuser's compiler itself (their frames are never the user's line)."""
    path = os.path.abspath(filename)
    return path.startswith(_OWN_DIRS) and not path.startswith(_USER_LEVEL)


def user_frame() -> FrameType | None:
    """The innermost frame of the user's code on the current stack."""
    frame = sys._getframe(1)
    while frame is not None and is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def user_loc() -> SourceLoc:
    """The user's file, line and line text for the op being traced now."""
    frame = user_frame()
    if frame is None:
        return UNKNOWN
    file, line = frame.f_code.co_filename, frame.f_lineno
    return SourceLoc(file, line, linecache.getline(file, line).rstrip("\n"))
