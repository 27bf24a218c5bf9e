"""Compile time to PTX: RedFuser cold, warm (memory) and from the disk cache, against Triton's cold compile.

    python benchmarks/compile_time.py [--repeats 3] [--tiny]

No GPU needed: both compilers target ``sm_90`` (an H100/H200). For every case of
``benchmarks/gpu_cases.py`` (the shapes ``gpu_check.py`` runs):

- **cold**: a fresh `Kernel` and a fresh, empty cache folder: trace, fuse, schedule, SIMT, LLVM, PTX;
- **warm**: the same `Kernel` object again (its in-memory specialization cache);
- **disk**: a fresh `Kernel` and a fresh cache object over the populated folder (the front end runs,
  the PTX is read from disk).

Where Triton is installed, its cold compile of the equivalent kernel (``benchmarks/triton_peers.py``:
attention with a hand-written online softmax, row softmax) for ``GPUTarget("cuda", 90, 32)`` runs in
the same process with a fresh cache folder: "to PTX" sums its stages up to PTX (``ir_initialization``,
``ttir``, ``ttgir``, ``llir``, ``ptx``), "+cubin" adds ptxas. Each cold number is the median of
``--repeats`` runs, the two compilers alternating so that both see the machine in the same state; the
ratio is the median of the pairs' ratios. "of it LLVM" is the part of RedFuser's cold compile spent in
LLVM's middle end and code generation (``Lowered.parts["ptx"]["llvm -> ptx"]``), in milliseconds and
over Triton's time: what no change to RedFuser's Python stages can take away. Each compiler first
compiles something else once, so
one-time process start-up (imports, LLVM initialization) is in neither. The goal: a cold RedFuser
compile at most a fifth of Triton's (ratio <= 0.20).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redfuser as rf                                          # noqa: E402
from redfuser import workloads                                 # noqa: E402
from redfuser.compiler import Lowered                          # noqa: E402
from redfuser.runtime.cache import reset_default_cache         # noqa: E402
from gpu_cases import Case, cases                              # noqa: E402
from bench_common import CacheFolder, description, positive_int  # noqa: E402

TRITON_EQUIVALENT = ("attention", "causal", "decode", "softmax", "log_softmax")   # cases with a Triton peer


def _lower(kernel, args) -> tuple[float, Lowered]:
    start = time.perf_counter()
    lowered = kernel.lower(*args)
    return time.perf_counter() - start, lowered


def redfuser_times(case: Case, repeats: int) -> dict:
    """Seconds: cold (median of `repeats`), warm and disk for `case`, and of the cold compiles' LLVM
    middle end and code generation (``Lowered.parts["ptx"]["llvm -> ptx"]``); or the error."""
    args = case.compile_args()
    colds, llvm, warm, disk = [], [], None, None
    try:
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as folder, CacheFolder(folder):
                kernel = rf.kernel(case.fn, backend="cuda", sm="sm_90", **case.options)
                cold, lowered = _lower(kernel, args)
                colds.append(cold)
                llvm.append(lowered.parts["ptx"]["llvm -> ptx"])
                warm = _lower(kernel, args)[0]
                reset_default_cache()                    # a new cache object over the populated folder
                disk = _lower(rf.kernel(case.fn, backend="cuda", sm="sm_90", **case.options), args)[0]
    except Exception as exc:  # a case that does not compile yet is a row saying why
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}"}
    return {"cold": statistics.median(colds), "llvm": statistics.median(llvm), "warm": warm, "disk": disk}


def triton_times(case: Case, repeats: int) -> dict:
    """Seconds: Triton's cold compile of `case`'s peer kernels to PTX and to cubin (medians), or why none."""
    try:
        import triton_peers
    except Exception as exc:
        return {"error": f"Triton is not installed ({type(exc).__name__})"}
    shape, dtype = case.inputs[0]
    to_ptx, to_cubin = [], []
    try:
        specs = triton_peers.kernel_specs(case.name, dtype, head_d=shape[-1], cols=shape[-1])
        for _ in range(repeats):
            ptx = cubin = 0.0
            for spec in specs:
                with tempfile.TemporaryDirectory() as folder:
                    t = triton_peers.compile_to_ptx(spec, 90, cache_dir=folder)
                ptx += sum(t[k] for k in ("ir_initialization", "ttir", "ttgir", "llir", "ptx")) * 1e-6
                cubin += t.get("cubin", 0) * 1e-6
            to_ptx.append(ptx)
            to_cubin.append(ptx + cubin)
    except Exception as exc:  # Triton that cannot compile without a GPU here: said in the table
        return {"error": f"Triton could not compile: {type(exc).__name__}: {str(exc)[:80]}"}
    return {"cold": statistics.median(to_ptx), "cubin": statistics.median(to_cubin)}


def paired_times(case: Case, repeats: int) -> tuple[dict, dict, float | None]:
    """`repeats` cold compiles by each compiler, alternating (RedFuser, Triton, RedFuser, ...), so both see
    the machine in the same state; ``(ours, theirs, ratio)`` with medians, the ratio the median of the
    pairs' ratios (the development machine's speed drifts by up to half within minutes)."""
    ours_runs: list[dict] = []
    theirs_runs: list[dict] = []
    theirs: dict = {"error": "no Triton peer"} if case.name not in TRITON_EQUIVALENT else {}
    for _ in range(repeats):
        ours = redfuser_times(case, 1)
        if "error" in ours:
            return ours, theirs or {"error": "not run"}, None
        ours_runs.append(ours)
        if not theirs:                                  # a peer, and no error from it yet
            once = triton_times(case, 1)
            if "error" in once:
                theirs = once
            else:
                theirs_runs.append(once)
    ours = {key: statistics.median(r[key] for r in ours_runs) for key in ("cold", "llvm", "warm", "disk")}
    if not theirs_runs:
        return ours, theirs, None
    theirs = {key: statistics.median(r[key] for r in theirs_runs) for key in ("cold", "cubin")}
    ratio = statistics.median(a["cold"] / b["cold"] for a, b in zip(ours_runs, theirs_runs))
    ours["llvm_ratio"] = statistics.median(a["llvm"] / b["cold"] for a, b in zip(ours_runs, theirs_runs))
    return ours, theirs, ratio


def warm_up() -> None:
    """Compile one small kernel with each compiler: process start-up stays out of the numbers. RedFuser's is a
    small f16 attention (another shape than any case), so the first case does not pay alone for loading
    the tensor-core lowering and LLVM's first mma instruction selection."""
    q = np.zeros((1, 1, 32, 16), np.float16)
    with tempfile.TemporaryDirectory() as folder, CacheFolder(folder):
        rf.kernel(workloads.attention, backend="cuda", sm="sm_90").lower(q, q, q)
    try:
        import triton_peers
        with tempfile.TemporaryDirectory() as folder:
            triton_peers.compile_to_ptx(triton_peers.kernel_specs("softmax", "float32")[0], 90, cache_dir=folder)
    except Exception:  # no Triton: its column says so
        pass


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f}" if seconds >= 0.01 else f"{seconds * 1e3:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="cold compiles by each compiler, their median kept (default 3)")
    parser.add_argument("--tiny", action="store_true", help="the tiny shapes (a quick run)")
    args = parser.parse_args(argv)
    warm_up()
    head = ["case", "RF cold ms", "of it LLVM ms", "RF warm ms", "RF disk ms", "Triton to PTX ms",
            "Triton +cubin ms", "RF cold / Triton", "of it LLVM", "goal <= 0.20"]
    lines = []
    for case in cases("tiny" if args.tiny else "full"):
        ours, theirs, ratio = paired_times(case, args.repeats)
        lines.append([case.label, ours.get("error") or _ms(ours["cold"]), _ms(ours.get("llvm")), _ms(ours.get("warm")),
                      _ms(ours.get("disk")), theirs.get("error") or _ms(theirs["cold"]), _ms(theirs.get("cubin")),
                      "-" if ratio is None else f"{ratio:.2f}",
                      "-" if ratio is None else f"{ours['llvm_ratio']:.2f}",
                      "-" if ratio is None else ("met" if ratio <= 0.2 else "missed")])
        print(f"  {case.label}: done", flush=True)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    for cells in [head, ["-" * w for w in widths]] + lines:
        print("  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip())
    try:
        import triton
        print(f"\ntriton {triton.__version__}; RedFuser {rf.__version__}; both for sm_90; medians of "
              f"{args.repeats} cold compiles, each in a fresh cache folder, the two compilers alternating; "
              "the ratio is the median of the pairs' ratios; \"of it LLVM\": LLVM's middle end and code "
              "generation alone (Lowered.parts), in ms and over Triton's time")
    except Exception:
        print("\nTriton is not installed here: its columns are empty (pip install triton to compare)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
