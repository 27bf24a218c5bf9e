"""The compile cache: keys, memory and disk layers, corrupt entries, unwritable folders, concurrency."""
from __future__ import annotations

import errno
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
    with pytest.warns(CacheWarning):
        assert cache.get(key_of()) is None
    assert not path.exists()


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

    monkeypatch.setattr(ptx_mod, "emit_text", no_emission)
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
        with pytest.raises(rf.ArgumentError, match="llvm_opt must be None, 1, 2 or 3"):
            rf.kernel(softmax, backend="cuda", sm="sm_90", llvm_opt=bad).lower(x)
    reset_default_cache()
