"""Kernels over lengths that change from call to call (issue 22): how many specializations each loop
compiles (`kernel.cache_info().misses`) and what the whole loop costs, against the same loop in numpy.

    python benchmarks/dynamic_shapes.py            # cpu; --steps N for a longer decoding loop

Loops, each on a fresh kernel with the on-disk cache off (every specialization is a compile):
- decoding: one query attending to a KV cache that grows by one key a step, from 1 to `--steps` keys
  ([1, 4, 1, 64] f32 query);
- prefill: attention over `--prompts` random prompt lengths from 1 to 512;
- routing: MoE routing (softmax, top-2, renormalize over 64 experts) for `--prompts` random token counts.
The goal of the issue is at most 2 compiles a loop; today every new length is a specialization of its own,
so this table is the baseline that shape-polymorphic kernels are measured against. Timings are wall
times of the whole loop on this machine (not a unit test).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redfuser as rf                                  # noqa: E402
from redfuser.workloads import attention, moe_routing  # noqa: E402
from cpu_bench import cpu_model                        # noqa: E402


def loop(body, calls: list[tuple], backend: str) -> tuple[int, float, float]:
    """(specializations compiled, seconds for the loop on RedFuser, seconds for it in numpy), each result
    checked against numpy's."""
    kernel = rf.kernel(body, backend=backend)
    start = time.perf_counter()
    results = [kernel(*args) for args in calls]
    ours = time.perf_counter() - start
    start = time.perf_counter()
    with np.errstate(all="ignore"):
        expected = [body(*args) for args in calls]
    theirs = time.perf_counter() - start
    for got, want in zip(results, expected):
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    return kernel.cache_info().misses, ours, theirs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=24, help="decoding steps (KV cache lengths 1..steps)")
    parser.add_argument("--prompts", type=int, default=8, help="random prompt lengths / token counts")
    parser.add_argument("--backend", default="cpu")
    args = parser.parse_args(argv)
    os.environ["REDFUSER_CACHE"] = "0"          # (read at each compile: every specialization is compiled)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 1, 64)).astype(np.float32)
    cache = rng.standard_normal((2, 1, 4, args.steps, 64)).astype(np.float32)
    decode = [(q, cache[0, :, :, :n].copy(), cache[1, :, :, :n].copy()) for n in range(1, args.steps + 1)]
    lengths = rng.integers(1, 513, args.prompts)
    prefill = [tuple(rng.standard_normal((1, 4, int(n), 64)).astype(np.float32) for _ in range(3)) for n in lengths]
    routing = [(rng.standard_normal((int(n), 64)).astype(np.float32) * 3,) for n in rng.integers(1, 4097, args.prompts)]
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; redfuser {rf.__version__}; backend {args.backend}")
    print(f"{'loop':34s} {'calls':>6s} {'compiles':>9s} {'redfuser s':>11s} {'numpy s':>8s}")
    for name, body, calls in ((f"decoding, KV cache 1..{args.steps}", attention, decode),
                              (f"prefill, {args.prompts} prompt lengths", attention, prefill),
                              (f"routing, {args.prompts} token counts", moe_routing, routing)):
        compiles, ours, theirs = loop(body, calls, args.backend)
        print(f"{name:34s} {len(calls):6d} {compiles:9d} {ours:11.2f} {theirs:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
