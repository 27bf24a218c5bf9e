"""What a kernel's body reads that is not an argument, compared on every call (`CapturedScalars`), and the
default values its parameters take (`Defaults`).

Tracing bakes into the program what the body reads of its module's globals, its closure, the attributes of
its ``self`` and the arguments a ``functools.partial`` bound: a scalar, what it indexes of a tuple, list or
dict of scalars (``TABLE[d]``, ``CFG["a"]["b"]``), what it reads of a small numpy array (``W[0]``,
``W.max()``). A kernel traces again when one of those changes, so each is compared on every call: a scalar
by identity and repr, a container by what it holds, whatever its nesting (`_signature`), an array by its
shape, dtype and bytes. What cannot be compared cheaply on each call -- an array over `CAPTURED_ARRAY_BYTES`,
a container holding more than `CONTAINER_LEAVES` values or nested deeper than `CONTAINER_DEPTH` -- is
refused when the kernel traces (`CapturedScalars.refuse_uncomparable`), never taken silently as it was.
"""
from __future__ import annotations

import dis
import functools
import operator
import types
from typing import Callable, NamedTuple

import numpy as np

from .ir import UnsupportedError
from .methods import BoundKernel, WeakMethod
from .source_info import user_loc
from .trace import is_dtype_value

_SCALARS = (bool, int, float, complex, str, np.generic)
_GLOBAL_READS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_ATTRIBUTE_READS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})     # (LOAD_METHOD: Python 3.10 and 3.11)
_BY_STRING_ATTRIBUTES = frozenset({"getattr", "hasattr", "vars", "__dict__", "attrgetter", "__getattribute__"})
"""Names through which a body reads an attribute named by a string (`_names_read`)."""
_BY_STRING_GLOBALS = frozenset({"globals", "vars"})
"""Names through which a body reads a global named by a string (``globals()["G"]``; ``vars()`` in a module)."""


class _Absent:
    """What a global, cell or attribute not bound (yet) holds, in `CapturedScalars.now`: binding it later is a
    change (a constant a module defines below its kernels)."""

    def __repr__(self) -> str:
        return "<not bound>"


_ABSENT = _Absent()


CONTAINER_LEAVES = 1024
"""The most values (scalars, arrays, other objects, keys included) a captured tuple, list or dict may hold,
all levels together, to be compared on each call; a larger one is refused when the kernel traces."""

CONTAINER_DEPTH = 8
"""The deepest nesting of captured tuples, lists and dicts compared on each call (``CFG["a"]["b"]["c"]`` is
3); a deeper one is refused when the kernel traces."""


class _TooLarge(Exception):
    """A captured container holding more than `CONTAINER_LEAVES` values, nested deeper than
    `CONTAINER_DEPTH`, or holding an array over `CAPTURED_ARRAY_BYTES`: what it holds is not compared."""


def _plain(value: object) -> bool:
    """A scalar, or a tuple, list or dict of scalars however nested (a config table ``SCALE = {64: 0.125}``):
    a value whose repr says all it holds, so that a repr compares it (the cheapest way). Raises `_TooLarge`
    past `CONTAINER_LEAVES` values or `CONTAINER_DEPTH` levels."""
    budget = [CONTAINER_LEAVES]

    def plain(v: object, depth: int) -> bool:
        if isinstance(v, _SCALARS) or v is None:
            return True
        if not isinstance(v, tuple | list | dict):
            return False
        items = [*v.keys(), *v.values()] if isinstance(v, dict) else v
        budget[0] -= len(items)
        _check_size(depth, budget)
        return all(plain(item, depth + 1) for item in items)

    return plain(value, 0)


def _check_size(depth: int, budget: list[int]) -> None:
    """Raise `_TooLarge` where a container at `depth` is nested too deep, or `budget` is spent."""
    if depth >= CONTAINER_DEPTH:
        raise _TooLarge(f"its tuples, lists and dicts nest deeper than {CONTAINER_DEPTH} levels")
    if budget[0] < 0:
        raise _TooLarge(f"it holds more than {CONTAINER_LEAVES} values (keys included, all levels together)")


