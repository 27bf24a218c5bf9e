"""What the compile-time work keeps true: per-stage timings are recorded (never asserted as numbers),
printing a module once gives the same text, LLVM's parse made by the emission's check is what code
generation starts from, a kernel the ``simt`` stage verified is not re-checked by the ``llvm`` stage but a
broken one still fails, and the garbage collector paused during a compile comes back on."""
from __future__ import annotations

import dataclasses
import gc

import numpy as np
import pytest

import redfuser as rf
import simt_kernels as K
from redfuser import cli, compiler, workloads
from redfuser.codegen import nvptx
from redfuser.codegen.simt_to_llvm import emit_module, emit_parsed, emit_text
from redfuser.ir.simt import verifier as simt_verifier
from redfuser.ir.errors import RedFuserError, VerifyError


def _softmax_input() -> np.ndarray:
    return np.ones((4, 64), np.float32)


def test_lower_records_each_stage_in_pipeline_order():
    lowered = rf.kernel(workloads.softmax, backend="cuda", sm="sm_90").lower(_softmax_input())
    assert list(lowered.timings) == ["traced", "fused", "tile", "simt", "llvm", "ptx"]
    assert all(seconds >= 0.0 for seconds in lowered.timings.values())
    table = lowered.timing_table()
    assert table.startswith("compile time per stage:") and "ptx" in table and "total" in table


def test_the_gpu_stages_say_where_their_time_went(tmp_path, monkeypatch):
    """The ``simt`` stage records its steps (planning, emission, clean-up, barriers, verifier), the ``llvm``
    stage its parts (the cache key, i.e. the printed SIMT IR; the LLVM emission) and the ``ptx`` stage
    LLVM's middle end and code generation; they lie inside their stage's own time, and the table prints
    them under it. A kernel the disk cache serves has no emission or code generation to report."""
    from redfuser.runtime.cache import reset_default_cache

    monkeypatch.setenv("REDFUSER_CACHE_DIR", str(tmp_path))
    reset_default_cache()
    try:
        lowered = rf.kernel(workloads.softmax, backend="simulate").lower(_softmax_input())
        steps = lowered.parts["simt"]
        assert list(steps) == ["plan", "emit", "clean-up", "barriers", "verify"]
        assert all(t > 0.0 for t in steps.values()) and sum(steps.values()) <= lowered.timings["simt"]
        expected = {"llvm": ["cache key", "llvm ir"], "ptx": ["llvm -> ptx"]}
        table = lowered.timing_table().splitlines()
        for stage, names in expected.items():
            parts = lowered.parts[stage]
            assert list(parts) == names
            assert all(t > 0.0 for t in parts.values()) and sum(parts.values()) <= lowered.timings[stage]
            at = next(i for i, line in enumerate(table) if line.split()[0] == stage)
            under = table[at + 1:at + 1 + len(names)]
            assert all(line.startswith("    ") and line.strip().startswith(name) for line, name in zip(under, names))
            assert not table[at + 1 + len(names)].startswith("    ")
        assert table[-1].split()[0] == "total"
        reset_default_cache()                              # a new cache object over the same folder
        again = rf.kernel(workloads.softmax, backend="simulate").lower(_softmax_input())
        assert list(again.parts["llvm"]) == ["cache key"] and "ptx" not in again.parts
        assert list(again.timings) == list(lowered.timings)
    finally:
        reset_default_cache()


def test_cpu_lower_records_its_stages():
    lowered = rf.kernel(workloads.softmax, backend="cpu").lower(_softmax_input())
    assert list(lowered.timings) == ["traced", "fused", "tile", "llvm", "native"]


def test_explain_stages_prints_the_timings(capsys):
    assert cli.main(["explain", "--backend", "interpret", "--workload", "softmax", "--stages"]) == 0
    assert "compile time per stage:" in capsys.readouterr().out


def test_emit_text_is_the_printed_module_and_its_parse_feeds_compile_module(monkeypatch):
    text = emit_text(K.block_sum())
    assert text == str(emit_module(K.block_sum()))
    again, parsed = emit_parsed(K.block_sum())
    assert again == text
    parses = []
    real = nvptx.parse_and_verify
    monkeypatch.setattr(nvptx, "parse_and_verify", lambda *a, **k: (parses.append(1), real(*a, **k))[1])
    from_parse = nvptx.compile_module(text, parsed=parsed).ptx
    assert parses == []                # code generation started from the emission's parse
    assert from_parse == nvptx.compile_module(text).ptx and parses == [1]


def test_the_llvm_stage_does_not_verify_again_and_a_broken_kernel_still_fails(monkeypatch, tmp_path):
    from redfuser.runtime.cache import reset_default_cache

    checked = []
    real = simt_verifier._check_kernel
    monkeypatch.setattr(simt_verifier, "_check_kernel", lambda k, name: (checked.append(name), real(k, name)))
    monkeypatch.setenv("REDFUSER_CACHE_DIR", str(tmp_path))
    reset_default_cache()
    try:
        lowered = rf.kernel(workloads.softmax, backend="simulate").lower(_softmax_input())
    finally:
        reset_default_cache()
    assert list(lowered.parts["llvm"]) == ["cache key", "llvm ir"]   # emitted, not served
    assert checked == ["lower_to_simt"] * len(lowered.stages["simt"].kernels)
    kernel = K.block_sum()
    assert simt_verifier.verify_simt_kernel(kernel) is kernel
    broken = dataclasses.replace(kernel, warps=40)  # more than 32 warps per block
    for _ in range(2):
        with pytest.raises(VerifyError):
            simt_verifier.verify_simt_kernel(broken)


def test_the_garbage_collector_is_back_on_after_a_compile_even_a_failing_one():
    assert gc.isenabled()
    rf.kernel(workloads.softmax, backend="cpu").lower(_softmax_input())
    assert gc.isenabled()

    def broken(x):
        return x.no_such_method()

    with pytest.raises((RedFuserError, AttributeError)):
        rf.kernel(broken, backend="cpu").lower(_softmax_input())
    assert gc.isenabled() and compiler._gc_pausers == 0


def test_a_compile_leaves_a_disabled_collector_disabled():
    gc.disable()
    try:
        rf.kernel(workloads.softmax, backend="cpu").lower(_softmax_input())
        assert not gc.isenabled()
    finally:
        gc.enable()
