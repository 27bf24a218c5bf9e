"""Autotuning (`redfuser.runtime.autotune`) on the cpu backend with a fake, deterministic timer: it times every
candidate of the search space once, keeps the fastest, stores it beside the compile cache, and a second kernel
or a restarted process reads it without timing anything; a corrupt file is ignored and rewritten; options the
user set are never tuned; tuning off compiles the fixed defaults; a progress line goes to stderr."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from redfuser.ir import BackendError
from redfuser.runtime import autotune
from redfuser.runtime.autotune import SPACES, Config
from redfuser.runtime.cache import CacheWarning

import redfuser as rf

X = np.random.default_rng(0).standard_normal((24, 40)).astype(np.float32)
FASTEST = Config(block_m=16)


def softmax(x):
    e = rf.exp(x - rf.max(x, axis=-1, keepdims=True))
    return e / rf.sum(e, axis=-1, keepdims=True)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache folder of this test's own (compile cache and tuning results)."""
    monkeypatch.setenv("REDFUSER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("REDFUSER_AUTOTUNE", raising=False)
    return tmp_path


class FakeTimer:
    """Runs each candidate once (so it must compile and run), then says `FASTEST` is fastest."""

    def __init__(self, fail=()):
        self.seen: list[Config] = []
        self.fail = set(fail)

    def __call__(self, run, config):
        self.seen.append(config)
        if config in self.fail:
            raise BackendError("too much shared memory for this tile")
        run()
        return 1e-3 if config == FASTEST else 2e-3 + 1e-4 * len(self.seen)


def no_timing(run, config):
    raise AssertionError(f"timed {config} although a result is stored")


def stored(cache) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((cache / "autotune").glob("*.json"))]


def test_picks_the_fastest_stores_it_and_prints_progress(cache, capfd):
    timer = FakeTimer()
    kernel = rf.kernel(softmax, backend="cpu", autotune=True)
    with autotune.using_timer(timer):
        np.testing.assert_allclose(kernel(X), softmax(X), rtol=1e-5, atol=1e-7)
    assert timer.seen == list(SPACES["cpu"])          # each candidate once, the untuned kernel first
    assert kernel.lower(X).options.block_m == 16
    assert "grid (2,)" in str(kernel.lower(X).stages["tile"])       # 24 rows in tiles of 16 (the default: 32)
    (record,) = stored(cache)
    assert record["best"] == {"block_m": 16} and record["kernel"] == "softmax" and record["backend"] == "cpu"
    assert len(record["timings"]) == len(SPACES["cpu"])
    err = capfd.readouterr().err
    assert "\rautotune softmax [cpu] 1/7 defaults: ..." in err and "7/7 split=1: " in err
    assert "\nautotune softmax [cpu]: block_m=16 (1.000 ms), saved to " in err and err.rstrip().endswith(".json")


def test_a_second_kernel_reads_the_result_without_timing(cache, capfd):
    with autotune.using_timer(FakeTimer()):
        rf.kernel(softmax, backend="cpu", autotune=True)(X)
    capfd.readouterr()
    again = rf.kernel(softmax, backend="cpu", autotune=True)
    with autotune.using_timer(no_timing):
        np.testing.assert_allclose(again(X), softmax(X), rtol=1e-5, atol=1e-7)
        assert again.lower(X).options.block_m == 16
    assert "autotune" not in capfd.readouterr().err
    with autotune.using_timer(FakeTimer()):       # another shape is another specialization: tuned anew
        rf.kernel(softmax, backend="cpu", autotune=True)(X[:5])
    assert len(stored(cache)) == 2


def test_with_the_cache_off_results_stay_in_memory(cache, monkeypatch, capfd):
    """``REDFUSER_CACHE=0`` writes nothing to disk, tuning results included; a second kernel in the process
    still finds the result (in memory) without timing."""
    monkeypatch.setenv("REDFUSER_CACHE", "0")
    monkeypatch.setattr(autotune, "_IN_MEMORY", autotune.TuningStore(None))
    with autotune.using_timer(FakeTimer()):
        rf.kernel(softmax, backend="cpu", autotune=True)(X)
    assert "kept in memory (the cache is off)" in capfd.readouterr().err
    assert list(cache.rglob("*")) == []
    with autotune.using_timer(no_timing):
        assert rf.kernel(softmax, backend="cpu", autotune=True).lower(X).options.block_m == 16


