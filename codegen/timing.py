"""Where a compile's time went: `timed` adds a piece's wall time to a dict of seconds by name.

The compiler times each stage (`Lowered.timed`, into `Lowered.timings`) and, around each stage, opens
`recording_parts` with the dict of that stage's parts (`Lowered.parts[stage]`). Code generators mark
their main steps with `timed_part(name)`, which adds to the dict being recorded in the current context
(a `contextvars` context: concurrent compiles in other threads record their own), so the stage table
(``explain --stages``) can say, say, how much of ``simt`` the verifier took without a ``parts``
parameter in every signature between. Steps run once per kernel add up over a program's kernels.
Nothing is recorded outside `recording_parts` (the code generators called on their own, as the tests do).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

_RECORDING: ContextVar[dict[str, float] | None] = ContextVar("redfuser_timed_parts", default=None)


@contextmanager
def timed(seconds: dict[str, float], name: str) -> Iterator[None]:
    """Add the wall time of the ``with`` body to ``seconds[name]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start


@contextmanager
def recording_parts(parts: dict[str, float]) -> Iterator[dict[str, float]]:
    """Make `parts` the dict `timed_part` adds to for the ``with`` body (in this context)."""
    token = _RECORDING.set(parts)
    try:
        yield parts
    finally:
        _RECORDING.reset(token)


@contextmanager
def timed_part(name: str) -> Iterator[None]:
    """Add the wall time of the ``with`` body to the recorded parts' ``name`` (nothing when none are)."""
    parts = _RECORDING.get()
    if parts is None:
        yield
        return
    with timed(parts, name):
        yield


__all__ = ["recording_parts", "timed", "timed_part"]
