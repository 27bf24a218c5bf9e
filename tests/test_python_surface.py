"""``rf.kernel`` as Python programmers use decorators (2026-12-06): methods, wrappers, dtypes and names read by
string behave as they do for the plain function, found by a helper trying the Python surface."""
import copy
import functools
import gc
import inspect
import weakref

import numpy as np
import pytest

import redfuser as rf

BACKENDS = ("interpret", "cpu")
X = np.arange(6, dtype=np.float32).reshape(2, 3)


def _layer_class(backend):
    class Layer:
        def __init__(self, scale):
            self.scale = scale
            self.weights = np.ones(1000, np.float32)      # (what a leak would keep alive)

        @rf.kernel(backend=backend)
        def f(self, x):
            return rf.sum(x, axis=-1) * self.scale

    return Layer


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_instance_whose_kernel_method_ran_is_freed(backend):
    """The kernel kept per instance held a bound method, which held the instance: every instance that ever
    called its ``@rf.kernel`` method (and its weights) lived as long as the class. It is held weakly now."""
    Layer = _layer_class(backend)
    layers = [Layer(float(k)) for k in range(3)]
    for k, layer in enumerate(layers):
        np.testing.assert_allclose(layer.f(X), X.sum(-1) * k)
    refs = [weakref.ref(layer) for layer in layers]
    del layers, layer
    gc.collect()
    assert [r() for r in refs] == [None] * 3
    assert not Layer.f._bound


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_method_kernel_called_through_its_class_binds_its_first_argument(backend):
    """``Layer.f(layer, x)`` (as Python allows for any method, and ``map(Layer.f, layers, xs)`` does) was refused:
    'argument self must be an array'. It is ``layer.f(x)``, attributes followed; ``lower`` and ``explain`` too."""
    Layer = _layer_class(backend)
    layer = Layer(2.0)
    np.testing.assert_allclose(Layer.f(layer, X), X.sum(-1) * 2)
    layer.scale = 5.0
    np.testing.assert_allclose(Layer.f(layer, X), X.sum(-1) * 5)
    assert Layer.f(layer, X).dtype == layer.f(X).dtype
    assert "fused" in Layer.f.lower(layer, X).stages
    assert Layer.f.explain(layer, X) == layer.f.explain(X)
    with pytest.raises(rf.ArgumentError, match="must be an array"):
        Layer.f([1.0], X)       # (a list is no instance: refused as an argument, as before)


def _two_times(x):
    return x * 2.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_staticmethod_or_a_partial_kernel_is_not_bound_to_an_instance(backend):
    """``@rf.kernel`` over ``@staticmethod``, and a kernel of a partial kept as a class attribute, bound the
    instance as ``self`` when called through one ('takes 0 argument(s)'); Python binds neither."""
    class A:
        @rf.kernel(backend=backend)
        @staticmethod
        def st(x):
            return x + 1.0

        kp = rf.kernel(functools.partial(_two_times), backend=backend)

    np.testing.assert_array_equal(A().st(X), X + 1)
    np.testing.assert_array_equal(A.st(X), X + 1)
    np.testing.assert_array_equal(A().kp(X), X * 2)


def test_a_kernel_over_a_classmethod_is_refused_with_where_to_put_it():
    with pytest.raises(rf.UnsupportedError, match="put @classmethod above @rf.kernel"):
        class A:
            @rf.kernel
            @classmethod
            def f(cls, x):
                return x


def _default_eps(f):
    @functools.wraps(f)
    def wrapper(x, eps=100.0):
        return f(x, eps)
    return wrapper


def _binds_eps(f):
    @functools.wraps(f)
    def wrapper(x):
        return f(x, 2.0)
    return wrapper


@_default_eps
def _norm_default(x, eps=1.0):
    return rf.sum(x, axis=-1) + eps


