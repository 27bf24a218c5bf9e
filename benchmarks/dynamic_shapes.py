"""Kernels over lengths that change from call to call (issue 22, docs/shapes.md): how many kernels each loop
compiles (`kernel.cache_info().misses`) and what the loop costs, then the shape-polymorphic kernel against
the exactly specialized one at large shapes, in the same run.

    python benchmarks/dynamic_shapes.py            # cpu; --backend cuda on a GPU; --steps/--prompts smaller

Loops, each on a fresh kernel with the default ``dynamic=None`` and the on-disk cache off (every kernel
made is a compile):
- decoding: one query attending to a KV cache that grows by one key a step, from 1 to `--steps` keys
  ([1, 4, 1, 64] f32 query; split reductions, flash decoding, where the machine has cores to fill), the
  cache as contiguous arrays, then as slices ``cache[:, :, :n]`` of one preallocated buffer (strided views);
- prefill: attention over `--prompts` random prompt lengths from 1 to 512;
- routing: MoE routing (softmax, top-2, renormalize over 64 experts) for `--prompts` random token counts.
The goal is at most 2 compiles a loop (the first call's exact shapes, then one symbolic kernel). Every
result is checked against the numpy body. The second table times one call at a large shape on the
polymorphic kernel (the one the default makes after two calls at other lengths) and on a kernel compiled
for exactly that shape (`dynamic=False`), interleaved, median of `--repeats`; the goal is within 5%. Wall times on this machine,
not a unit test.
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
from redfuser.config import BACKENDS                   # noqa: E402
from cpu_bench import cpu_model                        # noqa: E402
from bench_common import description, positive_int     # noqa: E402


def loop(body, calls: list[tuple], backend: str) -> tuple[int, float, float]:
    """(kernels compiled, seconds for the loop on RedFuser, seconds for it in numpy), each result checked
    against numpy's."""
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


def against_exact(body, smalls: tuple[tuple, tuple], large: tuple, backend: str, repeats: int
                  ) -> tuple[float, float]:
    """Median seconds of a call at `large` on the polymorphic kernel the default ``dynamic=None`` makes
    after two calls at other lengths (`smalls`: the axes that changed are symbolic), and on the kernel
    compiled for `large` exactly, interleaved; both checked against numpy."""
    poly = rf.kernel(body, backend=backend)
    exact = rf.kernel(body, backend=backend, dynamic=False)
    for small in smalls:
        poly(*small)
    want = body(*large)
    for k in (poly, exact):
        got = k(*large)
        got, ref = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for g, w in zip(got, ref):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    assert poly.cache_info().misses == 2, poly.polymorphism      # the large call reused the symbolic kernel
    times: dict[str, list[float]] = {"poly": [], "exact": []}
    for _ in range(repeats):
        for name, k in (("poly", poly), ("exact", exact)):
            start = time.perf_counter()
            k(*large)
            times[name].append(time.perf_counter() - start)
    return float(np.median(times["poly"])), float(np.median(times["exact"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--steps", type=positive_int, default=4096, help="decoding steps (KV cache lengths 1..steps)")
    parser.add_argument("--prompts", type=positive_int, default=64, help="random prompt lengths / token counts")
    parser.add_argument("--repeats", type=positive_int, default=15,
                        help="timed calls per kernel at each large shape")
    parser.add_argument("--backend", default="cpu", choices=list(BACKENDS), help="the backend (default cpu)")
    args = parser.parse_args(argv)
    os.environ["REDFUSER_CACHE"] = "0"          # (read at each compile: every specialization is compiled)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 1, 64)).astype(np.float32)
    cache = rng.standard_normal((2, 1, 4, args.steps, 64)).astype(np.float32)
    decode = [(q, cache[0, :, :, :n].copy(), cache[1, :, :, :n].copy()) for n in range(1, args.steps + 1)]
    in_place = [(q, cache[0, :, :, :n], cache[1, :, :, :n]) for n in range(1, args.steps + 1)]   # views
    lengths = rng.integers(1, 513, args.prompts)
    prefill = [tuple(rng.standard_normal((1, 4, int(n), 64)).astype(np.float32) for _ in range(3)) for n in lengths]
    routing = [(rng.standard_normal((int(n), 64)).astype(np.float32) * 3,) for n in rng.integers(1, 4097, args.prompts)]
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; redfuser {rf.__version__}; backend {args.backend}")
    print(f"{'loop':34s} {'calls':>6s} {'compiles':>9s} {'redfuser s':>11s} {'numpy s':>8s}")
    for name, body, calls in ((f"decoding, KV cache 1..{args.steps}", attention, decode),
                              (f"decoding, cache views 1..{args.steps}", attention, in_place),
                              (f"prefill, {args.prompts} prompt lengths", attention, prefill),
                              (f"routing, {args.prompts} token counts", moe_routing, routing)):
        compiles, ours, theirs = loop(body, calls, args.backend)
        print(f"{name:34s} {len(calls):6d} {compiles:9d} {ours:11.2f} {theirs:8.2f}")
    print()
    print(f"{'large shape':34s} {'polymorphic ms':>15s} {'exact ms':>9s} {'exact/poly':>11s}")
    big = rng.standard_normal((2, 1, 4, 32768, 64)).astype(np.float32)
    prompt = [rng.standard_normal((1, 4, 2048, 64)).astype(np.float32) for _ in range(3)]
    tokens = rng.standard_normal((65536, 64)).astype(np.float32) * 3
    for name, body, smalls, large in (
            ("decoding, 32768 keys", attention,
             [(q, big[0, :, :, :n].copy(), big[1, :, :, :n].copy()) for n in (100, 101)], (q, big[0], big[1])),
            ("prefill, 2048 tokens", attention,
             [tuple(a[:, :, :n].copy() for a in prompt) for n in (100, 101)], tuple(prompt)),
            ("routing, 65536 tokens", moe_routing, [(tokens[:n].copy(),) for n in (100, 101)], (tokens,))):
        poly, exact = against_exact(body, smalls, large, args.backend, args.repeats)
        print(f"{name:34s} {1e3 * poly:15.2f} {1e3 * exact:9.2f} {exact / poly:11.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
