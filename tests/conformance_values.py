"""Input arrays of the conformance table (`conformance_table.py`): special values first, then random ones.

Every dtype's edge cases are in every input of that dtype: NaN, +-inf, -0.0, the smallest and largest
subnormals, the smallest normal and the largest finite values, rounding ties of every narrower float type
(floats); +-448 and NaN (float8 e4m3fn,
which has no infinities); INT_MIN, INT_MAX and their neighbours (integers, so overflow wraps). Shapes are
never tile multiples. Each input is a pure function of (group, dtype), so a failure reproduces.
"""
from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np

DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16),
    "e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "i32": np.dtype(np.int32), "i64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}
FLOATS = ("f32", "f16", "bf16", "e4m3")
INTS = ("i32", "i64")
ALL = tuple(DTYPES)


def rng_for(*key: str) -> np.random.Generator:
    """A generator seeded by `key` (stable across runs and Python hash seeds)."""
    return np.random.default_rng(zlib.crc32("/".join(key).encode()))


def specials(name: str) -> np.ndarray:
    """The edge values of dtype `name`, in that dtype."""
    d = DTYPES[name]
    if name in FLOATS:
        fi = ml_dtypes.finfo(d)
        sub, tiny, big = float(fi.smallest_subnormal), float(fi.smallest_normal), float(fi.max)
        vals = [np.nan, 0.0, -0.0, sub, -sub, tiny - sub, tiny, -tiny, big, -big, 1.0, -1.0, 0.5, 2.0, 3.0]
        if name != "e4m3":
            vals += [np.inf, -np.inf]
        # rounding ties of each narrower type this one holds exactly (a tie to even down, one up, a negative):
        # a cast rounding ties away from zero passed the table without them (a helper planted one)
        for bits in (m for narrower, m in _MANTISSA.items() if _MANTISSA[name] > m):
            half = 2.0 ** -(bits + 1)
            vals += [1.0 + half, 1.0 + 3 * half, -(1.0 + half)]
        return np.array(vals, np.float64).astype(d)
    if name in INTS:
        ii = np.iinfo(d)
        return np.array([ii.min, ii.max, ii.min + 1, ii.max - 1, 0, 1, -1, 2, -2, 3, 100, -1000], d)
    return np.array([True, False], d)


_MANTISSA = {"f32": 23, "f16": 10, "bf16": 7, "e4m3": 3}
"""Mantissa bits of each float dtype (for `specials`' rounding ties)."""


