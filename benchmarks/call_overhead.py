"""Host time per call of a tiny kernel, cached, against a torch op on the same tiny input (issue 22, "The
call path"). The kernel's work is a few hundred floating-point operations, so what is measured is the
path from the arguments to the launch and back.

    python benchmarks/call_overhead.py              # cpu (and cuda with a device and torch)
    python benchmarks/call_overhead.py --calls 20000

Rows, each the best of `--repeats` runs of `--calls` calls back to back (wall time / calls, microseconds):
- redfuser, a cached call of ``softmax`` on a [4, 16] f32 array (numpy in, numpy out);
- redfuser with ``out=``, writing into a preallocated array (no allocation per call);
- on the CPU, ``torch.softmax`` on the same values as a CPU tensor (the peer: an op a user calls instead);
- on a GPU, the same three with device tensors (``torch.softmax`` launches one kernel), and a minimal Triton
  kernel's launch where Triton is installed; each timed with the device synchronized only at the end.
The ratio is the peer's time over RedFuser's (above 1: RedFuser's call is cheaper). Not a unit test:
timings go to the table only.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redfuser as rf                                 # noqa: E402
from redfuser.workloads import softmax               # noqa: E402
from cpu_bench import cpu_model                      # noqa: E402
from bench_common import description, positive_int    # noqa: E402

SHAPE = (4, 16)


def per_call_us(fn, calls: int, repeats: int, sync=None) -> float:
    """Best-of-`repeats` wall time per call of `fn` over `calls` calls, in microseconds."""
    fn()
    if sync is not None:
        sync()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if sync is not None:
            sync()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def cpu_rows(calls: int, repeats: int) -> list[tuple[str, float]]:
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    kernel = rf.kernel(softmax, backend="cpu")
    out = np.empty_like(x)
    kernel(x)
    np.testing.assert_allclose(kernel(x), softmax(x), rtol=1e-6)      # the row is the right kernel
    rows = [("redfuser cpu", per_call_us(lambda: kernel(x), calls, repeats)),
            ("redfuser cpu, out=", per_call_us(lambda: kernel(x, out=out), calls, repeats))]
    try:
        import torch
    except Exception:
        return rows
    t = torch.from_numpy(x)
    rows.append(("torch.softmax (CPU tensor)", per_call_us(lambda: torch.softmax(t, -1), calls, repeats)))
    return rows


def cuda_rows(calls: int, repeats: int) -> list[tuple[str, float]]:
    try:
        import torch
    except Exception:
        return []
    if not torch.cuda.is_available():
        return []
    x = torch.randn(*SHAPE, device="cuda")
    kernel = rf.kernel(softmax, backend="cuda")
    out = torch.empty_like(x)
    kernel(x)
    torch.testing.assert_close(kernel(x), torch.softmax(x, -1))
    sync = torch.cuda.synchronize
    rows = [("redfuser cuda (device tensors)", per_call_us(lambda: kernel(x), calls, repeats, sync)),
            ("redfuser cuda, out=", per_call_us(lambda: kernel(x, out=out), calls, repeats, sync)),
            ("torch.softmax (device tensor)", per_call_us(lambda: torch.softmax(x, -1), calls, repeats, sync))]
    try:
        import triton
        import triton.language as tl
    except Exception:
        return rows

    @triton.jit
    def copy(X, Y, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(Y + i, tl.load(X + i))

    y = torch.empty_like(x)
    rows.append(("triton launch (a copy)", per_call_us(lambda: copy[(1,)](x, y, N=x.numel()), calls, repeats, sync)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--calls", type=positive_int, default=5000, help="calls back to back per run (default 5000)")
    parser.add_argument("--repeats", type=positive_int, default=5, help="runs, the best one kept (default 5)")
    args = parser.parse_args(argv)
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; Python {platform.python_version()}; "
          f"numpy {np.__version__}; redfuser {rf.__version__}")
    for title, rows, peer in (("cpu", cpu_rows(args.calls, args.repeats), "torch.softmax (CPU tensor)"),
                              ("cuda", cuda_rows(args.calls, args.repeats), "torch.softmax (device tensor)")):
        if not rows:
            print(f"\n{title}: not measured here (no torch{' or no GPU' if title == 'cuda' else ''})")
            continue
        peer_us = dict(rows).get(peer)
        print(f"\n{title}: softmax of a {list(SHAPE)} f32 array, host time per call (best of {args.repeats} x "
              f"{args.calls} calls)")
        print(f"{'implementation':34s} {'us/call':>9s} {'peer / this':>12s}")
        for name, us in rows:
            ratio = f"{peer_us / us:.2f}" if peer_us else "-"
            print(f"{name:34s} {us:9.2f} {ratio:>12s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
