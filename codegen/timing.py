"""`timed_part`: where a compile stage's time goes, for `Lowered.parts` (``explain --stages``).

A stage (``simt``, ``ptx``) is timed as a whole by the compiler; the code generators add the wall time of
their main steps to a ``parts`` dict the compiler hands them, so the stage table can say, say, how much
of ``simt`` the verifier took. Steps run once per kernel add up over a program's kernels. Nothing is
recorded when no dict is given (the code generators called on their own, as the tests do).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def timed_part(parts: dict[str, float] | None, name: str) -> Iterator[None]:
    """Add the wall time of the ``with`` body to ``parts[name]`` (nothing when `parts` is None)."""
    if parts is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        parts[name] = parts.get(name, 0.0) + time.perf_counter() - start


__all__ = ["timed_part"]
