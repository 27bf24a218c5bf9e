"""`rf.kernel`: the user-facing kernel object (specialize, compile once, cache, run)."""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import numpy as np

from . import backends
from .compiler import Lowered, lower
from .ir import ArgumentError, DTypeError, RedFuserError, UnsupportedError
from .ir import types as T
from .ir.types import BufferType
from .runtime import arrays as arrays_rt
from .source_info import user_loc
from .trace import ArgSpec, ArraySpec, StaticSpec

# Options a kernel accepts, with their defaults (later stages add theirs here).
KNOWN_OPTIONS: dict[str, object] = {
    "fuse": True,             # run the fusion engine (False: every reduction is its own pass)
    "interpret_chunk": 64,    # chunk length the interpret backend runs fused loops with
    "block_m": None,          # tile rows (query rows); None: the backend's default (cpu 32; gpu: schedule/options.py)
    "block_n": None,          # tile columns / chunk of a fused loop's axis; None: default (64)
    "block_k": None,          # chunk of a reduced axis; None: default (cpu 64; gpu 128 for 16-bit dots, else 64)
    "num_threads": 0,         # cpu: worker threads splitting the grid; 0: one per core
    "split": None,            # slices of a fused loop's axis across programs (flash decoding); None: automatic
    "num_warps": None,        # cuda/simulate: warps per block; None: codegen/simt/plan.py (4, up to 16 a big tile)
    "min_blocks_per_sm": None,  # cuda/simulate: build for this many blocks an SM (.minnctapersm; caps registers)
    "sm": None,               # cuda/simulate: GPU target such as "sm_80"; None: the device's, else sm_90
    "autotune": False,        # cpu/cuda: time a few tile sizes, warps and splits on first call (runtime/autotune.py)
    "skip_masked": False,     # skip key blocks a causal-style mask hides (exact for finite values; schedule/masked.py)
    "prefetch": False,        # cuda/simulate: load tensor-core operands a loop iteration ahead (schedule/prefetch.py)
    "llvm_opt": None,         # cuda/simulate: None, RedFuser's middle end; 1-3, LLVM's O1-O3 (codegen/nvptx.py)
}
HOST_BACKENDS = frozenset({"interpret", "cpu", "simulate"})
SUPPORTED_DTYPES = ", ".join(d.numpy_name for d in T.ALL_DTYPES)


