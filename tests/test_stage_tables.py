"""Backends own their stage lists: `compiler.lower` runs the backend's `Stage`s in order, one name per stage
for its text, its timing and its dump file; the cpu backend's ``native`` stage makes the object code inside
`lower` (printed as assembly, a compile-cache hit doing no LLVM work); prefetch is its own stage; the GPU's
``llvm`` and ``ptx`` are two stages, a compile-cache hit doing no LLVM work in either; the compiler imports
no runtime module."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import redfuser as rf
from redfuser import backends, cli, compiler, workloads
from redfuser.codegen.native import NativeCode
from redfuser.codegen.simt.plan import choose_warps
from redfuser.schedule.prefetch import prefetch_operands


def _x() -> np.ndarray:
    return np.ones((4, 64), np.float32)


@pytest.mark.parametrize("name", sorted(backends.BACKENDS))
def test_each_stage_has_one_name_for_its_text_its_timing_and_its_dump_file(name, tmp_path, monkeypatch):
    monkeypatch.setenv("REDFUSER_DUMP_DIR", str(tmp_path))
    lowered = rf.kernel(workloads.softmax, backend=name, sm="sm_90").lower(_x())
    stages = backends.BACKENDS[name].stages
    ran = [s.name for s in stages if s.applies(lowered)]
    assert list(lowered.timings) == list(lowered.stages) == ran
    assert set(lowered.parts) <= set(ran)
    assert len(set(ran)) == len(ran)                           # one name a stage
    files = sorted(p.name for p in (tmp_path / "softmax" / lowered.specialization).iterdir())
    assert files == [f"{n:02d}-{stage}.txt" for n, stage in enumerate(ran)]
    assert [line[4:-4] for line in str(lowered).splitlines() if line.startswith("=== ")] == ran
    assert not lowered.artifacts.get("pending_ptx")            # the GPU's LLVM modules do not outlive the compile


def test_each_backend_record_says_where_its_arrays_live_and_how_it_schedules():
    assert {n: b.arrays for n, b in backends.BACKENDS.items()} == {
        "interpret": "host", "cpu": "host", "cuda": "device", "simulate": "host"}
    assert backends.BACKENDS["interpret"].schedule is None
    assert backends.BACKENDS["cuda"].schedule.pow2 and not backends.BACKENDS["cpu"].schedule.pow2
    assert backends.BACKENDS["cpu"].workers(rf.KernelOptions(num_threads=3)) == 3
    assert backends.BACKENDS["cpu"].gpu_options(rf.KernelOptions()) is None
    assert backends.BACKENDS["simulate"].gpu_options(rf.KernelOptions(sm="sm_80", num_warps=2)).num_warps == 2


def test_the_native_stage_is_object_code_printed_as_assembly():
    lowered = rf.kernel(workloads.softmax, backend="cpu").lower(_x())
    native = lowered.stages["native"]
    assert isinstance(native, NativeCode) and native.obj[:4] == b"\x7fELF"
    text = str(native)
    symbol = lowered.artifacts["host_kernels"][0].symbol
    assert f"{symbol}:" in text and "ret" in text
    assert "=== native ===" in str(lowered)


def test_a_cache_hit_in_the_native_stage_does_no_llvm_work(tmp_path, monkeypatch):
    from redfuser.runtime import cpu_jit
    from redfuser.runtime.cache import reset_default_cache

    built = []
    real = cpu_jit.compile_object
    # (log_softmax's own modules: the call path's trampoline, `native_entry`, is built once per process,
    # here if this test is a process's first to call a kernel)
    monkeypatch.setattr(cpu_jit, "compile_object",
                        lambda text: (built.append(1) if 'ModuleID = "log_softmax"' in text else None, real(text))[1])
    monkeypatch.setenv("REDFUSER_CACHE_DIR", str(tmp_path))
    reset_default_cache()
    try:
        first = rf.kernel(workloads.log_softmax, backend="cpu").lower(_x())
        reset_default_cache()                              # a new process would find it on disk
        second = rf.kernel(workloads.log_softmax, backend="cpu")
        again = second.lower(_x())
        np.testing.assert_allclose(second(_x()), rf.kernel(workloads.log_softmax, backend="interpret")(_x()),
                                   rtol=1e-6)
    finally:
        reset_default_cache()
    assert built == [1]
    assert (first.artifacts["compile"].source, again.artifacts["compile"].source) == ("build", "disk")
    assert again.stages["native"].obj == first.stages["native"].obj


def test_a_cache_hit_in_the_gpu_llvm_stage_does_no_llvm_work_in_either_stage(tmp_path, monkeypatch):
    """The ``llvm`` stage looks each kernel up in the compile cache; a disk hit carries the cached LLVM IR
    and PTX forward, so neither it emits nor the ``ptx`` stage compiles, and both print as before."""
    from redfuser.codegen.simt import ptx as ptx_mod
    from redfuser.runtime.cache import default_cache, reset_default_cache

    monkeypatch.setenv("REDFUSER_CACHE_DIR", str(tmp_path))
    reset_default_cache()
    try:
        first = rf.kernel(workloads.log_softmax, backend="cuda", sm="sm_80").lower(_x())
        assert default_cache().stats.builds == len(first.stages["simt"].kernels)
        reset_default_cache()                              # a new process would find it on disk

        def no_llvm_work(*args, **kwargs):
            raise AssertionError("LLVM work on a cache hit")

        monkeypatch.setattr(ptx_mod, "emit_parsed", no_llvm_work)
        monkeypatch.setattr(ptx_mod, "compile_module", no_llvm_work)
        again = rf.kernel(workloads.log_softmax, backend="cuda", sm="sm_80").lower(_x())
        stats = default_cache().stats
    finally:
        reset_default_cache()
    assert (stats.disk_hits, stats.misses, stats.builds) == (len(again.stages["simt"].kernels), 0, 0)
    assert list(again.timings) == list(first.timings) and "ptx" not in again.parts
    assert str(again.stages["llvm"]) == str(first.stages["llvm"]) and again.stages["ptx"] == first.stages["ptx"]


def test_the_dump_and_explain_show_the_native_stage(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("REDFUSER_DUMP_DIR", str(tmp_path))
    lowered = rf.kernel(workloads.softmax, backend="cpu").lower(_x())
    files = sorted(p.name for p in (tmp_path / "softmax" / lowered.specialization).iterdir())
    assert files == [f"{n:02d}-{name}.txt" for n, name in enumerate(lowered.stages)] and files[-1] == "04-native.txt"
    monkeypatch.delenv("REDFUSER_DUMP_DIR")
    assert cli.main(["explain", "--backend", "cpu", "--workload", "softmax", "--stages"]) == 0
    out = capsys.readouterr().out
    assert "=== native ===" in out and "  native " in out


def test_each_compile_dumps_to_a_folder_of_its_own(tmp_path, monkeypatch):
    """Two kernels named alike (closures of other constants), and a kernel's exact compile and its shape
    class, write their stages apart: one folder was overwritten and left mixed (02-tile of one compile beside
    03-tile of the next)."""
    monkeypatch.setenv("REDFUSER_DUMP_DIR", str(tmp_path))

    def scaled(c):
        def f(x):
            return x * c
        return f

    lowered = [rf.kernel(scaled(c), backend="cpu").lower(_x()) for c in (2.0, 3.0)]
    grows = rf.kernel(workloads.softmax, backend="cpu")
    for n in (64, 65, 66):
        grows(np.ones((4, n), np.float32))
    folders = sorted(p.name for p in (tmp_path / "f").iterdir())
    assert folders == sorted(lo.specialization for lo in lowered)
    assert "x[i0,i1] * 3.0" in (tmp_path / "f" / lowered[1].specialization / "00-traced.txt").read_text()
    for compiled in (tmp_path / "softmax").iterdir():
        names = sorted(p.name for p in compiled.iterdir())
        assert names == sorted(f"{n:02d}-{stage}.txt" for n, stage in enumerate(s[3:-4] for s in names)), names
    assert len(list((tmp_path / "softmax").iterdir())) == 2     # the exact compile and the shape class


def test_prefetch_is_its_own_stage_between_schedule_and_simt():
    q = np.ones((1, 2, 256, 64), np.float16)
    lowered = rf.kernel(workloads.attention, backend="simulate", prefetch=True, block_m=64).lower(q, q, q)
    assert list(lowered.timings) == ["traced", "fused", "tile", "prefetched", "simt", "llvm", "ptx"]
    assert list(lowered.stages)[2:4] == ["tile", "prefetched"]
    tile = lowered.stages["tile"]
    threads = {k.name: 32 * choose_warps(k, lowered.gpu) for k in tile.kernels}   # a plain count a kernel
    assert lowered.stages["prefetched"] == prefetch_operands(tile, threads) != tile
    off = rf.kernel(workloads.attention, backend="simulate", block_m=64).lower(q, q, q)
    assert "prefetched" not in off.timings and "prefetched" not in off.stages


def test_the_compiler_imports_no_runtime_module():
    tree = ast.parse(Path(compiler.__file__).read_text())
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert names and not [n for n in names if "runtime" in n]


def test_hopper_with_tma_has_the_k_major_stage_between_fusion_and_schedule():
    """On sm_90a with TMA the GPU stages read e4m3 weights from a K-major copy (`schedule/k_major.py`): a stage
    of its own after `fused`, printed and timed like the others; on sm_90 (no wgmma) there is none."""
    x = np.ones((512, 256), np.float16)
    w, ws = np.ones((256, 128), rf.float8_e4m3fn), np.ones(128, np.float32)
    lowered = rf.kernel(workloads.fp8_quant_gemm, backend="simulate", sm="sm_90a").lower(x, w, ws)
    assert list(lowered.timings) == ["traced", "fused", "k_major", "tile", "simt", "llvm", "ptx"]
    assert "w_k_major" in str(lowered.stages["k_major"])
    plain = rf.kernel(workloads.fp8_quant_gemm, backend="simulate", sm="sm_90").lower(x, w, ws)
    assert "k_major" not in plain.stages
