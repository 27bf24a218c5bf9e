"""The compile cache: compiled artifacts (object code, PTX...) as bytes, in memory and on disk.

Layers. `CompileCache.get` looks in a per-process memory layer (an LRU bounded
in bytes) and then on disk; `get_or_build` builds on a miss and stores in both
(`fill` does that half alone, for a caller whose `get` missed).
The API is bytes in, bytes out and knows nothing of any backend; a key comes
from `cache_key.CacheKey.build` (IR text, options, target, versions).

On disk. ``<dir>/<digest[:2]>/<digest>.bin``, one file per entry: a header
(magic, format version, the key's digest, payload length, sha256 of the body),
JSON metadata, the payload. `cache_entry` defines the format.

Reading checks every field: a short or over-long file, a wrong magic, another
key's digest or a checksum mismatch is *corrupt* (a `CacheWarning`, the file is
removed, the artifact rebuilt and re-stored); another format version is *stale*
(logged, rebuilt). A release bump or an edited compiler changes the key itself
(versions are part of it), so old entries are simply never looked up.

Checked payloads. The header's checksum only says the file is what *some*
writer wrote: a buggy writer, another tool or a copy whose checksum was redone
after a bit flip passes it. Code that is about to be linked into the process or
handed to a driver is therefore checked too: `fetch(..., check=...)` takes the
caller's check of the payload itself (`check(payload)` returns None or why the
payload must not be loaded; `runtime.object_check` for host objects, the PTX
check of `runtime.cuda_backend`). A disk entry served to a checked fetch must
also carry its *build record*, the payload's sha256 that `put` writes into the
metadata, and match it: a payload replaced under a redone checksum (a structurally
perfect object of the same kernel built for other shapes, say) fails there. A
payload that fails is *invalid*: the file is removed, a `CacheWarning` naming
what was asked for (`describe`) is shown at the user's call (the first frame
outside RedFuser, `ir.source.user_frame`), and the artifact is rebuilt and
re-stored. A fresh build that fails its own check is kept in memory only, with a
warning, so a check that is too strict can never make every later process warn.
Any bad entry therefore costs one rebuild: never a crash, never a wrong artifact.

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
import hashlib
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from stat import S_ISREG

from ..ir.errors import InternalError
from ..ir.source import warn_at_user
from . import cache_entry
from .cache_entry import BadEntry, decode_entry, encode_entry
from .cache_key import CacheKey

__all__ = ["CacheKey", "CacheStats", "CacheWarning", "CompileCache", "Fetched", "default_cache", "reset_default_cache"]

log = logging.getLogger("redfuser.cache")

TEMP_MAX_AGE_S = 3600.0
BUILD_RECORD = "payload_sha256"
"""The metadata field `put` writes: the payload's sha256, which a checked fetch compares with the payload."""

Check = Callable[[bytes], "str | None"]
"""A caller's check of a payload before it is used: None when it is fine, else why not (in words)."""


