"""Assemble PTX without a GPU (nvJitLink) and read each kernel's resource usage.

`assemble` turns PTX into a cubin with nvJitLink (``cuda.bindings.nvjitlink``,
package ``nvidia-nvjitlink``): invalid PTX raises `InternalError` carrying the
assembler's log. `resource_usage` reads registers, spills and shared memory
from ``ptxas -v`` when ``ptxas`` is on PATH, else from nvJitLink's ``-verbose``
info log (the same ``ptxas info`` lines). `check_ptx` assembles one PTX for
every architecture it can run on among sm_80 and sm_90.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..ir.errors import BackendError, InternalError


@dataclass(frozen=True, slots=True)
class ResourceUsage:
    """What one kernel costs per thread / block on `sm`, as the assembler reports it."""

    kernel: str
    sm: str
    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int
    shared_bytes: int      # static shared memory (dynamic shared memory is a launch argument)
    barriers: int
    source: str            # "ptxas" or "nvjitlink"

    def __str__(self) -> str:
        return (f"{self.kernel} on {self.sm}: {self.registers} registers, {self.shared_bytes} B shared, "
                f"spills {self.spill_store_bytes} B stored / {self.spill_load_bytes} B loaded, "
                f"{self.stack_bytes} B stack")


@dataclass(frozen=True, slots=True)
class AssembleResult:
    """A PTX assembled for `sm`: the cubin, nvJitLink's info log and each kernel's usage."""

    sm: str
    cubin: bytes
    info_log: str
    usage: tuple[ResourceUsage, ...]


SERIALIZED_BY_CALLS = "C7509"
"""ptxas's (nvJitLink 13.5's) "wgmma.mma_async instructions are serialized due to the presence of Extern calls":
a subroutine call anywhere in a kernel serializes its wgmmas. IEEE ``div.rn``/``sqrt.rn`` are such calls (their
slow paths), so a kernel that issues wgmma divides and takes roots in straight-line code instead
(`codegen/correctly_rounded.py`)."""


def ptx_target(ptx: str) -> str:
    """The ``.target`` of a PTX text (``sm_90``)."""
    found = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, flags=re.M)
    if not found:
        raise InternalError("PTX without a .target directive", pass_name="ptx_check")
    return found.group(1)


def assemble(ptx: str, sm: str) -> AssembleResult:
    """Assemble `ptx` for `sm` with nvJitLink; `InternalError` with the assembler's log on failure."""
    nvjitlink = _nvjitlink()
    data = ptx.encode()
    handle = nvjitlink.create(2, [f"-arch={sm}", "-verbose"])
    try:
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "redfuser.ptx")
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as exc:
            log = _log(handle, nvjitlink.get_error_log_size, nvjitlink.get_error_log)
            raise InternalError(f"nvJitLink could not assemble the PTX for {sm} ({exc})", pass_name="ptx_check",
                                context=_with_lines(log or "(empty error log)", ptx)) from None
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        info = _log(handle, nvjitlink.get_info_log_size, nvjitlink.get_info_log)
    finally:
        nvjitlink.destroy(handle)
    return AssembleResult(sm, bytes(cubin), info, parse_usage(info, sm, "nvjitlink"))


def check_ptx(ptx: str, archs: tuple[str, ...] = ("sm_80", "sm_90")) -> dict[str, AssembleResult]:
    """Assemble `ptx` for each of `archs` it can run on (an arch at or above its ``.target``).

    An arch-specific target (``sm_90a``) runs only on itself, so it is assembled for itself.
    Raises `InternalError` (with the log) on the first failure.
    """
    target = ptx_target(ptx)
    if target.endswith("a"):
        chosen = [target]
    else:
        chosen = [arch for arch in archs if _number(arch) >= _number(target)] or [target]
    return {arch: assemble(ptx, arch) for arch in chosen}


