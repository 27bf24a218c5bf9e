"""The compile cache: keys, memory and disk layers, corrupt entries, unwritable folders, concurrency, and payloads
that must not be loaded (host objects MCJIT would crash on, bad PTX)."""
from __future__ import annotations

import errno
import functools
import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from redfuser.ir.errors import InternalError
from redfuser.runtime import cache as cache_mod
from redfuser.runtime import cache_entry
from redfuser.runtime.cache import CacheKey, CacheWarning, CompileCache, default_cache, reset_default_cache
from redfuser.runtime.cache_entry import decode_entry, encode_entry
from redfuser.runtime.cache_key import default_versions

VERSIONS = {"redfuser": "0.1.0", "redfuser_src": "abc", "llvmlite": "0.50.0", "llvm": "20.1.0"}
PARTS = dict(artifact="cpu-object", stage="tile kernel(...)\n  load\n", options={"block_m": 64, "fast_math": False},
             target="x86_64-unknown-linux-gnu/skylake", versions=VERSIONS)


def key_of(**changes) -> CacheKey:
    return CacheKey.build(**{**PARTS, **changes})


def run_python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (a real second process)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=timeout)


# -- keys ----------------------------------------------------------------------------------------

def test_key_is_a_sha256_digest_independent_of_option_order_and_stage_type():
    key = key_of()
    assert len(key.digest) == 64 and str(key) == key.digest
    assert key_of(options={"fast_math": False, "block_m": 64}) == key
    assert key_of(stage=PARTS["stage"].encode()) == key
    assert CacheKey(key.digest) == key and hash(CacheKey(key.digest)) == hash(key)


def test_key_is_the_same_in_another_process():
    code = """
        import sys
        from redfuser.runtime.cache_key import CacheKey
        print(CacheKey.build(artifact="cpu-object", stage="tile kernel(...)\\n  load\\n",
                             options={"fast_math": False, "block_m": 64}, target="x86_64-unknown-linux-gnu/skylake",
                             versions={"redfuser": "0.1.0", "redfuser_src": "abc", "llvmlite": "0.50.0",
                                       "llvm": "20.1.0"}).digest)
    """
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == key_of().digest


@pytest.mark.parametrize("changes", [
    {"artifact": "ptx"},
    {"stage": PARTS["stage"] + " "},
    {"options": {"block_m": 32, "fast_math": False}},
    {"options": {"block_m": 64, "fast_math": True}},
    {"options": {"block_m": 64, "fast_math": False, "num_warps": 4}},
    {"options": {"block_m": 64.0, "fast_math": False}},
    {"options": {"block_m": "64", "fast_math": False}},
    {"target": "x86_64-unknown-linux-gnu/znver4"},
    {"versions": {**VERSIONS, "redfuser": "0.2.0"}},
    {"versions": {**VERSIONS, "redfuser_src": "abd"}},
    {"versions": {**VERSIONS, "llvmlite": "0.51.0"}},
    {"versions": {**VERSIONS, "llvm": "21.1.0"}},
], ids=lambda c: ",".join(c))
def test_changing_any_part_changes_the_key(changes):
    assert key_of(**changes) != key_of()


def test_key_encodes_numpy_enum_and_nonfinite_options_stably():
    tricky = {"dtype": np.dtype("float16"), "scalar": np.int64(3), "scale": math.inf, "shape": (4, 5)}
    assert key_of(options=tricky) == key_of(options={**tricky, "dtype": np.float16, "scalar": 3})
    assert key_of(options={"scale": math.inf}) != key_of(options={"scale": "inf"})
    assert key_of(options={"dtype": np.float16}) != key_of(options={"dtype": np.float32})


def test_key_rejects_options_without_a_stable_text():
    with pytest.raises(InternalError, match="cannot encode"):
        key_of(options={"callback": object()})
    with pytest.raises(InternalError, match="64 lowercase hex"):
        CacheKey("not-a-digest")


def test_default_versions_name_redfuser_llvmlite_and_llvm():
    import llvmlite
    import llvmlite.binding as llvm

    import redfuser

    versions = default_versions()
    assert versions["redfuser"] == redfuser.__version__
    assert versions["llvmlite"] == llvmlite.__version__
    assert versions["llvm"] == ".".join(map(str, llvm.llvm_version_info))
    assert len(versions["redfuser_src"]) == 64
    assert CacheKey.build(**{**PARTS, "versions": None}) == CacheKey.build(**{**PARTS, "versions": versions})


# -- memory and disk layers ----------------------------------------------------------------------

def test_memory_hit_runs_the_build_once(tmp_path):
    cache = CompileCache(tmp_path)
    builds = []
    first = cache.fetch(key_of(), lambda: builds.append(1) or b"object code")
    second = cache.fetch(key_of(), lambda: builds.append(1) or b"other")
    assert (first.source, second.source) == ("build", "memory")
    assert second.payload == b"object code" and len(builds) == 1
    stats = cache.stats
    assert (stats.misses, stats.builds, stats.memory_hits, stats.writes) == (1, 1, 1, 1)


def test_disk_hit_in_a_fresh_cache_object(tmp_path):
    CompileCache(tmp_path).put(key_of(), b"\x00ptx\xff", {"kernel": "attention"})
    fresh = CompileCache(tmp_path)
    got = fresh.fetch(key_of(), lambda: pytest.fail("must not rebuild"))
    assert (got.source, got.payload) == ("disk", b"\x00ptx\xff")
    assert fresh.read_meta(key_of())["kernel"] == "attention"
    assert fresh.get(key_of(target="sm_90")) is None
    assert fresh.stats.disk_hits == 1 and fresh.stats.misses == 1
    assert fresh.entry_path(key_of()) == tmp_path / key_of().digest[:2] / f"{key_of().digest}.bin"