SCRIPT = """
import sys
import numpy as np
import redfuser as rf
from redfuser.runtime import autotune

def scale_rows(x):
    return x / rf.sum(rf.abs(x), axis=-1, keepdims=True)

def timer(run, config):
    if sys.argv[1] == "read":
        raise SystemExit("timed after a restart")
    run()
    return 1.0 if config.block_m != 64 else 0.5

x = np.arange(60, dtype=np.float32).reshape(6, 10)
with autotune.using_timer(timer):
    kernel = rf.kernel(scale_rows, backend="cpu")
    assert np.allclose(kernel(x), x / np.abs(x).sum(-1, keepdims=True))
    print(kernel.lower(x).options.block_m)
"""


def test_a_restarted_process_reads_the_result(cache, tmp_path):
    script = tmp_path / "tuned.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "REDFUSER_CACHE_DIR": str(cache), "REDFUSER_AUTOTUNE": "1"}
    first = subprocess.run([sys.executable, str(script), "tune"], env=env, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "64" and "autotune scale_rows [cpu] 7/7" in first.stderr
    second = subprocess.run([sys.executable, str(script), "read"], env=env, capture_output=True, text=True, check=False)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "64" and "autotune" not in second.stderr


def test_a_corrupt_file_is_ignored_and_rewritten(cache):
    with autotune.using_timer(FakeTimer()):
        rf.kernel(softmax, backend="cpu", autotune=True)(X)
    (path,) = (cache / "autotune").glob("*.json")
    for garbage in ("{not json", json.dumps({**stored(cache)[0], "best": {"block_m": "huge"}}), ""):
        path.write_text(garbage)
        timer = FakeTimer()
        with autotune.using_timer(timer), pytest.warns(CacheWarning, match="unreadable"):
            rf.kernel(softmax, backend="cpu", autotune=True)(X)
        assert len(timer.seen) == len(SPACES["cpu"])
        assert stored(cache)[0]["best"] == {"block_m": 16}


def test_a_stored_config_the_options_refuse_or_a_file_that_is_not_regular_is_ignored(cache):
    """A best config of ints the options refuse (``num_warps: 7``) raised the options' error on every call of
    every process, naming options the user never set; a FIFO at the file's path hung the first call, a link to
    /dev/zero read until memory ran out. Each is now an unreadable file: warned, tuned again, rewritten.
    Found by a helper planting files in the cache."""
    with autotune.using_timer(FakeTimer()):
        rf.kernel(softmax, backend="cpu", autotune=True)(X)
    (path,) = (cache / "autotune").glob("*.json")
    record = stored(cache)[0]
    plants = [lambda: path.write_text(json.dumps({**record, "best": {"num_warps": 7}})),
              lambda: os.mkfifo(path), lambda: path.symlink_to("/dev/zero")]
    for plant in plants:
        path.unlink()
        plant()
        timer = FakeTimer()
        with autotune.using_timer(timer), pytest.warns(CacheWarning, match="unreadable"):
            rf.kernel(softmax, backend="cpu", autotune=True)(X)
        assert len(timer.seen) == len(SPACES["cpu"]) and path.is_file() and not path.is_symlink()
        assert stored(cache)[0]["best"] == {"block_m": 16}


def test_options_the_user_set_are_never_tuned_and_failures_are_skipped(cache, capfd):
    timer = FakeTimer(fail={Config(block_m=8, block_n=32, block_k=32)})
    kernel = rf.kernel(softmax, backend="cpu", autotune=True, block_m=8)
    with autotune.using_timer(timer):
        np.testing.assert_allclose(kernel(X), softmax(X), rtol=1e-5, atol=1e-7)
    assert {c.block_m for c in timer.seen} == {8} and len(timer.seen) == len(set(timer.seen)) == 5
    assert kernel.lower(X).options.block_m == 8
    assert "skipped (too much shared memory" in capfd.readouterr().err


def test_tuning_off_compiles_the_fixed_defaults(cache):
    with autotune.using_timer(no_timing):
        kernel = rf.kernel(softmax, backend="cpu")
        kernel(X)
        assert kernel.options.autotune is False and kernel.lower(X).options.block_m is None
        rf.kernel(softmax, backend="simulate", autotune=True)(X)    # the simulator is not timed
    assert not (cache / "autotune").exists()


def test_compiling_without_running_only_reads_stored_results(cache):
    kernel = rf.kernel(softmax, backend="cpu", autotune=True)
    with autotune.using_timer(no_timing):
        assert kernel.lower(X).options.block_m is None              # nothing stored: the defaults
    with autotune.using_timer(FakeTimer()):
        rf.kernel(softmax, backend="cpu", autotune=True)(X)
    with autotune.using_timer(no_timing):
        assert rf.kernel(softmax, backend="cpu", autotune=True).lower(X).options.block_m == 16


def test_the_key_ignores_source_lines_but_not_code_shapes_or_options():
    ir = "kernel f(x: f32[4]) -> (out: f32[4])\n  # a.py:3  y = x\n  out = x"
    key = autotune.tuning_key(ir, "specs", "cpu", "dev", {"fuse": True})
    assert key == autotune.tuning_key(ir.replace("a.py:3", "b.py:9"), "specs", "cpu", "dev", {"fuse": True})
    for other in (autotune.tuning_key(ir.replace("= x", "= x + 1"), "specs", "cpu", "dev", {"fuse": True}),
                  autotune.tuning_key(ir, "specs2", "cpu", "dev", {"fuse": True}),
                  autotune.tuning_key(ir, "specs", "cuda", "dev", {"fuse": True}),
                  autotune.tuning_key(ir, "specs", "cpu", "dev2", {"fuse": True}),
                  autotune.tuning_key(ir, "specs", "cpu", "dev", {"fuse": False})):
        assert other != key


@pytest.mark.gpu
def test_autotuning_on_the_device_with_cuda_events(cache, capfd):
    kernel = rf.kernel(softmax, backend="cuda", autotune=True)
    np.testing.assert_allclose(kernel(X), softmax(X), rtol=1e-5, atol=1e-6)
    (record,) = stored(cache)
    assert record["backend"] == "cuda" and all(s is None or 0 < s < 1 for _, s in record["timings"])
    assert "autotune softmax [cuda]" in capfd.readouterr().err


def test_a_stored_config_may_set_prefetch_only_as_a_bool():
    from redfuser.runtime.autotune import _config

    assert _config({"block_m": 64, "prefetch": True}) == Config(block_m=64, prefetch=True)
    assert str(Config(num_warps=8, prefetch=True)) == "num_warps=8 prefetch=True"
    for bad in ({"prefetch": 1}, {"block_m": True}, {"prefetch": "yes"}, {"unknown": 1}):
        with pytest.raises(ValueError, match="not a config"):
            _config(bad)
    assert Config(prefetch=True, min_blocks_per_sm=3) in SPACES["cuda"]   # the device measures it; off by default
    assert _config({"min_blocks_per_sm": 3}) == Config(min_blocks_per_sm=3)


def test_an_autotuned_kernel_compiles_every_shape_exactly(cache):
    """Tuning measures the call's own shapes, so `dynamic` does not make a tuned kernel a shape class."""
    kernel = rf.kernel(softmax, backend="cpu", autotune=True, dynamic=True)
    with autotune.using_timer(FakeTimer()):
        for rows in (24, 40):
            x = np.random.default_rng(rows).standard_normal((rows, 64)).astype(np.float32)
            np.testing.assert_allclose(kernel(x), softmax(x), rtol=1e-5, atol=1e-7)
    assert kernel.cache_info().misses == 2
    assert all(lowered.shapes is None for lowered, _ in kernel._cache.values())
