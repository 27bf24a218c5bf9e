"""Every environment variable RedFuser reads, in one place, typed.

- ``REDFUSER_BACKEND``: default backend of kernels that do not name one
  (``auto``, ``interpret``, ``cpu``, ``cuda``, ``simulate``); default ``auto``.
- ``REDFUSER_DUMP_DIR``: when set, every compiled kernel writes each stage's
  text to ``<dir>/<kernel>/<specialization>/<NN-stage>.txt`` (`Lowered.specialization`: a digest of the
  backend, options and traced program, so that each compile has a folder of its own).
- ``REDFUSER_CACHE``: ``0`` turns the on-disk compile cache off (default on).
- ``REDFUSER_CACHE_DIR``: where the on-disk cache lives (default
  ``$XDG_CACHE_HOME/redfuser`` or ``~/.cache/redfuser``).
- ``REDFUSER_UPDATE_SNAPSHOTS``: ``1`` makes the snapshot tests (generated SIMT IR
  and PTX under ``tests/snapshots``) rewrite the snapshots instead of comparing.
- ``REDFUSER_AUTOTUNE``: ``1`` makes every kernel autotune its tile sizes, warps
  and split on first call, as the ``autotune=True`` kernel option does (default
  off; see ``runtime/autotune.py``).
- ``HYPOTHESIS_PROFILE``: the hypothesis profile the test suite runs with
  (``ci``, quick, the default; ``fuzz``, long); see ``tests/conftest.py``.
- ``OUT``: a folder the benchmark scripts (``benchmarks/gpu_check.py``) also
  write their table and JSON results into, when set (the device machine's
  folder whose files come back).
"""
from __future__ import annotations

import os
from pathlib import Path

BACKENDS = ("auto", "interpret", "cpu", "cuda", "simulate")


def default_backend() -> str:
    """The backend from ``REDFUSER_BACKEND`` (lower-cased), or ``auto``."""
    return os.environ.get("REDFUSER_BACKEND", "auto").strip().lower() or "auto"


def dump_dir() -> Path | None:
    """The folder to dump every stage's text into, or None."""
    value = os.environ.get("REDFUSER_DUMP_DIR", "").strip()
    return Path(value) if value else None


def cache_enabled() -> bool:
    """False when ``REDFUSER_CACHE=0`` (or ``false``/``off``)."""
    return os.environ.get("REDFUSER_CACHE", "1").strip().lower() not in ("0", "false", "off", "no")


def cache_dir() -> Path:
    """The on-disk compile cache folder."""
    explicit = os.environ.get("REDFUSER_CACHE_DIR", "").strip()
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "redfuser"


def autotune_enabled() -> bool:
    """True when ``REDFUSER_AUTOTUNE`` is ``1`` (or ``true``/``yes``/``on``): every kernel autotunes."""
    return os.environ.get("REDFUSER_AUTOTUNE", "").strip().lower() in ("1", "true", "yes", "on")


def hypothesis_profile() -> str:
    """The hypothesis profile for the test suite from ``HYPOTHESIS_PROFILE``, or ``ci``."""
    return os.environ.get("HYPOTHESIS_PROFILE", "").strip().lower() or "ci"


def update_snapshots() -> bool:
    """True when ``REDFUSER_UPDATE_SNAPSHOTS`` is ``1`` (or ``true``/``yes``/``on``)."""
    return os.environ.get("REDFUSER_UPDATE_SNAPSHOTS", "").strip().lower() in ("1", "true", "yes", "on")


def results_dir() -> Path | None:
    """The folder from ``OUT`` that benchmark scripts write their results into, or None."""
    value = os.environ.get("OUT", "").strip()
    return Path(value) if value else None
