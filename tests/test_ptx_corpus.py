"""The snapshot corpus: generated SIMT IR and PTX of a fixed set of kernels, at the default GPU tiles.

Each kernel is compiled with ``backend="cuda"`` (no GPU needed) for sm_90 and sm_80; every PTX is assembled
for each architecture it can run on (nvJitLink), the assembler's registers / spill bytes / shared memory are
recorded, and the default tiles must not spill. The printed SIMT IR, the sm_90 PTX and the resource table are
compared with ``tests/snapshots/``: any difference fails and prints the diff; after an intended change,
``REDFUSER_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_ptx_corpus.py`` rewrites them (then review the diff).
"""
from __future__ import annotations

import pytest
from helpers import CORPUS, compare
from redfuser.codegen.ptx_check import check_ptx

import redfuser as rf


def resources(lowered) -> list[str]:
    """One line per (kernel, architecture): registers, spills, shared memory; every PTX assembled."""
    lines = []
    for k in lowered.stages["ptx"].kernels:
        for arch, result in check_ptx(k.ptx).items():
            (usage,) = [u for u in result.usage if u.kernel == k.entry]
            lines.append(f"{k.name} ptx={lowered.stages['ptx'].sm} on {arch}: {usage.registers} registers, "
                         f"spills {usage.spill_store_bytes}/{usage.spill_load_bytes} B, "
                         f"{usage.shared_bytes} B shared")
            assert usage.spill_store_bytes == usage.spill_load_bytes == 0, f"{k.name} spills on {arch}"
    return lines


@pytest.mark.parametrize("name", list(CORPUS))
def test_corpus(name):
    fn, args = CORPUS[name]
    sm90 = rf.kernel(fn, backend="cuda", sm="sm_90").lower(*args)
    sm80 = rf.kernel(fn, backend="cuda", sm="sm_80").lower(*args)
    compare(f"{name}.simt", f"{sm90.stages['simt']}\n")
    compare(f"{name}.sm_90.ptx", f"{sm90.stages['ptx']}\n")
    compare(f"{name}.resources", "\n".join(resources(sm90) + resources(sm80)) + "\n")


def test_attention_in_f16_runs_on_tensor_cores():
    fn, args = CORPUS["attention_f16"]
    for sm in ("sm_80", "sm_90"):
        assert "mma.sync.aligned.m16n8k16" in str(rf.kernel(fn, backend="cuda", sm=sm).lower(*args).stages["ptx"])
    fn, args = CORPUS["fp8_quant_gemm"]
    assert "e4m3" in str(rf.kernel(fn, backend="cuda", sm="sm_90").lower(*args).stages["ptx"])


def test_a_changed_snapshot_fails_with_its_diff(tmp_path, monkeypatch):
    monkeypatch.delenv("REDFUSER_UPDATE_SNAPSHOTS", raising=False)
    (tmp_path / "x.simt").write_text("a\nb\n")
    compare("x.simt", "a\nb\n", tmp_path)
    with pytest.raises(pytest.fail.Exception, match=r"(?s)-b.*\+c"):
        compare("x.simt", "a\nc\n", tmp_path)
    monkeypatch.setenv("REDFUSER_UPDATE_SNAPSHOTS", "1")
    compare("x.simt", "a\nc\n", tmp_path)
    assert (tmp_path / "x.simt").read_text() == "a\nc\n"
