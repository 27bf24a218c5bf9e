"""The SIMT IR: the per-thread program of one thread block (ARCHITECTURE.md sections 3 and 6).

A `SimtKernel` is what every thread of every block runs. The block is 1-d with
``warps * 32`` threads; the grid has 1 to 3 static dimensions. Statements define
SSA registers (`Reg`) of a `RegType`: a scalar or a short fixed-length vector
(``<4 x f32>``), one value *per thread*. Globals are the kernel's `Buffer`
params (flat element offsets, like the Tile IR); shared memory is a list of
static `SharedAlloc`s.

Semantics every backend implements (the simulator in `codegen/simulator` is the
executable definition; `codegen/simt_to_llvm` emits the same for nvptx64):

- Arithmetic (`Unary`, `Binary`, `IntBinary`, `Select`, `Cast`) is elementwise on
  scalars or equal-length vectors; f16/bf16/f8 are storage types only (loads,
  stores, casts, `Select`, `Pack`/`Extract`, mma operands): compute in f32.
  ``maximum`` and ``minimum`` propagate NaN; ``!=`` is true on NaN; integer
  arithmetic wraps. `IntBinary` ``div``/``rem`` truncate toward zero (C), ``shr``
  is arithmetic, shift amounts must be below the bit width. exp/log/pow are
  f32 only and within a few ulp (see `codegen.simt_to_llvm.mathlib`).
- `Bitcast` reinterprets bits between a float and an integer at least as wide
  (zero-extending float bits; keeping an integer's low bits).
- `Cast` rounds to nearest even; to f8 e4m3 it *saturates* to +-448 (NaN stays
  NaN), as ``cvt.rn.satfinite`` does; float to int truncates; to bool is ``!= 0``.
- `LoadGlobal`/`LoadShared` of a vector type read ``length`` consecutive elements
  from ``index`` (a multiple of ``length``: 16-byte vector loads need alignment);
  where `mask` is false nothing is read and the result is `other`. Stores write
  where `mask` holds. Indices count elements; i64 where they can pass 2**31.
- `Barrier` is ``bar.sync 0``: every thread of the block must reach it (never
  under divergent control flow). Shared memory is ordered only by barriers.
- `Shuffle`, `LdMatrix` and `Mma` are warp-collective: all 32 lanes of a warp
  execute them together (``shfl.sync``/``ldmatrix.sync``/``mma.sync`` with the
  full member mask). `Shuffle` follows the PTX ISA pseudo-code for ``shfl.sync``
  with segment width `width`; `LdMatrix` is ``ldmatrix.m8n8`` (see its docstring).
  `Mma` operands are the per-lane fragments of ``fragments.fragment_a/b/c``:
  vector element ``r * per_reg + j`` is element ``j`` of fragment register ``r``.
- `Wgmma` (sm_90a) is warpgroup-collective (128 threads, ``.sync.aligned``) and asynchronous: its
  result may be read only after `WgmmaCommit` and a `WgmmaWait` covering it, the first one needs a
  `WgmmaFence`, as does every register it reads that ordinary code wrote since; its shared-memory
  operands are read through descriptors (`WgmmaDescriptor` of a `SharedAddress`, byte offsets from
  `shared_offsets`) by the async proxy, so stores to them need a `FenceProxyAsync` first. Layouts:
  ``wgmma_fragments``; the simulator (`codegen/simulator/wgmma.py`) executes and checks all of it, and
  `codegen/simt_to_llvm/wgmma.py` emits it for sm_90a. `TmaLoad` copies a box of a global tensor into
  shared memory asynchronously, completing its bytes on an mbarrier (`MbarrierInit`, `MbarrierArrive`
  with ``expect_tx``, `MbarrierWait` on a phase parity); the simulator (`codegen/simulator/tma.py`) checks
  the protocol. The GPU lowering produces none of these yet (issue 21).
- `For` runs `body` for ``iv = start, start+step, ... < stop`` per thread (trip
  counts may differ between threads); `If` runs a branch for the threads whose
  `cond` holds. Both produce `results` from their yields.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from ..buffer import Buffer
from ..sizes import Size, SizeLike
from .ops import (  # noqa: F401 - re-exported: the SIMT IR in one import
    Barrier,
    Binary,
    Bitcast,
    BlockIdx,
    Cast,
    Const,
    Extract,
    IntBinary,
    LaneId,
    LdMatrix,
    LoadGlobal,
    LoadShared,
    Mma,
    Pack,
    Select,
    SharedAddress,
    Shuffle,
    StoreGlobal,
    StoreShared,
    ThreadIdx,
    Unary,
    WarpId,
    FenceProxyAsync,
    MbarrierArrive,
    MbarrierInit,
    MbarrierWait,
    TmaLoad,
    SetMaxNReg,
    Wgmma,
    WgmmaCommit,
    WgmmaDescriptor,
    WgmmaFence,
    WgmmaWait,
)
from .types import (  # noqa: F401
    BLOCK_RESERVED_SHARED_BYTES,
    MAX_DYNAMIC_SHARED_BYTES,
    MAX_STATIC_SHARED_BYTES,
    REGISTERS_PER_SM,
    SHARED_BYTES_PER_SM,
    MAX_VECTOR,
    WARP_SIZE,
    IntOp,
    MmaShape,
    Reg,
    RegType,
    Scalar,
    SharedAlloc,
    ShuffleKind,
    WgmmaShape,
)
from ..source import UNKNOWN, SourceLoc


def _loc() -> SourceLoc:
    return field(default=UNKNOWN, compare=False)  # type: ignore[return-value]


# --- structured control flow ------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Region:
    """A `For` body: induction variable, loop-carried args, statements, and the values yielded."""

    iv: Reg
    args: tuple[Reg, ...]
    stmts: tuple["Stmt", ...]
    yields: tuple[Reg, ...]


@dataclass(frozen=True, slots=True)
class For:
    """``for iv in range(start, stop, step)`` carrying `inits` -> `results` (the last yields)."""

    results: tuple[Reg, ...]
    start: Reg | int
    stop: Reg | int
    step: int
    inits: tuple[Reg, ...]
    body: Region
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Branch:
    """One side of an `If`: statements and the values it yields."""

    stmts: tuple["Stmt", ...]
    yields: tuple[Reg, ...] = ()


@dataclass(frozen=True, slots=True)
class If:
    """Threads where `cond` holds run `then`, the others `orelse`; `results` take the taken side's yields."""

    results: tuple[Reg, ...]
    cond: Reg
    then: Branch
    orelse: Branch
    loc: SourceLoc = _loc()


