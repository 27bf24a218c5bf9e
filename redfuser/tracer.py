"""Tracing: running the kernel body on `Tracer` values that record Loop IR.

A `Tracer` stands for an array of static shape and dtype. It is a *view* of a
buffer: for each buffer dimension, either the view dimension that indexes it or
a fixed position. Transposes, ``None``-indexing and ``keepdims`` are views and
emit no loop nest; every other op emits one loop nest (unfused) into the
active `TraceBuilder`.
"""
from __future__ import annotations

import contextvars
import math
import sys
import weakref
from dataclasses import dataclass, replace
from types import FrameType
from typing import Callable, Iterator

import numpy as np

from .ir import (
    Axis,
    Buffer,
    BufferType,
    Cast,
    Compute,
    Const,
    DType,
    Expr,
    IndexExpr,
    IndexValue,
    Load,
    Program,
    Reduce,
    ShapeError,
    SourceLoc,
    Stmt,
    TopK,
    TracerBoolError,
    UnsupportedError,
    rename_buffers,
    rename_loop_indices,
    Strided,
    map_expr,
    shift_index,
    written,
)
from .ir.loop.index import as_index, index_value
from .ir.types import int64
from .ir import types as T
from .probes import ProbeLength, defers_to, needed_past_the_call, probe_length, product_length
from .assigned import OpSite, assigned_variable
from .source_info import user_frame, user_loc


@dataclass(frozen=True, slots=True)
class Fixed:
    """A buffer dimension pinned to one position (integer indexing)."""

    pos: int


@dataclass(frozen=True, slots=True)
class Stepped:
    """A buffer dimension read at ``start + step * n`` where view dimension `dim` is at ``n``: a slice that
    is not the whole dimension (``(0, 1)`` is a prefix of it)."""

    dim: int
    start: int
    step: int


@dataclass(frozen=True, slots=True)
class Mapped:
    """A buffer dimension read at a position computed from several view dimensions (a reshape): `value` is an
    int64 expression of `view_index` placeholders, one per view dimension it reads."""

    value: Expr


ViewIndex = int | Fixed | Stepped | Mapped
"""Per buffer dimension: the view dimension indexing it (the whole of it, or a slice), a position computed
from several (a reshape), or a fixed position."""


def view_index(d: int) -> IndexValue:
    """The placeholder for view dimension `d`'s index in a `Mapped` position (extent 0: unknown here, so no
    simplification assumes a range for it; the load's real axes replace it, `Tracer.expr_for`)."""
    return IndexValue(Axis(f"view{d}", 0), int64)


def _position(v: ViewIndex) -> Expr:
    """The buffer position `v` reads, as an int64 expression of view-index placeholders."""
    if isinstance(v, Fixed):
        return Const(v.pos, int64)
    if isinstance(v, int):
        return view_index(v)
    if isinstance(v, Mapped):
        return v.value
    return index_value(Strided(view_index(v.dim).axis, v.start, v.step))


def redirect(v: ViewIndex, to: "Callable[[int], ViewIndex]") -> ViewIndex:
    """`v` with each view dimension `d` it reads replaced by ``to(d)`` (another dim, a fixed position, a slice
    of one or a computed position), composing them: the buffer position stays what it was for every
    element of the new view."""
    if isinstance(v, Fixed):
        return v
    if isinstance(v, int):
        return to(v)
    if isinstance(v, Stepped):
        new = to(v.dim)
        if isinstance(new, Fixed):
            return Fixed(v.start + v.step * new.pos)
        if isinstance(new, Stepped):
            return Stepped(new.dim, v.start + v.step * new.start, v.step * new.step)
        if isinstance(new, int):
            return Stepped(new, v.start, v.step)
    value = map_expr(_position(v), lambda n: _position(to(int(n.axis.name[4:])))
                     if isinstance(n, IndexValue) else None)
    folded = as_index(value, None)
    return Fixed(folded) if isinstance(folded, int) else Mapped(value)


MAX_ARRAY_BYTES = 1 << 62
"""The largest array a kernel may make (numpy's limit is the same order: ``size * itemsize`` must fit in a
signed 64-bit count); past it numpy's body fails too, with its bare ValueError."""