def test_a_get_that_missed_then_fill_counts_as_one_fetch(tmp_path):
    """`get` then `fill` (the GPU's ``llvm`` and ``ptx`` stages) is `fetch` in two halves: one miss, one
    build, stored on disk; a `fill` that finds what another process stored meanwhile builds nothing."""
    cache = CompileCache(tmp_path)
    assert cache.get(key_of()) is None
    got = cache.fill(key_of(), lambda: b"ptx")
    assert (got.source, got.payload) == ("build", b"ptx")
    assert (cache.stats.misses, cache.stats.builds, cache.stats.writes) == (1, 1, 1)
    late = CompileCache(tmp_path)
    assert late.fill(key_of(), lambda: pytest.fail("stored meanwhile")).source == "disk"
    assert late.stats.builds == 0


def test_memory_layer_is_a_bounded_lru():
    cache = CompileCache(None, memory_limit_bytes=10)
    keys = [key_of(target=f"t{n}") for n in range(3)]
    for key in keys:
        cache.put(key, b"4444")
    assert cache.get(keys[0]) is None and cache.get(keys[2]) == b"4444"
    assert CompileCache(None, memory_limit_bytes=0).fetch(keys[0], lambda: b"x").source == "build"


def _header_field(data: bytes, index: int, value: object) -> bytes:
    fields = list(cache_entry.HEADER.unpack_from(data))
    fields[index] = value
    return cache_entry.HEADER.pack(*fields) + data[cache_entry.HEADER.size:]


def _flip(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0x40]) + data[position + 1:]


CORRUPTIONS = {
    "empty file": lambda data, other: b"",
    "truncated header": lambda data, other: data[:20],
    "truncated payload": lambda data, other: data[:-7],
    "trailing bytes": lambda data, other: data + b"\x00",
    "flipped payload byte": lambda data, other: _flip(data, len(data) - 3),
    "flipped meta byte": lambda data, other: _flip(data, cache_entry.HEADER.size + 2),
    "wrong magic": lambda data, other: b"NOTCACHE" + data[8:],
    "header of another key": lambda data, other: other,
    "length field lies": lambda data, other: _header_field(data, 4, 5),
}


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS), ids=list(CORRUPTIONS))
def test_corrupt_entry_is_detected_rebuilt_and_restored(tmp_path, corrupt):
    key, other = key_of(), key_of(target="sm_90")
    writer = CompileCache(tmp_path)
    writer.put(key, b"old payload " * 50)
    writer.put(other, b"another kernel")
    path = writer.entry_path(key)
    path.write_bytes(CORRUPTIONS[corrupt](path.read_bytes(), writer.entry_path(other).read_bytes()))

    cache = CompileCache(tmp_path)
    with pytest.warns(CacheWarning, match="corrupt"):
        got = cache.fetch(key, lambda: b"rebuilt payload")
    assert (got.source, got.payload) == ("build", b"rebuilt payload")
    assert cache.stats.corrupt == 1
    assert decode_entry(key, path.read_bytes())[0] == b"rebuilt payload"
    assert CompileCache(tmp_path).fetch(key, lambda: pytest.fail("stored")).payload == b"rebuilt payload"


def test_get_of_a_corrupt_entry_is_none_and_removes_it(tmp_path):
    cache = CompileCache(tmp_path, memory_limit_bytes=0)
    cache.put(key_of(), b"payload")
    path = cache.entry_path(key_of())
    path.write_bytes(_flip(path.read_bytes(), len(path.read_bytes()) - 1))
    with pytest.warns(CacheWarning) as caught:
        assert cache.get(key_of()) is None
    assert not path.exists()
    assert caught[0].filename == __file__      # the caller's line, not a frame inside the cache


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are a POSIX thing")
def test_an_entry_that_is_a_fifo_is_a_miss_not_a_hang(tmp_path):
    """A FIFO (or a link to a device) where an entry belongs is a miss: opening a FIFO to read waits for a
    writer forever, and /dev/zero reads until memory runs out. The rebuilt entry replaces it."""
    cache = CompileCache(tmp_path, memory_limit_bytes=0)
    path = cache.entry_path(key_of())
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(cache.fetch(key_of(), lambda: b"rebuilt")), daemon=True)
    reader.start()
    reader.join(20)
    if reader.is_alive():      # (free the stuck reader: a writer that opens and closes gives it end-of-file)
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a cache entry that is a FIFO hangs")
    assert got[0].payload == b"rebuilt" and path.is_file()
    assert CompileCache(tmp_path).fetch(key_of(), lambda: pytest.fail("must not rebuild")).source == "disk"


