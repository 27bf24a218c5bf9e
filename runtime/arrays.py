"""What a kernel argument is, whatever library made it: numpy, DLPack or ``__cuda_array_interface__``.

`describe` reads an argument without copying it into an `ArrayInfo`: shape,
dtype, element strides, the device it lives on and the address of its first
element. numpy arrays are read directly; other objects through the CUDA Array
Interface (v2/v3: CuPy, PyTorch CUDA tensors, Numba) or the DLPack protocol
(``__dlpack__``/``__dlpack_device__``: PyTorch, JAX, ...). The DLPack capsule is
read but not consumed, so the producer keeps ownership; the caller keeps the
argument alive while the address is used. A capsule RedFuser reads itself is kept
with what it describes (a host view's base, a device `ArrayInfo`'s `owner`): the
protocol lets a producer export memory that only the capsule keeps alive (a
tensor materialized for the export), which its deleter frees.

`host_array` gives a zero-copy numpy view of a host-resident argument;
`new_like` allocates an output of the caller's own array type on the same
device when that library is importable (torch, cupy), else a numpy array.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field, replace

import numpy as np

from ..ir import ArgumentError, DTypeError, DType
from ..ir import types as T

CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13     # DLPack device types
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_BOOL = 0, 1, 2, 4, 6
_DL_FLOAT8_E4M3FN = 10


@dataclass(frozen=True)
class ArrayInfo:
    """A kernel argument as RedFuser sees it (no data copied)."""

    shape: tuple[int, ...]
    dtype: DType
    strides: tuple[int, ...]          # in elements
    device_type: int                  # DLPack device type: CPU, CUDA, ...
    device_id: int
    pointer: int                      # address of element [0, 0, ...]
    library: str                      # "numpy", "torch", "cupy", ... (the caller's array type)
    whole_elements: bool = True       # the address and every stride are whole elements (a numpy view of
    #                                   a structured or byte-offset buffer may not be)
    owner: object = field(default=None, compare=False, repr=False)   # the DLPack capsule the pointer was
    #                                   read from, where only it may keep the memory alive (a device export)
    odd_strides: tuple[int, ...] | None = None   # the byte strides where they are not whole elements (then
    #                                   `strides` are rounded down and only the bytes say what memory it spans)

    @property
    def byte_strides(self) -> tuple[int, ...]:
        """The strides in bytes, exact also for a view whose strides are not whole elements."""
        return self.odd_strides if self.odd_strides is not None else tuple(
            s * self.dtype.itemsize for s in self.strides)

    @property
    def on_gpu(self) -> bool:
        return self.device_type in (CUDA, CUDA_MANAGED)

    @property
    def contiguous(self) -> bool:
        expected = T.row_major_strides(self.shape)
        return all(s == e for s, e, n in zip(self.strides, expected, self.shape) if n > 1)


def _has(x: object, name: str) -> bool:
    """`hasattr` that also says yes when the attribute exists but raises (torch's CAI for float8 raises
    KeyError, for tensors that require grad RuntimeError): `describe` then says what is wrong."""
    try:
        getattr(x, name)
    except AttributeError:
        return False
    except Exception:
        return True
    return True


def is_array(x: object) -> bool:
    """True for anything `describe` accepts."""
    return isinstance(x, np.ndarray) or _has(x, "__cuda_array_interface__") or _has(x, "__dlpack__")


def library_of(x: object) -> str:
    """The library an array object comes from ("numpy", "torch", "cupy"...): the caller's array type."""
    return type(x).__module__.split(".")[0]


PLAIN_ARRAY_TYPES = (np.ndarray, np.memmap)
"""numpy array types whose elements are all they mean; other subclasses (a masked array's mask,
``np.matrix``'s ``*``) carry meaning a kernel would drop."""


def subclass_refusal(x: object, name: str, hint: str | None = None) -> str | None:
    """Why `x`, a numpy array subclass other than `PLAIN_ARRAY_TYPES`, is refused as `name` (an argument, an
    ``out=``), with `hint` (or one for arguments) on what to pass; None for anything else."""
    if not isinstance(x, np.ndarray) or type(x) in PLAIN_ARRAY_TYPES:
        return None
    kind = f"{type(x).__module__}.{type(x).__qualname__}"
    hint = hint or ("x.filled(fill_value)" if isinstance(x, np.ma.MaskedArray) else "np.asarray(x)")
    return (f"{name} is a {kind}, a numpy array subclass whose meaning a kernel would drop (a mask, matrix "
            f"products); pass a plain array ({hint})")


