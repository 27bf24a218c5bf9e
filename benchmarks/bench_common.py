"""Helpers shared by the benchmark scripts."""
from __future__ import annotations

import os

from redfuser.runtime.cache import reset_default_cache


class CacheFolder:
    """``REDFUSER_CACHE_DIR`` pointed at `folder` (and the process's cache object renewed) for a while.

    The benchmarks measure cold, warm and on-disk compiles, so they need a cache of their own; setting the
    variable is how a user points RedFuser at one too (`redfuser.config.cache_dir` reads it).
    """

    def __init__(self, folder: str) -> None:
        self.folder, self.old = folder, None

    def __enter__(self) -> "CacheFolder":
        self.old = os.environ.get("REDFUSER_CACHE_DIR")
        os.environ["REDFUSER_CACHE_DIR"] = self.folder
        reset_default_cache()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.old is None:
            os.environ.pop("REDFUSER_CACHE_DIR", None)
        else:
            os.environ["REDFUSER_CACHE_DIR"] = self.old
        reset_default_cache()
