"""The CUDA driver API through cuda-python (``cuda.bindings.driver``): every call checked.

    ctx = primary_context(0)                      # retained once, made current
    kernel = load_module(ptx).function("vector_add")
    a = DeviceBuffer.from_numpy(x)                # runtime.cuda_memory: cuMemAlloc + copy
    kernel.launch(grid=(blocks,), block=(256,), args=[a, b, c, np.int64(n)])
    c.to_numpy(x.shape, x.dtype)

A failed call raises `CudaError` with the call, the driver's error name and its
message (``cuGetErrorName``/``cuGetErrorString``). Importing this module never
touches the driver; without one (or without a device) `unavailable_reason` says
so and every entry point raises `BackendError` with that text.
"""
from __future__ import annotations

import ctypes
import hashlib
import threading
from dataclasses import dataclass, field

import numpy as np

from ..ir.errors import BackendError, CudaError

try:  # importing the bindings never loads libcuda; the first call does
    from cuda.bindings import driver
except Exception:  # pragma: no cover - cuda-python is a dependency, but stay importable without it
    driver = None

STATIC_SHARED_LIMIT = 48 * 1024  # dynamic shared memory above this needs the per-kernel opt-in


# --- calls and errors ---------------------------------------------------------------------------

def error_text(err: object) -> tuple[str, str]:
    """The driver's (name, message) for an error code; the enum name when the driver cannot say."""
    try:
        status, name = driver.cuGetErrorName(err)
        status2, message = driver.cuGetErrorString(err)
        if int(status) == 0 and int(status2) == 0:
            return _text(name), _text(message)
    except Exception:  # no driver library: describe the code ourselves
        pass
    try:
        return driver.CUresult(int(err)).name, "(the CUDA driver could not describe this error)"
    except Exception:
        return f"CUresult {int(err)}", "(unknown CUDA error code)"


def call(name: str, *args: object) -> object:
    """``driver.<name>(*args)``, checked: its value(s) without the status; `CudaError` on failure."""
    result = getattr(driver, name)(*args)
    status, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if int(status) != 0:
        raise CudaError(name, *error_text(status))
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, (bytes, bytearray)) else str(value)


# --- driver state -------------------------------------------------------------------------------

@dataclass
class _State:
    lock: threading.RLock = field(default_factory=threading.RLock)
    checked: bool = False
    reason: str | None = None                    # why the driver is unusable; None when usable
    contexts: dict[int, "Context"] = field(default_factory=dict)
    modules: dict[tuple[int, str], "Module"] = field(default_factory=dict)


_STATE = _State()


def unavailable_reason() -> str | None:
    """None when a CUDA device can be used, else why not (``"no CUDA driver found"``, ``"no CUDA device"``...)."""
    with _STATE.lock:
        if not _STATE.checked:
            _STATE.reason = _probe()
            _STATE.checked = True
        return _STATE.reason


def _probe() -> str | None:
    if driver is None:
        return "no CUDA driver found (cuda-python is not installed)"
    try:
        result = driver.cuInit(0)
    except Exception:  # cuda-python raises when libcuda.so cannot be loaded
        return "no CUDA driver found"
    status = result[0] if isinstance(result, tuple) else result
    if int(status) == int(driver.CUresult.CUDA_ERROR_NO_DEVICE):
        return "no CUDA device"
    if int(status) != 0:
        error_name, message = error_text(status)
        return f"the CUDA driver failed to initialize: {error_name}: {message}"
    try:
        count = call("cuDeviceGetCount")
    except CudaError as exc:
        return str(exc)
    return None if count else "no CUDA device"


def require_driver() -> None:
    """`BackendError` saying why unless a CUDA device is usable."""
    reason = unavailable_reason()
    if reason is not None:
        raise BackendError(f"cannot use the cuda backend: {reason}")


def reset_state() -> None:
    """Forget the probe result and every cached context and module (tests swap drivers with it)."""
    global _STATE
    _STATE = _State()


class DeviceAddress:
    """Anything a kernel receives as a device pointer: it has an integer `ptr` (see `cuda_memory.DeviceBuffer`)."""

    ptr: int


# --- contexts -----------------------------------------------------------------------------------

@dataclass(eq=False)
class Context:
    """A device's retained primary context."""

    device_index: int
    device: object
    handle: object

    def make_current(self) -> None:
        """Bind this context to the calling thread."""
        call("cuCtxSetCurrent", self.handle)

    def synchronize(self) -> None:
        """Wait for all work in this context."""
        self.make_current()
        call("cuCtxSynchronize")

    def attribute(self, name: str) -> int:
        """A device attribute by its short name: ``MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`` etc."""
        return int(call("cuDeviceGetAttribute", getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}"),
                        self.device))


def primary_context(index: int = 0) -> Context:
    """The primary context of device `index`, retained on first use and made current."""
    require_driver()
    with _STATE.lock:
        ctx = _STATE.contexts.get(index)
        if ctx is None:
            device = call("cuDeviceGet", index)
            ctx = Context(index, device, call("cuDevicePrimaryCtxRetain", device))
            _STATE.contexts[index] = ctx
    ctx.make_current()
    return ctx


def release_primary_context(index: int = 0) -> None:
    """Unload this device's cached modules and release its primary context (if retained)."""
    with _STATE.lock:
        ctx = _STATE.contexts.pop(index, None)
        if ctx is None:
            return
        for key in [key for key, module in _STATE.modules.items() if module.context is ctx]:
            call("cuModuleUnload", _STATE.modules.pop(key).handle)
        call("cuDevicePrimaryCtxRelease", ctx.device)


