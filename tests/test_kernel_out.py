"""``kernel(*args, out=...)`` on the host backends (the cuda backend's in test_cuda_interop.py) and
``kernel.cache_info()``: results written into the caller's arrays, returned as given, and every misuse
refused with an error naming the result and the caller's line before anything is written."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

import redfuser as rf
from redfuser.ir.errors import ArgumentError
from redfuser.workloads import layer_norm_stats, moe_routing, softmax

BACKENDS = ("interpret", "cpu", "simulate")
RNG = np.random.default_rng(5)


def rows(*shape):
    return (RNG.standard_normal(shape) * 3).astype(np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_results_are_written_into_out_and_out_is_returned(backend):
    x = rows(6, 70)
    k = rf.kernel(softmax, backend=backend)
    want = k(x)
    out = np.full_like(x, np.nan)
    assert k(x, out=out) is out
    np.testing.assert_array_equal(out, want)
    mu, var = np.full((6, 1), np.nan, np.float32), np.full((6, 1), np.nan, np.float32)
    given = (mu, var)
    stats = rf.kernel(layer_norm_stats, backend=backend)
    assert stats(x, out=given) is given
    for got, expected in zip(given, stats(x)):
        np.testing.assert_array_equal(got, expected)
    weights, experts = np.empty((6, 2), np.float32), np.empty((6, 2), np.int64)
    rf.kernel(moe_routing, backend=backend)(x, out=[weights, experts])
    np.testing.assert_array_equal(experts, moe_routing(x)[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_strided_out_gets_the_same_values(backend):
    """A transposed or strided view is a valid out: the results are copied into it (the cpu backend writes
    contiguous outs in place and copies into the others)."""
    x = rows(6, 70)
    k = rf.kernel(softmax, backend=backend)
    storage = np.zeros((70, 6), np.float32)
    k(x, out=storage.T)
    np.testing.assert_array_equal(storage.T, k(x))
    wide = np.zeros((6, 140), np.float32)
    k(x, out=wide[:, ::2])
    np.testing.assert_array_equal(wide[:, ::2], k(x))
    assert not wide[:, 1::2].any()


def test_torch_cpu_tensors_as_outs():
    torch = pytest.importorskip("torch")
    x = rows(6, 70)
    k = rf.kernel(softmax, backend="cpu")
    out = torch.empty(6, 70)
    assert k(torch.from_numpy(x), out=out) is out
    np.testing.assert_array_equal(out.numpy(), k(x))


def refused(k, *args, out, match: str) -> ArgumentError:
    with pytest.raises(ArgumentError, match=match) as info:
        k(*args, out=out)
    assert "test_kernel_out.py" in str(info.value)          # the caller's line
    return info.value


@pytest.mark.parametrize("backend", BACKENDS)
def test_outs_of_another_shape_dtype_or_count_are_refused_and_left_alone(backend):
    x = rows(6, 70)
    k = rf.kernel(softmax, backend=backend)
    for bad, match in [(np.zeros((6, 69), np.float32), r"is f32\[6,69\]; the kernel's result is f32\[6,70\]"),
                       (np.zeros((6, 70), np.float64), r"is f64\[6,70\]; the kernel's result is f32\[6,70\]"),
                       (np.zeros((6, 70), np.float16), r"is f16\[6,70\]")]:
        refused(k, x, out=bad, match=match)
        assert not bad.any()
    refused(k, x, out=(np.zeros_like(x), np.zeros_like(x)), match="must be one array")
    refused(rf.kernel(layer_norm_stats, backend=backend), x, out=np.zeros((6, 1), np.float32),
            match="must be a tuple of 2 arrays")
    frozen = np.zeros_like(x)
    frozen.flags.writeable = False
    refused(k, x, out=frozen, match="read-only")
    refused(k, x, out=[1.0] * 70, match="out")


@pytest.mark.parametrize("dtype", [np.uint8, np.complex64, np.dtype(">f4")], ids=["u8", "c64", "big-endian"])
def test_an_out_of_an_unsupported_dtype_names_the_kernel_and_the_callers_line(dtype):
    """(Found by a helper.) Such an out's DTypeError named neither the kernel nor the caller's line, where every
    other refused out and the same array passed as an argument name both."""
    x = rows(6, 70)
    bad = np.zeros((6, 70), dtype)
    with pytest.raises(rf.DTypeError) as info:
        rf.kernel(softmax, backend="interpret")(x, out=bad)
    assert "softmax" in str(info.value) and "test_kernel_out.py" in str(info.value)
    assert not bad.any()


def test_a_byte_swapped_out_is_told_what_to_pass_for_an_out():
    """A byte-swapped out was advised to "pass x.astype(...)", the advice for an argument (hunt_outs, minor)."""
    bad = np.zeros((6, 70), ">f4")
    with pytest.raises(rf.DTypeError, match=r"kernels write this machine's: pass an out of dtype <f4"):
        rf.kernel(softmax, backend="interpret")(rows(6, 70), out=bad)


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_an_out_of_a_numpy_subclass_is_refused_as_such_an_argument_is(backend):
    """A masked array or an ``np.matrix`` as ``out=`` was written (a masked array's elements under its mask
    stayed masked), where the same arrays as arguments are refused. Found by a helper (hunt_outs)."""
    x = rows(6, 70)
    k = rf.kernel(softmax, backend=backend)
    masked = np.ma.masked_array(np.zeros((6, 70), np.float32), mask=np.eye(6, 70, dtype=bool))
    refused(k, x, out=masked, match="numpy.ma.MaskedArray, a numpy array subclass")
    refused(k, x, out=np.asmatrix(np.zeros((6, 70), np.float32)), match="numpy.matrix, a numpy array subclass")
    assert not masked.data.any()
    plain = np.asarray(masked)
    assert k(x, out=plain) is plain


@pytest.mark.parametrize("backend", BACKENDS)
def test_outs_sharing_memory_with_an_argument_or_each_other_are_refused(backend):
    x = rows(6, 70)
    keep = x.copy()
    k = rf.kernel(softmax, backend=backend)
    refused(k, x, out=x, match="shares memory with argument 'x'")
    both = np.zeros((12, 70), np.float32)
    both[:6] = x
    refused(k, both[:6], out=both[3:9], match="shares memory with argument 'x'")   # a partial overlap
    np.testing.assert_array_equal(x, keep)
    stats = rf.kernel(layer_norm_stats, backend=backend)
    shared = np.zeros((6, 1), np.float32)
    refused(stats, x, out=(shared, shared), match=r"out\[1\] \(result 'var'\) shares memory with out\[0\]")
    k(both[:6], out=both[6:])                            # the other half of the same buffer is fine
    np.testing.assert_array_equal(both[6:], k(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_out_whose_elements_share_memory_is_refused(backend):
    """An out with a 0 stride (``as_strided``, torch's ``expand``) would get every row written into one place
    and return that row repeated; it is refused, after a good out made the cached call path. A transposed
    or strided out (no two elements in one place) is fine."""
    from numpy.lib.stride_tricks import as_strided

    x = rows(6, 70)
    k = rf.kernel(softmax, backend=backend)
    k(x, out=np.empty((6, 70), np.float32))
    one_row = np.zeros(70, np.float32)
    refused(k, x, out=as_strided(one_row, (6, 70), (0, 4)), match="elements that share memory")
    assert not one_row.any()
    folded = np.zeros(100, np.float32)     # rows 10 elements apart overlap 70-element rows
    refused(k, x, out=as_strided(folded, (6, 70), (40, 4)), match="elements that share memory")
    transposed = np.empty((70, 6), np.float32).T
    np.testing.assert_array_equal(k(x, out=transposed), k(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_empty_out_is_taken_on_every_call_path(backend):
    """numpy describes an array without elements with strides ``(0, 0)`` (``np.empty((0, 3))``), and the
    full call path refused it as an out whose elements share memory (the cached path took it: the answer
    depended on the call history); it has no two elements, and no memory to share with an argument."""
    def scale(x, w):
        return x * w

    from numpy.lib.stride_tricks import as_strided

    x0, w = np.zeros((0, 3), np.float32), np.ones(3, np.float32)
    buffer = np.ones((4, 3), np.float32)
    for fresh in (True, False):
        k = rf.kernel(scale, backend=backend)
        if not fresh:
            k(x0, w, out=np.empty((0, 3), np.float32))     # (the cached call path made)
        for out in (np.empty((0, 3), np.float32), buffer[:0], as_strided(w, (0, 3), (0, 0)), x0):
            assert k(x0, w, out=out) is out and out.shape == (0, 3)
    np.testing.assert_array_equal(buffer, 1)


def test_a_kernel_parameter_named_out_is_refused():
    def f(x, out):
        return x + out

    with pytest.raises(ArgumentError, match="cannot be named 'out'"):
        rf.kernel(f)


def test_cache_info_counts_specializations_like_lru_cache():
    k = rf.kernel(softmax, backend="interpret")
    assert k.cache_info() == (0, 0, None, 0)
    k(rows(2, 8))
    k(rows(2, 8))
    k(rows(3, 8))
    k.lower(rows(3, 8))
    k(rows(2, 8), out=np.empty((2, 8), np.float32))
    info = k.cache_info()
    assert (info.hits, info.misses, info.maxsize, info.currsize) == (3, 2, None, 2)
    assert rf.kernel(softmax, backend="cpu").cache_info().misses == 0


def _one_tuple(a):
    return (a + 1,)


def _one_list(a):
    return [a * 2]


class _Moments(NamedTuple):
    mean: object
    square: object


class _Only(NamedTuple):
    total: object


def _moments(a):
    return _Moments(rf.mean(a, axis=-1), rf.mean(a * a, axis=-1))


def _only(a):
    return _Only(rf.sum(a, axis=-1))


def _two_list(a):
    return [a + 1, a * 3]


@pytest.mark.parametrize("backend", ["interpret", "cpu"])
def test_a_body_returning_a_one_tuple_gives_a_one_tuple_on_every_call_path(backend):
    """A body returning ``(y,)`` gave a bare array (the trace flattened it), so ``k(x)[0]`` was silently the
    result's first row where numpy's body gives the whole result, and ``out=(o,)`` gave a 1-tuple: the call
    paths disagreed. Every path gives the 1-tuple now; a list gives a list, and a named tuple the same named
    tuple, as numpy's body does (``r.mean`` raised AttributeError: a plain tuple; hunt_outs/03)."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for body in (_one_tuple, _one_list, _moments, _only, _two_list):
        k = rf.kernel(body, backend=backend)
        want = body(x)
        for call in range(3):           # the first call, then the cached paths
            got = k(x)
            assert type(got) is type(want) and len(got) == len(want), (body.__name__, call, type(got))
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-6)
        if body is _moments:
            np.testing.assert_allclose(got.square, want.square, rtol=1e-6)
        if len(want) != 1:
            continue
        ref = want[0]
        o = np.empty_like(ref)
        outs = (o,)
        for _ in range(2):
            assert k(x, out=outs) is outs
            np.testing.assert_array_equal(o, ref)
        view = x.T.copy().T             # (a strided argument: the full path)
        got = k(view)
        assert type(got) is type(want) and len(got) == 1
        np.testing.assert_array_equal(got[0], body(view)[0])
        lowered_outputs = k.output_types(x)
        assert len(lowered_outputs) == 1
    torch = pytest.importorskip("torch")
    k = rf.kernel(_one_tuple, backend=backend)
    t = torch.from_numpy(x)
    for _ in range(3):
        got = k(t)
        assert type(got) is tuple and len(got) == 1 and isinstance(got[0], torch.Tensor)
        np.testing.assert_array_equal(got[0].numpy(), x + 1)
    single = rf.kernel(lambda a: a + 1, backend=backend)     # (a bare result stays bare)
    assert isinstance(single(x), np.ndarray) and isinstance(single(x), np.ndarray)


