"""Leaf statements of the SIMT IR: thread coordinates, constants, arithmetic, memory, warp ops.

Their semantics are in `simt.py`'s docstring; `simt.py` re-exports every class here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..semantics import BinaryOp, UnaryOp
from ..buffer import Buffer
from .types import IntOp, MmaShape, Reg, Scalar, SharedAlloc, ShuffleKind, WARP_SIZE, WgmmaShape
from ..source import UNKNOWN, SourceLoc


def _loc() -> SourceLoc:
    return field(default=UNKNOWN, compare=False)  # type: ignore[return-value]


# --- thread coordinates and constants ----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ThreadIdx:
    """``%tid.x``: this thread's index in the block, ``0 <= tid < warps * 32`` (i32)."""

    out: Reg
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class LaneId:
    """This thread's lane in its warp, ``tid % 32`` (i32)."""

    out: Reg
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class WarpId:
    """This thread's warp in the block, ``tid / 32`` (i32)."""

    out: Reg
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class BlockIdx:
    """``%ctaid.<axis>``: the block's index along grid dimension `axis` (0, 1, 2 = x, y, z; i32)."""

    out: Reg
    axis: int
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Const:
    """`value` in every thread (and every vector element)."""

    out: Reg
    value: Scalar
    loc: SourceLoc = _loc()


# --- arithmetic -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Unary:
    out: Reg
    op: UnaryOp
    x: Reg
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Binary:
    """``a op b`` with the Loop IR's ops; comparisons give bool."""

    out: Reg
    op: BinaryOp
    a: Reg
    b: Reg
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class IntBinary:
    """Integer ``div``/``rem``/shifts/bitwise ops for index arithmetic."""

    out: Reg
    op: IntOp
    a: Reg
    b: Reg
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Select:
    """``cond ? a : b``; a scalar `cond` selects whole vectors."""

    out: Reg
    cond: Reg
    a: Reg
    b: Reg
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Cast:
    """`x` converted to `out`'s dtype, elementwise (see the module docstring for rounding)."""

    out: Reg
    x: Reg
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Bitcast:
    """The bit pattern of `x` as `out`'s dtype: between a float and an integer at least as wide, elementwise.

    float -> int zero-extends the float's bits (``f32 -> i32`` reinterprets; an e4m3 byte gives 0..255);
    int -> float keeps the low bits (``i32 -> f8e4m3`` takes the low byte). Software float conversions
    (float8_e4m3fn without sm_89's ``cvt``) and 64-bit values crossing lanes as two i32 words use it.
    """

    out: Reg
    x: Reg
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Pack:
    """The concatenation of `parts` (scalars or vectors of `out`'s dtype) into one vector."""

    out: Reg
    parts: tuple[Reg, ...]
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Extract:
    """Element `index` of vector `vec`; or, when `out` is a vector, elements ``index .. index+len-1``."""

    out: Reg
    vec: Reg
    index: int
    loc: SourceLoc = _loc()


# --- memory ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LoadGlobal:
    """``buffer.flat[index : index + len(out)]`` where `mask` (None: always), `other` elsewhere."""

    out: Reg
    buffer: Buffer
    index: Reg
    mask: Reg | None = None
    other: Scalar = 0
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class StoreGlobal:
    """``buffer.flat[index : index + len(value)] = value`` where `mask` (None: always)."""

    buffer: Buffer
    index: Reg
    value: Reg
    mask: Reg | None = None
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class LoadShared:
    """``alloc.flat[index : index + len(out)]`` where `mask`, `other` elsewhere."""

    out: Reg
    alloc: SharedAlloc
    index: Reg
    mask: Reg | None = None
    other: Scalar = 0
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class StoreShared:
    """``alloc.flat[index : index + len(value)] = value`` where `mask`."""

    alloc: SharedAlloc
    index: Reg
    value: Reg
    mask: Reg | None = None
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Barrier:
    """``bar.sync 0``: all threads of the block meet here; orders shared and global memory."""

    loc: SourceLoc = _loc()


# --- warp-collective ops ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Shuffle:
    """``shfl.sync.<kind>`` of an f32/i32 `value` over segments of `width` lanes.

    `lane` is the xor mask (bfly), source lane (idx) or offset (down): a register or a constant.
    """

    out: Reg
    kind: ShuffleKind
    value: Reg
    lane: Reg | int
    width: int = WARP_SIZE
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class LdMatrix:
    """``ldmatrix.sync.aligned.m8n8.x<count>[.trans].shared.b16``: `count` 8x8 matrices of a 16-bit `alloc`.

    Lane ``8 m + r`` gives in `index` where row ``r`` of matrix ``m`` starts: 8 consecutive elements, the
    index a multiple of 8 (16 bytes); lanes past ``8 count`` give none. Lane ``4 r + w`` receives, for
    each matrix ``m``, elements ``2 m, 2 m + 1`` of `out`: row ``r``, columns ``2 w, 2 w + 1`` of the
    matrix, or of its transpose with `trans` (rows ``2 w, 2 w + 1``, column ``r``).
    """

    out: Reg
    alloc: SharedAlloc
    index: Reg
    count: int
    trans: bool = False
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Mma:
    """``D = A·B + C`` on a warp's fragments (`shape` names the instruction); `out` is D."""

    out: Reg
    shape: MmaShape
    a: Reg
    b: Reg
    c: Reg
    loc: SourceLoc = _loc()


