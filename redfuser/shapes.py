"""Shape-polymorphic kernels: which axes of a call are symbolic, and the shape class a call belongs to.

A kernel compiled for a *shape class* runs every call whose arrays have the class's dtypes and ranks,
the class's exact lengths on its static axes and any length >= 2 on its symbolic ones (docs/shapes.md).

- Which axes are symbolic (`DynamicAxes`, the kernel's ``dynamic=`` argument): ``None`` (the default)
  compiles a call's exact shapes first and, once an axis of an argument is seen with a second length,
  makes that axis symbolic from then on (one more compile; every later length reuses it), as
  ``torch.compile`` does; ``True`` makes every axis symbolic from the first call; ``False`` never;
  ``{"k": (-2,)}`` names the axes per argument (negative counts from the end).
- What a class fixes (`ShapePlan.key`): each array's dtype, rank and static lengths, which of its axes
  are symbolic and which symbolic axes have equal lengths (they share a symbol, so a kernel may add or
  compare them; a call where they differ is another class), the static arguments, and each array's
  layout (dense, or a view's exact strides: its axes may be symbolic under them). An axis of length 0
  or 1 stays static in every class (it changes the code: an empty loop, a broadcast).
- How a class is compiled (`redfuser.compiler`'s ``sized`` stage): the body is traced and fused at
  *probe* lengths (`PROBES`, primes no program computes by accident) and once more at other probes;
  the two programs must be equal up to the probes (`redfuser.ir.loop.extents`), which proves that
  nothing in the program depends on a symbolic length's value (a ``x.shape[0]`` used as a number, a
  fusion constant such as ``1 / n``). The probes then become symbols (`redfuser.ir.sizes`) for the
  scheduler and code generators, which either have a rule for a run-time extent or raise
  `SymbolicDecision`; then, and when the check fails, the class is compiled for the call's exact
  shapes instead (`Kernel.cache_info` counts that compile too, and ``kernel.polymorphism`` says why).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union

from .ir import ArgumentError, BufferType, SourceLoc
from .probes import CHECK_PROBES, PROBE_LENGTHS, PROBES
from .ir.sizes import Sym
from .trace import ArgSpec, ArraySpec

Dynamic = Union[None, bool, Mapping[str, "tuple[int, ...] | list[int] | int"]]
"""What ``rf.kernel(fn, dynamic=...)`` accepts (see the module docstring)."""

@dataclass(frozen=True)
class ShapePlan:
    """How one call maps onto its shape class.

    `key`: the class (what a compiled kernel is keyed by, with the backend and options); `specs`: the
    call's specs at `PROBES` (what the class is traced at), `check_specs` at `CHECK_PROBES`;
    `symbols`: each symbol's name and probe, in order; `values`: this call's length for each symbol;
    `axes`: each symbol's axes, ``(argument, axis)``."""

    key: tuple
    specs: tuple[ArgSpec, ...]
    check_specs: tuple[ArgSpec, ...]
    symbols: tuple[tuple[str, int], ...]
    values: tuple[int, ...]
    axes: tuple[tuple[tuple[str, int], ...], ...]

    def axes_of(self, symbols: frozenset[str]) -> frozenset[tuple[str, int]]:
        """The axes behind `symbols` (all of the class's when `symbols` names none of them)."""
        found = {a for (name, _), axes in zip(self.symbols, self.axes) if name in symbols for a in axes}
        return frozenset(found) if found else frozenset(a for axes in self.axes for a in axes)

    def only(self, symbol: str) -> tuple[ArgSpec, ...]:
        """The specs at `PROBES` with `symbol` alone at its `CHECK_PROBES` length (which symbols a program
        depends on: `redfuser.compiler.sized_stage`)."""
        i = [name for name, _ in self.symbols].index(symbol)
        probe, other = self.symbols[i][1], CHECK_PROBES[i]
        out: list[ArgSpec] = []
        for spec in self.specs:
            if isinstance(spec, ArraySpec) and probe in spec.type.shape:
                shape = tuple(other if n == probe else n for n in spec.type.shape)
                spec = ArraySpec(spec.name, BufferType(spec.type.dtype, shape))
            out.append(spec)
        return tuple(out)

    def describe(self) -> str:
        """The class in words: ``x: f32[x.0, 128]``."""
        parts = []
        for part in self.key:
            if isinstance(part, tuple) and part and part[0] == "array":
                _, name, dtype, pattern, _strides = part
                dims = [self.symbols[d[1]][0] if isinstance(d, tuple) else str(d) for d in pattern]
                parts.append(f"{name}: {dtype}[{', '.join(dims)}]")
        return ", ".join(parts)

    @property
    def probe_to_symbol(self) -> dict[int, Sym]:
        return {probe: Sym(name) for name, probe in self.symbols}

    @property
    def probe_to_check(self) -> dict[int, int]:
        return {probe: CHECK_PROBES[i] for i, (_, probe) in enumerate(self.symbols)}