@_binds_eps
def _norm_bound(x, eps=1.0):
    return rf.sum(x, axis=-1) * eps


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_wrapper_that_names_its_parameters_is_called_with_its_own(backend):
    """A ``functools.wraps`` wrapper with parameters of its own: the wrapped function's defaults were applied
    (eps 1.0 for the wrapper's 100.0), and a parameter the wrapper binds itself was asked of the caller. Python
    calls the wrapper with its own parameters; a ``*args, **kwargs`` wrapper still shows the wrapped ones."""
    np.testing.assert_allclose(rf.kernel(_norm_default, backend=backend)(X), _norm_default(X))
    np.testing.assert_allclose(rf.kernel(_norm_default, backend=backend)(X, 3.0), X.sum(-1) + 3)
    np.testing.assert_allclose(rf.kernel(_norm_bound, backend=backend)(X), X.sum(-1) * 2)
    assert list(inspect.signature(rf.kernel(_norm_bound)).parameters) == ["x"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_attributes_and_globals_read_by_string_are_followed(backend):
    """``getattr(self, "eps", 0.0)`` (the nn.Module idiom), ``vars(self)["eps"]`` and ``globals()["G"]`` read a
    name through a string: its first value was baked in and a change never seen."""
    class Norm:
        eps = 1.0

        @rf.kernel(backend=backend)
        def by_getattr(self, x):
            return rf.sum(x, axis=-1) + getattr(self, "eps", 0.0)

        @rf.kernel(backend=backend)
        def by_vars(self, x):
            return rf.sum(x, axis=-1) + vars(self)["offset"]

    n = Norm()
    n.offset = 1.0
    n.by_getattr(X), n.by_vars(X)
    n.eps, n.offset = 100.0, 50.0
    np.testing.assert_allclose(n.by_getattr(X), X.sum(-1) + 100)
    np.testing.assert_allclose(n.by_vars(X), X.sum(-1) + 50)
    globals()["_OFFSET"] = 1.0
    k = rf.kernel(_by_globals, backend=backend)
    k(X)
    globals()["_OFFSET"] = 7.0
    np.testing.assert_allclose(k(X), X.sum(-1) + 7)


_OFFSET = 1.0
_DTYPE = rf.float32


def _by_globals(x):
    return rf.sum(x, axis=-1) + globals()["_OFFSET"]


def _cast_to_global(x):
    return rf.sum(x, axis=-1).astype(_DTYPE)


def _cast_to(x, dtype):
    return rf.sum(x, axis=-1).astype(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dtype_held_by_a_global_or_passed_is_a_value(backend):
    """A global ``DTYPE = rf.float32`` was never compared (a numpy scalar type is a class, callable, taken for
    code): after ``DTYPE = rf.float16`` the kernel still returned float32. Passing the dtype was refused; it is a
    static argument now, the class and the ``np.dtype`` apart."""
    global _DTYPE
    k = rf.kernel(_cast_to_global, backend=backend)
    try:
        assert k(X).dtype == np.float32
        _DTYPE = rf.float16
        assert k(X).dtype == np.float16
    finally:
        _DTYPE = rf.float32
    k = rf.kernel(_cast_to, backend=backend)
    for dtype in (np.float16, rf.bfloat16, np.dtype(np.float32), np.dtype(np.float16)):
        got = k(X, dtype)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, _cast_to(X, dtype))
    assert k.cache_info().currsize == 4


def test_copy_of_a_kernel_is_the_kernel():
    """``copy.copy`` of a kernel not found at module level raised a PicklingError; it is the kernel, as
    ``copy.copy`` of a function is the function."""
    k = rf.kernel(lambda x: x + 1.0)
    assert copy.copy(k) is k and copy.deepcopy(k) is k


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_method_kernel_keeps_a_temporary_instance_through_its_call(backend):
    """(Found by a helper, hunt_today/01.) With the instance held weakly, ``Layer(2.0).f(x)`` freed the temporary
    as ``.f`` was looked up and the call raised a bare ReferenceError; ``obj.f`` is bound as a bound method is,
    holding the instance, and ``rf.kernel(obj.f)`` holds it too."""
    Layer = _layer_class(backend)
    np.testing.assert_allclose(Layer(2.0).f(X), X.sum(-1) * 2)
    f = Layer(3.0).f
    gc.collect()
    np.testing.assert_allclose(f(X), X.sum(-1) * 3)
    np.testing.assert_allclose(rf.kernel(Layer(4.0).f)(X), X.sum(-1) * 4)


class _Holder:
    def __init__(self, scale):
        self.scale = scale
        self.k = self.f

    @rf.kernel(backend="interpret")
    def f(self, x):
        return x * self.scale


def test_a_method_kernel_copies_and_pickles_as_a_bound_method():
    """(Found by a helper, hunt_today/02.) An object keeping ``self.k = self.f``, deep-copied, kept a ``k`` bound
    to the original (its ``scale``), and did not pickle; a bound method binds the copy, and pickles by name."""
    import pickle

    h = _Holder(2.0)
    c = copy.deepcopy(h)
    c.scale = 9.0
    np.testing.assert_array_equal(c.k(X), X * 9)
    np.testing.assert_array_equal(h.k(X), X * 2)
    p = pickle.loads(pickle.dumps(h))
    p.scale = 5.0
    np.testing.assert_array_equal(p.k(X), X * 5)
    assert copy.copy(h.k) == h.k


@pytest.mark.parametrize("backend", BACKENDS)
def test_attribute_reads_by_attrgetter_and_getattribute_are_followed(backend):
    """(Found by a helper, hunt_today/03.) ``operator.attrgetter("eps")(self)`` and ``self.__getattribute__("eps")``
    read a name through a string too: their first value was baked in."""
    import operator

    class Norm:
        eps = 1.0

        @rf.kernel(backend=backend)
        def by_attrgetter(self, x):
            return x + operator.attrgetter("eps")(self)

        @rf.kernel(backend=backend)
        def by_getattribute(self, x):
            return x + self.__getattribute__("eps")

    n = Norm()
    n.by_attrgetter(X), n.by_getattribute(X)
    n.eps = 5.0
    np.testing.assert_array_equal(n.by_attrgetter(X), X + 5)
    np.testing.assert_array_equal(n.by_getattribute(X), X + 5)


def _impl(self, x):
    return x * self.scale


class _Base:
    def __init__(self, scale):
        self.scale = scale
        self.alias = self.forward

    @rf.kernel(backend="interpret")
    def body(self, x):
        return x * self.scale

    forward = rf.kernel(_impl, backend="interpret")


class _Overriding(_Base):
    def __init__(self, scale):
        super().__init__(scale)
        self.fast = super().body     # (the base class's kernel, bound to this instance)

    def body(self, x):
        return x + 100.0


def test_a_deep_copy_binds_the_kernel_it_copies_not_a_name():
    """(Found by a helper, hunt_torch2/01-02.) A deep copy looked the kernel up by name on the copy: a subclass's
    plain ``body`` ran instead (102 for 2), and a kernel kept under another name than its function's
    (``forward = rf.kernel(_impl)``) raised AttributeError. The copy binds the class's kernel itself."""
    x = np.ones(3, np.float32)
    c = copy.deepcopy(_Overriding(2.0))
    c.scale = 3.0
    np.testing.assert_array_equal(c.fast(x), x * 3)
    np.testing.assert_array_equal(c.alias(x), x * 3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_partial_of_a_method_kernel_follows_the_instance(backend):
    """(Found by a helper, hunt_torch2/03.) ``rf.kernel(functools.partial(obj.f, ...))`` took the bound kernel's
    own ``__call__`` for the body, and the instance's attributes were baked in: the bound method is read now."""
    Layer = _layer_class(backend)
    layer = Layer(2.0)
    k = rf.kernel(functools.partial(layer.f), backend=backend)
    np.testing.assert_allclose(k(X), X.sum(-1) * 2)
    layer.scale = 5.0
    np.testing.assert_allclose(k(X), X.sum(-1) * 5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_the_methods_a_body_calls_read_is_followed(backend):
    """(Found by a helper, hunt_torch2/04.) A body calling a method of its instance (``self.norm(x)``) or the
    base class's kernel (``super().f(x)``) had that method's reads of ``self.eps`` baked in: a change was never
    seen (3.0 for 11.0). The methods the body reads by name, along the class's method order, are read too."""
    class Base:
        def __init__(self):
            self.scale, self.eps = 2.0, 1.0

        def norm(self, x):
            return x + self.eps

        @rf.kernel(backend=backend)
        def f(self, x):
            return x * self.scale

    class Sub(Base):
        @rf.kernel(backend=backend)
        def f(self, x):
            return super().f(x) + 1.0

        @rf.kernel(backend=backend)
        def g(self, x):
            return self.norm(x) * 2.0

    s = Sub()
    np.testing.assert_array_equal(s.f(X), X * 2 + 1)
    np.testing.assert_array_equal(s.g(X), (X + 1) * 2)
    s.scale, s.eps = 10.0, 5.0
    np.testing.assert_array_equal(s.f(X), X * 10 + 1)
    np.testing.assert_array_equal(s.g(X), (X + 5) * 2)
