"""A kernel's body bound to an instance: kept without keeping it alive (`WeakMethod`), bound as a method (`BoundKernel`).

``@rf.kernel`` on a method makes one kernel per instance (`Kernel.__get__`), kept by the class's kernel while
the instance lives. A bound method (``types.MethodType``) holds its instance: the kernel kept for an instance
would keep that instance, its weights and buffers, for as long as the class lives. A `WeakMethod` is the
bound method with a weak reference to its instance, so an instance is freed as it is without a kernel.
"""
from __future__ import annotations

import inspect
import types
from typing import Any, Callable


class WeakMethod:
    """`function` bound to an instance through `ref` (a ``weakref.ref``, or a function returning the instance
    where it cannot be weakly referenced): called, it calls ``function(instance, *args, **kwargs)``, as a bound
    method does. Its signature, name and code are the bound method's (what a kernel reads of its body; its
    qualified name, module and docstring are read from `__func__`, where `Kernel` copies them from)."""

    __slots__ = ("__func__", "_ref", "__signature__")

    def __init__(self, function: types.FunctionType, instance: object, ref: Callable[[], object]) -> None:
        self.__func__ = function
        self._ref = ref
        self.__signature__ = inspect.signature(types.MethodType(function, instance))

    @property
    def __self__(self) -> object:
        """The instance; `ReferenceError` once it was freed (no call can reach a freed instance's kernel)."""
        instance = self._ref()
        if instance is None:
            raise ReferenceError(f"the instance {self.__func__.__qualname__} was bound to no longer exists")
        return instance

    @property
    def __code__(self) -> types.CodeType:
        return self.__func__.__code__

    @property
    def __name__(self) -> str:
        return self.__func__.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__(self.__self__, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<method {self.__func__.__qualname__} of {self._ref()!r}>"


class BoundKernel:
    """``obj.body`` for an ``@rf.kernel`` method: the instance's kernel (`Kernel.__get__`: made once for each
    instance, compiled specializations and all, holding the instance weakly) bound to the instance as a bound
    method is. It holds the instance, so ``Layer(2.0).body(x)`` keeps its temporary alive through the call; it
    is equal to another for the same instance and kernel, and copies and pickles as a bound method does: a
    deep copy binds the class's kernel (`source`) to the copied instance (``copy.deepcopy`` of an object keeping
    ``self.k = self.body`` binds the copy's own), a pickle looks the kernel up by name on the instance. Every
    other attribute is the instance's kernel's (``lower``, ``explain``, ``cache_info``, ``options``)."""

    __slots__ = ("__self__", "_kernel", "_source")

    def __init__(self, kernel: Any, instance: object, source: Any) -> None:
        self._kernel = kernel
        self.__self__ = instance
        self._source = source

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._kernel(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in BoundKernel.__slots__:    # (not set yet: an object made without __init__, as a copier may)
            raise AttributeError(name)
        return getattr(self._kernel, name)

    def method(self) -> types.MethodType:
        """The bound method this is the kernel of (it holds the instance)."""
        return types.MethodType(self._source.__wrapped__, self.__self__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BoundKernel) and other._kernel is self._kernel and other.__self__ is self.__self__

    def __hash__(self) -> int:
        return hash((id(self._kernel), id(self.__self__)))

    def __repr__(self) -> str:
        return f"<bound redfuser.kernel {self._kernel.__qualname__} of {self.__self__!r}>"

    def __reduce__(self) -> tuple:
        return (getattr, (self.__self__, self._kernel.__name__))

    def __copy__(self) -> "BoundKernel":
        return self

    def __deepcopy__(self, memo: dict) -> object:
        import copy

        return self._source.__get__(copy.deepcopy(self.__self__, memo), type(self.__self__))


__all__ = ["BoundKernel", "WeakMethod"]
