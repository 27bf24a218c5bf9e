"""Source locations: where in the user's program an IR node came from, and finding the user's frame.

`user_frame`/`user_loc` walk the stack to the first frame outside RedFuser's own
code (errors, traced ops and compile-cache warnings point there). They live here,
in `ir` (which depends on nothing of ours), so `runtime` can use them too;
`redfuser.source_info` re-exports them.
"""
from __future__ import annotations

import functools
import linecache
import os
import sys
from dataclasses import dataclass
from types import FrameType


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


def _own_folders() -> tuple[tuple[str, ...], str]:
    """RedFuser's code folders and its package root (`redfuser/`), in either layout."""
    ir_dir = os.path.dirname(os.path.abspath(__file__))
    parent = os.path.dirname(ir_dir)
    if os.path.isfile(os.path.join(parent, "__init__.py")):   # installed: ir/ inside the redfuser package
        return (os.path.join(parent, ""),), parent
    # a source checkout (editable install): redfuser/, ir/, codegen/, runtime/ side by side
    folders = tuple(os.path.join(parent, name, "") for name in ("redfuser", "ir", "codegen", "runtime"))
    return folders, os.path.join(parent, "redfuser")


_OWN_DIRS, _PKG_ROOT = _own_folders()
# Kernels written inside the package (the reference workloads, the fuzzer's programs)
# are user code: their lines are the ones errors and printed IR should point at.
_USER_LEVEL = (os.path.join(_PKG_ROOT, "workloads.py"), os.path.join(_PKG_ROOT, "testing", ""))


@functools.lru_cache(maxsize=4096)
def is_internal(filename: str) -> bool:
    """True for files of RedFuser's compiler itself (their frames are never the user's line), and for Python's
    frozen modules (``<frozen runpy>`` runs ``python -m redfuser``: no user wrote that line either)."""
    if filename.startswith("<frozen "):
        return True
    path = os.path.abspath(filename)
    return path.startswith(_OWN_DIRS) and not path.startswith(_USER_LEVEL)


def user_frame() -> FrameType | None:
    """The innermost frame of the user's code on the current stack (None when there is none)."""
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


def warn_at_user(message: str, category: type[Warning]) -> None:
    """Warn with `category`, shown at the user's line (the first frame outside RedFuser) as `warnings.warn`
    would show its caller's."""
    import warnings

    frame = user_frame()
    if frame is None:
        warnings.warn(message, category, stacklevel=2)
        return
    # No module_globals: like warnings.warn, the line's text comes from the file (a `python -c` main
    # module's loader cannot give it and would raise).
    globals_ = frame.f_globals
    warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                           module=globals_.get("__name__", "<string>"),
                           registry=globals_.setdefault("__warningregistry__", {}))
