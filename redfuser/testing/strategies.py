"""Hypothesis strategies: shapes, broadcasts, arrays and random small kernel bodies.

`programs()` draws a `RandomProgram`: a list of `Step`s (elementwise ops,
reductions, views, matmul, casts) over a few input arrays, run by a small
closure over the ``redfuser`` op namespace. The same callable traces into a
kernel and runs on plain numpy as the reference, and its ``repr`` is the
program as Python source, so a failing example reads like a test case.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

import redfuser as rf

from .random_program import CONDITIONAL, ELEMENTWISE_BINARY, ELEMENTWISE_UNARY, RandomProgram, Step

FLOAT_DTYPES: tuple[np.dtype, ...] = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
SIDES = (1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 64)
"""Dimension lengths tests draw from: 1 (broadcasting), small primes (ragged edges), powers of two."""


@st.composite
def shapes(draw, min_dims: int = 0, max_dims: int = 4, max_side: int = 64, max_size: int = 1024,
           allow_zero: bool = False) -> tuple[int, ...]:
    """A shape of `min_dims`..`max_dims` dims from `SIDES` (and 0 with `allow_zero`), at most `max_size` elements."""
    ndim = draw(st.integers(min_dims, max_dims))
    sides = [s for s in SIDES if s <= max_side] + ([0] if allow_zero else [])
    shape: list[int] = []
    for _ in range(ndim):
        size = math.prod(max(s, 1) for s in shape)
        shape.append(draw(st.sampled_from([s for s in sides if size * max(s, 1) <= max_size])))
    return tuple(shape)


@st.composite
def broadcastable_to(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to `shape`: some leading dims dropped, some dims set to 1."""
    drop = draw(st.integers(0, len(shape)))
    return tuple(1 if draw(st.booleans()) else s for s in shape[drop:])