# --- modules and kernels --------------------------------------------------------------------------

@dataclass(eq=False)
class Module:
    """A loaded PTX (or cubin) image; kernels looked up by name, cached."""

    context: Context
    handle: object
    functions: dict[str, "Kernel"] = field(default_factory=dict)

    def function(self, name: str) -> "Kernel":
        """The kernel `name` of this module."""
        kernel = self.functions.get(name)
        if kernel is None:
            kernel = Kernel(self, name, call("cuModuleGetFunction", self.handle, name.encode()))
            self.functions[name] = kernel
        return kernel


def load_module(image: str | bytes, context: Context | None = None) -> Module:
    """Load PTX text (JIT-compiled by the driver) or a cubin into `context`, cached per context and image."""
    ctx = context or primary_context()
    data = image.encode() + b"\0" if isinstance(image, str) else bytes(image)
    key = (id(ctx), hashlib.sha256(data).hexdigest())
    with _STATE.lock:
        module = _STATE.modules.get(key)
        if module is None:
            ctx.make_current()
            try:
                handle = call("cuModuleLoadData", data)
            except CudaError as exc:
                if exc.error_name in ("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "CUDA_ERROR_INVALID_PTX"):
                    raise CudaError(exc.call, exc.error_name, exc.error_message + " (the installed driver may be "
                                    "older than the PTX ISA version emitted; see codegen.nvptx)") from None
                raise
            module = Module(ctx, handle)
            _STATE.modules[key] = module
    return module


@dataclass(eq=False)
class Kernel:
    """One ``.entry`` of a loaded module."""

    module: Module
    name: str
    handle: object
    dynamic_shared_limit: int = STATIC_SHARED_LIMIT

    def launch(self, grid: tuple[int, ...], block: tuple[int, ...], args: list[object], *,
               shared_bytes: int = 0, stream: object | None = None) -> None:
        """Launch on a `grid` of blocks of `block` threads (1-3 dims) with `args` (see `pack_params`).

        `shared_bytes` of dynamic shared memory; past 48 KiB the kernel's limit is raised first,
        up to the device's opt-in maximum. `stream` is a `cuda_memory.Stream` (None: the default stream).
        """
        grid3, block3 = _dims(grid, "grid"), _dims(block, "block")
        ctx = self.module.context
        ctx.make_current()
        if shared_bytes > self.dynamic_shared_limit:
            self._raise_shared_limit(shared_bytes)
        params, _keepalive = pack_params(args)
        call("cuLaunchKernel", self.handle, *grid3, *block3, shared_bytes, stream.handle if stream else 0,
             ctypes.addressof(params) if args else 0, 0)

    def _raise_shared_limit(self, shared_bytes: int) -> None:
        optin = self.module.context.attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
        static = int(call("cuFuncGetAttribute", driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                          self.handle))
        if shared_bytes + static > optin:
            raise BackendError(f"{self.name} asks for {shared_bytes} B dynamic + {static} B static shared memory; "
                               f"the device allows {optin} B per block")
        call("cuFuncSetAttribute", self.handle,
             driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes)
        self.dynamic_shared_limit = shared_bytes


def _dims(dims: tuple[int, ...], what: str) -> tuple[int, int, int]:
    values = tuple(int(d) for d in dims)
    if not 1 <= len(values) <= 3 or any(d < 1 for d in values):
        raise BackendError(f"{what} must be 1 to 3 positive sizes, got {dims!r}")
    return values + (1,) * (3 - len(values))  # type: ignore[return-value]


_CTYPES = {np.dtype(t): c for t, c in [
    (np.int8, ctypes.c_int8), (np.uint8, ctypes.c_uint8), (np.int16, ctypes.c_int16), (np.uint16, ctypes.c_uint16),
    (np.int32, ctypes.c_int32), (np.uint32, ctypes.c_uint32), (np.int64, ctypes.c_int64),
    (np.uint64, ctypes.c_uint64), (np.float32, ctypes.c_float), (np.float64, ctypes.c_double),
    (np.bool_, ctypes.c_bool)]}


def pack_params(args: list[object]) -> tuple[ctypes.Array, list[object]]:
    """The ``void*[]`` cuLaunchKernel reads arguments through, and the values it points at (keep both alive).

    An argument is a `DeviceAddress` such as a `DeviceBuffer` (its address), a numpy scalar (``np.int64(n)``), a
    ctypes value, or a ctypes array of bytes (a parameter passed by value: a ``CUtensorMap``). Python ints and
    floats are refused: the kernel's parameter width must be explicit.
    """
    values: list[object] = []
    for arg in args:
        if isinstance(arg, DeviceAddress):
            values.append(ctypes.c_uint64(arg.ptr))
        elif isinstance(arg, ctypes._SimpleCData | ctypes.Array):
            values.append(arg)
        elif isinstance(arg, np.generic) and arg.dtype in _CTYPES:
            values.append(_CTYPES[arg.dtype](arg.item()))
        else:
            raise BackendError(f"kernel argument {arg!r} of type {type(arg).__name__}: pass a DeviceBuffer, "
                               "a numpy scalar such as np.int64(n), or a ctypes value")
    array = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
    return array, values