class DynamicAxes:
    """A kernel's choice of symbolic axes (its ``dynamic=`` argument; see the module docstring), with the
    lengths seen so far for the default (automatic) choice."""

    def __init__(self, dynamic: Dynamic, kernel: str, params: tuple[str, ...], loc: SourceLoc | None) -> None:
        if dynamic is not None and not isinstance(dynamic, (bool, Mapping)):
            raise ArgumentError(f"dynamic must be None, True, False or a dict of argument name -> axes, got "
                                f"{type(dynamic).__name__}", op="kernel", loc=loc)
        self.mode = dynamic
        self.named: dict[str, tuple[int, ...]] = {}
        if isinstance(dynamic, Mapping):
            for name, axes in dynamic.items():
                if name not in params:
                    raise ArgumentError(f"dynamic names {name!r}, which is not a parameter of {kernel} "
                                        f"({', '.join(params)})", op="kernel", loc=loc)
                axes = (axes,) if isinstance(axes, int) else tuple(axes)
                if not all(isinstance(a, int) and not isinstance(a, bool) for a in axes):
                    raise ArgumentError(f"dynamic[{name!r}] must be an axis or a tuple of axes (ints), got "
                                        f"{dynamic[name]!r}", op="kernel", loc=loc)
                self.named[name] = axes
        self._first: dict[str, tuple[int, ...]] = {}
        self._seen_changing: set[tuple[str, int, int]] = set()   # (argument, rank, axis)
        self.refused: dict[str, str] = {}        # a class (in words) -> why some of its axes stay static
        self.excluded: dict[tuple, frozenset[tuple[str, int]]] = {}   # class key -> axes its compile kept static
        self.needs: dict[tuple, dict[tuple[str, int], int]] = {}    # class key -> axis -> least length (short calls)

    def chosen(self, spec: ArraySpec) -> set[int]:
        """The axes of argument `spec` to make symbolic for this call (before the length-0/1 and layout
        rules), updating what the automatic choice has seen."""
        shape, rank = spec.type.shape, len(spec.type.shape)
        if self.mode is False:
            return set()
        if self.mode is True:
            return set(range(rank))
        if self.named:
            named = self.named.get(spec.name, ())
            wrong = [a for a in named if not -rank <= a < rank]
            if wrong:
                from .source_info import user_loc
                raise ArgumentError(f"dynamic[{spec.name!r}] names axis {wrong[0]}, but {spec.name} has {rank} "
                                    f"dimension{'s' if rank != 1 else ''} (shape {tuple(shape)})", op="kernel",
                                    loc=user_loc())
            if len({a % rank for a in named}) < len(named):    # (numpy's "repeated axis", as a reduction's)
                from .source_info import user_loc
                raise ArgumentError(f"dynamic[{spec.name!r}] names an axis twice ({named!r}: {spec.name} has "
                                    f"{rank} dimension{'s' if rank != 1 else ''})", op="kernel", loc=user_loc())
            return {a % rank for a in named}
        first = self._first.setdefault(spec.name, shape)
        if len(first) == rank:
            self._seen_changing.update((spec.name, rank, d) for d in range(rank) if first[d] != shape[d])
        return {d for d in range(rank) if (spec.name, rank, d) in self._seen_changing}

    def below_needs(self, key: tuple, specs: tuple[ArgSpec, ...]) -> frozenset[tuple[str, int]]:
        """The axes along which this call is shorter than an earlier call of class `key` found its trace to
        need (`note_short_call`): the class's trace would index past this call again, so it is not tried."""
        lengths = _lengths(specs)
        return frozenset(a for a, least in self.needs.get(key, {}).items() if lengths.get(a, least) < least)

    def note_short_call(self, key: tuple, needs: dict[tuple[str, int], int], specs: tuple[ArgSpec, ...]) -> bool:
        """Remember that the trace of class `key` needed `needs` (axis -> least length) where this call had
        less. That is a fact about the call (``x[:, 7]`` on 3 columns: compiled exactly, it fails as numpy
        does), and longer calls still share the class -- unless the need grows with the length: True where
        this call met what an earlier one lacked and still fell short (``for i in range(1, x.shape[1]):
        x[:, i]`` indexes past every length), which makes the axes static for the class."""
        known = self.needs.setdefault(key, {})
        lengths = _lengths(specs)
        grew = any(a in known and lengths.get(a, 0) >= known[a] for a in needs)
        for a, least in needs.items():
            known[a] = max(known.get(a, 0), least)
        return grew

    def plan(self, specs: tuple[ArgSpec, ...], exclude: frozenset[tuple[str, int]] = frozenset()
             ) -> ShapePlan | None:
        """The call's shape class, or None for a call with no symbolic axis (compiled exactly); the axes in
        `exclude` (``(argument, axis)``) stay static."""
        symbol_of_length: dict[int, str] = {}
        dims: list[tuple[str, int, int]] = []              # (argument, axis, length) of symbolic axes
        for spec in specs:
            if not isinstance(spec, ArraySpec):
                continue
            axes = self.chosen(spec)
            for d in sorted(axes):
                n = spec.type.shape[d]
                if n >= 2 and (spec.name, d) not in exclude:
                    symbol_of_length.setdefault(n, f"{spec.name}.{d}")
                    dims.append((spec.name, d, n))
        if not dims or len(symbol_of_length) > len(PROBES):
            return None
        if any(n in PROBE_LENGTHS for spec in specs if isinstance(spec, ArraySpec) for n in spec.type.shape):
            return None     # a static length equal to a probe would be taken for the symbol: compile exactly
        order = list(symbol_of_length)                     # lengths, in order of first use
        probe_of = {n: PROBES[i] for i, n in enumerate(order)}
        check_of = {n: CHECK_PROBES[i] for i, n in enumerate(order)}
        symbolic = {(name, d) for name, d, _ in dims}
        key: list[object] = []
        specs_a: list[ArgSpec] = []
        specs_b: list[ArgSpec] = []
        for spec in specs:
            if not isinstance(spec, ArraySpec) or not any(name == spec.name for name, _ in symbolic):
                key.append(spec)
                specs_a.append(spec)
                specs_b.append(spec)
                continue
            shape = spec.type.shape
            pattern = tuple(("sym", order.index(n)) if (spec.name, d) in symbolic else n for d, n in enumerate(shape))
            key.append(("array", spec.name, spec.type.dtype, pattern, spec.type.strides))
            for out, probes in ((specs_a, probe_of), (specs_b, check_of)):
                probed = tuple(probes[n] if (spec.name, d) in symbolic else n for d, n in enumerate(shape))
                out.append(ArraySpec(spec.name, BufferType(spec.type.dtype, probed, spec.type.strides)))
        symbols = tuple((symbol_of_length[n], probe_of[n]) for n in order)
        axes = tuple(tuple((name, d) for name, d, m in dims if m == n) for n in order)
        return ShapePlan(tuple(key), tuple(specs_a), tuple(specs_b), symbols, tuple(order), axes)


def _lengths(specs: tuple[ArgSpec, ...]) -> dict[tuple[str, int], int]:
    """Each array axis of a call, ``(argument, axis)``, -> its length."""
    return {(spec.name, d): n for spec in specs if isinstance(spec, ArraySpec) for d, n in enumerate(spec.type.shape)}


__all__ = ["DynamicAxes", "ShapePlan", "PROBES", "CHECK_PROBES", "Dynamic"]
