"""``python -m redfuser``: the demo, explanations of the reference kernels, and the fuzzer.

    python -m redfuser demo [--backend B] [[--workload] W]   compile, fuse, run and check a kernel
    python -m redfuser explain [[--workload] W] [--stages]    what the compiler does with it, in words
    python -m redfuser fuzz [--backend B] --examples N      random programs on every backend == numpy?
"""
from __future__ import annotations

import argparse
import shutil
import sys
import textwrap

import numpy as np

from . import backends
from .fusion.explain import fusion_summary
from .kernel import kernel
from .workloads import WORKLOADS


def _outputs(x) -> tuple[np.ndarray, ...]:
    return x if isinstance(x, tuple) else (x,)


def demo(args: argparse.Namespace) -> int:
    """Compile a workload on the best backend, print each stage, and check it against numpy."""
    from .testing.tolerance import assert_close

    work = WORKLOADS[args.workload]
    backend, why = backends.resolve(args.backend)
    print(f"backend: {backend} ({why})")
    inputs = work.make_inputs(np.random.default_rng(0))
    k = kernel(work.fn, backend=backend)
    lowered = k.lower(*inputs)
    for name, ir in lowered.stages.items():
        if name in ("traced", "fused", "tile") or args.stages:
            print(f"\n=== stage: {name} ===\n{ir}")
    print("\n=== what was fused ===")
    for g in lowered.groups:
        print("\n".join(fusion_summary(g)))
    got = _outputs(k(*inputs))
    if args.workload == "fp8_quant_gemm":
        return _check_quantized(got[0], *inputs)
    if args.workload == "int8_quant_gemm":
        return _check_int8(got[0], *inputs)
    ref = _outputs(work.fn(*inputs))
    reduction_length = max(x.shape[-1] for x in inputs)
    worst = 0.0
    for a, b in zip(got, ref):
        assert_close(a, b, b.dtype, reduction_length)
        scale = float(np.max(np.abs(b))) or 1.0
        worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b))) / scale)
    print(f"\ncheck against the numpy reference: max error {worst:.3g} (relative to max |reference|) — OK")
    return 0


def _check_quantized(out: np.ndarray, x: np.ndarray, w: np.ndarray, w_scale: np.ndarray) -> int:
    """The fused FP8 GEMM quantizes with the running absmax, so it rounds other values than the unfused
    program: check the bounds both meet (`redfuser.testing.quantization`; docs/fusion.md, FP8 section)."""
    from .testing.quantization import assert_quantized_gemm

    result = assert_quantized_gemm(out, x, w, w_scale)
    print(f"\ncheck against the exact product: {result} — OK")
    return 0


def _check_int8(out: np.ndarray, x: np.ndarray, w: np.ndarray, w_scale: np.ndarray) -> int:
    """The fused int8 GEMM rounds with the running absmax (docs/fusion.md, "The same rule for int8"): within
    half a grid step per term of the exact product, and the body's result on the rows every kernel rounds as
    the body does (`redfuser.testing.quantization.assert_int8_quantized_gemm`)."""
    from .testing.quantization import assert_int8_quantized_gemm

    print(f"\ncheck against the exact product: {assert_int8_quantized_gemm(out, x, w, w_scale)} — OK")
    return 0


def explain_cmd(args: argparse.Namespace) -> int:
    """Print `Kernel.explain` for a workload."""
    work = WORKLOADS[args.workload]
    inputs = work.make_inputs(np.random.default_rng(0))
    k = kernel(work.fn, backend=args.backend)
    print(k.explain(*inputs))
    lowered = k.lower(*inputs)   # compiled once by explain
    if "ptx" in lowered.stages and args.backend is not None:
        print("\n" + gpu_resources(lowered))
    if args.stages:
        print("\n" + str(lowered))
        print("\n" + lowered.timing_table())
    return 0


def gpu_resources(lowered) -> str:
    """Per kernel: registers, spill bytes and shared memory of its PTX, as the assembler reports them."""
    from .codegen.ptx_check import resource_usage

    ptx = lowered.stages["ptx"]
    lines = [f"GPU kernels for {ptx.sm} (from {'ptxas' if shutil.which('ptxas') else 'nvJitLink'}):"]
    for k, simt in zip(ptx.kernels, lowered.stages["simt"].kernels):
        u = resource_usage(k.ptx, ptx.sm, k.entry)
        lines.append(f"  {k.name}: {simt.threads} threads, {u.registers} registers, "
                     f"spills {u.spill_store_bytes} B stored / {u.spill_load_bytes} B loaded, "
                     f"{u.shared_bytes} B shared")
    return "\n".join(lines)