def resource_usage(ptx: str, sm: str | None = None, kernel: str | None = None) -> ResourceUsage:
    """Registers, spills and shared memory of `kernel` (the only one if None) assembled for `sm`
    (the PTX's ``.target`` if None): from ``ptxas -v`` when on PATH, else nvJitLink's info log."""
    sm = sm or ptx_target(ptx)
    ptxas = shutil.which("ptxas")
    usages = _ptxas_usage(ptxas, ptx, sm) if ptxas else assemble(ptx, sm).usage
    if kernel is None:
        if len(usages) != 1:
            raise InternalError(f"name the kernel: the PTX has {[u.kernel for u in usages]}", pass_name="ptx_check")
        return usages[0]
    for usage in usages:
        if usage.kernel == kernel:
            return usage
    raise InternalError(f"no kernel {kernel!r} in the PTX (it has {[u.kernel for u in usages]})", pass_name="ptx_check")


def parse_usage(log: str, sm: str, source: str) -> tuple[ResourceUsage, ...]:
    """Every kernel's `ResourceUsage` from ``ptxas info`` lines (``ptxas -v`` or nvJitLink ``-verbose``)."""
    out: list[ResourceUsage] = []
    log = re.split(r"^info\s*:", log, maxsplit=1, flags=re.M)[0]  # nvJitLink's own summary repeats, less exactly
    # A kernel's block runs from its "Compiling entry function" line to the next one.
    for block in re.split(r"(?=^ptxas info\s*: Compiling entry function)", log, flags=re.M):
        name = re.search(r"Compiling entry function '([^']+)'", block)
        used = re.search(r"Used (\d+) registers", block)
        if not (name and used):
            continue
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", block)
        stack, spill_st, spill_ld = (int(g) for g in frame.groups()) if frame else (0, 0, 0)
        out.append(ResourceUsage(
            kernel=name.group(1), sm=sm, registers=int(used.group(1)),
            spill_store_bytes=spill_st, spill_load_bytes=spill_ld, stack_bytes=stack,
            shared_bytes=_first_int(r"(\d+) bytes smem", block), barriers=_first_int(r"used (\d+) barriers", block),
            source=source,
        ))
    return tuple(out)


def _ptxas_usage(ptxas: str, ptx: str, sm: str) -> tuple[ResourceUsage, ...]:
    with tempfile.TemporaryDirectory(prefix="redfuser-ptxas-") as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        done = subprocess.run([ptxas, "-v", f"-arch={sm}", "-o", str(Path(folder) / "kernel.cubin"), str(source)],
                              capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InternalError(f"ptxas could not assemble the PTX for {sm}", pass_name="ptx_check",
                            context=(done.stderr or done.stdout).strip())
    return parse_usage(done.stderr + done.stdout, sm, "ptxas")


def _with_lines(log: str, ptx: str) -> str:
    """The log, then each PTX line it names (``ptx input, line 43``) so the reader sees the culprit."""
    lines = ptx.splitlines()
    named = sorted({int(n) for n in re.findall(r"ptx input, line (\d+)", log)})
    quoted = [f"line {n}: {lines[n - 1].strip()}" for n in named[:10] if 0 < n <= len(lines)]
    return log + ("\n" + "\n".join(quoted) if quoted else "")


def _first_int(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    return int(found.group(1)) if found else 0


def _number(sm: str) -> int:
    return int(sm[3:].rstrip("a"))


def _log(handle: int, size_fn, get_fn) -> str:
    buffer = bytearray(size_fn(handle))
    if buffer:
        get_fn(handle, buffer)
    return bytes(buffer).rstrip(b"\0").decode(errors="replace").strip()


def _nvjitlink():
    """The nvJitLink bindings; `BackendError` when the library is missing."""
    try:
        from cuda.bindings import nvjitlink
        nvjitlink.version()
    except Exception as exc:  # ImportError, or the shared library not found at first use
        raise BackendError(f"nvJitLink is not available ({type(exc).__name__}: {exc}); "
                           "install the nvidia-nvjitlink package") from None
    return nvjitlink