def _too_large(value: object) -> str | None:
    """Why the container `value` is too large to compare on each call, or None."""
    try:
        if not _plain(value):
            _contents(value, 0, [CONTAINER_LEAVES])
    except _TooLarge as why:
        return str(why)
    return None


def _contents(value: object, depth: int, budget: list[int]) -> object:
    """What a container holding more than scalars holds, as compared per call: scalars by type and repr, small
    arrays by shape, dtype and bytes, containers by their contents, other objects by type (taken as traced).
    Raises `_TooLarge` (`budget`: the values left to `CONTAINER_LEAVES`)."""
    if isinstance(value, np.ndarray):
        if value.nbytes > CAPTURED_ARRAY_BYTES:
            raise _TooLarge(f"it holds a numpy array of {value.nbytes} bytes, over {CAPTURED_ARRAY_BYTES}")
        return np.ndarray, value.shape, value.dtype.str, value.tobytes()
    if isinstance(value, _SCALARS) or value is None:
        return type(value), repr(value)
    if is_dtype_value(value):
        return type(value), value
    if not isinstance(value, tuple | list | dict):
        return type(value)
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    budget[0] -= len(items)
    _check_size(depth, budget)
    return type(value), tuple(_contents(item, depth + 1, budget) for item in items)


def _names_code(value: object) -> bool:
    """A module or something callable (a function, a class, a ufunc): a name of the body's that holds one when
    the kernel is made keeps naming it (``rf``, ``np``, ``range``, a helper), so it is not compared per call.
    A numpy scalar type is a class but names a dtype (``DTYPE = rf.float16``, what ``astype`` takes): a value,
    compared as one (`_signature`)."""
    return (callable(value) and not is_dtype_value(value)) or isinstance(value, types.ModuleType)


METHOD_DEPTH = 8
"""How deep the methods a body calls on its owners are followed (a method calling another, `_methods_named`)."""


CAPTURED_ARRAY_BYTES = 4096
"""The largest numpy array a body may read from its globals, closure or ``self`` (`CapturedScalars`): its
contents are compared on every call (a trace bakes in what it reads of it: ``W[0]``, ``W.max()``, a 0-d ``W``
as a scalar), which costs a copy of its bytes; a larger one is refused when the kernel traces."""


def _signature(value: object) -> tuple:
    """What a trace may have baked in of `value`: its type, and its repr where it is a scalar or a container
    of scalars (a NaN equals itself by repr; ``2``, ``2.0`` and ``True`` differ); of a numpy array, its shape,
    dtype and bytes; of a container holding arrays or other objects, what each holds (`_contents`): changed in
    place or rebound, it is a change. Another object of the same type is the same to a kernel (it is taken as
    it was traced); one becoming plain, or plain another way, is a change. An array or a container too large
    to compare is marked ``"large"`` by its identity (`CapturedScalars.refuse_uncomparable` refuses it)."""
    if isinstance(value, np.ndarray):
        if value.nbytes > CAPTURED_ARRAY_BYTES:
            return type(value), ("large", id(value), value.shape, value.dtype.str)
        return type(value), (value.shape, value.dtype.str, value.tobytes())
    try:
        if _plain(value):
            return type(value), repr(value)
        if isinstance(value, tuple | list | dict):
            return type(value), _contents(value, 0, [CONTAINER_LEAVES])
    except _TooLarge:
        return type(value), ("large", id(value))
    if is_dtype_value(value):
        return type(value), value
    return type(value), None


def _unchanged(value: object, seen: tuple) -> bool:
    """Whether `value`, the object whose signature was `seen`, still has it (asked on every call). A container
    of scalars (its signature a repr) is compared by its repr alone: holding anything but scalars now, or more
    than `CONTAINER_LEAVES` of them, its repr differs too (an array's or an object's is not a scalar's), and the
    full signature is taken then."""
    if type(seen[1]) is str:
        return repr(value) == seen[1]
    return _signature(value) == seen


def _compared_in_place(value: object) -> bool:
    """Whether `value` may change its `_signature` in place (a container, an array): compared per call even
    while it is the object seen last."""
    return isinstance(value, tuple | list | dict | np.ndarray)