def fuzz_cmd(argv: list[str]) -> int:
    """Hand over to the fusion fuzzer's own argument parser."""
    from .testing.fuzz import main as fuzz_main

    return fuzz_main(argv)


DEMO_HELP = ("Compile, fuse, run and check a workload on the best backend present (or --backend), printing each "
             "stage: the traced, fused and tile programs (--stages: every stage), what was fused and why, and the "
             "largest error against the numpy reference.")
EXPLAIN_HELP = ("Print what the compiler does with a workload, in words: its cascades of reductions, which are fused "
                "into one pass and why (the separable factors G and H, the rescales, what is deferred to the end), "
                "which are not and the reason; on cuda and simulate the GPU kernels' registers and shared memory; "
                "with --stages every stage's program and the compile time of each.")


def _workload_list() -> str:
    lines = ["workloads:"]
    for name, work in sorted(WORKLOADS.items()):
        doc = (work.fn.__doc__ or "").strip().splitlines()
        lines.append(f"  {name:<20} {doc[0] if doc else ''}")
    return "\n".join(lines)


def cache_cmd(args: argparse.Namespace) -> int:
    """``python -m redfuser cache [--clear]``: the on-disk cache's folder, entries and size (`runtime.cache`)."""
    from .runtime.cache import default_cache

    cache = default_cache()
    if cache.directory is None:
        print("the compile cache is memory-only (REDFUSER_CACHE=0): nothing on disk")
        return 0
    entries, size = cache.disk_usage()
    print(f"compile cache: {cache.directory}: {entries} entries, {size / 2**20:.1f} MiB")
    if args.clear:
        cache.clear(disk=True)
        entries, size = cache.disk_usage()
        print(f"cleared: {entries} entries, {size / 2**20:.1f} MiB left")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m redfuser`` and the ``redfuser`` script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "fuzz":
        return fuzz_cmd(argv[1:])
    parser = argparse.ArgumentParser(prog="redfuser", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_workload_list())
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, help_text, text in (
            ("demo", demo, "compile, fuse, run and check a workload, printing each stage", DEMO_HELP),
            ("explain", explain_cmd, "print what the compiler does with a workload and why", EXPLAIN_HELP)):
        p = sub.add_parser(name, help=help_text, description=textwrap.fill(text, 100), epilog=_workload_list(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--workload", choices=sorted(WORKLOADS), default=None, metavar="W",
                       help="the workload (listed below; default: attention)")
        # (the workload list below reads like a positional argument, so `explain softmax` means it too)
        p.add_argument("named", nargs="?", choices=sorted(WORKLOADS), metavar="WORKLOAD",
                       help="the workload, as --workload gives it")
        p.add_argument("--backend", default=None, help="auto (default), interpret, cpu, cuda, simulate")
        p.add_argument("--stages", action="store_true", help="print every stage of the compiler")
        p.set_defaults(run=fn)
    sub.add_parser("fuzz", help="the whole-compiler fuzzer: random programs on every backend against numpy "
                                "(see `python -m redfuser fuzz --help`)")
    cache = sub.add_parser("cache", help="where the on-disk compile cache is and what it holds; --clear empties it",
                           description="The on-disk compile cache (REDFUSER_CACHE_DIR) keeps one entry for each "
                                       "specialization ever compiled, and nothing evicts them: this prints where "
                                       "it is and its size, and --clear deletes its entries.")
    cache.add_argument("--clear", action="store_true", help="delete every entry of the cache")
    cache.set_defaults(run=cache_cmd)
    args = parser.parse_args(argv)
    if args.command in ("demo", "explain"):
        if args.named is not None and args.workload is not None and args.named != args.workload:
            parser.error(f"two workloads named: {args.named} and --workload {args.workload}")
        args.workload = args.named or args.workload or "attention"
    from .ir import RedFuserError

    try:
        return args.run(args)
    except RedFuserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
