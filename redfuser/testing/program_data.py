"""The arguments a fuzzed program is called with: arrays (values, dtype, view) and static scalars.

An `ArrayData` says how an array's values are made: from a numpy seed (normal,
wide, small-integer, large or positive floats; integers; bools) or as literal
values (what the shrinker leaves), plus special values at a few flat positions,
and a `base` shape the values are drawn at and broadcast from. A `Layout` says
how the same values are handed to the kernel: contiguous, Fortran order, a
negative-stride view, a non-contiguous slice, a zero-stride ``broadcast_to``
view, or an ``np.ma.MaskedArray``. `build` and `source` walk the same recipe, so
a reproducer script builds the arrays the fuzzer checked bit for bit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np

from .program_rules import literal

DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn), "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}
KINDS = ("normal", "wide", "ints", "large", "positive", "offset", "far", "int_small", "int_wide", "int_edge", "bool")
LAYOUTS = ("c", "F", "rev", "strided", "bcast", "masked")
LITERAL_LIMIT = 96
"""Arrays of at most this many elements print as literal values; larger ones as their numpy recipe."""


def dtype_source(name: str) -> str:
    """``np.float32`` / ``rf.bfloat16``: how a script names the dtype."""
    return f"rf.{name}" if name in ("bfloat16", "float8_e4m3fn") else f"np.{'bool_' if name == 'bool' else name}"


@dataclass(frozen=True)
class ArrayData:
    """How one array's values are made (see the module docstring)."""

    dtype: str
    shape: tuple[int, ...]
    base: tuple[int, ...] | None = None       # shape the values are drawn at (broadcast to `shape`); None: `shape`
    seed: int = 0
    kind: str = "normal"
    specials: tuple[tuple[int, float], ...] = ()  # (flat position in the base, value)
    values: tuple | None = None               # literal values of the base, flat (overrides seed and kind)
    mask_seed: int = 0                        # the mask of a MaskedArray layout

    @property
    def base_shape(self) -> tuple[int, ...]:
        return self.shape if self.base is None else self.base

    def base_values(self) -> np.ndarray:
        """The values at `base_shape`, in `dtype`."""
        dt, shape = DTYPES[self.dtype], self.base_shape
        if self.values is not None:
            return np.asarray(self.values, dtype=dt if dt.kind in "biu" else np.float64).astype(dt).reshape(shape)
        rng = np.random.default_rng(self.seed)
        x = _draw(rng, self.kind, shape)
        if self.specials:
            x = np.array(x, dtype=np.float64 if dt.kind not in "biu" else x.dtype)
            for pos, v in self.specials:
                x.flat[pos] = v
        return np.asarray(x).astype(dt)

    def build(self) -> np.ndarray:
        """The logical array (contiguous; 0-d stays 0-d, which ``np.ascontiguousarray`` would not keep)."""
        return np.array(np.broadcast_to(self.base_values(), self.shape), order="C")

    def present(self, layout: str) -> object:
        """The array as the kernel gets it: the same values in `layout`."""
        if layout == "bcast":
            return np.broadcast_to(self.base_values(), self.shape)
        a = self.build()
        if layout == "F":
            return np.asfortranarray(a)
        if layout == "rev" and a.ndim:
            return np.ascontiguousarray(a[..., ::-1])[..., ::-1]
        if layout == "strided" and a.ndim:
            return np.repeat(a, 2, axis=-1)[..., ::2]
        if layout == "masked":
            return np.ma.masked_array(a, mask=np.random.default_rng(self.mask_seed).random(self.shape) < 0.3)
        return guarded(a)

    def literal_form(self) -> "ArrayData":
        """The same values as literals (no seed)."""
        base = self.base_values()
        flat = tuple(_plain(v) for v in base.reshape(-1))
        return replace(self, values=flat, seed=0, kind="literal", specials=())

    def size(self) -> int:
        return math.prod(self.base_shape)

    def source(self, name: str, layout: str) -> list[str]:
        """Lines that bind `name` to the array as `present(layout)` makes it (``np``, ``rf`` imported)."""
        dt = DTYPES[self.dtype]
        if self.values is not None or self.size() <= LITERAL_LIMIT:
            values = self.base_values().reshape(-1)
            items = ", ".join(_item_source(v, dt) for v in values)
            if dt.kind in "biu":
                lines = [f"{name} = np.array([{items}], dtype={dtype_source(self.dtype)})"]
            else:
                lines = [f"{name} = np.array([{items}]).astype({dtype_source(self.dtype)})"]
            lines[0] += f".reshape({self.base_shape!r})"
        else:
            lines = [f"{name} = {_recipe_source(self.kind, self.seed, self.base_shape)}"]
            if self.specials:
                lines.append(f"{name} = np.array({name}, dtype=np.float64)")
                lines += [f"{name}.flat[{pos}] = {_item_source(v, np.dtype(np.float64))}" for pos, v in self.specials]
            lines.append(f"{name} = np.asarray({name}).astype({dtype_source(self.dtype)})")
        shape = repr(self.shape)
        if layout == "bcast":
            lines.append(f"{name} = np.broadcast_to({name}, {shape})  # a read-only view with zero strides")
            return lines
        if self.base is not None:
            lines.append(f"{name} = np.array(np.broadcast_to({name}, {shape}), order='C')")
        lines += {
            "F": [f"{name} = np.asfortranarray({name})"],
            "rev": [f"{name} = np.ascontiguousarray({name}[..., ::-1])[..., ::-1]  # negative strides"]
            if self.shape else [],
            "strided": [f"{name} = np.repeat({name}, 2, axis=-1)[..., ::2]  # a non-contiguous slice"]
            if self.shape else [],
            "masked": [f"{name} = np.ma.masked_array({name}, mask=np.random.default_rng({self.mask_seed})"
                       f".random({shape}) < 0.3)"],
        }.get(layout, [])
        return lines