@st.composite
def broadcast_shape_pairs(draw, max_dims: int = 4, max_size: int = 1024,
                          allow_zero: bool = False) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two shapes that broadcast together (both derived from one common shape)."""
    base = draw(shapes(max_dims=max_dims, max_size=max_size, allow_zero=allow_zero))
    return draw(broadcastable_to(base)), draw(broadcastable_to(base))


@st.composite
def arrays(draw, dtype: object, shape: tuple[int, ...], *, large: bool = False, neg_inf: bool = False,
           positive: bool = False) -> np.ndarray:
    """A finite array of `dtype` and `shape` (values from a drawn seed, plus drawn special values).

    `large`: magnitudes up to about ``max(dtype) ** 0.25`` (products and sums of a
    few such values stay finite); `neg_inf`: some elements, sometimes whole rows of
    the last axis or a leading chunk of them, set to ``-inf`` (attention masks);
    `positive`: values > 0.
    """
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dtype == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if dtype.kind in "iu":
        return np.asarray(rng.integers(-100, 100, size=shape)).astype(dtype)
    top = float(ml_dtypes.finfo(dtype).max) ** 0.25 if large else 16.0
    scale = draw(st.sampled_from([1.0, 0.25, 4.0, top] if large else [1.0, 0.25, 4.0]))
    x = np.asarray(rng.standard_normal(shape) * scale)
    if x.size and draw(st.booleans()):  # exact special values at a few places
        flat = x.reshape(-1)
        specials = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, top]
        for pos in rng.integers(0, flat.size, size=min(4, flat.size)):
            flat[pos] = specials[int(rng.integers(len(specials)))]
    if positive:
        x = np.abs(x) + 0.5
    if neg_inf and x.size:
        kind = draw(st.sampled_from(["none", "random", "rows", "first_chunk"]))
        if kind == "random":
            x[rng.random(shape) < 0.3] = -np.inf
        elif kind == "rows" and x.ndim:
            x[rng.random(shape[:-1]) < 0.4] = -np.inf
        elif kind == "first_chunk" and x.ndim:
            x[..., : max(1, shape[-1] // 2)] = -np.inf
    return np.asarray(x.astype(dtype))


# ---------------------------------------------------------------------------------------------
# random programs
# ---------------------------------------------------------------------------------------------
_BIT_EXACT = frozenset({"neg", "abs", "maximum", "minimum", "where_max", "mask", "logic", "astype",
                        "swapaxes", "transpose", "T", "mT", "index", "max", "min"})
"""Steps every backend computes bit for bit as numpy does from bit-equal operands (selections, views, casts,
which round to nearest even on both sides)."""

_ROUNDED_ONCE = frozenset({"add", "sub", "mul", "div", "square", "scale", "scalar_left", "np_scalar_left",
                           "rsqrt", "sqrt"})
"""Arithmetic correctly rounded in the result's type on both sides: bit-exact for f32 (and f64) results only. A
16-bit result is rounded by numpy at every step and kept in f32 by a compiled kernel, so a condition on it
(``v0 != 3.0`` of a bf16 sum that numpy rounds to 3.0) could pick differently (a flaky failure on cpu)."""


@dataclass
class _Value:
    """A value of a program being drawn: its reference array and whether both sides agree on it bit for bit."""

    array: object
    exact: bool  # every backend computes it bit for bit as numpy does (`_BIT_EXACT`, `_ROUNDED_ONCE`)

    @property
    def shape(self) -> tuple[int, ...]:
        return np.shape(self.array)


class _Drawer:
    """Draws one program step by step, running each step on numpy to know shapes and dtypes."""

    def __init__(self, draw, dtype: np.dtype, max_size: int, allow_zero: bool, neg_inf: bool) -> None:
        self.draw, self.dtype, self.max_size = draw, dtype, max_size
        self.allow_zero, self.neg_inf = allow_zero, neg_inf
        self.names: list[str] = []
        self.inputs: list[np.ndarray] = []
        self.steps: list[Step] = []
        self.values: dict[str, _Value] = {}
        self.lengths: list[int] = []  # lengths of sums and matmul contractions

    def new_input(self, shape: tuple[int, ...]) -> str:
        # mix only with float32: numpy has no common type for some f16/bf16 pairs (np.where)
        dtype = self.dtype if self.draw(st.integers(0, 5)) else np.dtype(np.float32)
        array = self.draw(arrays(dtype, shape, neg_inf=self.neg_inf and self.draw(st.booleans())))
        name = f"x{len(self.inputs)}"
        self.names.append(name)
        self.inputs.append(array)
        self.values[name] = _Value(array, True)
        return name

    def pick(self, ok=lambda v: True) -> str | None:
        names = [n for n in reversed(list(self.values)) if ok(self.values[n])]
        return self.draw(st.sampled_from(names)) if names else None

    def add(self, op: str, a: str, b: str | None = None, params: tuple = (), exact: bool | None = None) -> None:
        step = Step(f"v{len(self.steps)}", op, a, b, params)
        with np.errstate(all="ignore"):
            array = step.apply({n: v.array for n, v in self.values.items()})
        if exact is None:
            wide = np.dtype(np.asarray(array).dtype).itemsize >= 4
            exact = self.values[a].exact and (b is None or self.values[b].exact) and (
                op in _BIT_EXACT or (op in _ROUNDED_ONCE and wide))
        self.steps.append(step)
        self.values[step.out] = _Value(array, exact)

    def fits(self, *shapes_: tuple[int, ...]) -> bool:
        try:
            return math.prod(np.broadcast_shapes(*shapes_)) <= self.max_size
        except ValueError:
            return False

    # -- one step of each kind; each returns False when it does not apply to the picked value --
    def unary(self, a: str) -> bool:
        op = self.draw(st.sampled_from(ELEMENTWISE_UNARY))
        params = {"scale": (self.draw(st.sampled_from([0.5, -2.0, 0.125, 3.0])),),
                  "scalar_left": (self.draw(st.sampled_from([1.0, 0.5, -3.0])),),
                  "np_scalar_left": (self.draw(st.sampled_from([0.5, 2.0])),),
                  "astype": (self.draw(st.sampled_from([rf.float32, self.dtype.type])),)}.get(op, ())
        self.add(op, a, params=params)
        return True

    def operand(self, a: str, exact: bool) -> str:
        """An existing value that broadcasts with `a` (bit-exact if `exact`), or a new input."""
        shape = self.values[a].shape
        b = None if self.draw(st.booleans()) else self.pick(lambda v: self.fits(shape, v.shape) and
                                                                (v.exact or not exact))
        return b or self.new_input(self.draw(broadcastable_to(shape)))

    def binary(self, a: str) -> bool:
        op = self.draw(st.sampled_from(ELEMENTWISE_BINARY + CONDITIONAL))
        b = self.operand(a, exact=op in CONDITIONAL)
        if self.draw(st.booleans()) and op not in CONDITIONAL:
            a, b = b, a
        self.add(op, a, b)
        return True

    def reduce(self, a: str) -> bool:
        shape = self.values[a].shape
        ndim = len(shape)
        kind = self.draw(st.sampled_from(["int", "tuple", "none", "empty"] if ndim else ["none"]))
        if kind == "int":
            dims: tuple[int, ...] = (self.draw(st.integers(-ndim, ndim - 1)),)
            axis: object = dims[0]
        elif kind == "tuple":
            dims = tuple(self.draw(st.permutations(range(ndim)))[: self.draw(st.integers(1, ndim))])
            axis = dims = tuple(d - ndim if self.draw(st.booleans()) else d for d in dims)
        else:
            dims, axis = (tuple(range(ndim)), None) if kind == "none" else ((), ())
        n = math.prod(shape[d] for d in dims)
        op = self.draw(st.sampled_from(["sum", "sum_method", "max", "min"]))
        if op in ("max", "min") and n == 0:
            op = "sum"
        if op == "sum_method" and n > 16:
            op = "sum"
        keepdims = self.draw(st.booleans())
        if op.startswith("sum"):
            self.lengths.append(n)
            params = (axis, keepdims) + ((1.0 if n <= 16 else 1.0 / n,) if op == "sum" else ())
            self.add(op, a, params=params, exact=False)
        else:
            self.add(op, a, params=(axis, keepdims))
        return True

    def view(self, a: str) -> bool:
        ndim = len(self.values[a].shape)
        op = self.draw(st.sampled_from(["swapaxes", "transpose", "T", "mT", "index"]))
        if op in ("swapaxes", "mT") and ndim < 2:
            return False
        if op == "swapaxes":
            i, j = (self.draw(st.integers(-ndim, ndim - 1)) for _ in range(2))
            self.add(op, a, params=(i, j))
        elif op == "transpose":
            self.add(op, a, params=(tuple(self.draw(st.permutations(range(ndim)))),))
        elif op == "index":
            self.add(op, a, params=(self.index_key(self.values[a].shape),))
        else:
            self.add(op, a)
        return True

    def index_key(self, shape: tuple[int, ...]) -> tuple:
        key: list[object] = []
        for size in shape:
            if self.draw(st.integers(0, 4)) == 0:
                key.append(None)
            fixed = size > 0 and self.draw(st.integers(0, 3)) == 0
            key.append(self.draw(st.integers(-size, size - 1)) if fixed else slice(None))
        if self.draw(st.booleans()):
            key.append(None)
        if self.draw(st.booleans()):  # a run of leading ':' becomes '...'
            lead = next((n for n, k in enumerate(key) if not isinstance(k, slice)), len(key))
            key = [Ellipsis] + key[self.draw(st.integers(0, lead)):] if lead else [Ellipsis] + key
        return tuple(key)

    def matmul(self, a: str) -> bool:
        shape = self.values[a].shape
        if not shape:
            return False
        n = self.draw(st.sampled_from([1, 2, 3, 8, 16]))
        if self.draw(st.booleans()):  # a @ new
            k = shape[-1]
            other = (k,) if self.draw(st.integers(0, 3)) == 0 else self.draw(broadcastable_to(shape[:-2])) + (k, n)
            lhs, rhs = a, None
        else:  # new @ a
            k = shape[-2] if len(shape) > 1 else shape[0]
            other = (k,) if self.draw(st.integers(0, 3)) == 0 else self.draw(broadcastable_to(shape[:-2])) + (n, k)
            lhs, rhs = None, a
        out_shape = np.matmul(np.zeros(shape if lhs else other, np.float32),
                              np.zeros(other if lhs else shape, np.float32)).shape
        if math.prod(out_shape) > self.max_size:
            return False
        new = self.new_input(other)
        self.lengths.append(k)
        self.add("matmul", lhs or new, rhs or new, params=(1.0 if k <= 16 else 1.0 / k,), exact=False)
        return True


@st.composite
def programs(draw, max_steps: int = 6, max_size: int = 512, dtypes: tuple = FLOAT_DTYPES,
             allow_zero: bool = False, neg_inf: bool = True) -> RandomProgram:
    """A random kernel body (a `RandomProgram`): 1-3 inputs, up to `max_steps` steps, 1-2 outputs.

    Steps are elementwise ops (with broadcasting, Python and numpy scalars, casts),
    ``where`` masks (conditions only on bit-exact values, so both sides pick the
    same branch), reductions (axis None/int/negative/tuple, keepdims), views
    (swapaxes, transpose, ``.T``, ``.mT``, ``None``/``...``/int indexing) and matmul
    against fresh inputs. Sums longer than 16 are scaled by ``1/n`` so magnitudes
    stay near 1 in every dtype.

    f16 and bf16 are storage types in compiled kernels (docs/cpu-backend.md): they compute
    in f32 and round on store, where numpy rounds every step. Finite differences that
    makes are the tolerance's business; a program whose NaN or infinities depend on it
    (``x**4`` overflowing f16 at x = 16 before ``v - v``) is not drawn.
    """
    d = _Drawer(draw, np.dtype(draw(st.sampled_from(dtypes))), max_size, allow_zero, neg_inf)
    for n in range(draw(st.integers(1, 2))):
        d.new_input(draw(shapes(min_dims=1 - n, max_dims=4, max_size=max_size, allow_zero=allow_zero)))
    kinds = {"unary": d.unary, "binary": d.binary, "reduce": d.reduce, "view": d.view, "matmul": d.matmul}
    for _ in range(draw(st.integers(1, max_steps))):
        # mostly chain on the latest value, so steps feed each other
        a = d.steps[-1].out if d.steps and draw(st.integers(0, 3)) else d.pick()
        if not kinds[draw(st.sampled_from(list(kinds)))](a):
            d.unary(a)
    outputs = (d.steps[-1].out,)
    if draw(st.integers(0, 3)) == 0:
        outputs += (d.pick(),)
    floats = [np.asarray(v.array, dtype=np.float64) for v in d.values.values()]
    scale = max(float(np.max(np.abs(f[np.isfinite(f)]), initial=0.0)) for f in floats)
    low = max((np.asarray(v.array).dtype for v in d.values.values()), key=lambda t: float(ml_dtypes.finfo(t).eps))
    program = RandomProgram(tuple(d.names), tuple(d.inputs), tuple(d.steps), outputs, low,
                            min(math.prod(d.lengths), 1 << 30), scale)
    if low.itemsize < 4:
        assume(_same_nonfinite([d.values[o].array for o in outputs], _storage_outputs(program)))
    return program


def _storage_outputs(program: RandomProgram) -> list[np.ndarray]:
    """`program`'s outputs computed the way compiled kernels do: f16/bf16 inputs widened to f32, every step in
    f32 (an ``astype`` to a narrow type rounds, then widens again), the outputs rounded by the caller."""
    env: dict = {n: x.astype(np.float32) if x.dtype.itemsize < 4 else x
                 for n, x in zip(program.input_names, program.inputs)}
    with np.errstate(all="ignore"):
        for step in program.steps:
            out = step.apply(env)
            if step.op == "astype" and np.dtype(step.params[0]).itemsize < 4:
                out = np.asarray(out).astype(np.float32)
            env[step.out] = out
    return [env[o] for o in program.outputs]


def _same_nonfinite(references: list, storage: list) -> bool:
    """Whether each reference output and its storage-precision twin (rounded to its dtype) have NaN and each
    infinity at the same places."""
    for ref, wide in zip(references, storage):
        ref = np.asarray(ref)
        with np.errstate(all="ignore"):
            a, b = ref.astype(np.float64), np.asarray(wide).astype(ref.dtype).astype(np.float64)
        for test in (np.isnan, np.isposinf, np.isneginf):
            if not np.array_equal(test(a), test(b)):
                return False
    return True


__all__ = ["FLOAT_DTYPES", "SIDES", "shapes", "broadcastable_to", "broadcast_shape_pairs", "arrays",
           "Step", "RandomProgram", "programs"]
