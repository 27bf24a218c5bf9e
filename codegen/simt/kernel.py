"""`lower_to_simt`: Tile IR -> SIMT IR, one `SimtKernel` per Tile IR kernel (ARCHITECTURE.md section 6).

Per kernel, in order:

1. `narrow_dot_operands`  dots that can use tensor cores get f16/bf16/e4m3 operands;
2. `plan_kernel`          a layout for every concrete tile value (`plan.py`);
3. emission               the environment walker over the rule tables in `context.py`:
                          program ids from the block index, then the ops in order;
4. `size_shared`          the shared scratch arrays get their final sizes (conversions alternate
                          between two arrays a dtype; one, when two do not fit);
5. `drop_unused`          definitions nobody reads go;
6. `drop_redundant_barriers`  barriers that separate no conflicting accesses go (`barriers.py`);
7. `verify_simt_kernel`.

The Tile grid (any rank) becomes a 1-d grid of blocks, the last grid axis
fastest; each program id is a div/mod of the block index.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ...ir.sizes import Size, SizeLike, is_static
from ...ir.tile import nodes as t
from ...ir.errors import BackendError
from ...ir.buffer import Buffer
from ...ir.simt.nodes import (
    Reg,
    BLOCK_RESERVED_SHARED_BYTES,
    MAX_DYNAMIC_SHARED_BYTES,
    MAX_STATIC_SHARED_BYTES,
    REGISTERS_PER_SM,
    SHARED_BYTES_PER_SM,
    For,
    If,
    IntOp,
    LdMatrix,
    LoadShared,
    SharedAlloc,
    SimtKernel,
    Stmt,
    StoreShared,
)
from ...ir.simt.verifier import verify_simt_kernel
from ...ir.types import BufferType, float8_e4m3fn, int32
from ..timing import timed_part
from . import control, dot, elementwise, memory, reduce, topk  # noqa: F401 - register their rules
from .barriers import drop_redundant_barriers
from .cleanup import drop_unused
from .context import Lowering
from .narrow import narrow_dot_operands
from .options import GpuOptions
from .plan import Plan, plan_kernel
from .values import LoweringBuilder
from .wgmma import has_wgmma


@dataclass(frozen=True)
class SimtProgram:
    """A Tile program's kernels in SIMT IR, launched in order over the program's buffers."""

    name: str
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    scratch: tuple[Buffer, ...]
    kernels: tuple[SimtKernel, ...]
    sm: str

    def __str__(self) -> str:
        head = (f"simt program {self.name} for {self.sm}: inputs ({', '.join(b.name for b in self.inputs)}) "
                f"-> outputs ({', '.join(b.name for b in self.outputs)})")
        if self.scratch:
            head += f" scratch ({', '.join(b.name for b in self.scratch)})"
        return "\n\n".join([head] + [str(k) for k in self.kernels])


def _program_ids(lw: Lowering, grid: tuple[SizeLike, ...]) -> None:
    """``pid_i = (block // prod(grid[i+1:])) % grid[i]`` (no mod for the first axis); a run-time grid
    dimension (or product) is a kernel parameter."""
    b = lw.b

    def value(n: SizeLike) -> Reg:
        return lw.size_param(n, int32) if isinstance(n, Size) else b.const_of(n, int32)

    block = b.block_idx(0)
    pids = []
    inner: SizeLike = 1
    for axis in reversed(range(len(grid))):
        if is_static(grid[axis]) and grid[axis] == 1:
            pid = b.const_of(0, int32)
        else:
            pid = block if is_static(inner) and inner == 1 else b.int_op(IntOp.DIV, block, value(inner))
            if axis > 0:
                pid = b.int_op(IntOp.REM, pid, value(grid[axis]))
        pids.append(pid)
        inner = inner * grid[axis]
    lw.pids = tuple(reversed(pids))


def _resize(stmts: tuple[Stmt, ...], final: dict[str, SharedAlloc]) -> tuple[Stmt, ...]:
    out = []
    for s in stmts:
        if isinstance(s, LoadShared | StoreShared | LdMatrix) and s.alloc.name in final:
            s = replace(s, alloc=final[s.alloc.name])
        elif isinstance(s, For):
            s = replace(s, body=replace(s.body, stmts=_resize(s.body.stmts, final)))
        elif isinstance(s, If):
            s = replace(s, then=replace(s.then, stmts=_resize(s.then.stmts, final)),
                        orelse=replace(s.orelse, stmts=_resize(s.orelse.stmts, final)))
        out.append(s)
    return tuple(out)


def shared_limit(sm: str) -> int:
    """The shared memory one block of a kernel for `sm` may have: past the 48 KiB a kernel declares statically,
    the launch's dynamic shared memory on sm_90a (Hopper's wgmma tiles: head 256 attention), not on the targets
    that also run on GPUs with less (an sm_80 kernel runs on Ada's 99 KiB as well)."""
    return MAX_DYNAMIC_SHARED_BYTES if has_wgmma(sm) else MAX_STATIC_SHARED_BYTES


def size_shared(kernel: SimtKernel, lw: Lowering, limit: int) -> SimtKernel:
    """`kernel` with each shared scratch array as large as its largest use, `SharedMemoryExceeded` past `limit`
    bytes; past `MAX_STATIC_SHARED_BYTES` (a `limit` from `shared_limit`) in the launch's dynamic shared memory."""
    final = {name: SharedAlloc(name, BufferType(alloc.dtype, (lw.arena_size[name],)))
             for name, alloc in lw.arenas.items()}
    # fixed allocations first, the most aligned (wgmma's operand tiles, 1024 bytes) in front: no padding
    # between them (a TMA tile's 8-byte mbarrier between two tiles would cost 1016 bytes)
    fixed = tuple(sorted((a for a in kernel.shared if a.name not in final), key=lambda a: -a.align))
    sized = replace(kernel, shared=fixed + tuple(final.values()), body=_resize(kernel.body, final))
    if sized.shared_bytes > limit:
        raise SharedMemoryExceeded(f"kernel {kernel.name} needs {sized.shared_bytes} bytes of shared memory for its "
                                   f"operand tiles and layout conversions (at most {limit} on {lw.opts.sm}); use "
                                   "smaller block_m / block_n / block_k")
    if sized.shared_bytes > MAX_STATIC_SHARED_BYTES:
        # a default register bound (`blocks_per_sm`) for more blocks than the SM's shared memory holds would
        # only cost registers
        blocks = sized.min_blocks_per_sm
        if lw.opts.min_blocks_per_sm is None and blocks is not None \
                and blocks * (sized.shared_bytes + BLOCK_RESERVED_SHARED_BYTES) > SHARED_BYTES_PER_SM:
            blocks = None
        sized = replace(sized, dynamic_shared=True, min_blocks_per_sm=blocks)
    return sized


class SharedMemoryExceeded(BackendError):
    """A kernel's scratch arrays need more shared memory than a block may have."""


def symbol(name: str) -> str:
    """`name` as a PTX identifier (``<lambda>_0`` -> ``_lambda__0``): LLVM's NVPTX backend aborts on others."""
    text = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return text if text and not text[0].isdigit() else f"_{text}"


def lower_kernel(k: t.TileKernel, opts: GpuOptions) -> SimtKernel:
    """One Tile IR kernel as a verified SIMT kernel (see the module docstring). The wall time of each step
    goes to the parts being recorded (`codegen.timing`): ``plan`` (steps 1-2), ``emit`` (3-4),
    ``clean-up`` (5), ``barriers`` (6) and ``verify`` (7)."""
    with timed_part("plan"):
        k = narrow_dot_operands(k, opts)
        plan = plan_kernel(k, opts)
    with timed_part("emit"):
        kernel = _emit_within_shared_memory(k, plan, opts)
    with timed_part("clean-up"):
        kernel = drop_unused(kernel)
    with timed_part("barriers"):
        kernel = drop_redundant_barriers(kernel)
    with timed_part("verify"):
        return verify_simt_kernel(kernel, "lower_to_simt")


def _emit_within_shared_memory(k: t.TileKernel, plan: Plan, opts: GpuOptions) -> SimtKernel:
    """`_emit` with two scratch arrays a dtype, else one, within the 48 KiB a kernel declares statically, then
    the same within the target's `shared_limit` (dynamic shared memory: fewer blocks an SM, so only where the
    static size cannot do), else (a kernel with wgmma dots, whose operand tiles take shared memory of their
    own) with its dots on ``mma.sync``: the first that fits."""
    ringed = _emit_with_rings(k, plan, opts) if plan.tma and opts.tma_stages > 1 else None
    if ringed is not None:
        return ringed
    limits = dict.fromkeys((MAX_STATIC_SHARED_BYTES, shared_limit(opts.sm)))
    for limit in limits:
        for alternate in (True, False):
            try:
                return _emit(k, plan, opts, alternate, limit, 1)[0]
            except SharedMemoryExceeded as exc:
                failure = exc
    if not any(d.wgmma is not None for d in plan.dots.values()):
        raise failure
    return _emit_within_shared_memory(k, plan_kernel(k, opts, wgmma=False), opts)


THREADS_PER_SM = {75: 1024}
"""The most resident threads of an SM (2048 on sm_80 .. sm_90, 1024 on sm_75): ``min_blocks_per_sm`` blocks of
a kernel must fit in it, or ptxas drops the bound with a warning."""

WGMMA_BLOCKS_PER_SM = 3
"""Without a ``min_blocks_per_sm`` option, a kernel of one warpgroup (4 warps) whose dots run on ``wgmma`` is
built for this many blocks an SM (ptxas keeps it within 168 registers a thread). On an H200
(benchmarks/device_notes.md, run 10) bf16 attention at head 128 went from 2.41 to 2.04 ms at
[4,16,4096,128] (10.1 to 8.0 ms at [1,16,16384,128]), causal f16 at head 128 within 4% either way; the
GEMMs' wgmma kernels are below 168 registers already."""

WGMMA_TWO_GROUP_BLOCKS_PER_SM = 2
"""The same for a kernel of two warpgroups (8 warps; `plan.WGMMA_TILE_ROWS`) whose dots' f32 accumulators leave
room (`ACCUMULATOR_SHARE` of the 128 registers the bound leaves a thread; larger tiles, such as a 128 x 256
GEMM tile, keep ptxas's choice rather than spill): 2 blocks an SM, 16 warps, the occupancy f16
attention ran at in run 11 (ncu; 124 registers from ptxas's own choice then). Its call-free division
(`codegen/correctly_rounded.py`) made ptxas's unbounded choice 130 registers, one block an SM; with this
bound it takes 124 again, without spills."""


ACCUMULATOR_SHARE = 0.6
"""A default bound (`blocks_per_sm`) applies where the wgmma accumulators take at most this share of the registers
it leaves a thread: bf16 attention at head 128 (96 of 168, one warpgroup) and f16 at head 64 (64 of 128, two)
run bounded without spills; head-256 attention (160 of 168) and a 128 x 256 GEMM tile (128 of 128) would
spill, and keep ptxas's choice."""


def _accumulator_registers(plan: Plan) -> int:
    """The f32 registers a thread holds for the results of the kernel's wgmma dots (all of them at once); twice
    that for an e4m3 dot, whose promoted chains sum into registers of their own before the accumulator
    (`wgmma.E4M3_PROMOTE_STEPS`): a 64 x 128 FP8 GEMM tile took 210 registers unbounded and spilled 152 bytes
    under the 3-block bound of 168 when counted once."""
    threads = plan.warps * 32
    return sum(d.wgmma.a.rows * d.wgmma.b.rows // threads * (2 if d.wgmma.shape.dtype == float8_e4m3fn else 1)
               for d in plan.dots.values() if d.wgmma is not None)


def blocks_per_sm(plan: Plan, opts: GpuOptions) -> int | None:
    """`opts.min_blocks_per_sm`, or where that is None `WGMMA_BLOCKS_PER_SM` for a one-warpgroup wgmma kernel
    and `WGMMA_TWO_GROUP_BLOCKS_PER_SM` for a two-warpgroup one, where its accumulators leave room
    (`ACCUMULATOR_SHARE`)."""
    if opts.min_blocks_per_sm is not None:
        threads, most = plan.warps * 32, THREADS_PER_SM.get(opts.sm_number, 2048)
        if opts.min_blocks_per_sm * threads > most:    # (ptxas would ignore it with a warning)
            raise BackendError(f"min_blocks_per_sm={opts.min_blocks_per_sm} asks for that many blocks of {threads} "
                               f"threads on an SM, which holds {most} threads on {opts.sm}: at most "
                               f"{most // threads} blocks of this kernel (num_warps={plan.warps})")
        return opts.min_blocks_per_sm
    if not any(d.wgmma is not None for d in plan.dots.values()):
        return None
    blocks = {4: WGMMA_BLOCKS_PER_SM, 8: WGMMA_TWO_GROUP_BLOCKS_PER_SM}.get(plan.warps)
    if blocks is None:
        return None
    registers = REGISTERS_PER_SM // (blocks * plan.warps * 32) // 8 * 8       # ptxas allocates in eights
    return blocks if _accumulator_registers(plan) <= ACCUMULATOR_SHARE * registers else None


def _emit_with_rings(k: t.TileKernel, plan: Plan, opts: GpuOptions) -> SimtKernel | None:
    """`_emit` with TMA rings of ``opts.tma_stages`` stages (`tma.ring_stages`) within the target's
    `shared_limit` and as many blocks an SM as with one stage (`rings_cost_blocks`): a ring hides a copy's
    latency within a block, and more blocks an SM hide it too, and everything else's. Where every ring's extra
    tiles would cost blocks, the rings get the shared memory the blocks leave, in program order (attention's
    ``K`` then ``V``; `ring_budget`); None where no staging point has a ring then."""
    bound = blocks_per_sm(plan, opts)
    budget: int | None = None
    for _ in range(2):
        for alternate in (True, False):
            try:
                kernel, ring_bytes = _emit(k, plan, opts, alternate, shared_limit(opts.sm), opts.tma_stages, budget)
                break
            except SharedMemoryExceeded:
                continue
        else:
            return None
        if not ring_bytes:
            return None
        if not rings_cost_blocks(kernel.shared_bytes, ring_bytes, bound):
            return kernel
        budget = ring_budget(kernel.shared_bytes - ring_bytes, bound)
    return None


def _blocks_fitting(shared_bytes: int) -> int:
    """How many blocks of `shared_bytes` each an SM's shared memory holds."""
    return SHARED_BYTES_PER_SM // (shared_bytes + BLOCK_RESERVED_SHARED_BYTES)


def _target_blocks(single_bytes: int, bound: int | None) -> int:
    """The blocks an SM a kernel whose shared memory is `single_bytes` with one stage a ring is held to: as many
    as fit, at most its register `bound`."""
    fitting = _blocks_fitting(single_bytes)
    return fitting if bound is None else min(fitting, bound)


def rings_cost_blocks(shared_bytes: int, ring_bytes: int, bound: int | None) -> bool:
    """Whether a kernel of `shared_bytes`, `ring_bytes` of them its TMA rings' extra stages, fits fewer blocks an
    SM than it would with one stage, as many as its register `bound` asks at most (no bound: as many as fit)."""
    return _blocks_fitting(shared_bytes) < _target_blocks(shared_bytes - ring_bytes, bound)


def ring_budget(single_bytes: int, bound: int | None) -> int:
    """The bytes of rings' extra stages a kernel of `single_bytes` with one stage can take and keep its
    `_target_blocks` an SM."""
    return SHARED_BYTES_PER_SM // _target_blocks(single_bytes, bound) - BLOCK_RESERVED_SHARED_BYTES - single_bytes


def _emit(k: t.TileKernel, plan: Plan, opts: GpuOptions, alternate: bool, limit: int,
          tma_stages: int, ring_budget: int | None = None) -> tuple[SimtKernel, int]:
    """Steps 3-4 of the module docstring: the kernel's statements, its scratch arrays sized, with TMA rings of
    up to `tma_stages` stages whose extra stages take at most `ring_budget` bytes (None: no limit); and the
    shared bytes the rings' extra stages take."""
    programs = k.num_programs
    b = LoweringBuilder(symbol(k.name), warps=plan.warps, grid=(max(1, programs) if is_static(programs) else programs,))
    b.params.extend(k.params)
    lw = Lowering(k, plan, opts, b, alternate)
    lw.tma_stages, lw.ring_budget = tma_stages, ring_budget
    _program_ids(lw, k.grid)
    lw.emit_ops(k.body)
    built = replace(b.build(verify=False), min_blocks_per_sm=blocks_per_sm(plan, opts),
                    sizes=tuple((reg.name, size) for (size, _), reg in lw.size_regs.items()))
    return size_shared(built, lw, limit), lw.ring_bytes


def lower_to_simt(p: t.TileProgram, opts: GpuOptions = GpuOptions()) -> SimtProgram:
    """Every kernel of `p` with at least one program, lowered (see the module docstring); each step's time
    as for `lower_kernel`, summed over the kernels."""
    kernels = tuple(lower_kernel(k, opts) for k in p.kernels if not is_static(k.num_programs) or k.num_programs > 0)
    return SimtProgram(p.name, p.inputs, p.outputs, p.scratch, kernels, opts.sm)