def test_entry_of_another_format_version_is_stale_and_rebuilt_quietly(tmp_path):
    cache = CompileCache(tmp_path)
    cache.put(key_of(), b"old format")
    path = cache.entry_path(key_of())
    path.write_bytes(_header_field(path.read_bytes(), 1, cache_entry.FORMAT_VERSION + 1))
    fresh = CompileCache(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fresh.fetch(key_of(), lambda: b"new format")
    assert (got.source, got.payload, fresh.stats.stale) == ("build", b"new format", 1)
    assert struct.unpack_from("<H", path.read_bytes(), 8)[0] == cache_entry.FORMAT_VERSION


def test_encode_decode_round_trip_keeps_meta():
    payload, meta = decode_entry(key_of(), encode_entry(key_of(), b"abc", {"n": 1, "path": Path("/x")}))
    assert payload == b"abc" and meta == {"n": 1, "path": "/x"}


# -- degrading -----------------------------------------------------------------------------------

def test_uncreatable_cache_folder_degrades_to_memory_with_one_warning(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cache = CompileCache(blocker / "cache")
    with pytest.warns(CacheWarning, match="memory only") as caught:
        assert cache.get_or_build(key_of(), lambda: b"one") == b"one"
        assert cache.get_or_build(key_of(target="sm_80"), lambda: b"two") == b"two"
    assert len([w for w in caught if issubclass(w.category, CacheWarning)]) == 1
    assert not cache.disk_writable and cache.stats.write_failures == 1
    assert cache.fetch(key_of(), lambda: b"again").source == "memory"


def test_read_only_filesystem_degrades_to_memory(tmp_path, monkeypatch):
    def read_only(path, data):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(cache_entry, "write_atomic", read_only)
    cache = CompileCache(tmp_path)
    with pytest.warns(CacheWarning, match="Read-only"):
        assert cache.get_or_build(key_of(), lambda: b"kept in memory") == b"kept in memory"
    assert cache.get(key_of()) == b"kept in memory" and not cache.disk_writable
    assert not list(tmp_path.rglob("*.bin"))


def test_cache_off_writes_nothing_to_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("REDFUSER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("REDFUSER_CACHE", "0")
    reset_default_cache()
    try:
        cache = default_cache()
        assert cache.directory is None
        assert cache.fetch(key_of(), lambda: b"x").source == "build"
        assert cache.fetch(key_of(), lambda: b"y").payload == b"x"
        assert not (tmp_path / "cache").exists()
        monkeypatch.setenv("REDFUSER_CACHE", "1")
        on = default_cache()
        assert on is not cache and on.directory == tmp_path / "cache" and default_cache() is on
        on.put(key_of(), b"z")
        assert on.entry_path(key_of()).is_file()
    finally:
        reset_default_cache()


def test_build_errors_propagate_and_leave_no_entry(tmp_path):
    cache = CompileCache(tmp_path)

    def broken() -> bytes:
        raise ValueError("codegen bug")

    with pytest.raises(ValueError, match="codegen bug"):
        cache.get_or_build(key_of(), broken)
    with pytest.raises(InternalError, match="expected bytes"):
        cache.get_or_build(key_of(), lambda: "text")
    assert not list(tmp_path.rglob("*.bin"))
    assert cache.get_or_build(key_of(), lambda: b"fine") == b"fine"  # the lock was released


# -- crashes and concurrency ---------------------------------------------------------------------

def test_crash_before_rename_leaves_nothing_in_use(tmp_path):
    code = """
        import os, sys
        from redfuser.runtime.cache import CacheKey, CompileCache
        cache = CompileCache(sys.argv[1])
        os.replace = lambda *args: os._exit(3)  # die between writing the temp file and renaming it
        cache.put(CacheKey(sys.argv[2]), b"half-done")
    """
    done = run_python(code, str(tmp_path), key_of().digest)
    assert done.returncode == 3, done.stderr
    assert len(list(tmp_path.rglob(".*.tmp"))) == 1 and not list(tmp_path.rglob("*.bin"))
    cache = CompileCache(tmp_path)
    assert cache.get(key_of()) is None
    assert cache.get_or_build(key_of(), lambda: b"complete") == b"complete"


def test_partial_entry_and_stray_temp_file_are_never_used(tmp_path):
    key = key_of()
    cache = CompileCache(tmp_path)
    path = cache.entry_path(key)
    path.parent.mkdir(parents=True)
    whole = encode_entry(key, b"stale kernel " * 100, {})
    path.write_bytes(whole[: len(whole) // 2])
    (path.parent / f".{key.digest[:16]}.crashed.tmp").write_bytes(whole)
    with pytest.warns(CacheWarning, match="corrupt"):
        assert cache.get_or_build(key, lambda: b"fresh kernel") == b"fresh kernel"
    assert decode_entry(key, path.read_bytes())[0] == b"fresh kernel"


def test_old_temp_files_are_swept_young_ones_kept(tmp_path):
    key = key_of()
    folder = tmp_path / key.digest[:2]
    folder.mkdir()
    old, young = folder / f".{key.digest[:16]}.old.tmp", folder / f".{key.digest[:16]}.young.tmp"
    for tmp in (old, young):
        tmp.write_bytes(b"partial")
    stamp = time.time() - 2 * cache_mod.TEMP_MAX_AGE_S
    os.utime(old, (stamp, stamp))
    CompileCache(tmp_path).put(key, b"payload")
    assert not old.exists() and young.exists()


def test_clear_deletes_only_the_caches_own_files(tmp_path):
    cache = CompileCache(tmp_path)
    cache.get_or_build(key_of(), lambda: b"payload")
    foreign = tmp_path / key_of().digest[:2] / "notes.txt"
    foreign.write_text("keep me")
    cache.clear(disk=True)
    assert foreign.exists() and not list(tmp_path.rglob("*.bin")) and not list(tmp_path.rglob("*.lock"))
    assert cache.get(key_of()) is None


@pytest.mark.skipif(not cache_entry.LOCK_AVAILABLE, reason="advisory locks need fcntl (POSIX)")
def test_lock_held_elsewhere_times_out_and_builds_anyway(tmp_path):
    import fcntl

    cache = CompileCache(tmp_path, lock_timeout_s=0.05)
    path = cache.entry_path(key_of())
    path.parent.mkdir(parents=True)
    with open(path.with_suffix(".lock"), "w") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        got = cache.fetch(key_of(), lambda: b"built without the lock")
    assert (got.source, got.payload) == ("build", b"built without the lock")
    assert cache.stats.lock_timeouts == 1 and decode_entry(key_of(), path.read_bytes())[0] == got.payload


def test_threads_compiling_one_key_build_it_once(tmp_path):
    cache = CompileCache(tmp_path)
    builds, results = [], []

    def build() -> bytes:
        builds.append(1)
        time.sleep(0.05)
        return b"shared kernel"

    threads = [threading.Thread(target=lambda: results.append(cache.fetch(key_of(), build))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r.payload for r in results] == [b"shared kernel"] * 4
    assert len(builds) == 1 if cache.use_lock else len(builds) >= 1


WORKER = """
    import json, os, sys, time
    from redfuser.runtime.cache import CacheKey, CompileCache
    folder, digest, go, use_lock = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    cache = CompileCache(folder, use_lock=use_lock)
    payload = digest.encode() * 65536  # 4 MiB: interleaved non-atomic writes would show

    def build():
        time.sleep(0.3)  # a slow compile, so the two processes overlap
        return payload

    while not os.path.exists(go):
        time.sleep(0.005)
    got = cache.fetch(CacheKey(digest), build)
    print(json.dumps({"source": got.source, "ok": got.payload == payload}))
"""


@pytest.mark.parametrize("use_lock", [True, False], ids=["flock", "no-lock"])
def test_two_processes_compiling_one_key_both_succeed(tmp_path, use_lock):
    key, go = key_of(), tmp_path / "go"
    folder = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(WORKER), str(folder), key.digest, str(go),
                               "1" if use_lock else "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    time.sleep(0.2)  # let both import; correctness does not depend on this
    go.touch()
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in reports)
    if use_lock and cache_entry.LOCK_AVAILABLE:
        assert sorted(r["source"] for r in reports) == ["build", "disk"]
    entry = CompileCache(folder).entry_path(key)
    assert decode_entry(key, entry.read_bytes())[0] == key.digest.encode() * 65536
    assert not list(folder.rglob("*.tmp"))


def test_readers_never_see_a_half_written_entry(tmp_path):
    key = key_of()
    writer = """
        import sys
        from redfuser.runtime.cache import CacheKey, CompileCache
        cache = CompileCache(sys.argv[1], memory_limit_bytes=0)
        for n in range(40):
            cache.put(CacheKey(sys.argv[2]), (b"A" if n % 2 else b"B") * (1 << 20))
    """
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(writer), str(tmp_path), key.digest],
                            stderr=subprocess.PIPE, text=True)
    reader = CompileCache(tmp_path, memory_limit_bytes=0)
    seen = set()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a corrupt entry would warn
        while proc.poll() is None:
            seen.add(reader.get(key))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    seen.add(reader.get(key))
    assert seen <= {None, b"A" * (1 << 20), b"B" * (1 << 20)} and len(seen - {None}) >= 1
    assert reader.stats.corrupt == 0


def test_a_cached_gpu_kernel_skips_llvm_emission_and_gives_the_same_stages(tmp_path, monkeypatch):
    """The PTX entry is keyed by the printed SIMT IR and holds the LLVM IR too: a fresh kernel object over
    the populated folder emits no LLVM module and compiles nothing, yet prints the same stages."""
    import redfuser as rf
    from redfuser.codegen.simt import ptx as ptx_mod
    from redfuser.workloads import softmax

    monkeypatch.setenv("REDFUSER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("REDFUSER_CACHE", raising=False)
    reset_default_cache()
    x = np.zeros((8, 300), np.float32)
    first = rf.kernel(softmax, backend="cuda", sm="sm_90").lower(x)
    reset_default_cache()                                  # only the disk layer is left

    def no_emission(*args, **kwargs):
        raise AssertionError("emitted LLVM IR on a cache hit")

    monkeypatch.setattr(ptx_mod, "emit_parsed", no_emission)
    again = rf.kernel(softmax, backend="cuda", sm="sm_90").lower(x)
    assert str(again.stages["llvm"]) == str(first.stages["llvm"])
    assert str(again.stages["ptx"]) == str(first.stages["ptx"])
    with pytest.raises(AssertionError, match="emitted LLVM IR"):   # another shape: a miss, which emits
        rf.kernel(softmax, backend="cuda", sm="sm_90").lower(np.zeros((8, 301), np.float32))
    reset_default_cache()


def test_llvm_opt_picks_the_middle_end_and_is_part_of_the_cache_key(tmp_path, monkeypatch):
    """``llvm_opt=None`` runs `GPU_PASSES`, 1-3 LLVM's pipelines; each its own cache entry; others refused."""
    import redfuser as rf
    from redfuser.codegen import nvptx
    from redfuser.workloads import softmax

    monkeypatch.setenv("REDFUSER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("REDFUSER_CACHE", raising=False)
    reset_default_cache()
    ran: list = []
    real = nvptx._optimize
    monkeypatch.setattr(nvptx, "_optimize", lambda mod, machine, level: (ran.append(level), real(mod, machine, level)))
    x = np.zeros((8, 300), np.float32)
    for level in (None, 1, 3, None, 1):      # the repeats are cache hits: nothing optimized again
        ptx = rf.kernel(softmax, backend="cuda", sm="sm_90", llvm_opt=level).lower(x).stages["ptx"]
        assert "softmax" in str(ptx)
    assert ran == [None, 1, 3]
    for bad in (0, 4, "O3", True):
        with pytest.raises(rf.ArgumentError, match="llvm_opt must be"):
            rf.kernel(softmax, backend="cuda", sm="sm_90", llvm_opt=bad).lower(x)
    reset_default_cache()


# -- payloads that must not be loaded (issue 18) --------------------------------------------------
#
# A cache entry whose header and checksum are valid but whose payload is bad (garbage, truncated, another
# kernel's object, an object for another machine...) used to be handed to MCJIT and crash every later
# process. Each case below poisons a real entry and calls the kernel in a fresh interpreter, so a crash
# fails the test instead of killing pytest; the call must give the right result, warn at its own line and
# re-store a good entry, which a second interpreter then loads without a warning.

# Every interpreter of these tests pins RedFuser's source fingerprint (part of every key), so the entries
# one of them writes are the ones the next one looks up even while the working tree is being edited.
PIN = """
import redfuser.runtime.cache_key as _key
_key.source_fingerprint = lambda: "pinned by test_cache"
"""

KERNEL = """
import json, sys, warnings
import numpy as np
import redfuser as rf
from redfuser.runtime.cache import default_cache

def body(x):
    m = rf.max(x, axis=-1, keepdims=True)
    e = rf.exp(x - m)
    return e / rf.sum(e, axis=-1, keepdims=True)

def other(x):
    return rf.sum(x * x, axis=-1)

def reference(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)

x = np.random.default_rng(7).standard_normal((8, 300)).astype(np.float32)
"""

BUILD = PIN + KERNEL + """
import re
import llvmlite.binding as llvm
from redfuser.runtime import cache as cache_mod

folder = sys.argv[1]
def in_folder(name):
    import os
    os.environ["REDFUSER_CACHE_DIR"] = f"{folder}/{name}"
    cache_mod.reset_default_cache()

in_folder("template")                               # the entries the cases poison
kernel = rf.kernel(body, backend="cpu")
kernel(x)
ptx = rf.kernel(body, backend="cuda", sm="sm_90").lower(x).stages["ptx"]
in_folder("other")                                  # another kernel, whose object and PTX are poison
rf.kernel(other, backend="cpu")(x)
rf.kernel(other, backend="cuda", sm="sm_90").lower(x)
in_folder("narrow")                                 # the same kernel (same symbol) for rows of 260
rf.kernel(body, backend="cpu")(np.zeros((8, 260), np.float32))

# The same module compiled for another machine (what a cache folder shared across machines could hold).
llvm.initialize_all_targets()
llvm.initialize_all_asmprinters()
triple = "aarch64-unknown-linux-gnu" if llvm.get_process_triple().startswith("x86_64") else "x86_64-unknown-linux-gnu"
machine = llvm.Target.from_triple(triple).create_target_machine(opt=2, reloc="pic", codemodel="jitdefault", jit=True)
text = re.sub(r'target (triple|datalayout) = "[^"]*"\\n', "", str(kernel.lower(x).stages["llvm"]))
module = llvm.parse_assembly(text)
module.triple, module.data_layout = triple, str(machine.target_data)
open(f"{folder}/foreign.o", "wb").write(machine.emit_object(module))
json.dump({"ptx": str(ptx), "symbol": kernel.lower(x).artifacts["host_kernels"][0].symbol},
          open(f"{folder}/built.json", "w"))
"""

# One interpreter per case pays for the imports once, then forks a child for the poisoned call and, after it
# has ended, another for the second call: two fresh processes (nothing compiled, empty memory cache), each
# of which may crash without taking the other or pytest down.
CALL = PIN + KERNEL + """
import os
backend, built_json = sys.argv[1], sys.argv[2]

def call():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if backend == "cpu":
            kernel = rf.kernel(body, backend="cpu")
            y = kernel(x)  # the call (cpu)
            ok = bool(np.allclose(y, reference(x), rtol=1e-5, atol=1e-6))
            source = kernel.lower(x).artifacts["compile"].source
        else:
            lowered = rf.kernel(body, backend="cuda", sm="sm_90").lower(x)  # the call (cuda)
            with open(built_json) as f:
                ok, source = str(lowered.stages["ptx"]) == json.load(f)["ptx"], None
    stats = default_cache().stats
    return {"ok": ok, "source": source,
            "stats": {name: getattr(stats, name) for name in ("disk_hits", "builds", "invalid")},
            "warnings": [[w.category.__name__, w.filename, w.lineno, str(w.message)] for w in caught]}

runs = []
for attempt in ("first", "again"):
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            report = call()
        except BaseException as err:
            report = {"error": repr(err)}
        os.write(write_end, json.dumps(report).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        report = pipe.read()
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    runs.append({"exit": status, **(json.loads(report) if status == 0 else {})})
print(json.dumps(runs))
"""


def _entries(folder: Path) -> dict[str, tuple[CacheKey, bytes, dict]]:
    """The kernel's entries of a cache folder by artifact (``host-object``, ``llvm+ptx``): key, payload, metadata.
    The cached call path's own object (``redfuser_entry``, `runtime.native_entry`) is a host object too: it is
    left out (which of the two a folder listing gave last depended on the entries' hashed names)."""
    found = {}
    for path in folder.rglob("*.bin"):
        key = CacheKey(path.stem)
        payload, meta = decode_entry(key, path.read_bytes())
        if meta.get("symbols") == ["redfuser_entry"]:
            continue
        found[meta["key"].split(" ")[0]] = (key, payload, meta)
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A folder with the kernel's good entries (``template``), the poison, and the fresh kernel's PTX."""
    folder = tmp_path_factory.mktemp("payloads")
    done = run_python(BUILD, str(folder), timeout=300)
    assert done.returncode == 0, done.stderr
    return folder


def _random_bytes(good: bytes, built: Path, artifact: str) -> bytes:
    return np.random.default_rng(3).bytes(len(good))


def _truncated(good: bytes, built: Path, artifact: str) -> bytes:
    if artifact == "llvm+ptx":
        llvm_ir, ptx = good.split(b"\0")
        return llvm_ir + b"\0" + ptx[: len(ptx) // 2]
    return good[: len(good) // 2]


def _other_kernel(good: bytes, built: Path, artifact: str) -> bytes:
    return _entries(built / "other")[artifact][1]


def _missing_symbol(good: bytes, built: Path, artifact: str) -> bytes:
    name = json.loads((built / "built.json").read_text())["symbol"].encode() + b"\0"
    assert good.count(name) == 1                        # its one mention, in the string table
    return good.replace(name, name[:-2] + b"Z\0")       # same length: only the name is wrong


def _foreign_machine(good: bytes, built: Path, artifact: str) -> bytes:
    return (built / "foreign.o").read_bytes()


def _other_shape(good: bytes, built: Path, artifact: str) -> bytes:
    from redfuser.codegen.native import host_target
    from redfuser.runtime.cpu_jit import in_process
    from redfuser.runtime.object_check import check_host_object
    from redfuser.runtime.object_machines import machine_of_triple

    narrow = _entries(built / "narrow")[artifact][1]
    machine = machine_of_triple(host_target().triple)
    symbol = json.loads((built / "built.json").read_text())["symbol"]
    check_host_object(narrow, machine, [symbol], in_process)   # a perfect object: only the build record tells
    return narrow


# name: (artifact, how the payload is replaced, whether the writer also redid the build record)
POISON = {
    "random bytes": ("host-object", _random_bytes, True),
    "truncated object": ("host-object", _truncated, True),
    "object of another kernel": ("host-object", _other_kernel, True),
    "object missing the kernel symbol": ("host-object", _missing_symbol, True),
    "object for another machine": ("host-object", _foreign_machine, True),
    "same kernel for other shapes": ("host-object", _other_shape, False),
    "truncated PTX": ("llvm+ptx", _truncated, True),
    "PTX of another kernel": ("llvm+ptx", _other_kernel, True),
}


def _call_twice(script: Path, *args: str) -> list[dict]:
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    for run in runs:
        assert run["exit"] == 0, f"the kernel call died (exit {run['exit']}):\n{done.stderr[-3000:]}"
        assert "error" not in run, run["error"]
    return runs


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the calls run in forked children")
@pytest.mark.parametrize("case", list(POISON), ids=list(POISON))
def test_bad_payload_is_rebuilt_with_a_warning_at_the_users_call(built, tmp_path, monkeypatch, case):
    import shutil

    import llvmlite.binding as llvm

    from redfuser.runtime.object_machines import machine_of_triple

    artifact, poison, redo_record = POISON[case]
    if artifact == "host-object" and machine_of_triple(llvm.get_process_triple()) is None:
        pytest.skip("no load check for this machine's objects: they are cached in memory only (tested below)")
    cache = tmp_path / "cache"
    shutil.copytree(built / "template", cache)
    key, good, meta = _entries(cache)[artifact]
    bad = poison(good, built, artifact)
    assert bad != good
    if redo_record:          # a writer that recorded what it wrote: only the payload itself can tell
        meta = {**meta, cache_mod.BUILD_RECORD: hashlib.sha256(bad).hexdigest()}
    path = CompileCache(cache).entry_path(key)
    path.write_bytes(encode_entry(key, bad, meta))
    backend = "cpu" if artifact == "host-object" else "cuda"
    script = tmp_path / "user_code.py"
    script.write_text(textwrap.dedent(CALL))
    call_line = 1 + next(n for n, line in enumerate(script.read_text().splitlines())
                         if line.endswith(f"# the call ({backend})"))
    monkeypatch.setenv("REDFUSER_CACHE_DIR", str(cache))
    monkeypatch.delenv("REDFUSER_CACHE", raising=False)

    first, again = _call_twice(script, backend, str(built / "built.json"))
    assert first["ok"], "wrong result from the rebuilt kernel"
    assert [w[:3] for w in first["warnings"]] == [["CacheWarning", str(script), call_line]], first["warnings"]
    message = first["warnings"][0][3]
    assert "cannot be loaded" in message and str(path) in message
    assert ("object code of body (kernel body_0)" if backend == "cpu" else "PTX of kernel body_0") in message
    assert first["stats"]["invalid"] == 1 and first["stats"]["builds"] >= 1
    assert first["source"] == ("build" if backend == "cpu" else None)
    rebuilt, rebuilt_meta = decode_entry(key, path.read_bytes())
    assert rebuilt == good and rebuilt_meta[cache_mod.BUILD_RECORD] == hashlib.sha256(good).hexdigest()

    assert again["ok"] and again["warnings"] == [], again["warnings"]
    assert again["stats"]["builds"] == 0 and again["stats"]["invalid"] == 0 and again["stats"]["disk_hits"] >= 1
    assert again["source"] == ("disk" if backend == "cpu" else None)


# -- the load check of host objects, in process ---------------------------------------------------

@pytest.fixture(scope="module")
def host_object() -> tuple[bytes, str, object]:
    """A real object of the host backend, its kernel symbol, machine: attention's module, with a function added
    that calls the C library's ``memmove``. (Whether LLVM lowers the kernel's own tile copies and clears to
    ``memcpy``/``memset`` calls or to vector stores depends on its version and the tile shapes, and the
    "unresolvable outside symbol" damage needs a call to rename.)"""
    import redfuser as rf
    from redfuser.codegen.native import compile_object, host_target
    from redfuser.runtime.object_machines import machine_of_triple
    from redfuser.workloads import attention

    machine = machine_of_triple(host_target().triple)
    if machine is None:
        pytest.skip(f"no load check for {host_target().triple} objects (they are cached in memory only)")
    q = np.random.default_rng(0).standard_normal((1, 1, 16, 16)).astype(np.float32)
    lowered = rf.kernel(attention, backend="cpu").lower(q, q, q)
    (abi,) = lowered.artifacts["host_kernels"]
    module = str(lowered.stages["llvm"]) + (
        "\ndeclare ptr @memmove(ptr, ptr, i64)\n"
        "define void @redfuser_test_move(ptr %to, ptr %from, i64 %n) {\n"
        "  %r = call ptr @memmove(ptr %to, ptr %from, i64 %n)\n  ret void\n}\n")
    return compile_object(module), abi.symbol, machine


def _elf_sections(data: bytes) -> list[dict]:
    """Section headers of a little-endian ELF64 object (test helper: where to plant a fault)."""
    shoff, = struct.unpack_from("<Q", data, 40)
    shnum, shstrndx = struct.unpack_from("<HH", data, 60)
    fields = ("name", "type", "flags", "addr", "offset", "size", "link", "info", "align", "entsize")
    sections = [dict(zip(fields, struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i)), header=shoff + 64 * i)
                for i in range(shnum)]
    names = sections[shstrndx]
    for s in sections:
        start = names["offset"] + s["name"]
        s["label"] = data[start:data.index(b"\0", start)].decode()
    return sections


def _put(data: bytes, offset: int, fmt: str, *values) -> bytes:
    patched = bytearray(data)
    struct.pack_into(fmt, patched, offset, *values)
    return bytes(patched)


def _section(data: bytes, kind: int) -> dict:
    return next(s for s in _elf_sections(data) if s["type"] == kind)


def _symbol_offset(data: bytes, name: str | None = None, kind: int | None = None) -> int:
    """The offset of the first symbol named `name` (or of `kind`, an STT_ value) in the symbol table."""
    symtab = _section(data, 2)
    strtab = _elf_sections(data)[symtab["link"]]
    for at in range(symtab["offset"] + 24, symtab["offset"] + symtab["size"], 24):
        name_at, info = struct.unpack_from("<IB", data, at)
        start = strtab["offset"] + name_at
        if (name is None or data[start:data.index(b"\0", start)].decode() == name) and \
                (kind is None or info & 0xF == kind):
            return at
    raise AssertionError(f"no symbol {name or kind}")


def _first_relocation(data: bytes) -> int:
    return _section(data, 4)["offset"]


def _other_machine(data, symbol, machine):
    return _put(data, 18, "<H", 183 if machine.e_machine == 62 else 62)


def _empty_section_far_away(data, symbol, machine):
    empty = next(s for s in _elf_sections(data) if s["size"] == 0 and s["type"] == 1)
    return _put(data, empty["header"] + 24, "<Q", len(data) + 4096)


def _as_eh_frame(data: bytes, offset: int) -> bytes:
    """The empty ``.note.GNU-stack`` renamed ``.eh_frame`` (same name length) over 8 bytes at `offset`."""
    note = next(s for s in _elf_sections(data) if s["label"] == ".note.GNU-stack")
    patched = data.replace(b".note.GNU-stack\0", b".eh_frame\0\0\0\0\0\0\0", 1)
    return _put(_put(patched, note["header"] + 24, "<Q", offset), note["header"] + 32, "<Q", 8)


def _rename_outside_routine(data: bytes) -> bytes:
    """`data` with its first call of a C library routine (``memset``, ``memcpy``, ``memmove``: the fixture
    adds a ``memmove`` call) renamed to one no process has."""
    for routine in (b"memset", b"memcpy", b"memmove"):
        if routine + b"\0" in data:
            return data.replace(routine + b"\0", routine[:-1] + b"\x01\0", 1)
    raise AssertionError("the attention object calls no C library routine")


# name: (how the object is damaged, what the refusal says)
DAMAGE = {
    "garbage": (lambda d, s, m: b"\x13\x37" * 4000, "not an ELF object"),
    "32-bit class": (lambda d, s, m: _put(d, 4, "B", 1), "ELF class 1"),
    "other byte order": (lambda d, s, m: _put(d, 5, "B", 2), "byte order"),
    "shared library": (lambda d, s, m: _put(d, 16, "<H", 3), "ELF type 3"),
    "another machine": (_other_machine, "an object for ELF machine"),
    "section table past the end": (lambda d, s, m: _put(d, 40, "<Q", len(d)), "section header table"),
    "section past the end": (lambda d, s, m: _put(d, _section(d, 2)["header"] + 32, "<Q", len(d)), "lies outside"),
    "empty section past the end": (_empty_section_far_away, "lies outside"),
    "kernel symbol missing": (lambda d, s, m: d.replace(s.encode() + b"\0", s[:-1].encode() + b"Z\0"),
                              "is not defined"),
    "kernel symbol is data": (lambda d, s, m: _put(d, _symbol_offset(d, s) + 4, "B", 0x11),
                              "is not a global function"),
    "unresolvable outside symbol": (lambda d, s, m: _rename_outside_routine(d),
                                    "this process does not provide it"),
    "undefined section symbol": (lambda d, s, m: _put(d, _symbol_offset(d, kind=3) + 6, "<H", 0),
                                 "undefined but not a named global"),
    "common-typed symbol": (lambda d, s, m: _put(d, _symbol_offset(d, kind=4) + 4, "B", 0x05),
                            "not ones LLVM emits"),
    "unknown relocation type": (lambda d, s, m: _put(d, _first_relocation(d) + 8, "<I", 0x7FFF),
                                "has type 32767"),
    "relocation of no symbol": (lambda d, s, m: _put(d, _first_relocation(d) + 12, "<I", 100000),
                                "refers to symbol 100000"),
    "relocation past its section": (lambda d, s, m: _put(d, _first_relocation(d), "<Q", 1 << 40),
                                    "patches bytes"),
    "unwind records past the section": (lambda d, s, m: _as_eh_frame(d, 0), "runs past the section"),
}


def test_object_check_accepts_what_the_host_backend_emits(host_object):
    from redfuser.runtime.cpu_jit import in_process
    from redfuser.runtime.object_check import check_host_object

    data, symbol, machine = host_object
    check_host_object(data, machine, [symbol], in_process)
    check_host_object(_as_eh_frame(data, 24), machine, [symbol], in_process)   # bytes 24..32 are 0: a terminator


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_object_check_refuses_what_would_crash_mcjit(host_object, damage):
    from redfuser.runtime.cpu_jit import in_process
    from redfuser.runtime.object_check import BadObject, check_host_object

    data, symbol, machine = host_object
    if machine.e_machine != 62 or not machine.little_endian:
        pytest.skip("the faults are planted at x86-64 little-endian offsets")
    make, says = DAMAGE[damage]
    bad = make(data, symbol, machine)
    assert bad != data
    with pytest.raises(BadObject, match=says):
        check_host_object(bad, machine, [symbol], in_process)


def test_object_check_only_ever_raises_bad_object(host_object):
    """Random damage to the headers and tables: accepted or `BadObject`, never another exception."""
    from redfuser.runtime.cpu_jit import in_process
    from redfuser.runtime.object_check import BadObject, check_host_object

    data, symbol, machine = host_object
    rng = np.random.default_rng(18)
    regions = [(0, 64)] + [(s["header"], s["header"] + 64) for s in _elf_sections(data)] + \
        [(s["offset"], s["offset"] + s["size"]) for s in _elf_sections(data) if s["type"] in (2, 3, 4) and s["size"]]
    refused = 0
    for _ in range(600):
        bad = bytearray(data)
        start, end = regions[rng.integers(len(regions))]
        for at in rng.integers(start, end, size=rng.integers(1, 4)):
            bad[at] = rng.integers(256)
        try:
            check_host_object(bytes(bad), machine, [symbol], in_process)
        except BadObject:
            refused += 1
    assert refused > 300


def test_machines_without_a_table_have_no_check():
    from redfuser.runtime.object_machines import AARCH64, X86_64, machine_of_triple

    assert machine_of_triple("x86_64-unknown-linux-gnu") is X86_64
    assert machine_of_triple("arm64-apple-darwin23.0.0") is AARCH64
    assert machine_of_triple("aarch64_be-unknown-linux-gnu").little_endian is False
    assert machine_of_triple("riscv64-unknown-linux-gnu") is None
    assert machine_of_triple("powerpc64le-unknown-linux-gnu") is None


def test_host_objects_stay_in_memory_where_the_machine_has_no_check(tmp_path, monkeypatch):
    """On a machine without a relocation table nothing is linked from disk: nothing is written there either."""
    import redfuser as rf
    from redfuser.runtime import cpu_jit
    from redfuser.workloads import softmax

    monkeypatch.setenv("REDFUSER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_jit, "machine_of_triple", lambda triple: None)
    monkeypatch.setattr(cpu_jit, "_memory_cache", functools.cache(cpu_jit._memory_cache.__wrapped__))
    reset_default_cache()
    try:
        text = str(rf.kernel(softmax, backend="cpu").lower(np.zeros((2, 40), np.float32)).stages["llvm"])
        _, first = cpu_jit.compile_cached(text, {"test": "no table"})
        _, second = cpu_jit.compile_cached(text, {"test": "no table"})
        assert (first.source, second.source) == ("build", "memory")
        assert not list((tmp_path / "cache").rglob("*.bin"))
    finally:
        reset_default_cache()


def test_exported_functions_are_the_modules_external_definitions():
    from redfuser.runtime.cpu_jit import exported_functions

    text = ('define internal float @"rf.expf"(float %".1") nounwind\n{\n}\n'
            'define void @"rf_softmax_0"(ptr noalias %"x", i64 %"begin") nounwind\n{\n}\n'
            'define private void @helper() {\n}\ndefine void @plain(i64 %n) {\n}\n')
    assert exported_functions(text) == ["rf_softmax_0", "plain"]


# -- checked payloads in the cache, in process ----------------------------------------------------

def _only_good(payload: bytes) -> str | None:
    return None if payload.startswith(b"good") else f"it starts with {payload[:4]!r}"


def test_checked_fetch_rebuilds_an_invalid_entry_and_warns_at_the_callers_line(tmp_path):
    CompileCache(tmp_path).put(key_of(), b"bad payload")
    cache = CompileCache(tmp_path)
    with pytest.warns(CacheWarning) as caught:
        line = sys._getframe().f_lineno + 1     # the warning points at the call below, not into the cache
        got = cache.fetch(key_of(), lambda: b"good payload", check=_only_good, describe="object code of f")
    (warning,) = caught
    assert (warning.filename, warning.lineno) == (__file__, line)
    assert "the cached object code of f in" in str(warning.message) and "it starts with b'bad '" in str(warning.message)
    assert (got.source, got.payload, cache.stats.invalid) == ("build", b"good payload", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = CompileCache(tmp_path).fetch(key_of(), lambda: pytest.fail("stored"), check=_only_good)
    assert (again.source, again.payload) == ("disk", b"good payload")


@pytest.mark.parametrize("meta, says", [
    ({}, "no build record"),
    ({cache_mod.BUILD_RECORD: hashlib.sha256(b"good other").hexdigest()}, "not the one its build record describes"),
], ids=["no record", "record of another payload"])
def test_checked_fetch_wants_the_build_record_of_the_payload(tmp_path, meta, says):
    path = CompileCache(tmp_path).entry_path(key_of())
    path.parent.mkdir(parents=True)
    path.write_bytes(encode_entry(key_of(), b"good but unrecorded", meta))
    assert CompileCache(tmp_path).get(key_of()) == b"good but unrecorded"   # an unchecked read does not care
    with pytest.warns(CacheWarning, match=says):
        assert CompileCache(tmp_path).get(key_of(), check=_only_good) is None
    assert not path.exists()


def test_a_fresh_build_failing_its_check_is_an_error_and_never_written(tmp_path):
    """Loading an object that fails the check can crash the process (a call to address 0, seen when LLVM
    emitted a call of __truncdfhf2): the fresh build is refused with an InternalError, not used."""
    from redfuser import InternalError

    cache = CompileCache(tmp_path)
    with pytest.raises(InternalError, match="just built fails its load check .*does not load it"):
        cache.fetch(key_of(), lambda: b"bad build", check=_only_good, describe="thing")
    assert not list(tmp_path.rglob("*.bin"))
    assert cache.fetch(key_of(), lambda: b"good payload", check=_only_good).source == "build"


# -- the PTX payload ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ptx_payload_of_softmax() -> bytes:
    import redfuser as rf
    from redfuser.runtime import ptx_payload
    from redfuser.workloads import softmax

    lowered = rf.kernel(softmax, backend="cuda", sm="sm_90").lower(np.zeros((4, 100), np.float32))
    (kernel,) = lowered.stages["ptx"].kernels
    assert kernel.entry == "softmax_0"
    return ptx_payload.encode(kernel.llvm_ir, kernel.ptx)


def _ptx_edit(payload: bytes, old: bytes, new: bytes) -> bytes:
    assert payload.count(old) >= 1
    return payload.replace(old, new)


PTX_DAMAGE = {
    "no separator": (lambda p: p.replace(b"\0", b"\n"), "0 separators"),
    "two separators": (lambda p: p + b"\0", "2 separators"),
    "not UTF-8": (lambda p: p + b"\xff", "not UTF-8"),
    "LLVM IR of another kernel": (lambda p: _ptx_edit(p, b'@"softmax_0"(', b'@"other_0"('), "does not define"),
    "another PTX version": (lambda p: _ptx_edit(p, b"\n.version ", b"\n.version 1"), ".version"),
    "another target": (lambda p: _ptx_edit(p, b".target sm_90", b".target sm_80"), ".target sm_90"),
    "32-bit addresses": (lambda p: _ptx_edit(p, b".address_size 64", b".address_size 32"), ".address_size"),
    "another entry": (lambda p: _ptx_edit(p, b".entry softmax_0", b".entry other_0"), "entries ['other_0']"),
    "truncated": (lambda p: p[:-40], "ends inside a block"),
}


@pytest.mark.parametrize("damage", list(PTX_DAMAGE), ids=list(PTX_DAMAGE))
def test_ptx_payload_check(ptx_payload_of_softmax, damage):
    from redfuser.runtime import ptx_payload

    assert ptx_payload.problem(ptx_payload_of_softmax, "softmax_0", "sm_90") is None
    make, says = PTX_DAMAGE[damage]
    assert says in (ptx_payload.problem(make(ptx_payload_of_softmax), "softmax_0", "sm_90") or "accepted")