def read_regular(path: Path) -> tuple[bytes, os.stat_result] | None:
    """The bytes and status of the file at `path`, or None where it is not a regular file: a FIFO or a device
    (a link to /dev/zero reads until memory runs out) left in a cache folder is no entry. Opened
    non-blocking, since opening a FIFO waits for a writer forever otherwise; `OSError`s propagate."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with open(fd, "rb") as f:
        stat = os.fstat(f.fileno())
        if not S_ISREG(stat.st_mode):
            return None
        return f.read(), stat


class CacheWarning(RuntimeWarning):
    """The compile cache hit a problem it worked around (corrupt or unloadable entry, unwritable folder)."""


@dataclass(slots=True)
class CacheStats:
    """Counters of one `CompileCache`; `CompileCache.stats` returns a copy."""

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0          # lookups neither layer served at first look
    builds: int = 0          # build callbacks run by get_or_build
    writes: int = 0          # entries written to disk
    corrupt: int = 0         # corrupt entries found (each then rebuilt)
    invalid: int = 0         # whole entries whose payload failed the caller's check (each then rebuilt)
    stale: int = 0           # entries of another format version found
    write_failures: int = 0
    lock_timeouts: int = 0


@dataclass(frozen=True, slots=True)
class Fetched:
    """What `CompileCache.fetch` returns: the payload, which layer served it and how long it took."""

    payload: bytes
    source: str  # "memory", "disk" or "build"
    seconds: float


_CACHES: "weakref.WeakSet[CompileCache]" = weakref.WeakSet()
"""Every cache made, for `_after_fork`."""


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
        _CACHES.add(self)
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

    def get(self, key: CacheKey, *, check: Check | None = None, describe: str = "") -> bytes | None:
        """The payload stored under `key`, or None; a corrupt (or, with `check`, invalid) disk entry is
        removed and reads as None."""
        found = self._lookup(key, check, describe)
        if found is None:
            self._count("misses")
            return None
        return found[0]

    def get_or_build(self, key: CacheKey, build: Callable[[], bytes], meta: Mapping[str, object] | None = None) -> bytes:
        """The payload of `key`, running `build()` and storing its result on a miss."""
        return self.fetch(key, build, meta).payload

    def fetch(self, key: CacheKey, build: Callable[[], bytes], meta: Mapping[str, object] | None = None, *,
              check: Check | None = None, describe: str = "") -> Fetched:
        """Like `get_or_build`, also saying which layer served the payload and how long it took.

        With `check`, a payload read from disk is used only if it matches its build
        record and passes `check` (module docstring, "Checked payloads"); `describe`
        names the artifact in the warning (``"object code of kernel softmax_0"``).
        """
        start = time.perf_counter()
        found = self._lookup(key, check, describe)
        if found is None:
            self._count("misses")
            found = self._build_missing(key, build, meta, check, describe)
        return Fetched(found[0], found[1], time.perf_counter() - start)

    def fill(self, key: CacheKey, build: Callable[[], bytes], meta: Mapping[str, object] | None = None, *,
             check: Check | None = None, describe: str = "") -> Fetched:
        """The second half of `fetch`, for a caller whose `get` of `key` missed and who did other work in
        between: build and store the payload under the key's build lock, or take the one another process
        stored meanwhile (`check` and `describe` as for `fetch`)."""
        start = time.perf_counter()
        found = self._build_missing(key, build, meta, check, describe)
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

    def _lookup(self, key: CacheKey, check: Check | None, describe: str) -> tuple[bytes, str] | None:
        # The memory layer holds only what this process built or checked, so it is not checked again.
        with self._mutex:
            payload = self._memory.get(key.digest)
            if payload is not None:
                self._memory.move_to_end(key.digest)
                self._stats.memory_hits += 1
                return payload, "memory"
        payload = self._read_disk(key, check, describe)
        if payload is None:
            return None
        self._count("disk_hits")
        self._remember(key, payload)
        return payload, "disk"

    def _build_missing(self, key: CacheKey, build: Callable[[], bytes], meta: Mapping[str, object] | None,
                       check: Check | None, describe: str) -> tuple[bytes, str]:
        with self._build_lock(key) as locked:
            # Another process may have finished this key while we waited for its lock.
            found = self._lookup(key, check, describe) if locked else None
            if found is None:
                payload = self._run_build(key, build)
                self._store_build(key, payload, meta, check, describe)
                found = (payload, "build")
        return found

    def _run_build(self, key: CacheKey, build: Callable[[], bytes]) -> bytes:
        self._count("builds")
        payload = build()
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise InternalError(f"compile cache: the build of {key.describe or key.digest} returned "
                                f"{type(payload).__name__}, expected bytes")
        return bytes(payload)

    def _store_build(self, key: CacheKey, payload: bytes, meta: Mapping[str, object] | None, check: Check | None,
                     describe: str) -> None:
        reason = check(payload) if check is not None else None
        if reason is None:
            self.put(key, payload, meta)
            return
        # Our own compiler's output fails our own check. The check exists because loading such code can
        # crash the process (an unresolvable symbol is a call to address 0), so it is not used either: an
        # error the user can report beats a segfault.
        raise InternalError(f"the {describe or key.describe} just built fails its load check ({reason}); "
                            "RedFuser does not load it, since that could crash the process (please report this)")

    # -- storing ---------------------------------------------------------------------------------

    def put(self, key: CacheKey, payload: bytes, meta: Mapping[str, object] | None = None) -> None:
        """Store `payload` under `key` in memory and (when writable) atomically on disk; never raises OSError."""
        payload = bytes(payload)
        self._remember(key, payload)
        path = self.entry_path(key)
        if path is None or not self._writable:
            return
        full_meta = {"created": time.time(), "key": key.describe, **(meta or {}),
                     BUILD_RECORD: hashlib.sha256(payload).hexdigest()}
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

    def disk_usage(self) -> tuple[int, int]:
        """(entries, bytes) this cache's files take on disk (only names it writes; (0, 0) memory-only). Nothing
        evicts them: a new specialization adds an entry, and an entry no key reads any more (another compiler
        version, other options) stays until `clear` (``python -m redfuser cache --clear``) deletes it."""
        entries = size = 0
        if self.directory is None or not self.directory.is_dir():
            return entries, size
        for folder in self.directory.iterdir():
            if not cache_entry.OWN_FOLDER.fullmatch(folder.name) or not folder.is_dir():
                continue
            for path in folder.iterdir():
                if cache_entry.OWN_FILE.fullmatch(path.name):
                    with contextlib.suppress(OSError):
                        size += path.stat().st_size
                        entries += path.suffix == ".bin"
        return entries, size

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
            found = read_regular(path)
            if found is None:
                log.debug("compile cache: %s is not a regular file", path)
            return found
        except FileNotFoundError:
            return None
        except OSError as err:  # unreadable, a folder in the way...: a miss, the build goes on
            log.debug("compile cache: cannot read %s (%s)", path, err)
            return None

    def _read_disk(self, key: CacheKey, check: Check | None, describe: str) -> bytes | None:
        found = self._read_file(key)
        if found is None:
            return None
        data, stat = found
        path = self.entry_path(key)
        try:
            payload, meta = decode_entry(key, data)
        except BadEntry as bad:
            self._discard(path, stat)   # first: a warning turned into an error must not leave the file behind
            if bad.stale:
                self._count("stale")
                log.info("compile cache: %s is stale (%s); rebuilding it", path, bad.reason)
            else:
                self._count("corrupt")
                _warn(f"RedFuser compile cache: entry {path} is corrupt ({bad.reason}); rebuilding it")
            return None
        reason = _invalid(payload, meta, check) if check is not None else None
        if reason is None:
            return payload
        self._count("invalid")
        self._discard(path, stat)
        _warn(f"RedFuser compile cache: the cached {describe or key.describe} in {path} cannot be loaded "
              f"({reason}); removed it, rebuilding")
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
            _warn(f"RedFuser compile cache: {why}; caching in memory only from now on")

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


def _invalid(payload: bytes, meta: dict, check: Check) -> str | None:
    """Why a decoded disk payload must not be used (its build record, then the caller's check), or None."""
    record = meta.get(BUILD_RECORD)
    if not isinstance(record, str):
        return "no build record in its metadata"
    if record != hashlib.sha256(payload).hexdigest():
        return "the payload is not the one its build record describes"
    return check(payload)


def _warn(message: str) -> None:
    """A `CacheWarning` shown at the user's line (the first frame outside RedFuser)."""
    warn_at_user(message, CacheWarning)


_default: tuple[tuple[bool, str], CompileCache] | None = None
_default_mutex = threading.Lock()


def _after_fork() -> None:
    """In a child of ``os.fork()``: every cache's lock free, since the thread that may have held one during the
    fork is not there (its first compile would wait for it forever)."""
    global _default_mutex
    _default_mutex = threading.Lock()
    for cache in list(_CACHES):
        cache._mutex = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


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
