"""Helpers shared by the benchmark scripts: their private cache folder and their command lines' checks.

The checks refuse a bad argument as an argparse error (usage, the reason, exit 2) before anything runs: a
count of 0 emptied a median (a bare traceback) or divided by zero (``inf``/``nan`` printed as results), and an
unknown ``--only`` name ran nothing and exited 0, which on a lent GPU spends the session on an empty table.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping

from redfuser.codegen.nvptx import SM_MIN_PTX
from redfuser.runtime.cache import reset_default_cache


def positive_int(text: str) -> int:
    """An argparse type for counts (``--repeats``, ``--calls``, ``--steps``...): a whole number of at least 1,
    refused as ``python -m redfuser fuzz --examples 0`` is (no median of zero runs, no time per zero calls)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type for a time budget: a number of seconds above 0 (a budget of 0 or less, or ``nan``,
    would skip every case and print an empty table as if the run had happened)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text}")
    return value


def sm_target(text: str) -> str:
    """An argparse type for ``--sm``: one of the GPU targets the compiler knows (`SM_MIN_PTX`). Checked up
    front, or every case compiles to the same cut-off error row and the script exits 0."""
    if text not in SM_MIN_PTX:
        raise argparse.ArgumentTypeError(f"unknown target {text!r}; choose one of {', '.join(SM_MIN_PTX)}")
    return text


def description(doc: str | None) -> str:
    """The first paragraph of a script's docstring, for ``--help``: its first line alone stopped mid-sentence
    where the sentence goes on to the next line."""
    paragraph = (doc or "").strip().split("\n\n")[0]
    return " ".join(paragraph.split())


def check_names(parser: argparse.ArgumentParser, option: str, given: Iterable[str], valid: Iterable[str],
                hints: Mapping[str, str] | None = None, more: str = "") -> None:
    """Refuse (``parser.error``: usage, message, exit 2) any name in `given` not among `valid`, listing the
    valid ones: an unknown name would otherwise select nothing, and the script would exit 0 having run nothing.
    `hints` says, for a name users may try (a workload's name where the rows are named otherwise), which valid
    names to use instead; `more` is appended to the message (what else the option accepts)."""
    valid = list(dict.fromkeys(valid))
    unknown = [name for name in given if name not in valid]
    if unknown:
        named = ", ".join(repr(name) + (f" ({hints[name]})" if hints and name in hints else "") for name in unknown)
        parser.error(f"argument {option}: unknown name{'s' if len(unknown) > 1 else ''} {named}; "
                     f"choose from {', '.join(valid)}{more}")


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