Stmt = Union[ThreadIdx, LaneId, WarpId, BlockIdx, Const, Unary, Binary, IntBinary, Select, Cast, Bitcast, Pack, Extract,
             LoadGlobal, StoreGlobal, LoadShared, StoreShared, Barrier, Shuffle, LdMatrix, Mma, SharedAddress,
             WgmmaDescriptor, Wgmma, WgmmaFence, WgmmaCommit, WgmmaWait, FenceProxyAsync, MbarrierInit,
             MbarrierArrive, MbarrierWait, TmaLoad, SetMaxNReg, For, If]
ELEMENTWISE = (Unary, Binary, IntBinary, Select, Cast)


def defs(s: Stmt) -> tuple[Reg, ...]:
    """The registers `s` defines (visible after it)."""
    if isinstance(s, For | If):
        return s.results
    out = getattr(s, "out", None)
    return () if out is None else (out,)


def uses(s: Stmt) -> tuple[Reg, ...]:
    """The registers `s` reads directly (for `For`/`If`: bounds, inits, condition; regions read more)."""
    read = _USES.get(type(s))
    return () if read is None else read(s)


def _regs(*values: int | Reg) -> tuple[Reg, ...]:
    """The registers among `values` (operands that may be a constant or a register)."""
    return tuple(v for v in values if isinstance(v, Reg))


def _masked(s) -> tuple[Reg, ...]:
    return () if s.mask is None else (s.mask,)


