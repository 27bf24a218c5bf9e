"""`timed_part`: the wall time of a piece of a compile, added to a dict of seconds by name.

The compiler times each stage with it (`Lowered.timed`, into `Lowered.timings`), and the code generators
add the time of their main steps to a ``parts`` dict the compiler hands them (`Lowered.parts`), so the
stage table (``explain --stages``) can say, say, how much of ``simt`` the verifier took. Steps run once per kernel add up over a program's kernels. Nothing is
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
