"""What the compiler emits for every benchmark kernel, and what the assembler makes of it. No GPU needed.

    python benchmarks/static_counts.py [--tiny] [--sm sm_90] [--variants]

For each kernel of each case of ``benchmarks/gpu_cases.py`` (the shapes ``gpu_check.py`` runs):

- **llvm**: instructions of the LLVM module as emitted (before LLVM's middle end);
- **ptx**: PTX instructions (lines ending in ``;`` that are not directives);
- **regs**, **spill B**: registers per thread and spill-store bytes, from nvJitLink (the assembler the
  corpus tests use; a driver's JIT may differ by a few registers);
- **shared B**: shared memory of a block, ``dyn`` where it is the launch's dynamic shared memory (past the
  48 KiB a kernel declares statically: sm_90a's wgmma tiles);
- **wgmma**: ``wgmma.mma_async`` instructions in the PTX, with ``serial`` where ptxas said it serialized
  them (its warning C7509, "... due to the presence of Extern calls": a subroutine in the kernel, and the
  wgmmas then wait on each other, losing the asynchrony);
- **sass**: SASS instructions of the assembled cubin (``NOP`` padding not counted), when ``cuobjdump`` is on
  PATH (``pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm``; cuobjdump runs nvdisasm, so put their
  ``bin`` folder, ``site-packages/nvidia/*/bin``, on PATH).

With ``--variants`` the kernel options ``gpu_check.py`` times beside the defaults (its ``VARIANTS``) are
counted too, so a choice can be compared without a device. These numbers are proxies, and deterministic for
a given LLVM and assembler: fewer instructions and registers usually run faster, but only a device run
(``gpu_check.py``) measures time. Nothing here is timed.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redfuser as rf                                        # noqa: E402
from redfuser.codegen.ptx_check import SERIALIZED_BY_CALLS, assemble   # noqa: E402
from bench_common import CacheFolder, description, sm_target   # noqa: E402
from gpu_cases import cases                                   # noqa: E402
from gpu_check import variants                                # noqa: E402

_SASS_LINE = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?);", re.M)


def ptx_instructions(ptx: str) -> int:
    """PTX instructions: statements ending in ``;`` that are neither directives nor comments."""
    return sum(1 for line in ptx.splitlines()
               if line.strip().endswith(";") and not line.strip().startswith((".", "//")))


def llvm_instructions(llvm_ir: str) -> int:
    """Instructions of an LLVM module's text: the indented lines of function bodies."""
    return sum(1 for line in llvm_ir.splitlines() if line.startswith("  ") and not line.lstrip().startswith(";"))


def count_sass(listing: str) -> int:
    """Instructions of a ``cuobjdump -sass`` listing, ``NOP`` padding left out."""
    count = 0
    for body in _SASS_LINE.findall(listing):
        words = body.split()
        opcode = words[1] if words[0].startswith("@") else words[0]     # after a predicate like @!P0
        count += not opcode.startswith("NOP")
    return count


def sass_instructions(cubin: bytes, cuobjdump: str) -> int:
    """SASS instructions of `cubin`, by ``cuobjdump -sass``."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        listing = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    return count_sass(listing)


def find_cuobjdump() -> str | None:
    """``cuobjdump`` on PATH, or in an installed ``nvidia-cuda-cuobjdump`` wheel, or None."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    for root in map(Path, sys.path):
        for candidate in root.glob("nvidia/*/bin/cuobjdump"):
            return str(candidate)
    return None


def kernel_rows(label: str, lowered, sm: str, cuobjdump: str | None) -> list[list[str]]:
    """One row per kernel of a lowered program."""
    rows = []
    for k, simt in zip(lowered.stages["ptx"].kernels, lowered.stages["simt"].kernels):
        result = assemble(k.ptx, sm)
        (usage,) = [u for u in result.usage if u.kernel == k.entry]
        sass = str(sass_instructions(result.cubin, cuobjdump)) if cuobjdump else "-"
        wgmma = k.ptx.count("wgmma.mma_async")
        serial = " serial" if SERIALIZED_BY_CALLS in result.info_log else ""
        rows.append([label, k.name, str(llvm_instructions(k.llvm_ir)), str(ptx_instructions(k.ptx)), sass,
                     str(usage.registers), str(usage.spill_store_bytes),
                     f"{simt.shared_bytes}{' dyn' if simt.dynamic_shared else ''}", f"{wgmma}{serial}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--tiny", action="store_true", help="the tiny shapes")
    parser.add_argument("--sm", type=sm_target, default="sm_90", help="the target (default sm_90, an H100/H200)")
    parser.add_argument("--variants", action="store_true",
                        help="also the options gpu_check.py times beside the defaults")
    args = parser.parse_args(argv)
    cuobjdump = find_cuobjdump()
    head = ["case", "kernel", "llvm", "ptx", "sass", "regs", "spill B", "shared B", "wgmma"]
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as folder, CacheFolder(folder):
        for case in cases("tiny" if args.tiny else "full"):
            settings = [("", {})] + (variants(case) if args.variants else [])
            for name, extra in settings:
                label = case.label + (f" {name.removeprefix('redfuser ')}" if name else "")
                options = {"sm": args.sm, **case.options, **extra}     # (a variant may name its own target)
                try:
                    lowered = rf.kernel(case.fn, backend="cuda", **options).lower(*case.compile_args())
                except rf.RedFuserError as exc:   # a case that does not compile is a row saying why
                    rows.append([label, f"{type(exc).__name__}: {str(exc).splitlines()[0][:50]}", *"-" * 7])
                    continue
                rows.extend(kernel_rows(label, lowered, options["sm"], cuobjdump))
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    for cells in [head, ["-" * w for w in widths]] + rows:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip())
    print(f"\nRedFuser {rf.__version__}, target {args.sm}; registers and spills from nvJitLink; "
          + (f"SASS by {cuobjdump}" if cuobjdump else "no cuobjdump on PATH: no SASS column "
             "(pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