def describe(x: object, name: str = "argument") -> ArrayInfo:
    """`x` as an `ArrayInfo`; raises `ArgumentError`/`DTypeError` for what RedFuser cannot take."""
    return _describe(x, name)[0]


def _describe(x: object, name: str) -> tuple[ArrayInfo, np.ndarray | None]:
    """`describe`, and the numpy view a host argument was read through (None for a device array)."""
    if isinstance(x, np.ndarray):
        dtype = _ir_dtype(x.dtype, name)
        strides = tuple(s // x.itemsize for s in x.strides)
        whole = x.flags.aligned and all(s % x.itemsize == 0 for s in x.strides)
        return ArrayInfo(tuple(x.shape), dtype, strides, CPU, 0, x.ctypes.data, "numpy", whole,
                         odd_strides=None if whole else tuple(x.strides)), x
    # Device arrays through DLPack first: it names the device ordinal and every dtype (torch's CAI
    # spells bfloat16 "<V2" and has no float8); the CAI is the fallback (Numba, or a producer whose
    # export fails, e.g. torch for a tensor on another device than the current one).
    dlpack_error: Exception | None = None
    if _has(x, "__dlpack__") and _has(x, "__dlpack_device__") and _device_type(x) != CPU:
        try:
            return _from_dlpack(x, name)
        except (ArgumentError, DTypeError):
            raise
        except Exception as exc:  # BufferError, RuntimeError...: try the other protocol
            dlpack_error = exc
    if _has(x, "__cuda_array_interface__"):
        try:
            cai = x.__cuda_array_interface__
        except Exception as exc:
            raise ArgumentError(f"{name}: its __cuda_array_interface__ failed: {exc}") from None
        return _from_cai(cai, library_of(x), name), None
    if dlpack_error is not None:
        raise ArgumentError(f"{name}: its DLPack export failed: {dlpack_error}")
    if _has(x, "__dlpack__"):
        return _from_dlpack(x, name)
    raise ArgumentError(f"{name} must be an array (numpy, DLPack or __cuda_array_interface__), got "
                        f"{type(x).__name__}")


def specialized_strides(info: ArrayInfo) -> tuple[int, ...] | None:
    """The element strides a kernel is specialized on for this argument (`ir.types.BufferType.strides`):
    None for a dense row-major array (or an empty one), else its strides with those of size-1 dims set to
    0 (they never move), so views that address the same elements the same way share a kernel."""
    if 0 in info.shape or info.contiguous:
        return None
    return tuple(0 if n == 1 else s for n, s in zip(info.shape, info.strides))


def readable_in_place(x: object, info: ArrayInfo, name: str) -> tuple[object, ArrayInfo]:
    """`x` and its info, or, where a kernel cannot address `x`'s elements through element strides (a
    numpy view whose address or byte strides are not whole elements), a dense copy and its info. A copy
    larger than the memory the argument spans is refused before anything is allocated: the caller
    decides whether to spend that memory."""
    if info.whole_elements:
        return x, info
    assert isinstance(x, np.ndarray)   # only numpy describes byte strides that are not whole elements
    spans = 0 if x.size == 0 else x.itemsize + sum((n - 1) * abs(s) for n, s in zip(x.shape, x.strides))
    if x.nbytes > spans:
        raise ArgumentError(f"{name} is a view with byte strides {x.strides} that are not whole {x.itemsize}-byte "
                            f"elements, so it must be copied, and a dense copy would take {x.nbytes} bytes where "
                            f"the view spans {spans}; pass np.ascontiguousarray of it if that is what you want")
    copy = np.ascontiguousarray(x)
    return copy, describe(copy, name)


def _ir_dtype(dtype: np.dtype, name: str) -> DType:
    d = T.from_numpy(dtype)
    if d is None and not dtype.isnative and T.from_numpy(dtype.newbyteorder("=")) is not None:
        raise DTypeError(f"{name} has dtype {dtype.str}, {dtype.name} in the other byte order; kernels read "
                         f"this machine's: pass x.astype(x.dtype.newbyteorder('='))")
    if d is None:
        supported = ", ".join(t.numpy_name for t in T.ALL_DTYPES if t != T.float64)
        raise DTypeError(f"{name} has dtype {dtype}, which is not supported; supported: {supported}")
    return d


def _from_cai(cai: dict, library: str, name: str) -> ArrayInfo:
    shape = tuple(int(s) for s in cai["shape"])
    dtype = _ir_dtype(np.dtype(cai["typestr"]), name)
    item = dtype.itemsize
    strides = cai.get("strides")
    if strides is None:
        strides_e = T.row_major_strides(shape)
    else:
        strides_e = tuple(int(s) // item for s in strides)
    pointer = int(cai["data"][0])
    return ArrayInfo(shape, dtype, strides_e, CUDA, -1, pointer, library)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_DTYPES: dict[tuple[int, int], DType] = {
    (_DL_FLOAT, 32): T.float32, (_DL_FLOAT, 16): T.float16, (_DL_FLOAT, 64): T.float64,
    (_DL_BFLOAT, 16): T.bfloat16, (_DL_INT, 32): T.int32, (_DL_INT, 64): T.int64, (_DL_BOOL, 8): T.bool_,
    (_DL_FLOAT8_E4M3FN, 8): T.float8_e4m3fn,
}


def _capsule_tensor(capsule: object) -> _DLTensor:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    address = get(capsule, b"dltensor")
    return _DLTensor.from_address(address)   # DLManagedTensor starts with its DLTensor


def _device_type(x: object) -> int:
    try:
        return int(x.__dlpack_device__()[0])
    except Exception:
        return CPU


def _torch_refusal(x: object, name: str) -> str | None:
    """Why a torch tensor cannot be read as its memory, or None: DLPack exports a tensor whose lazy negation
    (``c.conj().imag``) or conjugation is a bit beside its memory without the bit (the kernel would read
    ``-x``), and fails with torch's own errors on sparse, meta and nested tensors."""
    if getattr(x, "is_nested", False) is True:
        return f"{name} is a nested torch tensor; pass its components (x.unbind()) or x.to_padded_tensor(0.0)"
    layout = getattr(x, "layout", None)
    if layout is not None and str(layout) != "torch.strided":
        return f"{name} is a {layout} torch tensor; a kernel reads dense memory: pass x.to_dense()"
    if str(getattr(x, "device", "")) == "meta":
        return f"{name} is a torch tensor on the meta device: it has no data to compute with"
    if callable(getattr(x, "is_neg", None)) and x.is_neg():
        return (f"{name} is a torch tensor with its negative bit set (a lazy view such as c.conj().imag): its "
                f"memory holds -x; pass x.resolve_neg()")
    if callable(getattr(x, "is_conj", None)) and x.is_conj():
        return f"{name} is a torch tensor with its conjugate bit set; pass x.resolve_conj()"
    return None


def _from_dlpack(x: object, name: str) -> tuple[ArrayInfo, np.ndarray | None]:
    if getattr(x, "requires_grad", False) is True:   # torch refuses to export it (BufferError)
        raise ArgumentError(f"{name} is a tensor that requires grad; a kernel has no backward, so pass "
                            f"x.detach() (or call it under torch.no_grad() on detached tensors)")
    refusal = _torch_refusal(x, name) if library_of(x) == "torch" else None
    if refusal is not None:
        raise ArgumentError(refusal)
    device_type, device_id = (int(v) for v in x.__dlpack_device__())
    if device_type == CPU:
        view = _host_dlpack(x, name)
        return replace(describe(view, name), library=library_of(x)), view
    try:   # stream=-1: no synchronization by the producer; the cuda backend orders work on its stream
        capsule = x.__dlpack__(stream=-1)
    except TypeError:
        capsule = x.__dlpack__()
    dtype, shape, strides, pointer = _read_capsule(capsule, name)
    return ArrayInfo(shape, dtype, strides, device_type, device_id, pointer, library_of(x), owner=capsule), None


def _read_capsule(capsule: object, name: str) -> tuple[DType, tuple[int, ...], tuple[int, ...], int]:
    """``(dtype, shape, element strides, address of the first element)`` of a DLPack capsule's tensor."""
    t = _capsule_tensor(capsule)
    dtype = _DL_DTYPES.get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    if dtype is None:
        raise DTypeError(f"{name} has a DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits) RedFuser does "
                         "not support")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] for i in range(t.ndim))
    else:
        strides = T.row_major_strides(shape)
    return dtype, shape, strides, (t.data or 0) + t.byte_offset


