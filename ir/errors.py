"""The one error hierarchy of RedFuser (re-exported as ``redfuser.RedFuserError`` & co.).

It lives in `ir` because `ir` depends on nothing of ours and every layer raises
these. User errors carry the user's source location and print it with the
source line; internal errors name the pass and show the IR around the fault.
"""
from __future__ import annotations

from .source import SourceLoc


class RedFuserError(Exception):
    """Base of every error RedFuser raises on purpose."""


def render_user_error(message: str, op: str | None, loc: SourceLoc | None) -> str:
    """``op: message``, then the user's ``file:line`` and the source line underlined, when known."""
    text = f"{op}: {message}" if op else message
    if loc is not None and loc.line:
        text += f"\n  at {loc.file}:{loc.line}"
        if loc.text.strip():
            stripped = loc.text.rstrip()
            indent = len(stripped) - len(stripped.lstrip())
            text += f"\n    {stripped.strip()}\n    {'^' * max(1, len(stripped) - indent)}"
    return text


class CompileError(RedFuserError):
    """A problem in the user's kernel, found while tracing or compiling it.

    `op` names the operation (``matmul``, ``sum``...), `loc` the user's line.
    """

    def __init__(self, message: str, *, op: str | None = None, loc: SourceLoc | None = None) -> None:
        self.message = message
        self.op = op
        self.loc = loc
        super().__init__(render_user_error(message, op, loc))


class ShapeError(CompileError):
    """Shapes that do not fit: broadcasting, matmul, axes, reshapes."""


class DTypeError(CompileError):
    """A dtype the op does not accept, or two dtypes with no common type."""


class UnsupportedError(CompileError):
    """Something outside RedFuser's subset: a numpy function, an op, an argument kind."""


class UnknownNameError(UnsupportedError, AttributeError):
    """``rf.<name>`` for a name the redfuser namespace does not have (an `AttributeError` too, so
    ``hasattr`` and ``getattr(rf, name, default)`` keep working)."""


class TracerBoolError(CompileError):
    """Python control flow (``if``, ``while``, ``and``...) on a traced value."""


class ArgumentError(CompileError):
    """A kernel called with the wrong number or kind of arguments."""


class BackendError(RedFuserError):
    """A backend that is unknown, not built yet, or not usable on this machine (with the user's line where
    the user named it)."""

    def __init__(self, message: str, *, op: str | None = None, loc: SourceLoc | None = None) -> None:
        self.message = message
        self.op = op
        self.loc = loc
        super().__init__(render_user_error(message, op, loc))


class InternalError(RedFuserError):
    """A bug in RedFuser: a pass produced IR that breaks an invariant."""

    def __init__(self, message: str, *, pass_name: str = "", context: str = "") -> None:
        self.pass_name = pass_name
        text = f"internal error{f' after pass {pass_name}' if pass_name else ''}: {message}"
        if context:
            text += "\n" + "\n".join("    " + line for line in context.splitlines())
        super().__init__(text)


class VerifyError(InternalError):
    """The IR verifier found a broken invariant."""


class CudaError(BackendError):
    """A CUDA driver call failed: `call` (``cuMemAlloc``...), the driver's `error_name` and message."""

    def __init__(self, call: str, error_name: str, error_message: str) -> None:
        self.call = call
        self.error_name = error_name
        self.error_message = error_message
        super().__init__(f"{call} failed: {error_name}: {error_message}")


class SimulationError(RedFuserError):
    """The SIMT simulator caught a kernel doing something the GPU would not do reliably.

    `kind` is one of ``out_of_bounds``, ``misaligned``, ``race``, ``uninitialized``,
    ``divergent_barrier``, ``divergent_warp_op``, ``argument``; `stmt` is the
    printed SIMT statement at fault (empty when none).
    """

    def __init__(self, kind: str, message: str, *, kernel: str = "", stmt: str = "") -> None:
        self.kind, self.kernel, self.stmt = kind, kernel, stmt
        text = f"{kind.replace('_', ' ')}{f' in kernel {kernel}' if kernel else ''}: {message}"
        super().__init__(text + (f"\n  at: {stmt.strip()}" if stmt else ""))