def _check_size(op: str, dtype: DType, shape: tuple[int, ...]) -> None:
    """`ShapeError` for a value too large for any memory (``rf.arange(2**62)``), at the user's line; shapes
    with symbolic (probe) lengths are left alone (reading them would be noted as a use)."""
    if all(type(n) is int for n in shape) and math.prod(shape) * dtype.itemsize > MAX_ARRAY_BYTES:
        raise ShapeError(f"{dtype}[{','.join(map(str, shape))}] is too big for any memory ({math.prod(shape)} "
                         f"elements of {dtype.itemsize} bytes)", op=op, loc=user_loc())


class TraceBuilder:
    """Collects the loop nests of one trace and names their buffers."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inputs: list[Buffer] = []
        self.body: list[Stmt] = []
        self._counter: dict[str, int] = {}
        self._user_names: dict[str, str] = {}  # buffer name -> user variable name
        # buffer name -> the op's place in the user frame that made it: `_bind` prefers that frame's variables,
        # and `_temp_name` reads the statement there
        self._made_at: dict[str, OpSite] = {}
        self._name_rank: dict[str, int] = {}   # buffer name -> the `_bind` rank of the variable naming it
        self._taken: set[str] = set()
        self._view_names: dict[int, tuple["Tracer", str]] = {}  # id -> (a view a user variable held, its name)
        # (a length the body's checks read, the least it may be): an int index or a top-k's k needs the axis
        # to be that long; a shape-polymorphic kernel turns these into guards (`redfuser.compiler.sized_stage`)
        self.length_needs: list[tuple[int, int]] = []
        # argument name -> where the body first updates it in place (``a += 1``): numpy's body would write the
        # caller's array, and so change any other argument sharing its memory (`redfuser.in_place`)
        self.updated_inputs: dict[str, SourceLoc] = {}
        self._views: dict[str, dict[int, weakref.ref]] = {}   # buffer name -> live Tracers viewing it, by id
        # buffer name -> (the operator, where) of an in-place update made through one view of it while others lived:
        # numpy's other views see the new values and a kernel's do not, so reading one is refused (`check_current`)
        self._changed: dict[str, tuple[str, SourceLoc]] = {}
        # the first conversion of a traced value to a Python value (bool, int, float, an index, iteration): the
        # body may catch the error (``try: if rf.sum(a) > 0: ... except Exception: pass``) and go on down a path
        # numpy's body never takes, so `redfuser.trace.trace` raises it again once the body returns
        self.python_value_error: TracerBoolError | None = None

    def note_python_value(self, error: TracerBoolError) -> None:
        """Record `error`, a traced value converted to a Python value, unless one was recorded before."""
        if self.python_value_error is None:
            self.python_value_error = error

    def note_view(self, t: "Tracer") -> None:
        """Remember `t` among the live views of its buffer (weakly: `other_views`)."""
        self._views.setdefault(t.buffer.name, {})[id(t)] = weakref.ref(t)

    def forget_view(self, t: "Tracer") -> None:
        self._views.get(t.buffer.name, {}).pop(id(t), None)

    def other_views(self, t: "Tracer") -> list["Tracer"]:
        """The live traced values other than `t` that view `t`'s buffer: an in-place update of `t` changes them
        too in numpy (`note_changed`)."""
        found = (ref() for ref in self._views.get(t.buffer.name, {}).values())
        return [v for v in found if v is not None and v is not t]

    def note_changed(self, t: "Tracer", symbol: str, loc: SourceLoc) -> None:
        """`t`'s buffer is changed in place (``t += v``) through `t` while other traced values view it: those keep
        the old values, and reading one later is refused (`check_current`). Where no other view is read again
        (``t = x.T; t += 1`` with ``x`` never read after), nothing is refused."""
        self._changed.setdefault(t.buffer.name, (symbol, loc))

    def check_current(self, t: "Tracer", loc: SourceLoc | None = None) -> None:
        """Refuse reading `t` (at `loc`, the user's line by default; a returned value is read at the ``return``)
        where its buffer was changed in place through another view (`note_changed`): numpy's body would read the
        new values (``t = x[:]; t += x; return x`` is ``2 x``), a kernel the old ones."""
        changed = self._changed.get(t.buffer.name)
        if changed is not None:
            symbol, where = changed
            raise UnsupportedError(
                f"this value views an array that an in-place update ({symbol} at {where.file}:{where.line}) changed "
                "through another view of it (a transpose, a slice, the same array under another name): numpy's body "
                "reads the new values here, which a kernel does not do; write the update as a new array "
                f"(x = x {symbol[:-1]} v) and read that", op=symbol, loc=loc or user_loc())

    def note_update(self, t: "Tracer", loc: SourceLoc) -> None:
        """Record an in-place update of `t` (`updated_inputs`, where `t` is an argument's whole buffer)."""
        if any(t.buffer is b for b in self.inputs):
            self.updated_inputs.setdefault(t.buffer.name, loc)

    def need_length(self, length: int, least: int) -> None:
        """Record that the body is what it traced to only while an axis of `length` has >= `least` elements
        (and, while a shape class is traced for a call with fewer, that the length is read: `probes`)."""
        self.length_needs.append((int(length), int(least)))
        needed_past_the_call(length, int(least))

    def fresh(self, hint: str) -> str:
        n = self._counter.get(hint, 0)
        self._counter[hint] = n + 1
        return f"%{hint}.{n}"

    def add_input(self, name: str, type_: BufferType) -> "Tracer":
        """A kernel argument of `type_` (dense, or the strides of the view the caller passed)."""
        buf = Buffer(name, type_)
        self.inputs.append(buf)
        self._taken.add(name)
        return Tracer(self, buf, tuple(range(type_.ndim)), type_.shape, array0d=True)

    def emit(self, hint: str, dtype: DType, shape: tuple[int, ...], make: Callable[[Buffer], Stmt]) -> "Tracer":
        """Append the loop nest `make(out)` writing a new buffer; return a tracer for it."""
        frame = user_frame()
        self.name_user_variables(frame)
        _check_size(hint, dtype, shape)
        buf = Buffer(self.fresh(hint), BufferType(dtype, shape))
        self._note_maker(buf, frame)
        self.body.append(make(buf))
        return Tracer(self, buf, tuple(range(len(shape))), shape)

    def emit_pair(self, hints: tuple[str, str], types: tuple[BufferType, BufferType],
                  make: Callable[[Buffer, Buffer], Stmt]) -> tuple["Tracer", "Tracer"]:
        """Like `emit`, for a nest writing two buffers (top-k's values and indices)."""
        frame = user_frame()
        self.name_user_variables(frame)
        for h, t in zip(hints, types):
            _check_size(h, t.dtype, t.shape)
        a, b = (Buffer(self.fresh(h), t) for h, t in zip(hints, types))
        self._note_maker(a, frame)
        self._note_maker(b, frame)
        self.body.append(make(a, b))
        return tuple(Tracer(self, x, tuple(range(len(x.shape))), x.shape) for x in (a, b))  # type: ignore[return-value]

    def axes(self, shape: tuple[int, ...], prefix: str = "i") -> tuple[Axis, ...]:
        return tuple(Axis(f"{prefix}{n}", s) for n, s in enumerate(shape))

    # -- naming buffers after the user's variables -------------------------------------------
    def _note_maker(self, buf: Buffer, frame: FrameType | None) -> None:
        if frame is not None:
            self._made_at[buf.name] = OpSite(frame.f_code, frame.f_lasti)

    def name_user_variables(self, frame: FrameType | None) -> None:
        """Name the buffers that `frame`'s local variables hold after those variables (`_bind`)."""
        if frame is None:
            return
        code = frame.f_code
        parameters = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        for var, value in list(frame.f_locals.items()):
            if isinstance(value, Tracer) and value.builder is self:
                if not value.is_plain and not var.startswith("_"):
                    # (a returned view is copied into an output of its own, named after the variable; the
                    # outer frame returns last, so the caller's name wins over a helper's)
                    self._view_names[id(value)] = (value, var)
                site = self._made_at.get(value.buffer.name)
                rank = (_MADE_HERE if site is not None and site.code is code
                        else _PASSED_IN if var in parameters else _ASSIGNED_HERE)
                self._bind(value.buffer.name, var, rank)

    def _bind(self, buffer_name: str, var: str, rank: int) -> None:
        """Name `buffer_name` after `var` unless a variable of a higher `rank` named it, or one of the same rank
        did first. A parameter is seen first but ranks last: ``h = rf.exp(x); helper(h)`` is ``h``, though
        ``def helper(t)`` binds ``t`` to it at the helper's first op, before the caller's next op shows `h`."""
        if not buffer_name.startswith("%") or var.startswith("_") or self._name_rank.get(buffer_name, -1) >= rank:
            return
        if buffer_name in self._user_names:
            self._taken.discard(self._user_names.pop(buffer_name))   # the lower-ranked name gives way
        name, n = var, 1
        while name in self._taken:
            name, n = f"{var}_{n}", n + 1
        self._taken.add(name)
        self._user_names[buffer_name] = name
        self._name_rank[buffer_name] = rank

    def finish(self, outputs: list["Tracer"], out_names: list[str]) -> Program:
        """The traced `Program`: outputs materialized, buffers named, in source order."""
        out_bufs: list[Buffer] = []
        for t, hint in zip(outputs, out_names):
            if t.is_plain and t.buffer not in self.inputs and t.buffer not in out_bufs:
                out_bufs.append(t.buffer)
                self._bind(t.buffer.name, hint, _OUTPUT_HINT)
                continue
            copy = self.emit("out", t.ir_dtype, t.shape, lambda out, t=t: Compute(out, self.axes(t.shape), t.expr_for(self.axes(t.shape)), loc=t.loc))
            self._bind(copy.buffer.name, hint, _OUTPUT_HINT)
            held = self._view_names.get(id(t))
            if held is not None and held[0] is t:
                # (``s = rf.sum(x, axis=-1, keepdims=True)`` returned: the sum keeps ``s``, the name `explain`
                # and the fuzzer's reproducers know it by, and the copy is ``s_1``)
                self._bind(copy.buffer.name, held[1], _ASSIGNED_HERE)
            out_bufs.append(copy.buffer)
        names = {}
        for s in self.body:
            for out in written(s):
                names[out.name] = self._user_names.get(out.name) or self._temp_name(out.name)
        program = Program(self.name, tuple(self.inputs), tuple(out_bufs), tuple(self.body))
        return _indices_apart_from_buffers(rename_buffers(program, names))

    def _temp_name(self, old: str) -> str:
        """A temporary's name: its op, prefixed by the variable its statement assigns (``mu_sum``)."""
        base = old.lstrip("%").split(".")[0]
        site = self._made_at.get(old)
        target = assigned_variable(site) if site is not None else None
        if target and target != base and not target.startswith("_"):
            base = f"{target}_{base}"
        name, n = base, 1
        while name in self._taken:
            name, n = f"{base}_{n}", n + 1
        self._taken.add(name)
        return name


def _indices_apart_from_buffers(p: Program) -> Program:
    """`p` with every loop index that a buffer of the program is named like primed with ``_``. Index names
    are per nest, buffer names global: a parameter or a variable ``i0`` printed as ``i0[i0,i1]``, or ``r0``
    as ``sum over r0<3 of r0[i0,r0]``, reads as another program."""
    taken = {b.name for b in p.inputs} | {b.name for s in p.body for b in written(s)}
    body = []
    for s in p.body:
        own = [*s.axes, *(s.reduce_axes if isinstance(s, Reduce) else ()), *((s.reduce_axis,) if isinstance(s, TopK) else ())]
        used = {a.name for a in own}
        names: dict[str, str] = {}
        for a in own:
            if a.name in taken and a.name not in names:
                new = a.name + "_"
                while new in taken or new in used:
                    new += "_"
                used.add(new)
                names[a.name] = new
        body.append(rename_loop_indices(s, names))
    return replace(p, body=tuple(body))


# How strongly a variable names the buffer it holds (`TraceBuilder._bind`): an output's hint only where nothing
# else does, then a parameter that received the value, a variable of another frame it was assigned to (a value a
# helper returns unnamed takes its caller's name), and the variable of the frame whose line made the value.
_OUTPUT_HINT, _PASSED_IN, _ASSIGNED_HERE, _MADE_HERE = range(4)


_ACTIVE: contextvars.ContextVar[TraceBuilder | None] = contextvars.ContextVar("redfuser_trace", default=None)


def active_builder() -> TraceBuilder | None:
    """The trace in progress in this thread, if any."""
    return _ACTIVE.get()


class tracing:
    """Context manager making `builder` the active trace (so ``rf.arange`` can emit into it)."""

    def __init__(self, builder: TraceBuilder) -> None:
        self.builder = builder

    def __enter__(self) -> TraceBuilder:
        self._token = _ACTIVE.set(self.builder)
        return self.builder

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.reset(self._token)


@defers_to
class Tracer:
    """An abstract array during tracing: static shape and dtype, a view of a buffer."""

    __slots__ = ("builder", "buffer", "positions", "shape", "loc", "array0d", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, builder: TraceBuilder, buffer: Buffer, view: tuple[ViewIndex, ...], shape: tuple[int, ...],
                 array0d: bool = False) -> None:
        self.builder = builder
        self.buffer = buffer
        self.positions = view     # (not `view`: numpy arrays have a method of that name)
        # (a probe length of a shape class's trace stays a `ProbeLength`: redfuser.probes)
        self.shape = tuple(probe_length(int(s)) for s in shape)
        # A 0-d value the numpy body holds as a 0-d ndarray, not a numpy scalar (`ops.common.is_numpy_scalar`):
        # a 0-d argument, and what `where`, ``x[...]`` and `astype`/`transpose` of such an array return.
        self.array0d = array0d
        last = builder.body[-1] if builder.body else None
        self.loc: SourceLoc = last.loc if last is not None and buffer in written(last) else SourceLoc("<input>", 0)
        builder.note_view(self)

    def rebind(self, value: "Tracer") -> None:
        """Make this object `value` (an in-place operator: ``b = a; b += 1`` changes ``a`` too, as in numpy)."""
        self.builder.forget_view(self)
        self.buffer, self.positions, self.shape, self.loc = value.buffer, value.positions, value.shape, value.loc
        self.builder.note_view(self)

    # -- static properties (known at trace time) -----------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        return self.buffer.dtype.numpy

    @property
    def ir_dtype(self) -> DType:
        return self.buffer.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return product_length(int(np.prod(self.shape, dtype=np.int64)), self.shape)

    @property
    def is_plain(self) -> bool:
        """True when the view is the whole buffer in its own order."""
        return self.positions == tuple(range(len(self.buffer.shape))) and self.shape == self.buffer.shape

    def with_view(self, view: tuple[ViewIndex, ...], shape: tuple[int, ...], array0d: bool | None = None) -> "Tracer":
        """Another view of this buffer; a 0-d one is an ndarray in numpy where `array0d` says so (None: where
        this value is one: numpy's views of arrays are arrays, ``transpose`` of a scalar is a scalar)."""
        if array0d is None:
            array0d = self.ndim > 0 or self.array0d
        t = Tracer(self.builder, self.buffer, view, shape, array0d)
        t.loc = user_loc()      # (the line that made the view: a returned view is copied there, `finish`)
        return t

    def expr_for(self, axes: tuple[IndexExpr | None, ...]) -> Expr:
        """This value as a Loop IR load, given the index per view dim: an axis, a strided index of one (a
        piece of `concatenate`), or None for broadcast index 0."""
        self.builder.check_current(self)

        def at(d: int) -> IndexExpr:
            a = axes[d]
            return 0 if a is None or self.shape[d] == 1 else a

        idx: list[IndexExpr] = []
        for v, size in zip(self.positions, self.buffer.shape):
            if isinstance(v, Fixed):
                idx.append(v.pos)
            elif isinstance(v, int):
                idx.append(at(v))
            elif isinstance(v, Stepped):
                idx.append(shift_index(at(v.dim), v.start, v.step, size))
            else:
                value = map_expr(v.value, lambda n: index_value(at(int(n.axis.name[4:])))
                                 if isinstance(n, IndexValue) else None)
                idx.append(as_index(value, size))
        return Load(self.buffer, tuple(idx))

    def __repr__(self) -> str:
        return f"Tracer({self.buffer.dtype}[{','.join(map(str, self.shape))}], view of {self.buffer.name})"

    # -- Python control flow on traced values is an error ----------------------------------------
    def _no_python_value(self, what: str):
        self._refuse_python_value(TracerBoolError(
            f"{what} of a traced value {self.ir_dtype}[{','.join(map(str, self.shape))}] is not known at trace time; "
            "Python control flow runs while tracing, so use rf.where(...) for data-dependent choices",
            op=what,
            loc=user_loc(),
        ))

    def _no_python_number(self, what: str, uses: str):
        self._refuse_python_value(TracerBoolError(
            f"{what} of a traced value {self.ir_dtype}[{','.join(map(str, self.shape))}] needs a number that is not "
            f"known at trace time ({uses}); compute on traced values with the redfuser ops instead (rf.exp, not "
            "math.exp)",
            op=what,
            loc=user_loc(),
        ))

    def _refuse_python_value(self, error: TracerBoolError):
        """Raise `error`, noted in the trace first: the body's own ``except`` may swallow it (`TraceBuilder.
        note_python_value`)."""
        self.builder.note_python_value(error)
        raise error

    def __bool__(self) -> bool:
        self._no_python_value("bool()")

    def __float__(self) -> float:
        self._no_python_number("float()", "float(x), math.* functions")

    def __int__(self) -> int:
        self._no_python_number("int()", "int(x), math.* functions")

    def __index__(self) -> int:
        self._no_python_number("index", "an index, a slice bound, range(), a shape")

    def __complex__(self) -> complex:
        self._no_python_number("complex()", "complex(x), cmath.* functions")

    def __iter__(self) -> Iterator:
        self._no_python_value("iteration")

    def __setitem__(self, key: object, value: object) -> None:
        raise UnsupportedError(
            "item assignment: traced arrays cannot be modified in place; build the new value with rf.where "
            "(e.g. rf.where(mask, new, x))", op="setitem", loc=user_loc())

    def __delitem__(self, key: object) -> None:
        raise UnsupportedError("item deletion: traced arrays cannot be modified", op="delitem", loc=user_loc())

    def __len__(self) -> int:
        if not self.shape:
            raise ShapeError("len() of a 0-d traced value (it has no first dimension)", op="len()", loc=user_loc())
        n = self.shape[0]
        if isinstance(n, ProbeLength):    # len() hands back a plain int: the read is noted here
            n.note_if_user(sys._getframe(1))
        return n

    def __array__(self, *args, **kwargs):
        self._no_python_value("numpy.asarray()")

    def __array_function__(self, func, types, args, kwargs):
        name = getattr(func, "__name__", str(func))
        raise UnsupportedError(f"numpy.{name} on a traced value is not supported; {_instead(name)}",
                               op=f"numpy.{name}", loc=user_loc())

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        from . import ops

        op = ops.UFUNC_OPERATORS.get(ufunc)
        # numpy hands a scalar on the left of a comparison (np.float32(0) < x) over as a 0-d array
        inputs = tuple(x[()] if isinstance(x, np.ndarray) and x.ndim == 0 else x for x in inputs)
        scalars_ok = all(isinstance(x, Tracer) or np.ndim(x) == 0 and not isinstance(x, np.ndarray) for x in inputs)
        if method == "__call__" and op is not None and not kwargs and scalars_ok:
            return op(*inputs)  # a numpy scalar on the left of an operator: np.float32(2) * x
        captured = any(isinstance(x, np.ndarray) for x in inputs)
        if method == "__call__" and op is not None and not kwargs and captured:   # `array + x`: as `x + array`
            from .ops.common import _check_operand

            for x in inputs:
                _check_operand(ufunc.__name__, x)
        what = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
        raise UnsupportedError(
            f"numpy.{what} on a traced value is not supported; {_instead(ufunc.__name__, method)}"
            + ("; pass arrays as kernel arguments rather than capturing them" if captured else ""),
            op=f"numpy.{ufunc.__name__}",
            loc=user_loc(),
        )

    def __getattr__(self, name: str):
        if name.startswith("_"):  # protocol probes (hasattr(x, "__dlpack__")...) get the usual answer
            raise AttributeError(name)
        raise UnsupportedError(
            f"traced arrays have no attribute or method {name!r} in RedFuser's subset",
            op=f".{name}",
            loc=user_loc(),
        )


_SPELLED_OTHERWISE = {"absolute": "rf.abs or abs(x)", "invert": "the ~ operator", "bitwise_not": "the ~ operator",
                      "negative": "-x", "positive": "+x", "true_divide": "x / y"}
"""numpy functions RedFuser has under another spelling."""

def _instead(name: str, method: str = "__call__") -> str:
    """What to use instead of numpy's `name` (a ufunc's `method` of it) inside a kernel: ``rf.name`` when
    RedFuser has it, the spelling it has it under, or the reduction ``np.add.reduce`` is."""
    import redfuser
    from .ops.elementwise import REDUCTION_OF

    if method == "reduce" and name in REDUCTION_OF:
        return f"inside a kernel use {REDUCTION_OF[name]}"
    if method != "__call__":
        return f"RedFuser has no ufunc methods ({method}); its ops are listed in README.md, 'Op subset'"
    if name in _SPELLED_OTHERWISE:
        return f"inside a kernel use {_SPELLED_OTHERWISE[name]}"
    if name in redfuser.OPS:
        return f"inside a kernel use rf.{name}"
    return (f"RedFuser has no {name} (its ops are listed in README.md, 'Op subset'; rf.where, rf.exp and "
            "friends build most others)")


def as_ir_dtype(dtype: object) -> DType | None:
    return T.from_numpy(dtype)


__all__ = ["Tracer", "TraceBuilder", "Fixed", "Stepped", "Mapped", "view_index", "redirect", "tracing", "active_builder",
           "Cast", "Const", "Reduce", "Compute"]