class _HostMemory:
    """Another library's host memory as numpy sees it (``__array_interface__``); holding the producer and the
    capsule its memory was exported in keeps the memory alive as long as a view of it is (the capsule's
    deleter, run when it is collected unconsumed, may free a buffer the producer made for the export)."""

    def __init__(self, producer: object, capsule: object, pointer: int, shape: tuple[int, ...],
                 byte_strides: tuple[int, ...], itemsize: int) -> None:
        self.producer = producer
        self.capsule = capsule
        self.__array_interface__ = {"data": (pointer, False), "shape": shape, "strides": byte_strides,
                                    "typestr": f"|V{itemsize}", "version": 3}


def _host_dlpack(x: object, name: str) -> np.ndarray:
    """A zero-copy numpy view of a host DLPack tensor: numpy's own import, or, for the dtypes it lacks
    (bfloat16 and float8, which numpy knows only through ml_dtypes), the tensor read from its capsule."""
    try:
        return np.from_dlpack(x)
    except (RuntimeError, BufferError, TypeError):   # "Unsupported dtype in DLTensor" and the like
        pass
    capsule = x.__dlpack__()
    dtype, shape, strides, pointer = _read_capsule(capsule, name)
    if 0 in shape:
        return np.empty(shape, dtype.numpy)
    item = dtype.itemsize
    # (the view's base holds the capsule: dropped here, its deleter could free the memory the view reads)
    raw = np.asarray(_HostMemory(x, capsule, pointer, shape, tuple(s * item for s in strides), item))
    return raw.view(dtype.numpy)


