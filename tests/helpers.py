"""Helpers more than one test module uses, in one place (test modules import from here, not from each other).

- `as_tuple`: a kernel's or a body's result as a tuple of outputs;
- `quantization_bound`: what the FP8 quantized GEMM may differ from the exact product by;
- `ops_of`: the Tile IR ops of one kind in a kernel;
- `expected_softmax`: numpy's softmax over the last axis;
- `run_backend`, `outputs`, `simulated`, `assemble_without_spills`: a body run end to end on the ``cpu`` or
  ``simulate`` backend, for the suite parameterized over backends and each backend's own tests;
- `run_on_host`: a SIMT kernel's emitted LLVM IR run on the host CPU, thread by thread;
- `FakeDriver`, `OK`: just enough of ``cuda.bindings.driver`` to test the runtime without a GPU;
- `CORPUS`, `SNAPSHOTS`, `compare`: the snapshot corpus's kernels and the golden-file comparison;
- `quantization_bound`, `QUANTIZATION_BOUNDS`, `within_quantization_bound`: the quantized GEMMs' checks against
  the exact product;
- `DEFAULT_CHANGING`: the environment variables `conftest.py` clears so that the suite runs with the defaults.
"""
from __future__ import annotations

import ctypes
import difflib
import re
from pathlib import Path
from types import SimpleNamespace

import llvmlite.binding as llvm
import llvmlite.ir as ir
import ml_dtypes
import numpy as np
import pytest
from cuda.bindings import driver as real_driver

import redfuser as rf
from redfuser import config
from redfuser.codegen.llvm_dtypes import intrinsic_suffix
from redfuser.codegen.llvm_utils import F32, I64, PTR, call_intrinsic, counted_loop, initialize_native, like, splat
from redfuser.codegen.native import host_target, jit_machine
from redfuser.codegen.ptx_check import SERIALIZED_BY_CALLS, check_ptx
from redfuser.codegen.simt import GpuOptions, lower_to_simt
from redfuser.codegen.simt.run import simulate_program
from redfuser.codegen.simt_to_llvm import emit_module
from redfuser.ir.tile import nodes as t
from redfuser.schedule import options_for, schedule_program
from redfuser.testing.quantization import int8_quantization_bound
from redfuser.testing.quantization import quantization_bound as shared_bound
from redfuser.workloads import attention, fp8_quant_gemm, log_softmax, softmax


DEFAULT_CHANGING = ("REDFUSER_BACKEND", "REDFUSER_CACHE", "REDFUSER_AUTOTUNE", "REDFUSER_DUMP_DIR")
"""Variables of `redfuser.config` that change RedFuser's defaults for a user's own runs; the suite clears them."""


def as_tuple(x):
    """`x` if a tuple or list of outputs (as a tuple), else the one output `x` in a tuple."""
    return tuple(x) if isinstance(x, tuple | list) else (x,)


def routing(k: int):
    """MoE routing as users write it (the workload `moe_routing` with any k): softmax over experts,
    top-k, renormalized by the kept sum."""
    def route(x):
        m = rf.max(x, axis=-1, keepdims=True)
        e = rf.exp(x - m)
        p = e / rf.sum(e, axis=-1, keepdims=True)
        vals, idx = rf.topk(p, k)
        return vals / rf.sum(vals, axis=-1, keepdims=True), idx
    return route


def quantization_bound(x, w, w_scale):
    """|result - exact| allowed by rounding x * 448 / a to e4m3 (with any a' <= a per element), per output:
    `redfuser.testing.quantization`'s bound with room for the float32 epilogue."""
    return shared_bound(x, w, w_scale) * (1 + 1e-5) + 1e-6


QUANTIZATION_BOUNDS = {"fp8_quant_gemm": quantization_bound, "int8_quant_gemm": int8_quantization_bound}
"""The workloads that quantize with a running absmax (so they equal their numpy body only within the
quantization error), and each one's per-element bound against the exact product."""


def within_quantization_bound(name: str, out, x, w, w_scale) -> bool:
    """Whether every element of `out` (of workload `name` on ``(x, w, w_scale)``) is within its
    `QUANTIZATION_BOUNDS` bound of the exact ``(x @ w) * w_scale``, computed in float64."""
    exact = (x.astype(np.float64) @ w.astype(np.float64)) * w_scale
    return bool(np.all(np.abs(np.asarray(out, np.float64) - exact) <= QUANTIZATION_BOUNDS[name](x, w, w_scale)))