def randoms(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` ordinary values of dtype `name`: both signs, magnitudes over several binades."""
    d = DTYPES[name]
    if name in FLOATS:
        top = 6.0 if name == "e4m3" else 12.0
        mags = np.exp2(rng.uniform(-top, top, n)) * rng.choice([-1.0, 1.0], n)
        return mags.astype(d)
    if name in INTS:
        ii = np.iinfo(d)
        small = rng.integers(-50, 50, n)
        wide = rng.integers(ii.min, ii.max, n, dtype=d, endpoint=True)
        return np.where(rng.random(n) < 0.5, small, wide).astype(d)
    return rng.random(n) < 0.5


def values(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` values of dtype `name`: every special value (as many as fit), then random ones."""
    s = specials(name)[:n]
    return np.concatenate([s, randoms(name, n - len(s), rng)]).astype(DTYPES[name])


def _unary(name: str, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """``x`` (131,): every special value, float -> int cast edges, random values (1-d: 3x cheaper to compile)."""
    x = values(name, 131, rng)
    if name in FLOATS and name != "e4m3":   # float -> int casts: just inside and outside int32/int64
        edges = np.array([2.0**31, -(2.0**31), 2.0**31 - 2**8, 3e9, -3e9, 2.0**63, -(2.0**63), 1e19, -1.5, 2.5])
        with np.errstate(over="ignore"):
            x[40:50] = edges.astype(DTYPES[name])     # (after the special values)
    return (x,)


def _binary(name: str, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """`x` (29, 1) and `y` (131,) broadcast to every pair of special values; `c` a bool (29, 131) condition.

    (An inner dimension over ~100 keeps LLVM from unrolling the loops fully: 20x faster to compile.)"""
    x = values(name, 29, rng)[:, None]
    y = values(name, 131, rng)
    return x, y, rng.random((29, 131)) < 0.5


def _float_rows(name: str, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Rows of a reduction input: random; with NaN; with +inf; with +inf and -inf; all max; all -0.0;
    all subnormal; the rest random."""
    d = DTYPES[name]
    fi = ml_dtypes.finfo(d)
    out = np.empty((rows, n), np.float64)
    for r in range(rows):
        out[r] = randoms(name, n, rng).astype(np.float64)
    inf = np.inf if name != "e4m3" else np.nan
    if rows >= 7:
        out[1, n // 3] = np.nan
        out[2, n // 4] = inf
        out[3, n // 5], out[3, -2] = inf, -inf
        out[4] = float(fi.max)
        out[5] = -0.0
        out[6] = float(fi.smallest_subnormal) * rng.integers(-3, 4, n)
    elif rows >= 2:
        out[1, n // 2] = -inf
    return out.astype(d)


def _int_rows(name: str, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    d = DTYPES[name]
    out = np.stack([randoms(name, n, rng) for _ in range(rows)])
    if rows >= 7:
        ii = np.iinfo(d)
        out[4], out[5] = ii.max, ii.min
        out[6, : len(specials(name))] = specials(name)[:n]
    return out


def _bool_rows(rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    out = rng.random((rows, n)) < 0.5
    if rows >= 5:
        out[1], out[2] = True, False
        out[3] = False
        out[3, n // 2] = True
        out[4] = True
        out[4, n // 2] = False
    return out


def rows(name: str, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """A (rows, n) reduction input of dtype `name` with the special rows of its kind."""
    if name in FLOATS:
        return _float_rows(name, rows, n, rng)
    if name in INTS:
        return _int_rows(name, rows, n, rng)
    return _bool_rows(rows, n, rng)


def _reduce(name: str, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Reductions over 1 element (every special value), 37 (special rows), 300, and a 3-d (2, 5, 67)."""
    x1 = values(name, 17, rng)[:, None]
    x3 = rows(name, 10, 67, rng).reshape(2, 5, 67)
    return x1, rows(name, 7, 37, rng), rows(name, 3, 300, rng), x3


def _matmul(name: str, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """``a`` (2, 5, 37), ``b`` (37, 3), ``v`` (37,), ``w`` (2, 37, 3): odd M, N and K.

    Floats get a NaN, infinities, -0.0 and subnormals but not the largest finite value, whose sums with
    mixed signs overflow or not by summation order; integers get INT_MIN/INT_MAX rows (wrapping)."""
    d = DTYPES[name]
    a, b = rows(name, 10, 37, rng).reshape(2, 5, 37), randoms(name, 37 * 3, rng).reshape(37, 3)
    v = values(name, 37, rng)
    if name in FLOATS:
        fi = ml_dtypes.finfo(d)
        a = randoms(name, 2 * 5 * 37, rng).reshape(2, 5, 37)
        a[0, 1, 4], a[1, 2, 10] = np.nan, (np.inf if name != "e4m3" else fi.max)
        a[1, 3, :5] = -0.0
        b[7, :] = fi.smallest_subnormal
        b[5, 1] = np.inf if name != "e4m3" else -fi.max
        v = np.where(np.abs(v.astype(np.float64)) == float(fi.max), np.ones((), d), v).astype(d)
    return a, b, v, randoms(name, 2 * 37 * 3, rng).reshape(2, 37, 3)


def _views(name: str, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """``x`` (3, 5, 37) with every special value (views move values, so all must survive bit for bit)."""
    return (values(name, 3 * 5 * 37, rng).reshape(3, 5, 37),)


def _topk(name: str, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """``x`` (4, 37): many ties; NaN and -0.0/0.0 ties; -inf; every special value. ``s`` (5, 4): rows to
    sort in full (NaN last, ties to the lower index). (GPU top-k code grows fast with k: 48 s to compile
    k = 37, so k stays small.)"""
    d = DTYPES[name]
    if name in FLOATS:
        x = rng.choice([-2.0, -1.0, 0.0, 0.5, 1.0, 3.0], (4, 37))
        x[1, ::5] = np.nan
        x[1, 3], x[1, 4], x[1, 9] = -0.0, 0.0, -0.0
        low = -np.inf if name != "e4m3" else -448.0
        x[2, :] = low
        x[2, 30] = 1.0
        out = x.astype(d)
        sp = specials(name)
        out[3, : len(sp)] = sp
        small = np.array([[np.nan, 1.0, np.nan, 0.0], [-0.0, 0.0, -0.0, 1.0], [low, low, 2.0, np.nan],
                          [np.nan] * 4, [3.0, -1.0, 3.0, 0.5]]).astype(d)
        return out, small
    if name in INTS:
        sp = specials(name)
        return rng.choice(sp, (4, 37)).astype(d), rng.choice(sp[:4], (5, 4)).astype(d)
    return rng.random((4, 37)) < 0.3, rng.random((5, 4)) < 0.5


def _promote(name: str, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """``x`` (29, 1) of dtype `name` and one (131,) operand of every dtype."""
    x = values(name, 29, rng)[:, None]
    return (x,) + tuple(values(other, 131, rng) for other in ALL)


GROUPS = {
    "unary": _unary, "binary": _binary, "astype": _unary, "scalars": _unary, "arange": _unary,
    "reduce": _reduce, "matmul": _matmul, "views": _views, "topk": _topk, "promote": _promote,
}
"""Each group's input builder; the ops of a group take these inputs as their parameters."""


def inputs(group: str, name: str) -> tuple[np.ndarray, ...]:
    """The inputs of `group` for dtype `name` (fresh arrays, the same every call)."""
    return GROUPS[group](name, rng_for(group, name))
