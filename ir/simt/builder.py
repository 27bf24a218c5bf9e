"""`SimtBuilder`: build a `SimtKernel` statement by statement, with fresh register names.

    b = SimtBuilder("scale", warps=2, grid=(4,))
    x, out = b.buffer("x", float32, (256,)), b.buffer("out", float32, (256,))
    i = b.add(b.mul(b.block_idx(), b.const(64, int32)), b.thread_idx())
    b.store_global(out, i, b.mul(b.load_global(x, i), b.const(2.0, float32)))
    kernel = b.build()                      # verified

Regions are callables: ``b.for_(0, n, 4, [acc0], lambda iv, acc: [b.add(acc, ...)])``
returns the loop's results; ``b.if_(cond, then, orelse)`` the if's.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..errors import InternalError
from ..semantics import BinaryOp, UnaryOp
from ..buffer import Buffer
from .nodes import (
    Barrier, Binary, Bitcast, BlockIdx, Branch, Cast, Const, Extract, For, If, IntBinary, IntOp, LaneId, LdMatrix,
    LoadGlobal, LoadShared, Mma, MmaShape, Pack, Reg, RegType, Region, Scalar, Select, SharedAlloc, Shuffle, ShuffleKind,
    SimtKernel, Stmt, StoreGlobal, StoreShared, ThreadIdx, Unary, WarpId, FenceProxyAsync, SharedAddress, Wgmma,
    WgmmaCommit, WgmmaDescriptor, WgmmaFence, WgmmaShape, WgmmaWait, MbarrierArrive, MbarrierInit, MbarrierWait,
    TmaLoad, SetMaxNReg,
)
from .verifier import verify_simt_kernel
from ..types import BufferType, DType, bool_, int32, int64


class SimtBuilder:
    """Accumulates params, shared allocations and statements; `build` returns the verified kernel."""

    def __init__(self, name: str, *, warps: int, grid: tuple[int, ...]) -> None:
        self.name, self.warps, self.grid = name, warps, tuple(grid)
        self.params: list[Buffer | Reg] = []
        self.shared_allocs: list[SharedAlloc] = []
        self._blocks: list[list[Stmt]] = [[]]
        self._names: dict[str, int] = {}
        self._taken: set[str] = set()

    # --- declarations ------------------------------------------------------------------------

    def fresh(self, hint: str, type_: RegType) -> Reg:
        """A register named `hint` (``hint_1``, ``hint_2``... when taken)."""
        n, name = self._names.get(hint, 0), hint
        while name in self._taken:
            n += 1
            name = f"{hint}_{n}"
        self._names[hint] = n
        self._taken.add(name)
        return Reg(name, type_)

    def buffer(self, name: str, dtype: DType, shape: tuple[int, ...]) -> Buffer:
        buf = Buffer(name, BufferType(dtype, tuple(shape)))
        self.params.append(buf)
        return buf

    def scalar_param(self, name: str, dtype: DType) -> Reg:
        reg = self.fresh(name, RegType(dtype))
        self.params.append(reg)
        return reg

    def shared(self, name: str, dtype: DType, shape: tuple[int, ...], align: int = 16) -> SharedAlloc:
        alloc = SharedAlloc(name, BufferType(dtype, tuple(shape)), align)
        self.shared_allocs.append(alloc)
        return alloc

    def emit(self, s: Stmt) -> Stmt:
        self._blocks[-1].append(s)
        return s

    def _def(self, make: Callable[[Reg], Stmt], hint: str, type_: RegType) -> Reg:
        out = self.fresh(hint, type_)
        self.emit(make(out))
        return out

    # --- thread coordinates, constants, arithmetic -----------------------------------------------

    def thread_idx(self) -> Reg:
        return self._def(ThreadIdx, "tid", RegType(int32))

    def lane_id(self) -> Reg:
        return self._def(LaneId, "lane", RegType(int32))

    def warp_id(self) -> Reg:
        return self._def(WarpId, "warp", RegType(int32))

    def block_idx(self, axis: int = 0) -> Reg:
        return self._def(lambda o: BlockIdx(o, axis), f"bid{'xyz'[axis] if 0 <= axis < 3 else axis}", RegType(int32))

    def const(self, value: Scalar, dtype: DType, length: int = 1) -> Reg:
        return self._def(lambda o: Const(o, value), "c", RegType(dtype, length))

    def unary(self, op: UnaryOp, x: Reg) -> Reg:
        return self._def(lambda o: Unary(o, op, x), op.name.lower(), x.type)

    def binary(self, op: BinaryOp, a: Reg, b: Reg) -> Reg:
        out_type = a.type.with_dtype(bool_) if op.is_comparison else a.type
        return self._def(lambda o: Binary(o, op, a, b), op.name.lower(), out_type)

    def add(self, a: Reg, b: Reg) -> Reg:
        return self.binary(BinaryOp.ADD, a, b)

    def sub(self, a: Reg, b: Reg) -> Reg:
        return self.binary(BinaryOp.SUB, a, b)

    def mul(self, a: Reg, b: Reg) -> Reg:
        return self.binary(BinaryOp.MUL, a, b)

    def lt(self, a: Reg, b: Reg) -> Reg:
        return self.binary(BinaryOp.LT, a, b)

    def eq(self, a: Reg, b: Reg) -> Reg:
        return self.binary(BinaryOp.EQ, a, b)

    def int_op(self, op: IntOp, a: Reg, b: Reg) -> Reg:
        return self._def(lambda o: IntBinary(o, op, a, b), op.value, a.type)

    def select(self, cond: Reg, a: Reg, b: Reg) -> Reg:
        return self._def(lambda o: Select(o, cond, a, b), "sel", a.type)

    def cast(self, x: Reg, dtype: DType) -> Reg:
        return self._def(lambda o: Cast(o, x), f"{x.name}_{dtype}", x.type.with_dtype(dtype))

    def bitcast(self, x: Reg, dtype: DType) -> Reg:
        """`x`'s bits as `dtype` (see `Bitcast`)."""
        return self._def(lambda o: Bitcast(o, x), f"{x.name}_bits" if dtype.is_int else f"{x.name}_{dtype}",
                         x.type.with_dtype(dtype))

    def pack(self, parts: Sequence[Reg]) -> Reg:
        length = sum(p.length for p in parts)
        return self._def(lambda o: Pack(o, tuple(parts)), "pack", RegType(parts[0].dtype, length))

    def extract(self, vec: Reg, index: int, length: int = 1) -> Reg:
        return self._def(lambda o: Extract(o, vec, index), f"{vec.name}_{index}", RegType(vec.dtype, length))

    # --- memory and warp ops ------------------------------------------------------------------

    def load_global(self, buf: Buffer, index: Reg, *, length: int = 1, mask: Reg | None = None,
                    other: Scalar = 0) -> Reg:
        return self._def(lambda o: LoadGlobal(o, buf, index, mask, other), buf.name, RegType(buf.dtype, length))

    def store_global(self, buf: Buffer, index: Reg, value: Reg, *, mask: Reg | None = None) -> None:
        self.emit(StoreGlobal(buf, index, value, mask))

    def load_shared(self, alloc: SharedAlloc, index: Reg, *, length: int = 1, mask: Reg | None = None,
                    other: Scalar = 0) -> Reg:
        return self._def(lambda o: LoadShared(o, alloc, index, mask, other), alloc.name, RegType(alloc.dtype, length))

    def store_shared(self, alloc: SharedAlloc, index: Reg, value: Reg, *, mask: Reg | None = None) -> None:
        self.emit(StoreShared(alloc, index, value, mask))

    def barrier(self) -> None:
        self.emit(Barrier())

    def shuffle(self, kind: ShuffleKind, value: Reg, lane: Reg | int, width: int = 32) -> Reg:
        return self._def(lambda o: Shuffle(o, kind, value, lane, width), f"shfl_{kind.value}", value.type)

    def ldmatrix(self, alloc: SharedAlloc, index: Reg, count: int, *, trans: bool = False) -> Reg:
        """`count` 8x8 matrices of `alloc` (see `LdMatrix`): ``2 count`` elements per lane."""
        return self._def(lambda o: LdMatrix(o, alloc, index, count, trans), alloc.name, RegType(alloc.dtype, 2 * count))

    def mma(self, shape: MmaShape, a: Reg, b: Reg, c: Reg) -> Reg:
        return self._def(lambda o: Mma(o, shape, a, b, c), "mma", shape.c_type)

    # --- Hopper's warpgroup MMA (sm_90a) -------------------------------------------------------------

    def shared_address(self, alloc: SharedAlloc) -> Reg:
        return self._def(lambda o: SharedAddress(o, alloc), f"{alloc.name}_addr", RegType(int32))

    def wgmma_descriptor(self, address: Reg, *, leading: int, stride: int, swizzle: int) -> Reg:
        return self._def(lambda o: WgmmaDescriptor(o, address, leading, stride, swizzle), "desc", RegType(int64))

    def wgmma(self, shape: WgmmaShape, *, b_desc: Reg, c: Reg | None = None, a: Reg | None = None,
              a_desc: Reg | None = None, b_mn_major: bool = False) -> Reg:
        return self._def(lambda o: Wgmma(o, shape, a, a_desc, b_desc, c, b_mn_major), "acc", shape.c_type)

    def wgmma_fence(self) -> None:
        self.emit(WgmmaFence())

    def wgmma_commit(self) -> None:
        self.emit(WgmmaCommit())

    def wgmma_wait(self, pending: int = 0) -> None:
        self.emit(WgmmaWait(pending))

    def fence_proxy_async(self) -> None:
        self.emit(FenceProxyAsync())

    def mbarrier_init(self, alloc: SharedAlloc, index: int, count: int) -> None:
        self.emit(MbarrierInit(alloc, index, count))

    def mbarrier_arrive(self, alloc: SharedAlloc, index: int | Reg, tx_bytes: int = 0) -> None:
        self.emit(MbarrierArrive(alloc, index, tx_bytes))

    def mbarrier_wait(self, alloc: SharedAlloc, index: int | Reg, parity: Reg | int) -> None:
        self.emit(MbarrierWait(alloc, index, parity))

    def tma_load(self, dst: SharedAlloc, dst_index: int | Reg, src: Buffer, coords: Sequence[Reg],
                 box: Sequence[int], *, swizzle: int, barrier: SharedAlloc, barrier_index: int | Reg) -> None:
        self.emit(TmaLoad(dst, dst_index, src, tuple(coords), tuple(box), swizzle, barrier, barrier_index))

    def set_max_nreg(self, count: int, *, increase: bool) -> None:
        self.emit(SetMaxNReg(count, increase))

    def butterfly(self, value: Reg, combine: Callable[[Reg, Reg], Reg], width: int = 32) -> Reg:
        """All-reduce over groups of `width` lanes: log2(width) ``shfl.bfly`` steps, `combine` the monoid."""
        offset = width // 2
        while offset:
            value = combine(value, self.shuffle(ShuffleKind.BFLY, value, offset, width))
            offset //= 2
        return value

    # --- regions ---------------------------------------------------------------------------------

    def _region(self, body: Callable[[], Sequence[Reg] | None]) -> tuple[tuple[Stmt, ...], tuple[Reg, ...]]:
        self._blocks.append([])
        yields = tuple(body() or ())
        return tuple(self._blocks.pop()), yields

    def for_(self, start: Reg | int, stop: Reg | int, step: int, inits: Sequence[Reg],
             body: Callable[..., Sequence[Reg] | None], *, iv_type: RegType | None = None,
             names: Sequence[str] | None = None, iv_name: str = "iv") -> list[Reg]:
        """``for iv in range(start, stop, step)``; ``body(iv, *args)`` emits the body and returns the yields.

        `names` name the carried values (``acc`` gives ``%acc_run`` inside, ``%acc`` after the loop).
        """
        bound = next((v for v in (start, stop) if isinstance(v, Reg)), None)
        iv = self.fresh(iv_name, iv_type or (bound.type if bound is not None else RegType(int32)))
        hints = list(names) if names is not None else [r.name for r in inits]
        args = [self.fresh(f"{h}_run", r.type) for h, r in zip(hints, inits)]
        stmts, yields = self._region(lambda: body(iv, *args))
        results = [self.fresh(h if names is not None else f"{h}_out", r.type) for h, r in zip(hints, inits)]
        self.emit(For(tuple(results), start, stop, step, tuple(inits), Region(iv, tuple(args), stmts, yields)))
        return results

    def if_(self, cond: Reg, then: Callable[[], Sequence[Reg] | None],
            orelse: Callable[[], Sequence[Reg] | None] | None = None) -> list[Reg]:
        """Threads where `cond` holds run `then`, the others `orelse`; both return their yields."""
        then_stmts, then_yields = self._region(then)
        else_stmts, else_yields = self._region(orelse or (lambda: ()))
        results = [self.fresh("if", y.type) for y in then_yields]
        self.emit(If(tuple(results), cond, Branch(then_stmts, then_yields), Branch(else_stmts, else_yields)))
        return results

    def build(self, *, verify: bool = True) -> SimtKernel:
        if len(self._blocks) != 1:
            raise InternalError("SimtBuilder.build() called inside a region", pass_name="simt_builder")
        kernel = SimtKernel(self.name, tuple(self.params), self.warps, self.grid, tuple(self.shared_allocs),
                            tuple(self._blocks[0]))
        return verify_simt_kernel(kernel, "simt_builder") if verify else kernel