def host_array(x: object, name: str = "argument") -> np.ndarray:
    """A numpy view of a host-resident argument (no copy); `ArgumentError` for device arrays."""
    if isinstance(x, np.ndarray):
        return x
    info, view = _describe(x, name)   # a host DLPack tensor is imported once, for the checks and the view
    if view is None:
        raise ArgumentError(f"{name} lives on a GPU (DLPack device {info.device_type}); this backend takes host "
                            "arrays — use backend='cuda' or copy it to the host")
    return view


def c_contiguous(a: object) -> np.ndarray:
    """`a` as a C-contiguous numpy array of its own shape, copied only where it is not one already: a 0-d
    result stays 0-d (``np.ascontiguousarray`` returns at least one dimension)."""
    return np.array(a, order="C", copy=None)


def as_caller_type(out: np.ndarray, library: str):
    """A host result handed back as the caller's array type (a torch CPU tensor for torch callers)."""
    if library == "torch":
        import torch

        try:
            return torch.from_numpy(out)
        except TypeError:   # an ml_dtypes array (bfloat16, float8): torch takes its bits and reinterprets them
            torch_dtype = getattr(torch, out.dtype.name, None)
            if torch_dtype is None or torch_dtype.itemsize != out.dtype.itemsize:   # old torch without float8
                return out
            bits = np.int16 if out.dtype.itemsize == 2 else np.int8
            return torch.from_numpy(c_contiguous(out).view(bits)).view(torch_dtype)
    return out


def new_like(library: str, shape: tuple[int, ...], dtype: DType, device_id: int = 0, on_gpu: bool = False):
    """An uninitialized output of the caller's array type on the caller's device."""
    if library == "torch":
        import torch

        torch_dtype = {T.float32: torch.float32, T.float16: torch.float16, T.bfloat16: torch.bfloat16,
                       T.int32: torch.int32, T.int64: torch.int64, T.bool_: torch.bool,
                       T.float64: torch.float64,
                       T.float8_e4m3fn: getattr(torch, "float8_e4m3fn", None)}.get(dtype)
        if torch_dtype is not None:
            device = f"cuda:{max(device_id, 0)}" if on_gpu else "cpu"
            return torch.empty(shape, dtype=torch_dtype, device=device)
    if library == "cupy" and on_gpu:
        import cupy

        with cupy.cuda.Device(max(device_id, 0)):
            return cupy.empty(shape, dtype=dtype.numpy)
    return np.empty(shape, dtype=dtype.numpy)