def ops_of(kernel: t.TileKernel, kind) -> list:
    """The ops of type `kind` in `kernel`, loop bodies included, in order."""
    return [op for op in t.walk_ops(kernel.body) if isinstance(op, kind)]


def expected_softmax(x):
    """numpy's softmax of `x` over its last axis."""
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def assemble_without_spills(lowered) -> None:
    """Assemble each kernel's PTX for every architecture among sm_80/sm_90 it runs on (sm_90a for itself); no
    spills, and no warning from ptxas that it serialized the wgmmas (the asynchrony would be lost; its cause
    is a subroutine call in the kernel, `ptx_check.SERIALIZED_BY_CALLS`)."""
    for k in lowered.stages["ptx"].kernels:
        for arch, result in check_ptx(k.ptx).items():
            assert all(u.spill_store_bytes == 0 for u in result.usage), f"{k.name} spills on {arch}"
            assert "serializ" not in result.info_log.lower(), result.info_log
            assert SERIALIZED_BY_CALLS not in result.info_log, result.info_log


_ENGINES: list = []       # the JIT engines must outlive the functions they made


def reciprocal_estimate(kind: str, kept_bits: int | None, up: bool = False):
    """``1/x`` (kind "reciprocal") or ``1/sqrt(x)`` ("reciprocal_sqrt") of an f64 scalar or vector exactly, or
    with only `kept_bits` significant bits (the others cleared, or set where `up`)."""
    def estimate(b, x):
        root = x if kind == "reciprocal" else call_intrinsic(b, f"llvm.sqrt.{intrinsic_suffix(x.type)}", x.type, [x])
        exact = b.fdiv(splat(x.type, 1.0), root)
        if kept_bits is None:
            return exact
        low = (1 << (53 - kept_bits)) - 1
        bits_type = like(x.type, I64)
        bits = b.bitcast(exact, bits_type)
        bits = b.or_(bits, splat(bits_type, low)) if up else b.and_(bits, splat(bits_type, ~low & (2**64 - 1)))
        return b.bitcast(bits, x.type)
    return estimate


