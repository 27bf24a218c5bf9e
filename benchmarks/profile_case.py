"""Run one `gpu_check.py` case's RedFuser kernel a few times, for a profiler to wrap. Needs a CUDA device.

    ncu --section SpeedOfLight --section WarpStateStats --section Occupancy -k regex:'^CASE_KERNEL' \\
        --launch-skip 2 --launch-count 1 python benchmarks/profile_case.py 'attention f16 [4,16,4096,64]' \\
        [--variant 'redfuser wgmma (sm_90a)'] [--calls 4]

The case is named by its label (as the table prints it), the variant by its row name in `gpu_check.VARIANTS`
(default: the case's own options). The kernel is compiled first, then called ``--calls`` times on torch
inputs made like the device check's; nothing is checked or timed here (gpu_check.py does that). It prints
the kernels' names, so that ``-k`` can select one.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redfuser as rf                          # noqa: E402
from gpu_cases import cases, make_inputs       # noqa: E402
from bench_common import description, positive_int   # noqa: E402
from gpu_check import variants                 # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("label", help="a case's label, e.g. 'attention f16 [4,16,4096,64]' (gpu_check.py "
                                      "--dry-run lists them)")
    parser.add_argument("--variant", default=None, help="a row name of gpu_check.VARIANTS for this case")
    parser.add_argument("--calls", type=positive_int, default=4, help="calls after the compile (default 4)")
    args = parser.parse_args(argv)
    # The arguments first (they need no device), then the device: each refusal is one line, exit 1.
    case = next((c for c in cases("full") if c.label == args.label), None)
    if case is None:
        raise SystemExit(f"profile_case: no case labelled {args.label!r}; the labels: "
                         + ", ".join(repr(c.label) for c in cases("full")))
    extra = {}
    if args.variant is not None:
        extra = dict(variants(case)).get(args.variant)
        if extra is None:
            raise SystemExit(f"profile_case: {args.label} has no variant {args.variant!r}: "
                             f"{[name for name, _ in variants(case)]}")
    try:
        import torch
    except ImportError:
        raise SystemExit("profile_case: needs torch (its inputs are torch tensors on the device)") from None
    if not torch.cuda.is_available():   # as gpu_check.py says it, not torch's traceback from the first tensor
        raise SystemExit("profile_case: torch sees no CUDA device (static_counts.py or gpu_check.py --dry-run "
                         "compile without one)")
    kernel = rf.kernel(case.fn, backend="cuda", **{**case.options, **extra})
    inputs = make_inputs(case, torch, "cuda", 0)
    lowered = kernel.lower(*inputs)
    print("kernels:", ", ".join(k.name for k in lowered.stages["ptx"].kernels), flush=True)
    for _ in range(args.calls):
        kernel(*inputs)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