def _doubled(x):
    return x * 2


@pytest.mark.parametrize("backend", ("interpret", "cpu"))
def test_a_torch_out_is_written_as_torchs_in_place_ops_write_it(backend):
    """A torch out was written without bumping its version counter, so a backward that saved its old values
    silently used the new ones (a wrong gradient, no error); the version is now bumped as ``o.copy_`` bumps
    it, and autograd refuses that backward as it does for torch's own in-place ops."""
    torch = pytest.importorskip("torch")
    k = rf.kernel(_doubled, backend=backend)
    x = torch.arange(1.0, 5.0)
    o = torch.ones(4)
    w = torch.ones(4, requires_grad=True)
    saved = (w * o).sum()           # autograd saves o (ones) for w's gradient
    before = o._version
    assert k(x, out=o) is o
    assert o._version > before and torch.equal(o, x * 2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()
    # a detached tensor shares its base's counter: the optimizer-step way of writing a parameter
    with torch.no_grad():
        before = w._version
        k(x, out=w.detach())
    assert w._version > before and torch.equal(w.detach(), x * 2)


def test_a_torch_out_that_torch_would_not_let_an_in_place_op_write_is_refused():
    """An inference tensor outside inference mode was written where torch refuses ``o.copy_``; a tensor
    that requires grad was refused by the argument reader, saying to pass ``x.detach()`` but not why an out
    may not be written. Nothing is written on a refusal."""
    torch = pytest.importorskip("torch")
    k = rf.kernel(_doubled, backend="cpu")
    x = torch.arange(1.0, 5.0)
    with torch.inference_mode():
        frozen, other = torch.zeros(4), torch.zeros(4)
    with pytest.raises(RuntimeError, match="inference tensor"):
        other.copy_(x)             # (torch's own rule)
    refused(k, x, out=frozen, match=r"_doubled: out \(result 'out'\) is an inference tensor .* inside "
                                    r"torch.inference_mode\(\)")
    assert not frozen.any()
    with torch.inference_mode():
        assert k(x, out=frozen) is frozen      # where torch lets it be written
    assert torch.equal(frozen, x * 2)
    w = torch.zeros(4, requires_grad=True)
    refused(k, x, out=w, match="requires grad, a leaf, which torch does not let an in-place write change")
    refused(k, x[:2], out=w[:2], match="requires grad, a view of a leaf, which torch does not let")
    refused(k, x, out=w * 1, match="requires grad: autograd would have to record the write")
    assert not w.detach().any() and w._version == 0