GUARD = 64
"""Bytes of a known pattern on each side of a contiguous argument: a kernel that writes there is caught."""


def guarded(a: np.ndarray) -> np.ndarray:
    """`a`'s values in the middle of a buffer with `GUARD` pattern bytes on each side (`guards_intact` checks)."""
    raw = np.full(a.nbytes + 2 * GUARD, 0xA5, np.uint8)
    view = raw[GUARD:GUARD + a.nbytes].view(a.dtype).reshape(a.shape)
    view[...] = a
    return view


def guards_intact(a: object) -> bool:
    """False when something wrote into the guard bytes around an array made by `guarded`."""
    raw = getattr(a, "base", None)
    while isinstance(raw, np.ndarray) and raw.base is not None and raw.dtype != np.uint8:
        raw = raw.base
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 1:
        return True
    return bool((raw[:GUARD] == 0xA5).all() and (raw[-GUARD:] == 0xA5).all())


def _draw(rng: np.random.Generator, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """Values of one kind (the same calls `_recipe_source` prints)."""
    if kind == "bool":
        return rng.random(shape) < 0.5
    if kind == "int_small":
        return rng.integers(-8, 9, shape)
    if kind == "int_wide":
        return rng.integers(-100000, 100001, shape)
    if kind == "int_edge":  # near the int32 limits: sums and products wrap around
        return rng.integers(-2**31, 2**31, shape)
    if kind == "ints":
        return rng.integers(-4, 5, shape).astype(np.float64)
    if kind == "positive":
        return np.abs(rng.standard_normal(shape)) + 0.5
    if kind in OFFSETS:  # unit spread far from 0: what expanded central moments and entropies cancel on
        return rng.standard_normal(shape) + OFFSETS[kind]
    scale = {"normal": 1.0, "wide": 4.0, "large": 1000.0}[kind]
    return rng.standard_normal(shape) * scale


OFFSETS = {"offset": 300.0, "far": 1000.0}


def _recipe_source(kind: str, seed: int, shape: tuple[int, ...]) -> str:
    rng = f"np.random.default_rng({seed})"
    if kind == "bool":
        return f"{rng}.random({shape!r}) < 0.5"
    if kind in ("int_small", "int_wide", "int_edge"):
        lo, hi = {"int_small": (-8, 9), "int_wide": (-100000, 100001), "int_edge": ("-2**31", "2**31")}[kind]
        return f"{rng}.integers({lo}, {hi}, {shape!r})"
    if kind == "ints":
        return f"{rng}.integers(-4, 5, {shape!r}).astype(np.float64)"
    if kind == "positive":
        return f"np.abs({rng}.standard_normal({shape!r})) + 0.5"
    if kind in OFFSETS:
        return f"{rng}.standard_normal({shape!r}) + {OFFSETS[kind]!r}"
    scale = {"normal": 1.0, "wide": 4.0, "large": 1000.0}[kind]
    return f"{rng}.standard_normal({shape!r}) * {scale!r}"


def _plain(v: object) -> object:
    if isinstance(v, np.bool_ | bool):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    return float(v)


def _item_source(v: object, dt: np.dtype) -> str:
    if dt == np.bool_:
        return repr(bool(v))
    if dt.kind in "iu":
        return repr(int(v))
    return literal(float(v)).replace("rf.inf", "np.inf").replace('float("nan")', "np.nan")


# ---------------------------------------------------------------------------------------------
# static scalar arguments
# ---------------------------------------------------------------------------------------------
SCALAR_FAMILIES: tuple[tuple[object, ...], ...] = (
    (2, 2.0, True, np.float32(2), 2),           # equal values of other types: one compiled kernel each
    (0.0, -0.0, 0.0),                           # the sign of zero
    (1, True, 1.0, np.float16(1)),
    (0.5, np.float32(0.5), np.float64(0.5)),
    (float("nan"), 1.0, float("nan")),
    (float("inf"), -float("inf"), 3),
    (3, -3, 7),
    (False, True, 0),
    (448.0, np.float32(448.0), 448),
)
"""Runs of static scalar values the same kernel object is called with, one after another."""


def scalar_source(v: object) -> str:
    """A static scalar as a script writes it."""
    return literal(v)
