"""The IR of RedFuser, one subpackage per level: `loop` (traced and fused loop nests), `tile` (what the
scheduler builds) and `simt` (the per-thread GPU program), each with its nodes, printer and verifier.

At this top level sits what every level shares: `types` (dtypes, buffer types), `buffer`, `errors`,
`source` (source locations), `excerpt` (the IR around a verifier error), `array_memory`, `semantics`
(each op and its numpy meaning) and `topk` (top-k's order). This package re-exports those and the Loop
IR, the level users build and run. `redfuser.ir` depends on nothing else of RedFuser's.
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
from .buffer import Buffer
from .loop.expr import (
    Axis,
    Binary,
    Cast,
    Computed,
    Const,
    Expr,
    IndexExpr,
    IndexValue,
    Length,
    Load,
    Select,
    Strided,
    Unary,
    children,
    index_axes,
    reads_axis,
    shift_index,
    strided,
    loads,
    walk,
)
from .loop.interpreter import run_program, run_stmt
from .loop.nodes import Compute, FusedLoop, OnlineState, Program, Reduce, Stmt, TopK, TopKState, written
from .loop.printer import format_expr, format_program, format_stmt
from .loop.rewrite import compared_branch, decided, map_expr, rename_buffers, rounded
from .loop.index import rename_loop_indices
from .semantics import BinaryOp, ReduceOp, UnaryOp
from .source import UNKNOWN, SourceLoc
from .types import ALL_DTYPES, BufferType, DType, from_numpy
from .loop.verifier import verify_program