# What each statement kind reads (a table: `uses` runs for every statement of every pass).
_USES = {
    Unary: lambda s: (s.x,), Cast: lambda s: (s.x,), Bitcast: lambda s: (s.x,),
    Binary: lambda s: (s.a, s.b), IntBinary: lambda s: (s.a, s.b),
    Select: lambda s: (s.cond, s.a, s.b),
    Pack: lambda s: s.parts,
    Extract: lambda s: (s.vec,),
    LoadGlobal: lambda s: (s.index,) + _masked(s), LoadShared: lambda s: (s.index,) + _masked(s),
    LdMatrix: lambda s: (s.index,),
    StoreGlobal: lambda s: (s.index, s.value) + _masked(s), StoreShared: lambda s: (s.index, s.value) + _masked(s),
    Shuffle: lambda s: (s.value, s.lane) if isinstance(s.lane, Reg) else (s.value,),
    Mma: lambda s: (s.a, s.b, s.c),
    WgmmaDescriptor: lambda s: (s.address,),
    Wgmma: lambda s: tuple(r for r in (s.a, s.a_desc, s.b_desc, s.c) if r is not None),
    MbarrierArrive: lambda s: _regs(s.index),
    MbarrierWait: lambda s: _regs(s.index, s.parity),
    TmaLoad: lambda s: s.coords + _regs(s.dst_index, s.barrier_index),
    For: lambda s: tuple(v for v in (s.start, s.stop) if isinstance(v, Reg)) + s.inits,
    If: lambda s: (s.cond,),
}


def walk_stmts(stmts: tuple[Stmt, ...]):
    """Every statement, nested regions included (pre-order)."""
    for s in stmts:
        yield s
        if isinstance(s, For):
            yield from walk_stmts(s.body.stmts)
        elif isinstance(s, If):
            yield from walk_stmts(s.then.stmts)
            yield from walk_stmts(s.orelse.stmts)


@dataclass(frozen=True, slots=True)
class SimtKernel:
    """One launch: `grid` blocks of ``warps * 32`` threads running `body`.

    `params` are the kernel arguments in order: global `Buffer`s and scalar `Reg`s
    (uniform values defined for the whole body). A shape-polymorphic kernel's run-time
    extents are scalar params: `sizes` names each one's register and its `Size`, which the
    runtime evaluates per launch, as it does a `grid` dimension that is a `Size`.

    `dynamic_shared`: the `shared` allocations live in the launch's dynamic shared memory
    (`shared_bytes` of it, at the same offsets) instead of static ``.shared`` arrays: a kernel
    needing more than `MAX_STATIC_SHARED_BYTES` (up to `MAX_DYNAMIC_SHARED_BYTES`, sm_90a only).
    """

    name: str
    params: tuple[Buffer | Reg, ...]
    warps: int
    grid: tuple[SizeLike, ...]
    shared: tuple[SharedAlloc, ...]
    body: tuple[Stmt, ...]
    loc: SourceLoc = _loc()
    min_blocks_per_sm: int | None = None   # `.minnctapersm`: ptxas keeps registers low enough for this many
    sizes: tuple[tuple[str, Size], ...] = ()
    dynamic_shared: bool = False

    @property
    def threads(self) -> int:
        return self.warps * WARP_SIZE

    @property
    def num_blocks(self) -> SizeLike:
        n: SizeLike = 1
        for g in self.grid:
            n *= g
        return n

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return tuple(p for p in self.params if isinstance(p, Buffer))

    def buffer(self, name: str) -> Buffer:
        """The kernel's buffer parameter called `name`: the one a statement names, at this launch's lengths
        where the kernel was made for them (`codegen.simt.run.at_lengths` replaces the parameters, not the
        statements, of a shape-polymorphic kernel)."""
        return next(p for p in self.params if isinstance(p, Buffer) and p.name == name)

    @property
    def scalars(self) -> tuple[Reg, ...]:
        return tuple(p for p in self.params if isinstance(p, Reg))

    @property
    def shared_bytes(self) -> int:
        """Static shared memory of one block: the allocations in order, each at a multiple of its alignment
        (`shared_offsets`), the total rounded up to 16 bytes."""
        end = 0
        for a, offset in zip(self.shared, shared_offsets(self.shared).values()):
            end = offset + a.nbytes
        return -(-end // 16) * 16

    def __str__(self) -> str:
        from .printer import format_simt_kernel

        return format_simt_kernel(self)


def shared_offsets(allocs: tuple[SharedAlloc, ...]) -> dict[str, int]:
    """Each allocation's byte offset in the block's shared memory: in order, each at the next multiple of its
    `align` (16 by default) after the previous one's end. A `SharedAddress` is this offset."""
    out: dict[str, int] = {}
    end = 0
    for a in allocs:
        start = -(-end // a.align) * a.align
        out[a.name] = start
        end = start + a.nbytes
    return out