def _user_facing(method: Callable) -> Callable:
    """Re-raise RedFuser errors without RedFuser's internal frames in the traceback."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except RedFuserError as err:
            raise err.with_traceback(None) from None

    return wrapper


class Kernel:
    """A function compiled by RedFuser. Call it with numpy arrays; get numpy arrays back.

    Compiles once per (argument shapes and dtypes, static scalars, backend,
    options) and keeps the result in memory.
    """

    def __init__(self, fn: Callable, backend: str | None = None, **options: object) -> None:
        unknown = sorted(set(options) - set(KNOWN_OPTIONS))
        if unknown:
            known = ", ".join(sorted(KNOWN_OPTIONS)) or "none yet"
            raise ArgumentError(f"unknown option(s) {', '.join(unknown)}; known options: {known}", op="kernel")
        self.__wrapped__ = fn
        self.backend = backend
        self.options = {**KNOWN_OPTIONS, **options}
        self._params = list(inspect.signature(fn).parameters.values())
        self._cache: dict[tuple, tuple[Lowered, backends.Executable]] = {}
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<redfuser.kernel {self.__name__} backend={self.backend or 'auto'}>"

    # -- arguments --------------------------------------------------------------------------------
    def _specs(self, args: tuple[Any, ...]) -> tuple[tuple[ArgSpec, ...], list[np.ndarray]]:
        names = [p.name for p in self._params]
        if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY) for p in self._params):
            raise UnsupportedError("kernels take positional parameters only (no *args, **kwargs or keyword-only)",
                                   op=self.__name__, loc=user_loc())
        if len(args) != len(names):
            raise ArgumentError(f"takes {len(names)} argument(s) ({', '.join(names)}) but {len(args)} were given",
                                op=self.__name__, loc=user_loc())
        specs: list[ArgSpec] = []
        arrays: list[np.ndarray] = []
        for name, value in zip(names, args):
            if isinstance(value, bool | int | float) and not isinstance(value, np.generic):
                specs.append(StaticSpec(name, value))
                continue
            if not arrays_rt.is_array(value):
                raise ArgumentError(
                    f"argument {name!r} must be an array (numpy, DLPack or __cuda_array_interface__) or a Python "
                    f"scalar, got {type(value).__name__}", op=self.__name__, loc=user_loc())
            try:
                info = arrays_rt.describe(value, f"argument {name!r}")
            except (ArgumentError, DTypeError) as err:
                raise type(err)(err.message, op=self.__name__, loc=user_loc()) from None
            if info.dtype == T.float64:
                raise DTypeError(f"argument {name!r} has dtype float64, which is not supported; "
                                 f"supported: {', '.join(d.numpy_name for d in T.ALL_DTYPES if d != T.float64)}",
                                 op=self.__name__, loc=user_loc())
            specs.append(ArraySpec(name, BufferType(info.dtype, info.shape)))
            arrays.append(value)
        return tuple(specs), arrays

    def _compiled(self, args: tuple[Any, ...], *, to_run: bool = True
                  ) -> tuple[Lowered, backends.Executable | None, list[np.ndarray]]:
        specs, arrays = self._specs(args)
        backend, _ = backends.resolve(self.backend, to_run=to_run)
        key = (specs, backend, tuple(sorted(self.options.items())))
        entry = self._cache.get(key)
        if entry is None:
            options = self._tuned(specs, backend, arrays, to_run)
            entry = self._cache[key] = [lower(self.__wrapped__, specs, backend, options), None]
        if to_run and entry[1] is None:   # compiled without running (lower/explain): build it now
            entry[1] = backends.BACKENDS[backend].build(entry[0])
        return entry[0], entry[1], arrays

    def _tuned(self, specs: tuple[ArgSpec, ...], backend: str, arrays: list, to_run: bool) -> dict:
        """The options to compile with: tuned ones where autotuning is on (stored results only when not running)."""
        from .runtime import autotune
        from .trace import trace

        if backend not in autotune.SPACES or not autotune.wanted(self.options):
            return self.options

        def prepare(options: dict) -> Callable[[], object]:
            run = backends.BACKENDS[backend].build(lower(self.__wrapped__, specs, backend, options))
            inputs = [arrays_rt.host_array(a) for a in arrays] if backend in HOST_BACKENDS else arrays
            return lambda: run(inputs)

        return autotune.tuned_options(self.__name__, str(trace(self.__wrapped__, specs)), repr(specs), backend,
                                      self.options, KNOWN_OPTIONS, prepare, measure=to_run)

    # -- public -----------------------------------------------------------------------------------
    @_user_facing
    def __call__(self, *args: Any, stream: object | None = None) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run on `args`. `stream`: the CUDA stream the ``cuda`` backend queues its work on (an int handle, a
        torch or cupy stream...; default: torch's/cupy's current one for their tensors); host backends ignore
        it. See docs/gpu-backend.md, "Arrays and streams"."""
        lowered, run, arrays = self._compiled(args)
        if lowered.backend in HOST_BACKENDS:
            # Host backends read numpy views of host arrays (torch CPU tensors too, without a copy) and
            # hand results back as the caller's array type.
            names = [s.name for s in lowered.specs if isinstance(s, ArraySpec)]
            library = next((arrays_rt.library_of(a) for a in arrays if not isinstance(a, np.ndarray)), "numpy")
            outputs = tuple(arrays_rt.as_caller_type(o, library)
                            for o in run([arrays_rt.host_array(a, f"argument {n!r}") for a, n in zip(arrays, names)]))
        else:
            outputs = run(arrays, stream=stream)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @_user_facing
    def lower(self, *args: Any) -> Lowered:
        """Compile for these arguments (without running) and return every stage."""
        return self._compiled(args, to_run=False)[0]

    @_user_facing
    def explain(self, *args: Any) -> str:
        """What the compiler found and did for these arguments, in words (cascades, G, H, rescales)."""
        from .fusion.explain import explain

        lowered = self._compiled(args, to_run=False)[0]
        return explain(lowered.name, lowered.groups, lowered.stages.get("fused"))

    @property
    def cache_size(self) -> int:
        """How many specializations are compiled in memory."""
        return len(self._cache)


def kernel(fn: Callable | None = None, *, backend: str | None = None, **options: object):
    """Make `fn` a RedFuser kernel: ``@rf.kernel``, ``@rf.kernel(backend=...)`` or ``rf.kernel(fn, ...)``."""
    if fn is None:
        return lambda f: Kernel(f, backend=backend, **options)
    return Kernel(fn, backend=backend, **options)
