"""Compile-cache keys: a stable sha256 over everything that decides a compiled artifact.

A key is built from five parts:

- ``artifact``: what is being produced (``"cpu-object"``, ``"ptx"``...), so the
  same IR compiled to two different products never shares an entry;
- ``stage``: the text (or bytes) of the IR the expensive step starts from, e.g.
  the printed Tile IR or the LLVM IR. Key on the *last* text stage before the
  expensive step, so a change anywhere upstream changes the key;
- ``options``: a dict of compile options (tile sizes, opt level, fast-math...);
- ``target``: ``"x86_64-unknown-linux-gnu/skylake"``, ``"sm_90"``...;
- ``versions``: RedFuser's ``__version__``, llvmlite's, LLVM's, and a
  fingerprint of RedFuser's own source files (see `source_fingerprint`), so a
  release bump *or* an edited compiler in a development tree never reads an
  entry that an older compiler wrote.

The digest is sha256 of one canonical JSON document (sorted keys, no
whitespace, ASCII only) holding the parts, with the stage text replaced by its
own sha256. Nothing uses Python's `hash()`, so the digest is the same in every
process, on every run, and on every machine with the same versions.
"""
from __future__ import annotations

import enum
import functools
import hashlib
import importlib.util
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..ir.errors import InternalError

# Bump when the way parts are encoded into the digest changes.
KEY_SCHEMA = 1

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, slots=True)
class CacheKey:
    """A compile-cache key: a 64-character lowercase sha256 hex digest.

    Build one with `CacheKey.build`; `CacheKey(digest)` re-creates one from a
    digest (checked). `describe` is a short human summary for messages and
    entry metadata; it is not part of equality.
    """

    digest: str
    describe: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if len(self.digest) != 64 or not set(self.digest) <= _HEX:
            raise InternalError(f"cache key digest must be 64 lowercase hex characters, got {self.digest!r}")

    def __str__(self) -> str:
        return self.digest

    @classmethod
    def build(
        cls,
        *,
        artifact: str,
        stage: str | bytes,
        options: Mapping[str, object],
        target: str,
        versions: Mapping[str, str] | None = None,
    ) -> CacheKey:
        """The key of `artifact` compiled from `stage` with `options` for `target`.

        `versions` defaults to `default_versions()`; pass an explicit mapping in
        tests or to pin a key. Option values may be str, int, float, bool, None,
        lists/tuples, str-keyed dicts, numpy scalars/dtypes and enums; anything
        else is an `InternalError` (its text would not be stable across runs).
        """
        stage_bytes = stage.encode("utf-8") if isinstance(stage, str) else bytes(stage)
        document = {
            "schema": KEY_SCHEMA,
            "artifact": str(artifact),
            "target": str(target),
            "options": _canonical(dict(options), "options"),
            "versions": _canonical(dict(default_versions() if versions is None else versions), "versions"),
            "stage_sha256": hashlib.sha256(stage_bytes).hexdigest(),
        }
        text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
        digest = hashlib.sha256(text.encode("ascii")).hexdigest()
        return cls(digest, f"{artifact} for {target}")


def _canonical(value: object, where: str) -> object:
    """`value` as plain JSON data whose text is the same in every process."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)  # int subclasses (IntEnum is handled below) print as plain ints
    if isinstance(value, float):
        # JSON has no inf/nan; tag them so 1e999 and "inf" (a string option) stay distinct.
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, enum.Enum):
        return {"enum": f"{type(value).__module__}.{type(value).__qualname__}.{value.name}"}
    if isinstance(value, np.dtype):
        return {"dtype": value.str if value.names is None else str(value.descr)}
    if isinstance(value, type) and issubclass(value, np.generic):
        return {"dtype": np.dtype(value).str}
    if isinstance(value, np.generic):
        return _canonical(value.item(), where)
    if isinstance(value, Path):
        return {"path": str(value)}
    if isinstance(value, (list, tuple)):
        return [_canonical(item, f"{where}[{n}]") for n, item in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for name, item in value.items():
            if not isinstance(name, str):
                raise InternalError(f"cache key {where}: dict keys must be str, got {name!r}")
            out[name] = _canonical(item, f"{where}.{name}")
        return out
    raise InternalError(
        f"cache key {where}: cannot encode a {type(value).__name__} ({value!r}) stably; "
        "convert it to str/int/float/bool/list/dict first"
    )


@functools.cache
def source_fingerprint() -> str:
    """sha256 over RedFuser's own ``.py`` files (relative path and contents).

    A development tree keeps ``__version__`` while the code generator changes;
    this fingerprint makes every edit a new key, so an old build is never
    served to a newer compiler. Computed once per process (a few ms).
    """
    sha = hashlib.sha256()
    seen: set[Path] = set()
    for package in ("redfuser", "redfuser.ir", "redfuser.codegen", "redfuser.runtime"):
        # find_spec locates the folder without running the subpackage's __init__.
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            base = Path(folder).resolve()
            for path in sorted(base.rglob("*.py")):
                if path in seen:  # a wheel nests ir/ inside redfuser/: count each file once
                    continue
                seen.add(path)
                sha.update(f"{package}/{path.relative_to(base).as_posix()}\0".encode())
                sha.update(hashlib.sha256(path.read_bytes()).digest())
    return sha.hexdigest()


@functools.cache
def _versions() -> tuple[tuple[str, str], ...]:
    import llvmlite
    import llvmlite.binding as llvm

    import redfuser  # local: runtime must not import redfuser while redfuser is importing it

    return (
        ("redfuser", str(getattr(redfuser, "__version__", "unknown"))),
        ("redfuser_src", source_fingerprint()),
        ("llvmlite", str(llvmlite.__version__)),
        ("llvm", ".".join(str(part) for part in llvm.llvm_version_info)),
    )


def default_versions() -> dict[str, str]:
    """The versions every key includes: RedFuser, its sources, llvmlite and LLVM (a fresh dict)."""
    return dict(_versions())
