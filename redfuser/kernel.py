"""`rf.kernel`: the user-facing kernel object (specialize, compile once, cache, run)."""
from __future__ import annotations

import dis
import functools
import inspect
import operator
import os
import re
import sys
import threading
import weakref
import types
from typing import Any, Callable, NamedTuple

import numpy as np

from . import backends, config, in_place, outputs
from .compiler import AFTER_TRACE, Lowered, ShortCall, lower
from .arguments import ShapeDtype, bind, check_signature, spec_of
from .captured import CapturedScalars, Defaults
from .ir import ArgumentError, RedFuserError, UnsupportedError
from .ir import Buffer, BufferType
from .ir.sizes import SymbolicDecision, bind_buffers, concrete
from .ir.types import row_major_strides
from .kernel_options import DEFAULT_OPTIONS, KernelOptions
from .methods import BoundKernel, WeakMethod
from .probes import PROBE_LENGTHS
from .shapes import Dynamic, DynamicAxes, ShapePlan
from .runtime import arrays as arrays_rt
from .runtime import autotune
from .runtime.addresses import data_address
from .source_info import user_loc
from .trace import ArgSpec, ArraySpec, kernel_name
from .tracer import Tracer


def _user_facing(method: Callable) -> Callable:
    """Re-raise RedFuser errors without RedFuser's internal frames in the traceback."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except RedFuserError as err:
            raise err.with_traceback(None) from None

    return wrapper


class _FastPath(NamedTuple):
    """What a cached call needs of its specialization (`Kernel._fast`), decided once when it was made."""

    lowered: Lowered
    run: "backends.Executable"
    host: bool                    # a host backend (numpy views of the arrays)
    numpy_only: bool              # the key's arrays are all numpy arrays (no torch tensors)
    dense: Callable | None        # the executable's `call_dense`, where it has one and `numpy_only`
    only_arrays: bool             # no static arguments: the call's arguments are its arrays
    direct: Callable | None       # the executable's `direct()` function: arrays -> the call's value, or None
    results: tuple | None         # each result's (shape, numpy dtype) where they are static (no shape class)
    sequence: bool | type         # the body returned a tuple (a list, a named tuple: its type): `_one_or_tuple`


class CacheInfo(NamedTuple):
    """`Kernel.cache_info`'s answer, shaped like `functools.lru_cache`'s."""

    hits: int
    misses: int
    maxsize: int | None
    currsize: int


class Kernel:
    """A function compiled by RedFuser. Call it with numpy arrays; get numpy arrays back.

    Compiles once per specialization and keeps the result in memory: the arrays' dtypes, shapes and
    strides, each static value's type and exact value (``2``, ``2.0`` and ``True`` are three), the
    backend and the options (`redfuser.arguments`). `options` is the kernel's `KernelOptions`.
    Shapes: a shape class where axes are symbolic (`dynamic`, `redfuser.shapes`): by default an axis seen
    with a second length becomes symbolic, and one kernel then serves all its lengths.
    """

    @_user_facing
    def __init__(self, fn: Callable, backend: str | None = None, options: KernelOptions | None = None,
                 dynamic: Dynamic = None, **given: object) -> None:
        while isinstance(fn, Kernel | BoundKernel):   # rf.kernel(a_kernel): its body, with these options and backend
            # (of ``obj.body``, the bound method: it holds `obj`, as a bound method given to rf.kernel does)
            fn = fn.method() if isinstance(fn, BoundKernel) else fn.__wrapped__
        name = kernel_name(fn)
        self._signature = check_signature(fn, name)
        self._dynamic = DynamicAxes(dynamic, name, tuple(self._signature.parameters), user_loc())
        if options is not None and not isinstance(options, KernelOptions):
            raise ArgumentError(f"options must be an rf.KernelOptions, got {type(options).__name__}", op="kernel",
                                loc=user_loc())
        if options is not None and given:
            raise ArgumentError(f"give options either as options=rf.KernelOptions(...) or as keywords, not both "
                                f"({', '.join(sorted(given))})", op="kernel", loc=user_loc())
        self.options: KernelOptions = options if options is not None else KernelOptions.given(given, loc=user_loc())
        if backend is not None:
            backends.check_name(backend, loc=user_loc())
        self.__wrapped__ = fn
        self.backend = backend
        self._cache: dict[tuple, tuple[Lowered, backends.Executable]] = {}
        self._compiling = threading.RLock()
        _KERNELS.add(self)
        # id of an instance -> (a reference to it, the kernel of its bound method): `__get__`
        self._bound: dict[int, tuple[Callable[[], object], Kernel]] = {}
        self._hits = self._misses = 0
        self._dropped = 0      # how many times a changed captured value dropped the specializations
        # `_fast_key` of a call -> its `_FastPath`: the call path of a specialization already made, for calls
        # whose arguments need no checks beyond what the key says
        self._fast: dict[tuple, _FastPath] = {}
        # the same for shape classes: the symbolic axes (argument position, axis) of each class made ->
        # `_class_key` of a call -> (its call path as in `_fast`, each symbol's guard in the class's order)
        self._classes: dict[frozenset, dict[tuple, tuple[_FastPath, tuple[int, ...]]]] = {}
        self._captured = CapturedScalars.of(fn)
        self._defaults = Defaults.of(fn)
        # (a method's kernel takes its function's module and docstring; the body stays the method)
        functools.update_wrapper(self, fn.__func__ if isinstance(fn, WeakMethod) else fn)
        self.__wrapped__ = fn
        # (a functools.partial or a callable object has no __name__ for update_wrapper to copy)
        self.__name__ = getattr(self, "__name__", name)

    def __repr__(self) -> str:
        return f"<redfuser.kernel {self.__name__} backend={self.backend or 'auto'}>"

    @property
    def __signature__(self) -> inspect.Signature:
        """The parameters a call takes, as Python calls the body (`trace.body_signature`): what
        `inspect.signature` and `help` show."""
        return self._signature

    # -- a kernel as an attribute: methods, pickling, copies --------------------------------------
    def __get__(self, obj: object, objtype: type | None = None) -> "Kernel | BoundKernel":
        """``@rf.kernel`` on a method: ``obj.body`` is the kernel of the bound method (``rf.kernel(obj.body)``,
        its ``self`` attributes tracked as captured values), one per instance and kept while the instance
        lives (by identity where the instance cannot be weakly referenced: then for the process's life), bound
        to the instance as a bound method is (`BoundKernel`, which holds it). The kernel kept holds its instance
        weakly (`WeakMethod`): an instance is freed as it would be without one.
        Without this, ``obj.body(x)`` called the kernel without ``self`` and said an argument was missing.

        Bound as Python binds the body: a function is, a ``staticmethod`` or a ``functools.partial`` is not
        (``obj.body`` is the kernel itself), and through the class (``Class.body``) nothing is: a call
        ``Class.body(obj, x)`` binds ``obj`` then (`_bound_to_first`)."""
        fn = self.__wrapped__
        if obj is None or not isinstance(fn, types.FunctionType):
            return self
        bound = self._bound
        key = id(obj)
        found = bound.get(key)
        if found is not None and found[0]() is obj:
            return BoundKernel(found[1], obj, self)
        try:
            ref = weakref.ref(obj, lambda _, key=key: bound.pop(key, None))
        except TypeError:          # (no weak references: kept, as a strong one)
            ref = (lambda obj=obj: obj)
        made = Kernel(WeakMethod(fn, obj, ref), backend=self.backend, options=self.options,
                      dynamic=self._dynamic.mode)
        bound[key] = (ref, made)
        return BoundKernel(made, obj, self)

    def _bound_to_first(self, args: tuple[Any, ...]) -> "BoundKernel | None":
        """The kernel of the body bound to ``args[0]`` where a method's body is called through its class with its
        instance first (``Class.body(obj, x)``, ``map(Class.body, objs, xs)``): Python calls the function with
        the instance as ``self``, so the kernel is ``obj.body``'s (`__get__`). None for any other call: the
        first argument is an array, a static value, or not an object whose attributes a body reads (a tuple,
        a list, a dict)."""
        if not args or not isinstance(self.__wrapped__, types.FunctionType):
            return None
        first = args[0]
        if (first is None or isinstance(first, _NOT_OWNERS) or arrays_rt.is_array(first)
                or not (hasattr(first, "__dict__") or hasattr(type(first), "__slots__"))):
            return None
        return self.__get__(first, type(first))

    def __reduce__(self) -> tuple:
        """Pickled by reference, as functions are: the module and qualified name a kernel is found at (a
        ``@rf.kernel`` at module level); unpickling finds it there, compiled specializations and all. A
        kernel that is not found there cannot be pickled (`pickle.PicklingError`, naming it)."""
        import pickle

        module, qualname = getattr(self, "__module__", None), getattr(self, "__qualname__", None)
        if module is None or qualname is None or _by_reference(module, qualname) is not self:
            raise pickle.PicklingError(f"cannot pickle {self!r}: it is not the object found at "
                                       f"{module}.{qualname} (a kernel pickles by reference, as functions do)")
        return (_by_reference, (module, qualname))

    def __copy__(self) -> "Kernel":
        """The kernel itself, as ``copy.copy`` of a function is the function."""
        return self

    def __deepcopy__(self, memo: dict) -> "Kernel":
        """The kernel itself, as ``copy.deepcopy`` of a function is the function (it holds compiled code and
        locks, which copy as nothing useful)."""
        return self

    # -- arguments --------------------------------------------------------------------------------
    def _specs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[ArgSpec, ...], list[Any]]:
        """The call's specs, one per parameter in order, and its arrays (views read in place)."""
        loc = user_loc()
        specs: list[ArgSpec] = []
        arrays: list[Any] = []
        for name, value in bind(self._signature, self.__name__, args, kwargs, loc).items():
            spec, array = spec_of(name, value, self.__name__, loc)
            specs.append(spec)
            if array is not None:
                arrays.append(array)
        return tuple(specs), arrays

    def _callers_arrays(self, names: list[str], arrays: list[Any], read_in_place: bool, args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
        """(name, the caller's array) of each array argument: what sharing and read-only checks must look at.
        `arrays` may hold a dense copy of a view a kernel cannot address (`arrays_rt.readable_in_place`), and
        two copies of one array share no memory, nor is a copy read-only."""
        if read_in_place:
            return list(zip(names, arrays))
        bound = bind(self._signature, self.__name__, args, kwargs, user_loc())
        return [(name, bound[name]) for name in names]

    def _retrace_if_captured_changed(self) -> None:
        """Drop every specialization made where a captured value the body reads has changed, or a default
        value of its parameters (then the signature is taken again): the body traces to another program (the
        disk cache is keyed by the traced program, so it stays right)."""
        defaults = self._defaults.changed()
        if defaults:
            self._signature = check_signature(self.__wrapped__, self.__name__)
        now = self._captured.changed() if self._captured is not None else None
        if now is None and not defaults:
            return
        self._dropped += 1     # (a compile running now traced the old values: it must not cache what it makes)
        self._drop_specializations()
        if now is not None:
            self._captured.seen = now

    def _drop_specializations(self) -> None:
        """Forget every specialization made (compiled programs, call paths, shape classes)."""
        self._cache.clear()
        self._fast.clear()
        self._classes.clear()

    def _compiled(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, to_run: bool = True
                  ) -> tuple[Lowered, backends.Executable | None, list[Any]]:
        # one thread at a time finds or makes a specialization: threads calling a new kernel at once made one
        # each (six threads, six compiles of one op); the cached call path (`__call__`'s fast key) takes no lock
        with self._compiling:
            self._retrace_if_captured_changed()
            if self._captured is not None:
                self._captured.refuse_uncomparable(self.__name__)
            # the values as the trace left them (what the body itself changed while tracing, a log list, is
            # not a reason to trace again), noted right after it: another thread's change during the rest of
            # the compile must still be one (`compiler.AFTER_TRACE`)
            captured, before = self._captured, self._captured.now() if self._captured is not None else ()

            def after_trace() -> None:
                captured.note_traced(before)

            hook = AFTER_TRACE.set(after_trace if captured is not None else None)
            dropped = self._dropped
            try:
                made = self._specialization(args, kwargs, to_run)
                made[0].artifacts["captured_generation"] = dropped   # (the values it was traced from)
                return made
            finally:
                AFTER_TRACE.reset(hook)
                if self._dropped != dropped:
                    # another thread saw a captured value change while this compile ran (it cleared the caches
                    # without this lock, then waits for it): what this compile made from the old values is
                    # returned to its own call only, not kept for the next one
                    self._drop_specializations()

    def _specialization(self, args: tuple[Any, ...], kwargs: dict[str, Any], to_run: bool
                        ) -> tuple[Lowered, backends.Executable | None, list[Any]]:
        specs, arrays = self._specs(args, kwargs)
        if to_run and any(isinstance(a, ShapeDtype) for a in arrays):
            raise ArgumentError("an rf.ShapeDtype argument can be compiled (kernel.lower, kernel.explain) but not run",
                                op=self.__name__, loc=user_loc())
        backend, _ = backends.resolve(self.backend, to_run=to_run)
        plan = self._dynamic.plan(specs)
        if plan is not None and backend in autotune.SPACES and autotune.wanted(self.options):
            plan = None      # tuning measures the call's own shapes: an autotuned kernel compiles them exactly
        if plan is not None:
            plan, specs = self._known_view_class(plan, specs, backend) or (plan, specs)
            found = self._polymorphic(plan, specs, backend, to_run)
            if found is not None:
                return found[0], found[1], arrays
        key = (specs, backend, self.options)
        entry = self._cache.get(key)
        if entry is not None:
            self._hits += 1
        else:
            self._misses += 1
            options = self._tuned(specs, backend, arrays, to_run)
            entry = self._cache[key] = [lower(self.__wrapped__, specs, backends.BACKENDS[backend], options), None]
        if to_run and entry[1] is None:   # compiled without running (lower/explain): build it now
            entry[1] = backends.BACKENDS[backend].build(entry[0])
        return entry[0], entry[1], arrays

    def _known_view_class(self, plan: ShapePlan, specs: tuple[ArgSpec, ...], backend: str
                          ) -> tuple[ShapePlan, tuple[ArgSpec, ...]] | None:
        """The class of views already compiled that this call's dense arrays belong to, with the call's specs
        describing them by their strides, where the call's own class is not compiled: the full slice
        ``cache[:, :, :N]`` of a KV cache held as slices of one buffer is dense, its strides the views'
        (which the class fixes), and compiled a third kernel of its own."""
        if (plan.key, backend, self.options) in self._cache:
            return None
        strided = _dense_as_views(specs, {name for axes in plan.axes for name, _ in axes})
        other = self._dynamic.plan(strided) if strided is not None else None
        if other is None:
            return None
        excluded = self._dynamic.excluded.get(other.key, frozenset())
        current = self._dynamic.plan(strided, excluded) if excluded else other
        if current is None or (current.key, backend, self.options) not in self._cache:
            return None
        return other, strided

    def _polymorphic(self, plan: ShapePlan, specs: tuple[ArgSpec, ...], backend: str, to_run: bool
                     ) -> tuple[Lowered, backends.Executable | None] | None:
        """The kernel of the call's shape class (`redfuser.shapes`): compiled, or found. Where compiling it
        meets a decision on a symbolic length (`SymbolicDecision`), the axes behind it are kept static and
        the narrower class is tried, and remembered for the next call of the class; any other failure of a
        class's compile keeps every axis static (the exact shapes then compile, or raise the user's error as
        they always did), its reason kept in `polymorphism`. Each failure is remembered under the key of the
        class that failed, which holds all it can depend on (a narrower class's key holds the call's
        static lengths), except a trace that indexed past the call's own length (`ShortCall`): that is about
        the call, and is kept as the length the class needs (`_short_call`). None when no axis is left
        symbolic (the caller compiles the exact shapes)."""
        dynamic = self._dynamic
        excluded: frozenset[tuple[str, int]] = frozenset()
        current: ShapePlan | None = plan
        while current is not None:
            key = (current.key, backend, self.options)
            entry = self._cache.get(key)
            skip = frozenset() if entry is not None else (
                dynamic.excluded.get(current.key, frozenset()) | dynamic.below_needs(current.key, specs))
            if skip:                     # (its compile is known to fail for this call: narrower at once)
                excluded |= skip
                current = dynamic.plan(specs, excluded)
                continue
            if entry is not None:
                if not _within_guards(entry[0], current):
                    return None          # a length the class's program cannot take: the exact shapes say why
                self._hits += 1
            else:
                try:
                    lowered = lower(self.__wrapped__, current.specs, backends.BACKENDS[backend], self.options, current)
                except Exception as why:   # noqa: BLE001 - the exact shapes compile or raise the user's error
                    symbols = why.symbols if isinstance(why, SymbolicDecision) else frozenset()
                    axes = current.axes_of(symbols)
                    if not (isinstance(why, ShortCall) and self._short_call(why, current, specs)):
                        dynamic.excluded[current.key] = dynamic.excluded.get(current.key, frozenset()) | axes
                        kind = "" if isinstance(why, SymbolicDecision | RedFuserError) else f"{type(why).__name__}: "
                        dynamic.refused[current.describe()] = _in_symbols(
                            kind + (str(why).splitlines() or [""])[0], current)
                    excluded |= axes
                    current = dynamic.plan(specs, excluded)
                    continue
                entry = self._cache[key] = [lowered, None]
                if not _within_guards(lowered, current):
                    return None
                self._misses += 1
            if to_run and entry[1] is None:
                entry[1] = backends.BACKENDS[backend].build(entry[0])
            return entry[0], entry[1]
        return None

    def _short_call(self, why: ShortCall, plan: ShapePlan, specs: tuple[ArgSpec, ...]) -> bool:
        """Whether the class's trace indexing past the call's length (`why`) is about the call alone: True
        where the call is just shorter than the class needs (``x[:, 7]`` on 3 columns), remembered as that
        need (`DynamicAxes.note_short_call`) and not as axes kept static, so that every longer call still
        shares the class; False where the need grows with the length (a loop over it): the class keeps the
        axes static."""
        needs = {axis: least for name, least in why.needs.items() for axis in plan.axes_of(frozenset({name}))}
        return bool(needs) and not self._dynamic.note_short_call(plan.key, needs, specs)

    def _remember_class(self, lowered: Lowered, args: tuple, backend_key: object, path: "_FastPath") -> None:
        """Keep the call path of a shape class for `_class_path` (calls by position, plain arrays)."""
        plan = lowered.shapes
        assert plan is not None
        if any(isinstance(spec, ArraySpec) and spec.type.strides is not None for spec in lowered.specs):
            return      # (a view class a dense call ran in, `_known_view_class`: dense calls of another length
            #             have other strides, and the class key of plain arrays has none)
        positions = {name: i for i, name in enumerate(self._signature.parameters)}
        symbolic = frozenset((positions[name], d) for axes in plan.axes for name, d in axes)
        found = _class_key(args, symbolic, backend_key)
        if found is None:
            return
        key, _ = found
        guards = lowered.artifacts.get("guards", {})
        table = self._classes.setdefault(symbolic, {})
        if len(table) >= _FAST_ENTRIES:
            table.clear()
        table[key] = (path, tuple(guards.get(name, 0) for name, _ in plan.symbols))

    def _class_path(self, args: tuple, backend_key: object) -> "_FastPath | None":
        """The call path of a shape class made before whose class this call (plain arrays, by position) is in
        and whose guards its lengths meet; None to take the full path."""
        for symbolic, table in self._classes.items():
            found = _class_key(args, symbolic, backend_key)
            if found is None:
                continue
            key, lengths = found
            entry = table.get(key)
            if entry is not None and len(lengths) == len(entry[1]) and all(
                    n >= least for n, least in zip(lengths, entry[1])):
                return entry[0]
        return None

    def _tuned(self, specs: tuple[ArgSpec, ...], backend: str, arrays: list, to_run: bool) -> KernelOptions:
        """The options to compile with: tuned ones where autotuning is on (stored results only when not running)."""
        from .trace import trace

        if backend not in autotune.SPACES or not autotune.wanted(self.options):
            return self.options
        target = backends.BACKENDS[backend]

        def prepare(options: KernelOptions) -> Callable[[], object]:
            run = target.build(lower(self.__wrapped__, specs, target, options))
            inputs = [arrays_rt.host_array(a) for a in arrays] if target.arrays == "host" else arrays
            return lambda: run(inputs)

        return autotune.tuned_options(self.__name__, str(trace(self.__wrapped__, specs).program), repr(specs), backend,
                                      self.options, DEFAULT_OPTIONS, prepare, measure=to_run)

    # -- public -----------------------------------------------------------------------------------
    @_user_facing
    def __call__(self, /, *args: Any, stream: object | None = None, out: object | None = None,
                 **kwargs: Any) -> Any:
        """Run on `args` and `kwargs` (Python's rules: by position or by name, defaults applied). `stream`: the
        CUDA stream the ``cuda`` backend queues its work on (an int handle, a torch or cupy stream...; default:
        torch's/cupy's current one for their tensors); host backends ignore it. See docs/gpu-backend.md,
        "Arrays and streams". `out`: arrays to write the results into (one, or a tuple with one per result),
        returned as given; see `redfuser.outputs` for what they must be."""
        self._retrace_if_captured_changed()
        fast_key = _fast_key(args, self.backend) if not kwargs else None
        fast = self._fast.get(fast_key) if fast_key is not None else None
        if fast is None and fast_key is not None and self._classes:
            fast = self._class_path(args, fast_key[0])
        if fast is not None:
            # a specialization seen before with plain, contiguous numpy arrays or torch CPU tensors: nothing
            # to re-derive (`_fast_key`)
            lowered, run, host, numpy_only, dense, only_arrays, direct, results, sequence = fast
            arrays = args if only_arrays else [a for a in args if type(a) not in _FAST_STATICS]
            if out is None:
                self._hits += 1
                if direct is not None:
                    return direct(arrays)
                if dense is not None:
                    return _one_or_tuple(dense(arrays), sequence)
                if not host:
                    return _one_or_tuple(run(arrays, stream=stream), sequence)
                if numpy_only:
                    return _one_or_tuple(run(arrays), sequence)
                return _one_or_tuple(tuple(_torch_from_numpy(r) for r in run([a.numpy() for a in arrays])), sequence)
            given = _plain_outs(out, results or _results_at(lowered, arrays), arrays) \
                if host and numpy_only else None
            if given is not None:
                self._hits += 1
                if direct is not None:
                    direct(arrays, given)
                elif dense is not None:
                    dense(arrays, given)
                else:
                    _run_into(run, arrays, given)
                return out
        if _traced(args, kwargs):
            return self.__wrapped__(*args, **kwargs)     # called in another kernel's body: traced inline
        method = self._bound_to_first(args)
        if method is not None:
            return method(*args[1:], stream=stream, out=out, **kwargs)
        lowered, run, arrays = self._compiled(args, kwargs)
        host = backends.BACKENDS[lowered.backend].arrays == "host"
        passed = [a for a in args if type(a) not in _FAST_STATICS]
        names = [s.name for s in lowered.specs if isinstance(s, ArraySpec)]
        updated = lowered.artifacts.get("updated_inputs")
        read_in_place = len(arrays) == len(passed) and all(a is b for a, b in zip(arrays, passed))
        if updated:     # (checked at every call: such a kernel keeps no fast path)
            in_place.check(updated, self._callers_arrays(names, arrays, read_in_place, args, kwargs),
                           self.__name__, self._captured.arrays() if self._captured is not None else ())
        elif fast_key is not None and read_in_place:
            if len(self._fast) >= _FAST_ENTRIES:
                self._fast.clear()      # a shape-polymorphic kernel sees many shapes: keep the table small
            numpy_only = all(type(a) is np.ndarray for a in passed)
            dense = getattr(run, "call_dense", None) if host and numpy_only else None
            direct = None
            if host and hasattr(run, "direct"):
                tensor = getattr(sys.modules.get("torch"), "Tensor", None)
                if numpy_only:
                    direct = run.direct()
                elif tensor is not None and all(type(a) is tensor for a in passed):
                    direct = run.direct(tensors=True)
            results = None if lowered.shapes is not None else tuple(
                (b.shape, np.dtype(b.dtype.numpy)) for b in lowered.program.outputs)
            sequence = _returns_sequence(lowered)
            if direct is not None and sequence is not False and (
                    sequence is not True or len(lowered.program.outputs) == 1):
                direct = _as_returned(direct, sequence)
            path = _FastPath(lowered, run, host, numpy_only, dense, len(passed) == len(args), direct, results,
                             sequence)
            generation = lowered.artifacts.get("captured_generation")
            if generation == self._dropped:     # (not traced from values another thread has since changed)
                self._fast[fast_key] = path    # (each array read in place: no copy to redo)
                if lowered.shapes is not None:
                    self._remember_class(lowered, args, fast_key[0], path)
                if generation != self._dropped:     # (dropped meanwhile: the drop may have cleared before us)
                    self._fast.pop(fast_key, None)
                    self._classes.clear()
        outs = None
        if out is not None:
            loc = user_loc()
            outs = outputs.as_tuple(out, len(lowered.program.outputs), self.__name__, loc)
            outputs.check(outs, _results_at(lowered, arrays),
                          self._callers_arrays(names, arrays, read_in_place, args, kwargs), self.__name__, loc)
        if host:
            # Host backends read numpy views of host arrays (torch CPU tensors too, without a copy) and
            # hand results back as the caller's array type.
            inputs = [arrays_rt.host_array(a, f"argument {n!r}") for a, n in zip(arrays, names)]
            if outs is not None:
                _run_into(run, inputs, [arrays_rt.host_array(o, "out") for o in outs])
                outputs.mark_written(outs)
                return out
            library = next((arrays_rt.library_of(a) for a in arrays if not isinstance(a, np.ndarray)), "numpy")
            results = tuple(arrays_rt.as_caller_type(o, library) for o in run(inputs))
        else:
            results = run(arrays, stream=stream, outputs=outs)
            if outs is not None:
                outputs.mark_written(outs)
                return out
        return _one_or_tuple(results, _returns_sequence(lowered))

    @_user_facing
    def lower(self, /, *args: Any, **kwargs: Any) -> Lowered:
        """Compile for these arguments (without running) and return every stage."""
        method = self._bound_to_first(args)
        if method is not None:
            return method.lower(*args[1:], **kwargs)
        return self._compiled(args, kwargs, to_run=False)[0]

    @_user_facing
    def explain(self, /, *args: Any, **kwargs: Any) -> str:
        """What the compiler found and did for these arguments, in words (cascades, G, H, rescales)."""
        from .fusion.explain import explain

        lowered = self.lower(*args, **kwargs)
        return explain(lowered.name, lowered.groups, lowered.stages.get("sized", lowered.stages.get("fused")),
                       fusion_on=lowered.options.fuse)

    @_user_facing
    def output_types(self, /, *args: Any, **kwargs: Any) -> tuple[ShapeDtype, ...]:
        """The shape and dtype of each result for these arguments (arrays or `rf.ShapeDtype`s), from tracing
        alone: nothing is compiled (what a framework's shape inference, e.g. a torch fake tensor, needs)."""
        return self.output_structure(*args, **kwargs)[0]

    def output_structure(self, /, *args: Any, **kwargs: Any) -> tuple[tuple[ShapeDtype, ...], bool | type]:
        """`output_types`, and whether the body returns a tuple or a list (a call's value for one result is
        then a 1-tuple, as numpy's body gives), from tracing alone."""
        from .trace import trace

        method = self._bound_to_first(args)
        if method is not None:
            return method.output_structure(*args[1:], **kwargs)
        specs, _ = self._specs(args, kwargs)
        traced = trace(self.__wrapped__, specs)
        return tuple(ShapeDtype(b.shape, b.dtype.numpy) for b in traced.program.outputs), traced.returns_sequence

    @property
    def dynamic(self) -> Dynamic:
        """The kernel's ``dynamic=`` choice as given (None, True, False or the dict of axes): a kernel made
        from this one (`redfuser.torch.op`'s per-device kernels) makes the same axes symbolic."""
        return self._dynamic.mode

    @property
    def polymorphism(self) -> dict[str, str]:
        """The shape classes whose compile kept some axes static, and why (`redfuser.shapes`): each class in
        words -> the reason (empty while every class seen compiled with all its symbolic axes)."""
        return dict(self._dynamic.refused)

    @property
    def cache_size(self) -> int:
        """How many specializations are compiled in memory."""
        return len(self._cache)

    def cache_info(self) -> CacheInfo:
        """``(hits, misses, maxsize, currsize)`` of the kernel's specializations, as `functools.lru_cache`
        reports its own: a miss is a specialization made (compiled, or served by the disk cache) for a
        call, `lower` or `explain`, or tried and refused (a miss that holds nothing, as `lru_cache` counts a
        call that raises); a hit one found in memory; `maxsize` None (the cache is not bounded);
        `currsize` how many it holds."""
        return CacheInfo(self._hits, self._misses, None, len(self._cache))


def _in_symbols(reason: str, plan: ShapePlan) -> str:
    """A class compile's failure in words: the probe lengths it was traced at (`redfuser.probes`, primes the
    user never chose) named by their symbols (``f32[x.0,x.1]``), saying these axes are kept static."""
    for name, probe in plan.symbols:
        reason = re.sub(rf"\b{probe}\b", name, reason)
    return f"kept static: with these axes symbolic, {reason}"


def _by_reference(module: str, qualname: str) -> object:
    """The object at `module`.`qualname` (a pickled kernel's reference); None where there is none."""
    import importlib

    try:
        found: object = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return found


_KERNELS: "weakref.WeakSet[Kernel]" = weakref.WeakSet()
"""Every live kernel, so that a forked child can give each a compile lock of its own (`_after_fork`)."""


def _after_fork() -> None:
    """In a child of ``os.fork()``: a kernel another thread of the parent was compiling at the fork has its
    lock held by a thread the child does not have (its first call waited forever); the child has only the
    forking thread, so every lock starts free."""
    for k in list(_KERNELS):
        k._compiling = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _dense_as_views(specs: tuple[ArgSpec, ...], names: set[str]) -> tuple[ArgSpec, ...] | None:
    """`specs` with each dense array of `names` (those with a symbolic axis) described by its row-major strides,
    as `runtime.arrays.specialized_strides` describes a view (size-1 dims 0); None where there is none."""
    out: list[ArgSpec] = []
    for spec in specs:
        shape = spec.type.shape if isinstance(spec, ArraySpec) else ()
        if isinstance(spec, ArraySpec) and spec.name in names and spec.type.strides is None and shape \
                and 0 not in shape:
            strides = tuple(0 if n == 1 else s for n, s in zip(shape, row_major_strides(shape)))
            spec = ArraySpec(spec.name, BufferType(spec.type.dtype, shape, strides))
        out.append(spec)
    return tuple(out) if out != list(specs) else None


def _class_key(args: tuple, symbolic: frozenset, backend_key: object) -> tuple[tuple, list[int]] | None:
    """A call's shape class as `_fast_key` sees a shape (its arguments passed that key's checks): each array's
    dtype and lengths with the `symbolic` axes ``(position, axis)`` of length >= 2 replaced by the number of
    their symbol (equal lengths, one symbol, in order of first use, as `redfuser.shapes` numbers them), and
    the symbols' lengths; None where a static length equals a probe (the full path then compiles exactly)."""
    key: list = [backend_key]
    lengths: dict[int, int] = {}
    for pos, a in enumerate(args):
        if type(a) in _FAST_STATICS:
            key.append((type(a), a, repr(a)))
            continue
        dims = []
        for d, n in enumerate(a.shape):
            if (pos, d) in symbolic and n >= 2:
                dims.append(("s", lengths.setdefault(n, len(lengths))))
            elif n in PROBE_LENGTHS:
                return None
            else:
                dims.append(n)
        key.append((str(a.dtype), type(a) is np.ndarray, tuple(dims)))
    return tuple(key), list(lengths)


def _results_at(lowered: Lowered, arrays: list) -> tuple:
    """The program's outputs as buffers of this call's shapes (a shape class's evaluated at its lengths)."""
    outs = lowered.program.outputs
    if lowered.shapes is None:
        return outs
    values = bind_buffers(lowered.program.inputs, arrays)
    return tuple(Buffer(b.name, BufferType(b.dtype, concrete(b.shape, values))) for b in outs)


def _within_guards(lowered: Lowered, plan: ShapePlan) -> bool:
    """Whether the call's lengths meet the least lengths the class's program needs (its ``guards``)."""
    guards = lowered.artifacts.get("guards", {})
    return all(n >= guards.get(name, 0) for (name, _), n in zip(plan.symbols, plan.values))


_FAST_STATICS = (bool, int, float, str, type(None))

_NOT_OWNERS = (bool, int, float, complex, str, bytes, tuple, list, dict, np.generic, ShapeDtype, Tracer,
               types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType)
"""What a method's kernel called through its class never binds as its ``self`` (`Kernel._bound_to_first`):
values a kernel takes as arguments, or refuses as such, and functions and modules."""
_FAST_ENTRIES = 1024
"""The most call keys `Kernel._fast` holds (one per exact shape seen; a shape class serves many)."""


_OWNDATA = 0x4                  # numpy's NPY_ARRAY_OWNDATA
_WRITABLE_C = 0x1 | 0x400       # NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_WRITEABLE


def _plain_outs(out: object, results: tuple, arrays: list[np.ndarray]) -> list[np.ndarray] | None:
    """`out` as a list when every one is a writable C-contiguous numpy array of its result's shape and dtype
    (`results`: Buffers, or (shape, numpy dtype) pairs) whose memory meets no argument's and no other out's
    (`outputs.check` would accept it; the arguments are C-contiguous numpy arrays, the call key says so);
    None to take the full path, which checks and explains."""
    outs = list(out) if type(out) is tuple or type(out) is list else [out]
    if len(outs) != len(results):
        return None
    owners = True       # every array owns its memory: then only the same object twice can overlap
    for o, b in zip(outs, results):
        if type(o) is not np.ndarray:
            return None
        shape, dtype = b if type(b) is tuple else (b.shape, b.dtype.numpy)
        flags = o.flags.num
        if flags & _WRITABLE_C != _WRITABLE_C or o.shape != shape or (o.dtype is not dtype and o.dtype != dtype):
            return None
        if not flags & _OWNDATA:
            owners = False
    if owners:
        # (two arrays that each own their memory are two allocations: 1.9 -> 1.0 us for one in, one out)
        for a in arrays:
            if not a.flags.num & _OWNDATA:
                break
            for o in outs:
                if a is o:
                    return None
        else:
            return outs if len(outs) == 1 or len(set(map(id, outs))) == len(outs) else None
    spans = [(data_address(a), a.nbytes) for a in arrays]
    for o in outs:
        start, size = data_address(o), o.nbytes
        for begin, n in spans:
            if begin < start + size and start < begin + n:
                return None
        spans.append((start, size))
    return outs


def _fast_key(args: tuple[Any, ...], backend: str | None) -> tuple | None:
    """A key that determines the specialization of a call by position whose arrays are plain numpy arrays,
    C-contiguous, aligned and in native byte order (`spec_of` then reads each in place, its spec is its
    dtype and shape) and whose other arguments are Python scalars, strings or None (their type and value);
    None for any other call, which takes the full path. The backend ``auto`` resolves to is in the key (it
    depends on ``REDFUSER_BACKEND``)."""
    key: list = [backend if backend is not None else ("auto", config.default_backend())]
    for a in args:
        if type(a) is np.ndarray:
            flags = a.flags
            if not (flags.c_contiguous and flags.aligned and a.dtype.isnative):
                return None
            key.append((a.dtype, a.shape))
        elif type(a) in _FAST_STATICS:
            key.append((type(a), a, repr(a)))   # (repr: -0.0 and 0.0 are two specializations)
        else:
            torch = sys.modules.get("torch")     # (looked up only here: most calls pass numpy arrays)
            if torch is None or type(a) is not getattr(torch, "Tensor", None) or a.is_nested:
                return None      # (a nested tensor has no sizes: `arrays._torch_refusal` says what to pass)
            if a.is_cpu and not a.requires_grad and a.dtype in _torch_numpy_dtypes(torch) and a.is_contiguous() \
                    and not a.is_neg():   # (a lazily negated view's memory holds -x: `arrays._torch_refusal`)
                key.append(("torch", a.dtype, a.shape))   # (a torch.Size: a tuple, hashed as one)
            else:
                return None
    return tuple(key)


@functools.cache
def _torch_numpy_dtypes(torch: Any) -> frozenset:
    """The torch dtypes whose CPU tensors ``Tensor.numpy()`` views without a copy."""
    return frozenset({torch.float32, torch.float16, torch.int32, torch.int64, torch.bool})


def _traced(args: tuple, kwargs: dict) -> bool:
    """Whether a call passes traced values: a kernel called inside another kernel's body, while it traces. Its
    body then runs on them as part of the outer trace (asked on the full call path only: a cached call's
    arguments are arrays)."""
    return any(isinstance(a, Tracer) for a in (*args, *kwargs.values()))


def _one_or_tuple(results: tuple, sequence: bool | type = False) -> Any:
    """A kernel call's value: its one result, or the tuple of them (a 1-tuple where the body returned a tuple
    or a list of one, as numpy's body does: ``k(x)[0]`` is then the result, not its first row); a list or a
    named tuple where the body returned one (`redfuser.trace.Traced.returns_sequence`)."""
    if sequence is True or (sequence is False and len(results) != 1):
        return tuple(results)
    if sequence is False:
        return results[0]
    return list(results) if sequence is list else sequence(*results) if hasattr(sequence, "_fields") else \
        sequence(results)


def _returns_sequence(lowered: Lowered) -> bool | type:
    """Whether `lowered`'s body returned a tuple or a list, or the sequence's type
    (`redfuser.trace.Traced.returns_sequence`)."""
    return lowered.artifacts.get("returns_sequence", False)


def _as_returned(direct: Callable, sequence: bool | type) -> Callable:
    """An executable's `direct` function (one result, or a tuple of them) returning what the body returned
    (`_one_or_tuple`): the 1-tuple of a body returning ``(y,)``, a list, a named tuple; with `outputs`, those as
    given."""
    def call(arrays: Any, outputs: Any = None) -> Any:
        if outputs is not None:
            return direct(arrays, outputs)
        results = direct(arrays)
        return _one_or_tuple(results if type(results) is tuple else (results,), sequence)

    return call


def _torch_from_numpy(r: np.ndarray) -> Any:
    return arrays_rt.as_caller_type(r, "torch")   # (a bfloat16 or float8 result: torch takes its bits)


def _run_into(run: backends.Executable, inputs: list[np.ndarray], views: list[np.ndarray]) -> None:
    """Run a host executable writing its results into `views` (checked by `outputs.check`): in place where it
    can (`runtime.cpu_jit.CpuProgram` writes into contiguous ones), else copied."""
    if getattr(run, "writes_outputs", False):
        run(inputs, outputs=views)
        return
    for view, result in zip(views, run(inputs)):
        np.copyto(view, result, casting="no")


def kernel(fn: Callable | None = None, *, backend: str | None = None, options: KernelOptions | None = None,
           dynamic: Dynamic = None, **given: object):
    """Make `fn` a RedFuser kernel: ``@rf.kernel``, ``@rf.kernel(backend=...)`` or ``rf.kernel(fn, ...)``; options
    as keywords (``block_m=64``) or as ``options=rf.KernelOptions(...)``; `dynamic`: which axes are symbolic
    (None: those seen with a second length; True: all; False: none; ``{"k": (-2,)}``: these;
    `redfuser.shapes`)."""
    if fn is None:
        return lambda f: Kernel(f, backend=backend, options=options, dynamic=dynamic, **given)
    return Kernel(fn, backend=backend, options=options, dynamic=dynamic, **given)
