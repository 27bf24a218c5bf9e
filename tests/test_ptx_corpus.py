"""The snapshot corpus: generated SIMT IR and PTX of a fixed set of kernels, at the default GPU tiles.

Each kernel is compiled with ``backend="cuda"`` (no GPU needed) for sm_90 and sm_80; every PTX is assembled
for each architecture it can run on (nvJitLink), the assembler's registers / spill bytes / shared memory are
recorded, and the default tiles must not spill. The printed SIMT IR, the sm_90 PTX and the resource table are
compared with ``tests/snapshots/``: any difference fails and prints the diff; after an intended change,
``REDFUSER_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_ptx_corpus.py`` rewrites them (then review the diff).
"""
from __future__ import annotations

import difflib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from redfuser.codegen.ptx_check import check_ptx

import redfuser as rf
from redfuser import config
from redfuser.workloads import attention, fp8_quant_gemm, log_softmax, softmax

SNAPSHOTS = Path(__file__).parent / "snapshots"


def _inputs(seed: int, *specs) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(dtype) for shape, dtype in specs)


def matmul(a, b):
    return a @ b


CORPUS = {
    "attention_f16": (attention, _inputs(0, *[((1, 2, 128, 64), np.float16)] * 3)),
    "attention_f32": (attention, _inputs(1, *[((1, 2, 128, 64), np.float32)] * 3)),
    "softmax": (softmax, _inputs(2, ((64, 1000), np.float32))),
    "log_softmax": (log_softmax, _inputs(3, ((64, 1000), np.float32))),
    "matmul": (matmul, _inputs(4, ((128, 96), np.float32), ((96, 64), np.float32))),
    "fp8_quant_gemm": (fp8_quant_gemm, _inputs(5, ((64, 256), np.float16), ((256, 128), ml_dtypes.float8_e4m3fn),
                                             ((128,), np.float32))),
}


def compare(name: str, text: str, folder: Path = SNAPSHOTS) -> None:
    """`text` against ``folder/name``; rewritten instead when ``REDFUSER_UPDATE_SNAPSHOTS`` is set."""
    path = folder / name
    if config.update_snapshots():
        folder.mkdir(exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"no snapshot {path}; run with REDFUSER_UPDATE_SNAPSHOTS=1 to create it")
    old = path.read_text()
    if old != text:
        diff = list(difflib.unified_diff(old.splitlines(), text.splitlines(), f"snapshots/{name}", "generated",
                                         lineterm="", n=2))
        shown = "\n".join(diff[:80]) + (f"\n... {len(diff) - 80} more diff lines" if len(diff) > 80 else "")
        pytest.fail(f"generated code differs from snapshots/{name} (REDFUSER_UPDATE_SNAPSHOTS=1 accepts it "
                    f"after review):\n{shown}", pytrace=False)


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