@functools.lru_cache(maxsize=512)
def _names_read(code: types.CodeType) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The global names and the attribute names `code` reads, with those of the code nested in it: on Python
    3.11 a comprehension, a lambda and an inner function each have their own code object (a constant of the
    body's), and the body's own names do not list what they read."""
    globals_: dict[str, None] = {}
    attributes: dict[str, None] = {}
    for instruction in dis.get_instructions(code):
        if instruction.opname in _GLOBAL_READS:
            globals_[instruction.argval] = None
        elif instruction.opname in _ATTRIBUTE_READS:
            attributes[instruction.argval] = None
    # names read by string: ``getattr(self, "eps", 0.0)``, ``vars(self)["eps"]``, ``globals()["G"]`` load a
    # builtin and a string constant, not the name; every string constant that could be a name is then taken
    # as one read (one more never read costs a look-up per call; one missed was baked in and never compared)
    by_string = tuple(c for c in code.co_consts if isinstance(c, str) and c.isidentifier())
    if by_string and not _BY_STRING_ATTRIBUTES.isdisjoint((*globals_, *attributes)):
        attributes.update(dict.fromkeys(by_string))
    if by_string and not _BY_STRING_GLOBALS.isdisjoint(globals_):
        globals_.update(dict.fromkeys(by_string))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            nested_globals, nested_attributes = _names_read(const)
            globals_.update(dict.fromkeys(nested_globals))
            attributes.update(dict.fromkeys(nested_attributes))
    return tuple(globals_), tuple(attributes)


def _body_of(fn: Callable) -> tuple[types.FunctionType | None, list[object], list[object]]:
    """The Python function that runs as `fn`'s body; the objects whose attributes it reads as ``self`` (a bound
    method's ``__self__``, a callable object, a ``functools.partial``'s positional arguments: the body reads
    ``self.scale`` of each; a `WeakMethod`'s instance as `_HeldWeakly`); and the partial's bound tuples, lists,
    dicts and numpy arrays (changed in place, they are changes: the body reads them as captured values).
    A bound method forwards ``__code__`` to its function, so it cannot be told from one by that."""
    owners: list[object] = []
    held: list[object] = []
    for _ in range(8):          # (a partial of a bound method of a callable object's __call__...)
        if isinstance(fn, types.FunctionType):
            return fn, owners, held
        if isinstance(fn, functools.partial):
            owners += [a for a in fn.args if hasattr(a, "__dict__") or hasattr(type(a), "__slots__")]
            held += [a for a in fn.args if isinstance(a, tuple | list | dict | np.ndarray)]
            fn = fn.func
        elif isinstance(fn, types.MethodType):
            owners.append(fn.__self__)
            fn = fn.__func__
        elif isinstance(fn, BoundKernel):
            fn = fn.method()            # (``partial(obj.body, ...)``: the bound method, read as one next)
        elif isinstance(fn, WeakMethod):
            owners.append(_HeldWeakly(fn._ref))      # (as weakly as the method holds it: `_owner_refs`)
            fn = fn.__func__
        else:
            owners.append(fn)
            fn = getattr(type(fn), "__call__", None)
            if not isinstance(fn, types.FunctionType):
                break
    return None, owners, held


class CapturedScalars:
    """The Python scalars a kernel's body reads from its module's globals, its closure or the attributes of
    its ``self`` (a callable object, a bound method's object, a ``functools.partial``'s bound object; tuples,
    lists and dicts too, a table ``SCALE[d]`` a user may update, and the partial's bound arrays and containers): tracing fixes their
    values into the program, so a kernel must trace again when one changes (a call costs a look-up and an
    identity test per name, and a repr or `_contents` per tuple, list or dict: `changed`).

    Which names: every global the body loads, the body's comprehensions, lambdas and inner functions
    included (they have code objects of their own), and so of each function along its ``__wrapped__`` chain, every cell of its closure and every attribute name it
    loads, looked up on the owners as the body looks it up (`_attribute`: an instance's ``__dict__``, a
    ``__slots__`` slot, a class attribute, a property), decided when the kernel is made but compared on each call, bound or
    not: a constant defined below the kernel (``SCALE = 2.0`` after ``@rf.kernel``), a placeholder that later
    holds a scalar and an attribute first set after the kernel was made are all changes. Left out, to keep the
    call cheap: names that hold a module or something callable when the kernel is made (`_names_code`: ``rf``,
    ``np``, ``range``, a helper): they keep naming code. A captured numpy array mixed with traced values is
    refused while tracing; one the trace reads (``W[0]``, ``W.max()``, a 0-d ``W`` as a scalar) is compared by
    its shape, dtype and bytes, inside a container too; one over `CAPTURED_ARRAY_BYTES`, and a container too
    large to compare, are refused (`refuse_uncomparable`); other objects, functions and modules are taken as
    they were traced (their type is compared, not what they hold)."""

    def __init__(self, globals_: tuple[tuple[dict, tuple[str, ...]], ...], cells: tuple,
                 owners: tuple[tuple[Callable[[], object], tuple[str, ...], tuple[str, ...]], ...] = (),
                 cell_labels: tuple[str, ...] = ()) -> None:
        # (each module's globals with the names read of them: a decorated body may live in another module)
        self.globals, self.cells, self.owners, self.cell_labels = globals_, cells, owners, cell_labels
        # (`seen`, the values whose signatures were found equal to it, the positions of those a change in
        # place could change): `changed` compares objects, not reprs, while they are these (`_unchanged`)
        self._checked: tuple[tuple, list, tuple[int, ...]] | None = None
        self.seen = self.now()

    @staticmethod
    def of(fn: Callable) -> "CapturedScalars | None":
        """What `fn`'s body reads, None where it reads nothing to compare. The functions a ``functools.wraps``
        decorator wrapped are followed (`_bodies`), as the kernel's signature is: the wrapper reads none of the
        body's globals, only the wrapped function in a cell."""
        bodies = _bodies(fn)
        if not bodies:
            return None
        reads: dict[int, tuple[dict, dict[str, None]]] = {}     # id of a module's globals -> them, their names
        cells: list = []
        cell_labels: list[str] = []
        owners: list[object] = []
        attribute_reads: dict[str, None] = {}
        def read_globals(function: types.FunctionType) -> dict[str, None]:
            """The names `function` reads of its module's globals, noted; the attribute names it reads."""
            globals_ = function.__globals__
            builtins_ = globals_.get("__builtins__", {})
            builtins_ = vars(builtins_) if isinstance(builtins_, types.ModuleType) else builtins_
            global_reads, attributes = _names_read(function.__code__)
            names = reads.setdefault(id(globals_), (globals_, {}))[1]
            names.update(dict.fromkeys(n for n in global_reads if not _names_code(globals_.get(n, builtins_.get(n)))))
            return dict.fromkeys(attributes)

        for body, body_owners, held in bodies:
            attributes = read_globals(body)
            for name, cell in zip(body.__code__.co_freevars, body.__closure__ or ()):
                if not _names_code(_cell_value(cell)):
                    cells.append(cell)
                    cell_labels.append(name)
            cells += [types.CellType(v) for v in held]
            cell_labels += ["an argument bound by functools.partial"] * len(held)
            owners += body_owners
            attribute_reads.update(attributes)
        # what the methods the body calls on its owners read too (``self.norm(x)``, ``super().body(x)`` of a
        # kernel): traced into the body, their reads of ``self.eps`` or of a global were baked in and never
        # compared (found by a helper, hunt_torch2/04)
        refs = _owner_refs(owners)
        seen_methods: set[int] = set()
        for _ in range(METHOD_DEPTH):
            found = [m for ref in refs for m in _methods_named(ref(), attribute_reads) if id(m) not in seen_methods]
            if not found:
                break
            for method in found:
                seen_methods.add(id(method))
                attribute_reads.update(read_globals(method))
        read_by = tuple(_attribute_reads(ref, tuple(n for n in attribute_reads
                                                    if not _names_code(_attribute(ref(), n))))
                        for ref in refs)
        read_by = tuple(r for r in read_by if r[1] or r[2])
        global_names = tuple((g, tuple(names)) for g, names in reads.values() if names)
        if not (global_names or cells or read_by):
            return None
        return CapturedScalars(global_names, tuple(cells), read_by, tuple(cell_labels))

    def _values(self) -> list:
        """The objects the names, cells and attributes hold now (`_ABSENT` where one is not bound)."""
        values: list = []
        for globals_, names in self.globals:
            get = globals_.get
            values += [get(n, _ABSENT) for n in names]
        if self.cells:
            values += [_cell_value(c) for c in self.cells]
        if self.owners:
            for ref, attributes, in_dict in self.owners:
                owner = ref()
                if owner is None:       # (a method's instance, freed: its kernel can no longer be called)
                    values += [_ABSENT] * (len(attributes) + len(in_dict))
                    continue
                try:
                    values += [getattr(owner, n, _ABSENT) for n in attributes]
                except Exception:       # noqa: BLE001 - a property that raises: the others looked up one by one
                    values += [_attribute(owner, n) for n in attributes]
                if in_dict:
                    get = getattr(owner, "__dict__", {}).get
                    values += [get(n, _ABSENT) for n in in_dict]
        return values

    def _labels(self) -> list[str]:
        """What the user calls each of `_values` (``W``, ``self.scale``), for an error."""
        labels = [n for _, names in self.globals for n in names] + list(self.cell_labels)
        for _, attributes, in_dict in self.owners:
            labels += [f"self.{n}" for n in (*attributes, *in_dict)]
        return labels

    def arrays(self) -> list[tuple[str, np.ndarray]]:
        """(label, array) of every numpy array the body can read now, inside tuples, lists and dicts too (at most
        `CONTAINER_DEPTH` deep): what an argument the body updates in place must not share memory with
        (`in_place.check`)."""
        found: list[tuple[str, np.ndarray]] = []

        def walk(value: object, label: str, depth: int) -> None:
            if isinstance(value, np.ndarray):
                found.append((label, value))
            elif isinstance(value, tuple | list) and depth < CONTAINER_DEPTH:
                for k, v in enumerate(value):
                    walk(v, f"{label}[{k}]", depth + 1)
            elif isinstance(value, dict) and depth < CONTAINER_DEPTH:
                for k, v in value.items():
                    walk(v, f"{label}[{k!r}]", depth + 1)
        for value, label in zip(self._values(), self._labels()):
            walk(value, label, 0)
        return found

    def refuse_uncomparable(self, kernel: str) -> None:
        """Refuse a trace while the body can read a value too large to compare per call: a numpy array over
        `CAPTURED_ARRAY_BYTES`, a container holding one, or more than `CONTAINER_LEAVES` values, or nested
        deeper than `CONTAINER_DEPTH`. What a trace reads of it (an element, its maximum) would be baked into
        the kernel and never checked again."""
        for i, value in enumerate(self._values()):
            if isinstance(value, np.ndarray) and value.nbytes > CAPTURED_ARRAY_BYTES:
                raise UnsupportedError(
                    f"the body reads the captured numpy array {self._labels()[i]} ({value.dtype}"
                    f"{list(value.shape)}, {value.nbytes} bytes): what a trace reads of it would be baked into "
                    f"the kernel, and arrays over {CAPTURED_ARRAY_BYTES} bytes are not compared on each call; pass "
                    "it as a kernel argument (or its values as a static tuple)", op=kernel, loc=user_loc())
            why = _too_large(value) if isinstance(value, tuple | list | dict) else None
            if why is not None:
                raise UnsupportedError(
                    f"the body reads the captured {type(value).__name__} {self._labels()[i]}, too large to compare "
                    f"on each call ({why}): what a trace reads of it would be baked into the kernel and a change "
                    "never seen; pass what the body needs as kernel arguments (arrays, or scalars and static "
                    "tuples)", op=kernel, loc=user_loc())

    def now(self) -> tuple:
        """The values as they are: `_signature` of each."""
        return tuple(map(_signature, self._values()))

    def note_traced(self, before: tuple) -> None:
        """Take the values a trace read as the ones seen, given `before`, noted before it began: a list or
        dict as the trace left it (one the body appends to while tracing, a log, would otherwise make every
        call trace again), a scalar as it was before (a trace cannot rebind it; another thread that did so
        while the trace ran made the kernel trace again on its next call instead of keeping stale values)."""
        self.seen = tuple(now if was[0] in (list, dict) else was for was, now in zip(before, self.now()))

    def changed(self) -> tuple | None:
        """The values as they are where one differs from the last ones seen, else None (the caller drops what
        it traced from them, then takes these as seen: a thread calling in between still sees a change).
        Every cached call asks, so the objects found unchanged last time are compared by identity, and only
        the containers among them by repr (a repr per scalar doubled the cost of a cached call)."""
        seen, values, checked = self.seen, self._values(), self._checked
        if checked is not None and checked[0] is seen and all(map(operator.is_, values, checked[1])) and (
                not checked[2] or all(_unchanged(values[i], seen[i]) for i in checked[2])):
            return None     # (the objects last found to match `seen`; a scalar, a string or another object
            #                 cannot change its signature, a container or an array changed in place can)
        now = tuple(map(_signature, values))
        if now != seen:
            return now
        self._checked = (seen, values, tuple(i for i, v in enumerate(values) if _compared_in_place(v)))
        return None


def _bodies(fn: Callable) -> list[tuple[types.FunctionType, list[object], list[object]]]:
    """`_body_of` of `fn` and of each function its ``__wrapped__`` chain leads to (``functools.wraps``; each
    link's own body too: a decorator's wrapper may read globals of its own)."""
    found: list[tuple[types.FunctionType, list[object], list[object]]] = []
    for _ in range(16):           # (a chain of decorators; a cycle ends here too)
        body, owners, held = _body_of(fn)
        if body is not None and not any(body is b for b, _, _ in found):
            found.append((body, owners, held))
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is None and body is not None:
            wrapped = getattr(body, "__wrapped__", None)
        if wrapped is None:
            break
        fn = wrapped
    return found


def _methods_named(owner: object, names: dict[str, None]) -> list[types.FunctionType]:
    """The Python functions `owner`'s classes define under `names` (along the whole method resolution order,
    as ``super()`` reaches any of them): plain methods, static and class methods, properties' getters, and the
    bodies of kernels defined on them."""
    out: list[types.FunctionType] = []
    for cls in type(owner).__mro__ if owner is not None else ():
        for name in names:
            value = cls.__dict__.get(name)
            if isinstance(value, staticmethod | classmethod):
                value = value.__func__
            elif isinstance(value, property):
                value = value.fget
            for _ in range(8):      # (a kernel's body, a kernel of a kernel, a functools.wraps chain)
                if value is None or isinstance(value, types.FunctionType):
                    break
                value = getattr(value, "__wrapped__", None)
            if isinstance(value, types.FunctionType):
                out.append(value)
    return out


def _attribute(owner: object, name: str) -> object:
    """``owner.name`` as the body reads it (an instance's ``__dict__``, a ``__slots__`` slot, a class attribute,
    a property), or `_ABSENT` where it is not set or its property raises (the body would raise too)."""
    try:
        return getattr(owner, name, _ABSENT)
    except Exception:       # noqa: BLE001 - a property that raises: not a value the body can have baked in
        return _ABSENT


class _HeldWeakly(NamedTuple):
    """An owner a body reads ``self`` attributes of that a kernel must not keep alive (a `WeakMethod`'s
    instance): `ref` returns it, or None once it was freed."""

    ref: Callable[[], object]


def _owner_refs(owners: list[object]) -> list[Callable[[], object]]:
    """Each of `owners` as a function returning it, once each: a `_HeldWeakly`'s reference (a `WeakMethod`'s
    instance), or a function holding the object."""
    refs: list[Callable[[], object]] = []
    seen: list[object] = []
    for owner in owners:
        ref = owner.ref if isinstance(owner, _HeldWeakly) else (lambda o=owner: o)
        target = ref()
        if not any(target is s for s in seen):
            seen.append(target)
            refs.append(ref)
    return refs


def _attribute_reads(ref: Callable[[], object], names: tuple[str, ...]
                     ) -> tuple[Callable[[], object], tuple[str, ...], tuple[str, ...]]:
    """`ref` (a function returning an owner) with the attribute `names` the body reads of the owner, split by how
    each call looks them up: by
    `getattr`, as the body does; except, where the owner's class has a ``__getattr__`` (an ``nn.Module``), the
    names neither set nor defined by its class when the kernel is made (most are the names of other objects'
    attributes, ``x.shape``, ``rf.exp``), which are looked up in its ``__dict__`` alone, where setting one
    later puts it: a ``__getattr__`` raising for each cost a cached call 0.6 us a name."""
    owner = ref()
    if getattr(type(owner), "__getattr__", None) is None:
        return ref, names, ()
    kind = type(owner)
    found = tuple(n for n in names if _attribute(owner, n) is not _ABSENT or hasattr(kind, n))
    return ref, found, tuple(n for n in names if n not in found)


def _cell_value(cell: object) -> object:
    try:
        return cell.cell_contents
    except ValueError:       # (a cell not filled yet: the enclosing function assigns it after the def)
        return _ABSENT


class Defaults:
    """The default values `fn`'s parameters take, watched for a change after the kernel is made: a function's
    ``__defaults__`` and ``__kwdefaults__`` (along the ``__wrapped__`` chain, as `inspect.signature` follows
    it) and a ``functools.partial``'s ``keywords``. The kernel binds its arguments by the signature it took
    when it was made; when one of these is replaced or changed in place it must take the signature again
    (a static default is part of a specialization, an array default an argument): the body run by Python
    uses the new default, and the kernel kept the old one. Compared by identity, so that a cached call costs
    an attribute look-up per function (0.1-0.2 us)."""

    def __init__(self, holders: tuple[tuple[Callable[[object], tuple], object], ...]) -> None:
        self.holders = holders        # (an `operator.attrgetter` returning a tuple, the object it reads)
        self._take()

    @staticmethod
    def of(fn: Callable) -> "Defaults":
        """The holders of `fn`'s defaults."""
        holders: list[tuple[Callable[[object], tuple], object]] = []
        link: object = fn
        for _ in range(16):       # (a chain of decorators and partials; a cycle ends here too)
            if isinstance(link, functools.partial):
                holders.append((_PARTIAL_DEFAULTS, link))
                link = link.func
                continue
            if isinstance(link, BoundKernel):
                link = link.method()
            if isinstance(link, types.MethodType | WeakMethod):
                link = link.__func__
            if isinstance(link, types.FunctionType):
                holders.append((_FUNCTION_DEFAULTS, link))
            wrapped = getattr(link, "__wrapped__", None)
            if wrapped is None:
                break
            link = wrapped
        return Defaults(tuple(holders))

    def _now(self) -> tuple:
        """The holders' defaults as they are (a function's are one look-up: the common case)."""
        if len(self.holders) == 1:
            get, holder = self.holders[0]
            return get(holder)
        return tuple(value for get, holder in self.holders for value in get(holder))

    def _take(self) -> None:
        """Take the defaults as they are now as the ones seen."""
        self.values = self._now()
        self.items = _dict_items(self.values)

    def changed(self) -> bool:
        """Whether a default was replaced or changed in place since last asked (then the new ones are seen)."""
        values = self.values
        if self.items:
            now = self._now()
            items = _dict_items(now)
            same = (len(items) == len(self.items) and all(map(operator.is_, now, values))
                    and all(map(operator.is_, items, self.items)))
        elif len(self.holders) == 1:     # (one function without keyword-only defaults: the common case)
            get, holder = self.holders[0]
            first, second = get(holder)
            same = first is values[0] and second is values[1]
        else:
            same = all(map(operator.is_, self._now(), values))
        if same:
            return False
        self._take()
        return True


_FUNCTION_DEFAULTS = operator.attrgetter("__defaults__", "__kwdefaults__")
_PARTIAL_DEFAULTS = operator.attrgetter("keywords", "args")


def _dict_items(values: tuple) -> tuple:
    """The keys and values of the dicts among `values` (a change in place replaces one)."""
    return tuple(item for v in values if type(v) is dict for pair in v.items() for item in pair)
