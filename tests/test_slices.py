"""Slices ``x[start:stop:step]``, ``rf.concatenate`` and ``rf.stack``: numpy's views and joins, as index maps.

A slice is a view (no nest, no copy): the reads of the sliced array become strided indices
``start + step * axis`` (`ir.loop.expr.Strided`). A concatenation is one elementwise nest choosing the piece
by position; each piece is read shifted back by its start, clamped where the choice discards it. Both must
equal numpy on every backend here, inside fused cascades too, and keep the fusion engine honest: a result
read at another row's position cannot join the pass that makes it.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import redfuser as rf
from helpers import assemble_without_spills, run_backend

BACKENDS = ("interpret", "cpu", "simulate")
RNG = np.random.default_rng(5)


def _equal(got, want, n: int = 1, computed_in=None, scale=None) -> None:
    """Same dtype and shape; integers and bools exact, floats within the tolerance of the dtype they were
    computed in (`computed_in`, default the result's) over a reduction of `n`."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    if want.dtype.kind in "biu":
        assert np.array_equal(got, want)
    else:
        rf.testing.assert_close(got, want, computed_in or want.dtype, n, scale=scale)


@st.composite
def _slices(draw, size: int) -> slice:
    """A slice of a dim of `size`, numpy's bounds included (negative, past the end, empty, reversed)."""
    bound = st.none() | st.integers(-size - 2, size + 2)
    step = draw(st.none() | st.integers(-3, 3).filter(lambda s: s != 0))
    return slice(draw(bound), draw(bound), step)


@settings(deadline=None)
@given(data=st.data(), backend=st.sampled_from(BACKENDS))
def test_random_slices_read_what_numpy_reads(data, backend):
    shape = tuple(data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    first = tuple(data.draw(_slices(n)) for n in shape)
    inner = data.draw(st.integers(0, len(shape) - 1))
    x = RNG.standard_normal(shape).astype(np.float32)
    second = data.draw(_slices(len(range(*first[inner].indices(shape[inner])))))

    def body(v):
        y = v[first]
        z = y[(slice(None),) * inner + (second,)]           # a slice of a slice
        return z * 2.0, rf.sum(z, axis=inner) if z.shape[inner] else z + 1.0, y.T

    got, want = run_backend(backend, body, x)
    for g, w in zip(got, want):
        _equal(g, w, x.size)


def _chains(v, i):
    a = v[1:, ::-2][:, 1:3]          # slice of a slice (negative step)
    b = rf.swapaxes(v, 0, 1)[::2, 1]  # a transpose, a slice, an int
    c = v[..., None, 2:][-1]          # ellipsis, new axis, then an int on the sliced view
    d = i[::-1, ::3] // 2             # ints keep their dtype
    return a, b, c, d, v[2:2], v[-1:-9:-3, -1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_chains_of_views(backend):
    v = RNG.standard_normal((7, 6)).astype(np.float32)
    i = RNG.integers(-50, 50, (5, 8)).astype(np.int32)
    got, want = run_backend(backend, _chains, v, i)
    for g, w in zip(got, want):
        _equal(g, w)


def _rope_attention(q, k, v, cos, sin):
    half = q.shape[-1] // 2

    def rotate_half(x):
        return rf.concatenate((-x[..., half:], x[..., :half]), axis=-1)

    qr, kr = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    s = qr @ rf.swapaxes(kr, -1, -2) * float(q.shape[-1]) ** -0.5
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    return (p @ v) / rf.sum(p, axis=-1, keepdims=True)


def _rope_inputs(n: int = 45, d: int = 16):
    q, k, v = (RNG.standard_normal((2, n, d)).astype(np.float32) for _ in range(3))
    angle = np.arange(n)[:, None] * (10000.0 ** (-np.arange(d // 2) * 2.0 / d))[None, :]
    angle = np.concatenate([angle, angle], axis=-1)
    return q, k, v, np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_attention_fuses_into_one_pass(backend):
    args = _rope_inputs()
    kernel = rf.kernel(_rope_attention, backend=backend)
    assert [g.fused for g in kernel.lower(*args).groups] == [True]
    got, want = run_backend(backend, _rope_attention, *args)
    _equal(got[0], want[0], 45)


def _sliced_cascades(x):
    odd = x[:, 1::2]                                   # a strided view along the reduced axis
    m = rf.max(odd, axis=-1, keepdims=True)
    e = rf.exp(odd - m)
    joined = rf.concatenate([x[:, :5], 2.0 * x[:, ::-1]], axis=-1)   # pieces along the reduced axis
    mj = rf.max(joined, axis=-1, keepdims=True)
    return e / rf.sum(e, axis=-1, keepdims=True), rf.sum(rf.exp(joined - mj), axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cascades_over_strided_and_joined_axes_fuse(backend):
    x = RNG.standard_normal((6, 131)).astype(np.float32)
    kernel = rf.kernel(_sliced_cascades, backend=backend)
    assert [g.fused for g in kernel.lower(x).groups] == [True, True]
    got, want = run_backend(backend, _sliced_cascades, x)
    for g, w in zip(got, want):
        _equal(g, w, 136)


def _strided_statistics(x):
    odd = x[:, 1::2]
    mu = rf.mean(odd, axis=-1, keepdims=True)
    m = rf.max(odd, axis=-1, keepdims=True)
    p = rf.exp(odd - m) / rf.sum(rf.exp(odd - m), axis=-1, keepdims=True)
    return (rf.sum((odd - mu) ** 2, axis=-1), rf.var(odd, axis=-1), -rf.sum(p * rf.log(p), axis=-1),
            rf.sum(rf.where(odd > m - 1, odd, 0.0), axis=-1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_centred_and_conditional_terms_over_a_strided_axis(backend):
    """A strided read of the loop's axis varies along it (the algebra's x): centring, entropy and a condition on
    the running max all fuse (before, such a read counted as a constant and the rewrite left it out of scope)."""
    x = (RNG.standard_normal((4, 200)) + 300).astype(np.float32)
    kernel = rf.kernel(_strided_statistics, backend=backend)
    assert [g.fused for g in kernel.lower(x).groups] == [True]
    got, want = run_backend(backend, _strided_statistics, x)
    for g, w in zip(got, want):
        _equal(g, w, 100)


def _other_rows_max(x):
    m = rf.max(x, axis=-1)
    return rf.sum(rf.exp(x - m[::-1, None]), axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_result_read_at_another_rows_position_does_not_join_its_pass(backend):
    """Row i reads row n-1-i's max: final only after every row's pass, so the sum is a second pass."""
    x = RNG.standard_normal((9, 70)).astype(np.float32) * np.arange(1, 10, dtype=np.float32)[:, None]
    kernel = rf.kernel(_other_rows_max, backend=backend)
    assert not any(g.fused for g in kernel.lower(x).groups)
    got, want = run_backend(backend, _other_rows_max, x)
    _equal(got[0], want[0], 70)


def _shifted_local(q, k):
    s = q @ k.T
    t = s[:, ::-1]                       # the loop's per-chunk scores, read in reverse
    m = rf.max(t, axis=-1, keepdims=True)
    return rf.sum(rf.exp(t - m) * s, axis=-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reversed_scores_inside_a_fused_loop(backend):
    q, k = RNG.standard_normal((10, 8)).astype(np.float32), RNG.standard_normal((77, 8)).astype(np.float32)
    got, want = run_backend(backend, _shifted_local, q, k)
    _equal(got[0], want[0], 77)


@settings(deadline=None)
@given(data=st.data(), backend=st.sampled_from(BACKENDS))
def test_concatenate_and_stack_equal_numpy(data, backend):
    ndim = data.draw(st.integers(1, 3))
    axis = data.draw(st.integers(-ndim, ndim - 1))
    base = list(data.draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim)))
    lengths = data.draw(st.lists(st.integers(0, 7), min_size=1, max_size=4))
    dtypes = data.draw(st.lists(st.sampled_from([np.float32, np.float16, np.int32, np.bool_]),
                                min_size=len(lengths), max_size=len(lengths)))
    pieces = []
    for n, d in zip(lengths, dtypes):
        shape = list(base)
        shape[axis] = n
        pieces.append((RNG.standard_normal(shape) * 4).astype(d))
    if all(p.shape[axis] == 0 for p in pieces) and backend == "simulate":
        pieces[0] = np.ones_like(pieces[0], shape=base)  # (an empty result launches nothing to simulate)
    count = len(pieces)
    pieces += [pieces[0]] * (4 - count)    # (a kernel has a fixed list of parameters)

    def body(a, b, c, d):
        arrays = (a, b, c, d)[:count]
        return rf.concatenate(arrays, axis=axis), rf.stack([a, a[...], a], axis=axis)

    got, want = run_backend(backend, body, *pieces)
    for g, w in zip(got, want):
        _equal(g, w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stack_of_a_traced_scalar_and_python_numbers(backend):
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    got, want = run_backend(backend, lambda v: (rf.stack([rf.sum(v), 3.0, v[1, 2]]),
                                                rf.stack([v[:, 0], v[:, 1] > 0], axis=1)), x)
    for g, w in zip(got, want):
        _equal(g, w, 20, np.float32)     # (an f32 sum stacked with a Python float: f64, rounded as f32)


def test_printed_ir_shows_the_index_maps():
    def body(x, y):
        return x[:, 1::2] * 2.0, rf.concatenate([x, y], axis=1)

    x, y = np.zeros((3, 8), np.float32), np.zeros((3, 2), np.float32)
    text = str(rf.kernel(body, backend="interpret").lower(x, y).stages["traced"])
    assert "x[i0,2*i1 + 1]" in text
    assert "where(i1 < 8, x[i0,clip(i1)], y[i0,clip(i1 - 8)])" in text


def test_rope_attention_assembles_for_sm80_and_sm90():
    args = _rope_inputs(64, 64)
    for sm in ("sm_80", "sm_90"):
        lowered = rf.kernel(_rope_attention, backend="cuda", sm=sm).lower(*args)
        assert [g.fused for g in lowered.groups] == [True]
        assemble_without_spills(lowered)


@pytest.mark.parametrize("backend", ("cpu", "simulate"))
def test_a_sliced_or_joined_axis_specializes_a_dynamic_kernel(backend):
    """A slice's length and where pieces meet are compiled in: the kernel specializes on the lengths they come
    from, and every length still gives numpy's values."""
    def body(x, y):
        return rf.sum(x[:, 1:] * x[:, :-1], axis=-1), rf.concatenate([x, y[:, ::-1]], axis=-1)

    kernel = rf.kernel(body, backend=backend, dynamic=True)
    for n, m in [(5, 2), (17, 4), (3, 9)]:
        x, y = RNG.standard_normal((3, n)).astype(np.float32), RNG.standard_normal((3, m)).astype(np.float32)
        for g, w in zip(kernel(x, y), body(x, y)):
            _equal(g, w, n)


# -- reshape ------------------------------------------------------------------------------------------------
def _factorizations(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def _shapes_of(draw, size: int) -> tuple[int, ...]:
    """A shape holding `size` elements (length-1 dims sprinkled in), sometimes with one -1."""
    dims, left = [], size
    while left > 1 and len(dims) < 4:
        d = draw(st.sampled_from(_factorizations(left)))
        dims.append(d)
        left //= d
    if left > 1:
        dims.append(left)
    for _ in range(draw(st.integers(0, 2))):
        dims.insert(draw(st.integers(0, len(dims))), 1)
    if dims and draw(st.booleans()):
        dims[draw(st.integers(0, len(dims) - 1))] = -1
    return tuple(dims)


@settings(deadline=None)
@given(data=st.data(), backend=st.sampled_from(BACKENDS))
def test_random_reshapes_equal_numpy(data, backend):
    shape = tuple(data.draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=4)))
    # drawn from hypothesis's seed, not the module's RNG: a failure replays with the same values
    x = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).standard_normal(shape).astype(np.float32)
    view = data.draw(st.sampled_from(["plain", "reversed", "transposed", "sliced"]))
    views = {"plain": lambda v: v, "reversed": lambda v: v[::-1], "transposed": lambda v: v.T,
             "sliced": lambda v: v[..., ::2]}
    size = views[view](x).size
    first, second = data.draw(_shapes_of(size)), data.draw(_shapes_of(size))

    def body(v):
        y = views[view](v).reshape(first)
        z = rf.reshape(y * 2.0, second)                       # a reshape of a computed value
        w = y.reshape(second)
        w = w[..., ::-1] if w.ndim else w                    # a view of a reshape of a reshape of a view
        return y, z, rf.sum(z, axis=-1) if z.ndim else z, w

    got, want = run_backend(backend, body, x)
    for g, w in zip(got, want):
        # the sum's error follows its terms (2x, up to 2 max|x|), not its result, which may cancel to near 0
        # (six terms of magnitude ~1 summed to -0.041 were 6e-7 off, twice the result's own tolerance)
        _equal(g, w, x.size, scale=2 * float(np.abs(x).max()) if x.size else None)


def _group_norm(x, w, b):
    n, c, h, wd = x.shape
    g = x.reshape(n, 4, -1)                   # channels split into 4 groups, merged with the pixels
    mu = rf.mean(g, axis=-1, keepdims=True)
    var = rf.var(g, axis=-1, keepdims=True)
    y = ((g - mu) / rf.sqrt(var + 1e-5)).reshape(n, c, h, wd)
    return y * w[:, None, None] + b[:, None, None]


def _heads(x):
    t, width = x.shape
    q = x.reshape(t, 4, width // 4)           # split into heads, attend per head, merge back
    s = rf.swapaxes(q, 0, 1) @ rf.transpose(q, (1, 2, 0))
    m = rf.max(s, axis=-1, keepdims=True)
    p = rf.exp(s - m)
    o = (p / rf.sum(p, axis=-1, keepdims=True)) @ rf.swapaxes(q, 0, 1)
    return rf.swapaxes(o, 0, 1).reshape(t, width)


@pytest.mark.parametrize("backend", BACKENDS)
def test_group_norm_and_heads_split_and_merged_in_the_kernel_fuse(backend):
    x = (RNG.standard_normal((2, 8, 3, 5)) + 100).astype(np.float32)
    w, b = RNG.standard_normal(8).astype(np.float32), RNG.standard_normal(8).astype(np.float32)
    assert [g.fused for g in rf.kernel(_group_norm, backend=backend).lower(x, w, b).groups] == [True]
    got, want = run_backend(backend, _group_norm, x, w, b)
    # x - mean cancels: the terms are |x| / std in size, not the output's (the tolerance rule's scale)
    spread = float(x.reshape(2, 4, -1).std(axis=-1).min())
    _equal(got[0], want[0], 30, scale=float(np.abs(x).max() * np.abs(w).max()) / spread)
    h = RNG.standard_normal((33, 16)).astype(np.float32)
    assert [g.fused for g in rf.kernel(_heads, backend=backend).lower(h).groups] == [True]
    got, want = run_backend(backend, _heads, h)
    _equal(got[0], want[0], 33)


def test_reshape_prints_its_positions():
    def body(x):
        return x.reshape(2, 3, 4) * 2.0, x.reshape(-1)[3::5]

    text = str(rf.kernel(body, backend="interpret").lower(np.zeros((6, 4), np.float32)).stages["traced"])
    assert "x[i0 * 3 + i1,i2]" in text                       # a split: 16*g + c
    assert "x[(5 * i0 + 3) // 4,(5 * i0 + 3) % 4]" in text   # a merge read through a slice


@pytest.mark.parametrize("backend", ("cpu", "simulate"))
def test_a_reshaped_dim_specializes_a_dynamic_kernel(backend):
    kernel = rf.kernel(lambda x: rf.sum(x.reshape(x.shape[0], 2, -1), axis=-1), backend=backend, dynamic=True)
    for n, m in [(3, 4), (5, 8), (2, 6)]:
        x = RNG.standard_normal((n, m)).astype(np.float32)
        _equal(kernel(x), x.reshape(n, 2, -1).sum(-1), m)


def _joined_then_viewed(x, y):
    c = rf.concatenate([x, y], axis=0)
    return c[1], c[4], c.reshape(-1)[::3], rf.concatenate([x, 2 * y], axis=1).reshape(2, -1)[:, 3:]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_concatenation_read_at_fixed_positions_and_through_a_reshape(backend):
    """Each piece is read at the position shifted back by its start: at a fixed row of another piece, or through
    a reshape's computed positions, that read is out of the piece and discarded; it must stay a valid read
    (clamped), not an internal error or a read outside memory."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    got, want = run_backend(backend, _joined_then_viewed, x, -x - 1)
    for g, w in zip(got, want):
        _equal(g, w)


def test_a_reshapes_positions_run_in_the_kernels_index_type_where_they_fit():
    """GPU kernels index in i32: a reshape's divisions and remainders run there too when their loop indices bound
    every step below 2**30 (64-bit division is a long software sequence on a GPU); a gather's data, or a
    position that may not fit, stays int64."""
    from redfuser.ir import Axis, Binary, BinaryOp, Const, IndexValue, Load
    from redfuser.ir.buffer import Buffer
    from redfuser.ir.loop.index import in_index_type
    from redfuser.ir.types import BufferType, int32, int64

    def position(extent: int):
        i = IndexValue(Axis("i0", extent), int64)
        return Binary(BinaryOp.MOD, Binary(BinaryOp.FLOORDIV, i, Const(8, int64), int64), Const(3, int64), int64)

    small = in_index_type(position(4096), int32)
    assert small.dtype == int32 and small.a.a.dtype == int32 and small.a.a.axis.extent == 4096
    assert in_index_type(position(2**31), int32) == position(2**31)
    gathered = Load(Buffer("idx", BufferType(int64, (4,))), (Axis("i0", 4),))
    assert in_index_type(Binary(BinaryOp.MOD, gathered, Const(4, int64), int64), int32).dtype == int64
    text = str(rf.kernel(lambda x: rf.sum(rf.transpose(x, (0, 2, 1)).reshape(8, 3, 8), axis=-1),
                         backend="simulate").lower(np.zeros((8, 6, 4), np.float32)).stages["tile"])
    assert " // " in text and not any(" // " in line and "i64" in line for line in text.splitlines())


def test_a_reshape_of_contiguous_memory_reads_it_contiguously():
    """A reshape's per-dim positions fold into one element offset where that is affine (``(r // 4) * 4 + r % 4``
    is ``r``): the kernel reads a merged row as the contiguous row it is, no division left to vectorize past."""
    x = RNG.standard_normal((8, 6, 4)).astype(np.float32)
    body = lambda v: rf.sum(v.reshape(8, 3, 8), axis=-1)   # noqa: E731
    for backend in ("cpu", "simulate"):
        text = str(rf.kernel(body, backend=backend).lower(x).stages["tile"])
        assert " // " not in text and " % " not in text
        _equal(rf.kernel(body, backend=backend)(x), body(x), 8)
