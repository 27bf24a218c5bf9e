"""The compile cache: compiled artifacts (object code, PTX...) as bytes, in memory and on disk.

Layers. `CompileCache.get` looks in a per-process memory layer (an LRU bounded
in bytes) and then on disk; `get_or_build` builds on a miss and stores in both.
The API is bytes in, bytes out and knows nothing of any backend; a key comes
from `cache_key.CacheKey.build` (IR text, options, target, versions).

On disk. ``<dir>/<digest[:2]>/<digest>.bin``, one file per entry: a header
(magic, format version, the key's digest, payload length, sha256 of the body),
JSON metadata, the payload. `cache_entry` defines the format.

Reading checks every field: a short or over-long file, a wrong magic, another
key's digest or a checksum mismatch is *corrupt* (a `CacheWarning`, the file is
removed, the artifact rebuilt and re-stored); another format version is *stale*
(logged, rebuilt). A bad entry therefore costs one rebuild, never a crash and
never a wrong artifact. A release bump or an edited compiler changes the key
itself (versions are part of it), so old entries are simply never looked up.

Atomicity. A write goes to ``.<digest[:16]>.<random>.tmp`` in the entry's
folder, then `os.replace` renames it over the entry, so a reader sees the old
file or the new one, whole. A crash mid-write leaves only a temp file, which
nothing reads; temp files older than an hour are swept when that folder is next
written. There is no fsync: after a power loss the checksum catches a torn file.

Two processes. Before building, a process takes an advisory `fcntl.flock` on
``<digest>.lock`` (polled, `lock_timeout_s`), then looks on disk again, so the
second process usually reads what the first built. Without the lock (timeout,
no fcntl, an unopenable lock file) both build and the last `os.replace` wins;
both entries are valid, so either is fine. Lock files are left in place:
removing one while another process waits on it would break the exclusion.

Degrading. ``REDFUSER_CACHE=0`` makes `default_cache` memory-only. A cache folder
that cannot be created or written turns the cache memory-only with one
`CacheWarning`; unreadable entries count as misses.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from ..ir.errors import InternalError
from . import cache_entry
from .cache_entry import BadEntry, decode_entry, encode_entry
from .cache_key import CacheKey

__all__ = ["CacheKey", "CacheStats", "CacheWarning", "CompileCache", "Fetched", "default_cache", "reset_default_cache"]

log = logging.getLogger("redfuser.cache")

TEMP_MAX_AGE_S = 3600.0


class CacheWarning(RuntimeWarning):
    """The compile cache hit a problem it worked around (corrupt entry, unwritable folder)."""


@dataclass(slots=True)
class CacheStats:
    """Counters of one `CompileCache`; `CompileCache.stats` returns a copy."""

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0          # lookups neither layer served at first look
    builds: int = 0          # build callbacks run by get_or_build
    writes: int = 0          # entries written to disk
    corrupt: int = 0         # corrupt entries found (each then rebuilt)
    stale: int = 0           # entries of another format version found
    write_failures: int = 0
    lock_timeouts: int = 0


@dataclass(frozen=True, slots=True)
class Fetched:
    """What `CompileCache.fetch` returns: the payload, which layer served it and how long it took."""

    payload: bytes
    source: str  # "memory", "disk" or "build"
    seconds: float


class CompileCache:
    """A byte-oriented compile cache: a memory LRU in front of an optional disk folder.

    `directory=None` keeps it memory-only. `memory_limit_bytes=0` turns the
    memory layer off (every lookup goes to disk). `lock_timeout_s` bounds the
    wait for another process building the same key; `use_lock=False` skips the
    lock (both build, last writer wins). Thread-safe.
    """

    def __init__(
        self,
        directory: str | os.PathLike | None,
        *,
        memory_limit_bytes: int = 256 << 20,
        lock_timeout_s: float = 30.0,
        use_lock: bool = True,
    ) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.memory_limit_bytes = memory_limit_bytes
        self.lock_timeout_s = lock_timeout_s
        self.use_lock = use_lock and cache_entry.LOCK_AVAILABLE
        self._memory: OrderedDict[str, bytes] = OrderedDict()
        self._memory_bytes = 0
        self._stats = CacheStats()
        self._mutex = threading.Lock()
        self._writable = self.directory is not None
        self._swept: set[str] = set()

    def __repr__(self) -> str:
        where = "memory only" if self.directory is None else str(self.directory)
        return f"CompileCache({where}{'' if self.disk_writable or self.directory is None else ', read-only'})"

    @property
    def disk_writable(self) -> bool:
        """True while entries are still written to disk (False once degraded or memory-only)."""
        return self._writable

    @property
    def stats(self) -> CacheStats:
        """A copy of the counters."""
        with self._mutex:
            return replace(self._stats)

    def entry_path(self, key: CacheKey) -> Path | None:
        """Where `key`'s entry lives on disk (whether or not it exists), or None when memory-only."""
        if self.directory is None:
            return None
        return self.directory / cache_entry.entry_name(key)

    # -- lookups ---------------------------------------------------------------------------------

    def get(self, key: CacheKey) -> bytes | None:
        """The payload stored under `key`, or None; a corrupt disk entry is removed and reads as None."""
        found = self._lookup(key)
        if found is None:
            self._count("misses")
            return None
        return found[0]

    def get_or_build(self, key: CacheKey, build: Callable[[], bytes], meta: Mapping[str, object] | None = None) -> bytes:
        """The payload of `key`, running `build()` and storing its result on a miss."""
        return self.fetch(key, build, meta).payload

    def fetch(self, key: CacheKey, build: Callable[[], bytes], meta: Mapping[str, object] | None = None) -> Fetched:
        """Like `get_or_build`, also saying which layer served the payload and how long it took."""
        start = time.perf_counter()
        found = self._lookup(key)
        if found is None:
            self._count("misses")
            with self._build_lock(key) as locked:
                # Another process may have finished this key while we waited for its lock.
                found = self._lookup(key) if locked else None
                if found is None:
                    payload = self._run_build(key, build)
                    self.put(key, payload, meta)
                    found = (payload, "build")
        return Fetched(found[0], found[1], time.perf_counter() - start)

    def read_meta(self, key: CacheKey) -> dict | None:
        """The metadata of `key`'s valid disk entry, or None (no entry, memory-only, or invalid)."""
        data = self._read_file(key)
        if data is None:
            return None
        try:
            return decode_entry(key, data[0])[1]
        except BadEntry:
            return None

    def _lookup(self, key: CacheKey) -> tuple[bytes, str] | None:
        with self._mutex:
            payload = self._memory.get(key.digest)
            if payload is not None:
                self._memory.move_to_end(key.digest)
                self._stats.memory_hits += 1
                return payload, "memory"
        payload = self._read_disk(key)
        if payload is None:
            return None
        self._count("disk_hits")
        self._remember(key, payload)
        return payload, "disk"

    def _run_build(self, key: CacheKey, build: Callable[[], bytes]) -> bytes:
        self._count("builds")
        payload = build()
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise InternalError(f"compile cache: the build of {key.describe or key.digest} returned "
                                f"{type(payload).__name__}, expected bytes")
        return bytes(payload)

    # -- storing ---------------------------------------------------------------------------------

    def put(self, key: CacheKey, payload: bytes, meta: Mapping[str, object] | None = None) -> None:
        """Store `payload` under `key` in memory and (when writable) atomically on disk; never raises OSError."""
        payload = bytes(payload)
        self._remember(key, payload)
        path = self.entry_path(key)
        if path is None or not self._writable:
            return
        full_meta = {"created": time.time(), "key": key.describe, **(meta or {})}
        try:
            self._prepare_folder(path.parent)
            cache_entry.write_atomic(path, encode_entry(key, payload, full_meta))
            self._count("writes")
        except OSError as err:
            self._degrade(f"cannot write {path} ({err})")

    def _remember(self, key: CacheKey, payload: bytes) -> None:
        if self.memory_limit_bytes <= 0 or len(payload) > self.memory_limit_bytes:
            return
        with self._mutex:
            old = self._memory.pop(key.digest, None)
            self._memory_bytes += len(payload) - (len(old) if old is not None else 0)
            self._memory[key.digest] = payload
            while self._memory_bytes > self.memory_limit_bytes:
                _, evicted = self._memory.popitem(last=False)
                self._memory_bytes -= len(evicted)

    def clear(self, *, disk: bool = False) -> None:
        """Forget the memory layer; with `disk`, also delete this cache's files (only names it writes)."""
        with self._mutex:
            self._memory.clear()
            self._memory_bytes = 0
        if not disk or self.directory is None or not self.directory.is_dir():
            return
        for folder in self.directory.iterdir():
            if not cache_entry.OWN_FOLDER.fullmatch(folder.name) or not folder.is_dir():
                continue
            for path in folder.iterdir():
                if cache_entry.OWN_FILE.fullmatch(path.name):  # never delete what we did not write
                    with contextlib.suppress(OSError):
                        path.unlink()

    # -- disk details ----------------------------------------------------------------------------

    def _read_file(self, key: CacheKey) -> tuple[bytes, os.stat_result] | None:
        path = self.entry_path(key)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                return f.read(), os.fstat(f.fileno())
        except FileNotFoundError:
            return None
        except OSError as err:  # unreadable, a folder in the way...: a miss, the build goes on
            log.debug("compile cache: cannot read %s (%s)", path, err)
            return None

    def _read_disk(self, key: CacheKey) -> bytes | None:
        found = self._read_file(key)
        if found is None:
            return None
        data, stat = found
        try:
            return decode_entry(key, data)[0]
        except BadEntry as bad:
            path = self.entry_path(key)
            if bad.stale:
                self._count("stale")
                log.info("compile cache: %s is stale (%s); rebuilding it", path, bad.reason)
            else:
                self._count("corrupt")
                warnings.warn(f"RedFuser compile cache: entry {path} is corrupt ({bad.reason}); rebuilding it",
                              CacheWarning, stacklevel=4)
            self._discard(path, stat)
            return None

    def _discard(self, path: Path, seen: os.stat_result) -> None:
        """Remove the bad file we read, unless another process has already replaced it."""
        with contextlib.suppress(OSError):
            now = os.stat(path)
            if (now.st_ino, now.st_dev) == (seen.st_ino, seen.st_dev):
                os.unlink(path)

    def _prepare_folder(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)  # concurrent creation is fine with exist_ok
        if folder.name not in self._swept:
            self._swept.add(folder.name)
            cache_entry.sweep_temp_files(folder, TEMP_MAX_AGE_S)

    def _degrade(self, why: str) -> None:
        with self._mutex:
            self._stats.write_failures += 1
            first = self._writable
            self._writable = False
        if first:
            warnings.warn(f"RedFuser compile cache: {why}; caching in memory only from now on",
                          CacheWarning, stacklevel=4)

    @contextlib.contextmanager
    def _build_lock(self, key: CacheKey) -> Iterator[bool]:
        """Hold `key`'s build lock across processes (True), or go on without it (False)."""
        path = self.entry_path(key)
        if path is None or not self._writable or not self.use_lock:
            yield False
            return
        try:
            self._prepare_folder(path.parent)
        except OSError:
            yield False  # put() will find the folder unwritable and degrade with a warning
            return
        with cache_entry.build_lock(path, self.lock_timeout_s) as state:
            if state == "timeout":
                self._count("lock_timeouts")
                log.info("compile cache: waited %.1fs for %s; building without the lock", self.lock_timeout_s, path)
            yield state == "locked"

    def _count(self, name: str) -> None:
        with self._mutex:
            setattr(self._stats, name, getattr(self._stats, name) + 1)


_default: tuple[tuple[bool, str], CompileCache] | None = None
_default_mutex = threading.Lock()


def default_cache() -> CompileCache:
    """The process's cache for the current configuration (`redfuser.config`).

    Memory-only when ``REDFUSER_CACHE=0``, else on disk under `config.cache_dir()`.
    Made on first use and again if the configuration has changed since.
    """
    from .. import config  # local: config lives in the package that imports runtime

    global _default
    settings = (config.cache_enabled(), str(config.cache_dir()))
    with _default_mutex:
        if _default is None or _default[0] != settings:
            _default = (settings, CompileCache(settings[1] if settings[0] else None))
        return _default[1]


def reset_default_cache() -> None:
    """Drop the process's cache (tests); the next `default_cache()` makes a fresh one."""
    global _default
    with _default_mutex:
        _default = None
