"""A kernel's body bound to an instance without keeping the instance alive (`WeakMethod`).

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


__all__ = ["WeakMethod"]
