"""The IR of RedFuser: types, Loop IR nodes, printer, verifier and the numpy interpreter.

`redfuser.ir` depends on nothing else of RedFuser's.
"""
from .errors import (
    ArgumentError,
    BackendError,
    CompileError,
    CudaError,
    DTypeError,
    InternalError,
    RedFuserError,
    ShapeError,
    SimulationError,
    TracerBoolError,
    UnknownNameError,
    UnsupportedError,
    VerifyError,
)
from .expr import (
    Axis,
    Binary,
    BinaryOp,
    Buffer,
    Cast,
    Const,
    Expr,
    IndexExpr,
    IndexValue,
    Load,
    ReduceOp,
    Select,
    Unary,
    UnaryOp,
    children,
    loads,
    walk,
)
from .interpreter import run_program, run_stmt
from .loop import Compute, FusedLoop, OnlineState, Program, Reduce, Stmt, TopK, TopKState, written
from .printer import format_expr, format_program, format_stmt
from .rewrite import map_expr, rename_buffers
from .source import UNKNOWN, SourceLoc
from .types import ALL_DTYPES, BufferType, DType, from_numpy
from .verifier import verify_program
