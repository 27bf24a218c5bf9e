"""One compile-cache entry on disk: its file format, its atomic write and its build lock.

Format of ``<dir>/<digest[:2]>/<digest>.bin``::

    header  struct "<8sHH32sQI32s": magic b"RFCACHE\\0", format version, flags (0),
            the key's digest (32 raw bytes), payload length (u64),
            meta length (u32), sha256 of meta + payload
    meta    UTF-8 JSON (creation time, the key's description, the caller's meta)
    payload the artifact's bytes

`decode_entry` checks every field and raises `BadEntry` (``stale`` for another
format version) for anything but a whole, valid entry of the asked key.
`write_atomic` writes ``.<digest[:16]>.<random>.tmp`` beside the entry and
`os.replace`s it over the entry: readers see the old file or the new one, whole.
`build_lock` is an advisory `fcntl.flock` on ``<digest>.lock`` with a timeout.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from .cache_key import CacheKey

try:
    import fcntl
except ImportError:  # Windows: no advisory lock, the last writer wins
    fcntl = None

MAGIC = b"RFCACHE\x00"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sHH32sQI32s")
# The names this cache writes inside its two-hex-digit folders (and the only ones `clear` deletes).
OWN_FOLDER = re.compile(r"[0-9a-f]{2}")
OWN_FILE = re.compile(r"[0-9a-f]{64}\.(bin|lock)|\.[0-9a-f]{16}\..+\.tmp")
LOCK_AVAILABLE = fcntl is not None


class BadEntry(Exception):
    """An entry file that must not be used: `reason` in words; `stale` for another format version."""

    def __init__(self, reason: str, *, stale: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.stale = stale


def entry_name(key: CacheKey) -> str:
    """``<digest[:2]>/<digest>.bin``, the entry's path relative to the cache folder."""
    return f"{key.digest[:2]}/{key.digest}.bin"


def encode_entry(key: CacheKey, payload: bytes, meta: Mapping[str, object]) -> bytes:
    """The bytes of an entry file (format in the module docstring)."""
    meta_bytes = json.dumps(dict(meta), sort_keys=True, default=str).encode("utf-8")
    body_sha = hashlib.sha256(meta_bytes + payload).digest()
    header = HEADER.pack(MAGIC, FORMAT_VERSION, 0, bytes.fromhex(key.digest), len(payload), len(meta_bytes), body_sha)
    return header + meta_bytes + payload


def decode_entry(key: CacheKey, data: bytes) -> tuple[bytes, dict]:
    """(payload, meta) of an entry file's bytes; `BadEntry` unless it is a whole, valid entry of `key`."""
    if len(data) < HEADER.size:
        raise BadEntry(f"truncated: {len(data)} bytes, shorter than the {HEADER.size}-byte header")
    magic, version, _flags, digest, payload_len, meta_len, body_sha = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise BadEntry("not a RedFuser cache entry (wrong magic)")
    if version != FORMAT_VERSION:
        raise BadEntry(f"format version {version}, expected {FORMAT_VERSION}", stale=True)
    if digest.hex() != key.digest:
        raise BadEntry(f"holds the entry of another key ({digest.hex()[:16]}...)")
    expected = HEADER.size + meta_len + payload_len
    if len(data) != expected:
        raise BadEntry(f"{len(data)} bytes where the header promises {expected}")
    body = data[HEADER.size:]
    if hashlib.sha256(body).digest() != body_sha:
        raise BadEntry("checksum mismatch")
    try:
        meta = json.loads(body[:meta_len].decode("utf-8"))
    except ValueError as err:
        raise BadEntry(f"unreadable metadata ({err})") from None
    return bytes(body[meta_len:]), meta if isinstance(meta, dict) else {}


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file and `os.replace`; OSError on failure (no temp file left).

    No fsync: a crash of the process leaves the old entry or the new one; after
    a power loss a torn file fails `decode_entry`'s checks and is rebuilt.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:16]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def sweep_temp_files(folder: Path, max_age_s: float) -> None:
    """Delete temp files older than `max_age_s` in `folder` (left by crashed writers; young ones may be live)."""
    cutoff = time.time() - max_age_s
    for tmp in folder.glob(".*.tmp"):
        with contextlib.suppress(OSError):
            if OWN_FILE.fullmatch(tmp.name) and tmp.stat().st_mtime < cutoff:
                tmp.unlink()


@contextlib.contextmanager
def build_lock(path: Path, timeout_s: float) -> Iterator[str]:
    """Hold the advisory lock of entry `path` for a build.

    Yields ``"locked"``, ``"timeout"`` (another holder kept it `timeout_s`) or
    ``"unavailable"`` (no fcntl, unopenable lock file, no flock on this
    filesystem); in the last two cases the caller builds without the lock.
    Lock files stay: deleting one while a process waits on it breaks exclusion.
    """
    if fcntl is None:
        yield "unavailable"
        return
    try:
        fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield "unavailable"
        return
    try:
        yield _acquire(fd, timeout_s)
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _acquire(fd: int, timeout_s: float) -> str:
    # flock has no timeout of its own: poll with a short, growing sleep.
    deadline = time.monotonic() + timeout_s
    delay = 0.002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return "locked"
        except BlockingIOError:
            pass
        except OSError:
            return "unavailable"
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.05)