def native_elementwise(operation, operands: int, lanes: int = 1):
    """``out[i] = operation(builder, in0[i], ...)`` over f32 arrays (`operation` emits LLVM IR for f32 values:
    scalars, or with `lanes` > 1 vectors of that many elements), compiled for this CPU by LLVM's JIT, as a
    function of numpy arrays (their length a multiple of `lanes`)."""
    initialize_native()
    module = ir.Module()
    module.triple = llvm.get_process_triple()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR] * (operands + 1) + [I64]), "apply")
    b = ir.IRBuilder(fn.append_basic_block())
    *inputs, out, n = fn.args
    value_type = ir.VectorType(F32, lanes) if lanes > 1 else F32
    with counted_loop(b, ir.Constant(I64, 0), n) as i:
        # align 4: numpy guarantees an f32 array no more (a vector's own 32-byte alignment let LLVM use aligned
        # moves, which fault on an array 16 bytes off: a segfault where numpy's allocator placed one so)
        values = [b.load(b.gep(p, [i], source_etype=value_type), typ=value_type, align=4) for p in inputs]
        b.store(operation(b, *values), b.gep(out, [i], source_etype=value_type), align=4)
    b.ret_void()
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    # a target machine of its own: an MCJIT engine takes ownership of the one it is given (`runtime.cpu_jit`)
    target = host_target()
    engine = llvm.create_mcjit_compiler(parsed, jit_machine(target.triple, target.cpu, target.features))
    engine.finalize_object()
    _ENGINES.append(engine)
    native = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * (operands + 1), ctypes.c_int64)(
        engine.get_function_address("apply"))

    def run(*arrays: np.ndarray) -> np.ndarray:
        arrays = tuple(np.ascontiguousarray(a, dtype=np.float32) for a in arrays)
        assert arrays[0].size % lanes == 0, f"{arrays[0].size} elements are not whole vectors of {lanes}"
        result = np.empty_like(arrays[0])
        native(*[a.ctypes.data for a in arrays], result.ctypes.data, result.size // lanes)
        return result
    return run


def run_backend(backend: str, body, *args, **options) -> tuple[tuple, tuple]:
    """(outputs of ``rf.kernel(body, backend=backend)``, outputs of the numpy body), the inputs checked
    untouched. On ``simulate`` the PTX of the simulated program (sm_90) and of the sm_80 build are assembled too."""
    copies = [a.copy() for a in args]
    with np.errstate(all="ignore"):
        expected = as_tuple(body(*args))
    kernel = rf.kernel(body, backend=backend, **options)
    actual = as_tuple(kernel(*args))
    for a, c in zip(args, copies):
        assert a.tobytes() == c.tobytes(), "an input was modified"
    if backend == "simulate":
        assemble_without_spills(kernel.lower(*args))
        assemble_without_spills(rf.kernel(body, backend="cuda", **{**options, "sm": "sm_80"}).lower(*args))
    return actual, expected


def simulated(body, *args, sm: str = "sm_90", **options) -> tuple[np.ndarray, ...]:
    """The SIMT pipeline without LLVM: schedule, lower, simulate (for many random programs)."""
    lowered = rf.kernel(body, backend="interpret").lower(*args)
    tile = schedule_program(lowered.program, options_for("gpu", options))
    return simulate_program(lower_to_simt(tile, GpuOptions(sm=sm)), args)


def outputs(backend: str, body, *args, **options) -> tuple[np.ndarray, ...]:
    """`body`'s outputs on `backend` by the quickest path that runs its code: the ``cpu`` kernel (inputs
    checked untouched), or on ``simulate`` the SIMT program simulated without LLVM (`simulated`)."""
    if backend == "simulate":
        return tuple(simulated(body, *args, **options))
    return run_backend(backend, body, *args, **options)[0]


# A SIMT kernel without warp ops, barriers or f16/bf16 (whose host lowering needs libcalls) runs on the CPU
# when the few NVVM intrinsics it uses become host functions: the thread/block index read from globals, and
# the ex2/lg2 approximations replaced by the exact exp2/log2.
_HOST_DEFS = {
    "llvm.nvvm.read.ptx.sreg.tid.x": "define i32 @{n}() {{\n  %v = load i32, ptr @host_tid\n  ret i32 %v\n}}",
    "llvm.nvvm.read.ptx.sreg.ctaid.x": "define i32 @{n}() {{\n  %v = load i32, ptr @host_ctaid\n  ret i32 %v\n}}",
    "llvm.nvvm.ex2.approx.ftz.f32": "define float @{n}(float %x) {{\n  %v = call float @llvm.exp2.f32(float %x)\n"
                                    "  %tiny = fcmp olt float %v, 0x3810000000000000\n"      # below 2**-126: flushed
                                    "  %r = select i1 %tiny, float 0.0, float %v\n  ret float %r\n}}",
    "llvm.nvvm.lg2.approx.f": "define float @{n}(float %x) {{\n  %v = call float @llvm.log2.f32(float %x)\n"
                              "  ret float %v\n}}",
}
_HOST_DECLS = ["@host_tid = global i32 0", "@host_ctaid = global i32 0", "declare float @llvm.exp2.f32(float)",
               "declare float @llvm.log2.f32(float)"]


def _host_text(kernel) -> str:
    text = str(emit_module(kernel))
    text = re.sub(r"^(target (triple|datalayout)|!nvvm.annotations|!\d+ = ).*$", "", text, flags=re.M)
    text = text.replace("define ptx_kernel void", "define void").replace(" addrspace(3)", "")
    extra = [d for d in _HOST_DECLS if f'@"{d.split("@")[1].split("(")[0]}"' not in text]   # declare each once
    for n, (name, body) in enumerate(_HOST_DEFS.items()):
        text = re.sub(r'^declare .*@"' + re.escape(name) + r'"\(.*$', "", text, flags=re.M)
        text = text.replace(f'@"{name}"', f"@host_fn{n}")
        extra.append(body.format(n=f"host_fn{n}"))
    assert "llvm.nvvm" not in text, "a kernel the host cannot run"
    return text + "\n" + "\n".join(extra) + "\n"


def run_on_host(kernel, args) -> dict:
    """Every thread of every block in turn (valid for kernels without barriers and warp ops)."""
    import ctypes

    import llvmlite.binding as llvm
    import numpy as np

    from redfuser.codegen.llvm_utils import initialize_native

    initialize_native()
    module = llvm.parse_assembly(_host_text(kernel))
    module.verify()
    engine = llvm.create_mcjit_compiler(module, llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    tid = ctypes.c_int32.from_address(engine.get_global_value_address("host_tid"))
    ctaid = ctypes.c_int32.from_address(engine.get_global_value_address("host_ctaid"))
    scalar = {"f32": ctypes.c_float, "i32": ctypes.c_int32, "i64": ctypes.c_int64}
    arrays, cargs, ctypes_ = {}, [], []
    for p, a in zip(kernel.params, args):
        if p in kernel.buffers:
            arrays[p.name] = np.array(a, dtype=p.dtype.numpy).reshape(-1)
            cargs.append(arrays[p.name].ctypes.data)
            ctypes_.append(ctypes.c_void_p)
        else:
            cargs.append(scalar[p.dtype.name](a))
            ctypes_.append(scalar[p.dtype.name])
    fn = ctypes.CFUNCTYPE(None, *ctypes_)(engine.get_function_address(kernel.name))
    for block in range(kernel.num_blocks):
        ctaid.value = block
        for t in range(kernel.threads):
            tid.value = t
            fn(*cargs)
    return {p.name: arrays[p.name].reshape(p.shape) for p in kernel.buffers}


OK = real_driver.CUresult.CUDA_SUCCESS


TENSOR_MAP_TYPES = ("CUtensorMapDataType", "CUtensorMapInterleave", "CUtensorMapSwizzle", "CUtensorMapL2promotion",
                    "CUtensorMapFloatOOBfill", "cuuint64_t", "cuuint32_t")
"""What `runtime.tensor_maps.encode` takes from the driver module besides the call."""


class FakeDriver(SimpleNamespace):
    """Just enough of ``cuda.bindings.driver`` for the runtime, recording every call."""

    def __init__(self, **overrides):
        super().__init__(CUresult=real_driver.CUresult, CUdevice_attribute=real_driver.CUdevice_attribute,
                         CUfunction_attribute=real_driver.CUfunction_attribute,
                         CUstream_flags=real_driver.CUstream_flags,
                         **{name: getattr(real_driver, name) for name in TENSOR_MAP_TYPES})
        self.calls: list[tuple] = []
        self.next_ptr = 0x7000_0000_0000
        self.optin = 227 * 1024
        for name, fn in overrides.items():
            setattr(self, name, fn)

    def __getattr__(self, name):  # any cu* call not defined: record it and succeed
        if not name.startswith("cu"):
            raise AttributeError(name)
        return lambda *args: self._record(name, args, (OK,))

    def _record(self, name, args, result):
        self.calls.append((name, args))
        return result

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def cuInit(self, flags):
        return self._record("cuInit", (flags,), (OK,))

    def cuDeviceGetCount(self):
        return self._record("cuDeviceGetCount", (), (OK, 1))

    def cuDeviceGet(self, index):
        return self._record("cuDeviceGet", (index,), (OK, index))

    def cuDevicePrimaryCtxRetain(self, dev):
        return self._record("cuDevicePrimaryCtxRetain", (dev,), (OK, "ctx"))

    def cuModuleLoadData(self, image):
        return self._record("cuModuleLoadData", (image,), (OK, "module"))

    def cuModuleGetFunction(self, module, name):
        return self._record("cuModuleGetFunction", (module, name), (OK, f"fn:{name.decode()}"))

    def cuMemAlloc(self, nbytes):
        self.next_ptr += 0x1000
        return self._record("cuMemAlloc", (nbytes,), (OK, self.next_ptr))

    def cuDeviceGetAttribute(self, attr, dev):
        values = {"MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": self.optin, "COMPUTE_CAPABILITY_MAJOR": 9,
                  "COMPUTE_CAPABILITY_MINOR": 0, "MULTIPROCESSOR_COUNT": 132, "MAX_THREADS_PER_BLOCK": 1024,
                  "MAX_SHARED_MEMORY_PER_BLOCK": 48 * 1024, "WARP_SIZE": 32}
        return self._record("cuDeviceGetAttribute", (attr, dev), (OK, values[attr.name[len("CU_DEVICE_ATTRIBUTE_"):]]))

    def cuFuncGetAttribute(self, attr, fn):
        return self._record("cuFuncGetAttribute", (attr, fn), (OK, 1024))

    def cuDeviceGetName(self, length, dev):
        return self._record("cuDeviceGetName", (length, dev), (OK, b"Fake H200\0\0\0"))

    def cuDeviceTotalMem(self, dev):
        return self._record("cuDeviceTotalMem", (dev,), (OK, 141 * 2**30))

    def cuDriverGetVersion(self):
        return self._record("cuDriverGetVersion", (), (OK, 12080))

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        # Read the arguments back through the void*[] the runtime built, as the driver would.
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p)) if params else None
        read = [ctypes.c_uint64.from_address(slots[0]).value, ctypes.c_int64.from_address(slots[3]).value] \
            if slots else []
        return self._record("cuLaunchKernel", (fn, (gx, gy, gz), (bx, by, bz), shared, stream, read), (OK,))


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