# --- Hopper's asynchronous warpgroup MMA (sm_90a; ir/simt/wgmma_fragments.py has the layouts) ----------

@dataclass(frozen=True, slots=True)
class SharedAddress:
    """The shared-memory byte address (i32) of element 0 of `alloc` (`nodes.shared_offsets`)."""

    out: Reg
    alloc: SharedAlloc
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class WgmmaDescriptor:
    """The 64-bit matrix descriptor (i64) of an operand tile at byte `address` (a register): `leading` and
    `stride` byte offsets, the `swizzle` mode's number (`wgmma_fragments.Swizzle`), base offset 0."""

    out: Reg
    address: Reg
    leading: int
    stride: int
    swizzle: int
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Wgmma:
    """``wgmma.mma_async``: D (`out`) = A·B + C (`c`) over the warpgroup, issued asynchronously.

    A is the register fragment `a` or the K-major shared tile of descriptor `a_desc` (exactly one of them);
    B the shared tile of descriptor `b_desc`: K-major (N rows of K), or with `b_mn_major` (the instruction's
    imm-trans-b, 16-bit types only) N-major (K rows of N: a row-major ``[K, N]`` tile, as ``V`` is in
    ``P @ V``). `c` None is the instruction's scale-d predicate false: D = A·B. D takes C's registers: `c` is dead after the issue, and D may be read only
    after a `WgmmaWait` that covers its commit group (another `Wgmma` may take it as its C before that:
    accumulator chaining)."""

    out: Reg
    shape: WgmmaShape
    a: Reg | None
    a_desc: Reg | None
    b_desc: Reg
    c: Reg | None
    b_mn_major: bool = False
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class WgmmaFence:
    """``wgmma.fence.sync.aligned``: orders earlier register writes before the next `Wgmma` reads them."""

    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class WgmmaCommit:
    """``wgmma.commit_group.sync.aligned``: the issued, uncommitted `Wgmma`s become one group."""

    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class WgmmaWait:
    """``wgmma.wait_group.sync.aligned N``: waits until at most `pending` committed groups are in flight."""

    pending: int
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class FenceProxyAsync:
    """``fence.proxy.async.shared::cta``: makes this thread's earlier shared-memory stores (generic proxy)
    visible to the async proxy that `Wgmma` (and TMA) read through."""

    loc: SourceLoc = _loc()


# --- TMA and mbarriers (sm_90) ------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MbarrierInit:
    """``mbarrier.init.shared.b64``: barrier `index` of the i64 allocation `alloc` expects `count` arrivals a
    phase; its phase bit starts at 0 and its transaction count at 0."""

    alloc: SharedAlloc
    index: int
    count: int
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class MbarrierArrive:
    """``mbarrier.arrive[.expect_tx].shared.b64``: each executing thread adds `tx_bytes` to the transaction
    count it expects (0: a plain arrive), then arrives. A phase completes when all its arrivals are in and
    the transaction count is back to 0; the phase bit then flips. `index` may be an i32 register, the same in
    every executing thread (a ring's stage)."""

    alloc: SharedAlloc
    index: int | Reg
    tx_bytes: int = 0
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class MbarrierWait:
    """``mbarrier.try_wait.parity`` in a loop: waits until the phase of parity `parity` (a register or 0/1)
    has completed, that is until the barrier's phase bit differs from it. `index`: as `MbarrierArrive`'s."""

    alloc: SharedAlloc
    index: int | Reg
    parity: Reg | int
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class TmaLoad:
    """``cp.async.bulk.tensor.Nd.shared::cluster.global.tile.mbarrier::complete_tx::bytes``: each executing
    thread copies the `box` (outermost dimension first) of the global tensor `src` at element `coords` (one
    register per dimension, outermost first) into `dst` from element `dst_index` on, rows of the box
    stored one after another and swizzled by `swizzle` (`wgmma_fragments.Swizzle`'s number); elements
    outside `src` read as 0. The copy's bytes complete transactions on barrier `barrier_index` of
    `barrier`, and `dst` may be read only after a wait on that barrier sees the phase complete. `dst_index`
    and `barrier_index` may be i32 registers (a ring's stage picks its tile and its barrier at run time)."""

    dst: SharedAlloc
    dst_index: int | Reg
    src: Buffer
    coords: tuple[Reg, ...]
    box: tuple[int, ...]
    swizzle: int
    barrier: SharedAlloc
    barrier_index: int | Reg
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class SetMaxNReg:
    """``setmaxnreg.{inc,dec}.sync.aligned.u32 count`` (sm_90a): the executing warpgroup's per-thread
    register budget becomes `count` (24 to 256, a multiple of 8); warp specialization gives a producer
    warpgroup few registers and the consumers many."""

    count: int
    increase: bool
    loc: SourceLoc = _loc()
