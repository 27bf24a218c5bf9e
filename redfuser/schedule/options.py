"""Tile sizes and other knobs of the scheduling pass, with sound defaults per backend.

| option      | meaning                                                         | cpu | gpu |
|-------------|-----------------------------------------------------------------|-----|-----|
| `block_m`   | rows of an output tile (second-to-last tiled axis, query rows)  | 32  | auto|
|             | auto (None): `ROWS` -- 64, or 32 for a fused loop whose states  |     |     |
|             | are one value or top-k list per row (softmax's ``m``, ``l``);   |     |     |
|             | `WIDE_ROWS` (128) for a loop feeding tensor cores within        |     |     |
|             | `ACC_TILE`; whole rows with `whole_rows` (below)                |     |     |
| `block_n`   | columns of an output tile; chunk length of a fused loop's axis  | 64  | 64  |
| `block_k`   | chunk length of a reduced axis (``for`` over chunks beyond it;  | 64  | auto|
|             | GPU: a smaller power of two dividing the axis, `chunk`); auto   |     |     |
|             | (None): `K_BLOCK` -- 128 for a contraction of 16-bit data, 64   |     |     |
| `pow2`      | round tile sizes up to powers of two (masks cover the excess)   | no  | yes |
| `split`     | slices of a fused loop's axis run by separate programs (flash   | auto| auto|
|             | decoding); None: automatic (`split.auto_split`), 1: never       |     |     |
| `workers`   | programs the target runs at once, for the automatic split       | cores | SMs |
| `skip_masked` | stop a fused loop after the last chunk its rows' mask lets    | no  | no  |
|             | through (causal attention; `masked.py`: exact for finite values)|     |     |
| `skip_exact`| the same stop, moved past any dead chunk where a scan finds a   | yes | no  |
|             | value that would not vanish under the mask (``v = inf``): exact |     |     |
|             | for every input; off with ``skip_masked=False``                 |     |     |
| `whole_rows`| a fused loop of per-row states over an axis of at most          | no  | yes |
|             | `ONE_PASS_MAX` is one chunk of whole rows, `ONE_PASS_TILE`      |     |     |
|             | elements a tile (one pass over memory); off when ``block_m`` or |     |     |
|             | ``block_n`` is given, and where it would leave SMs idle         |     |     |
| `dot_tile`  | (rows, chunk) of a fused loop with a contraction (attention's   |256, | no  |
|             | ``q @ k^T``): the host GEMM core's blocks amortize the loop's   |128  |     |
|             | per-chunk work (K's transpose, V's panels, the rescale) over    |     |     |
|             | more of them; rows at most `MASKED_DOT_ROWS` in a loop that     |     |     |
|             | stops at its mask, halved while a worker would idle; off when   |     |     |
|             | ``block_m`` or ``block_n`` is given                             |     |     |
| `row_tile`  | (elements, longest chunk) of a fused loop of per-row states    |8192,| no  |
|             | ending in a sweep (softmax, RMSNorm): chunks of the whole       |4096 |     |
|             | row up to 4096, as many rows as fill 8192 elements, so the      |     |     |
|             | closing sweep reads the rows again from L1/L2 (`ROW_TILE`); off |     |     |
|             | when ``block_m`` or ``block_n`` is given                        |     |     |
| `gemm_tile` | (rows, chunk, columns) of a fused loop whose state is a GEMM    |256, | no  |
|             | with no contraction among its locals (layer norm + GEMM's       |512, |     |
|             | ``y @ w``, a quantized GEMM), and of a plain matmul's nest: the |512  |     |
|             | columns tile the grid; each program's statistics of its rows    |     |     |
|             | and copy of ``w``'s block are amortized over its output tile    |     |     |
|             | (`GEMM_TILE`); rows halved while a worker would idle; off when  |     |     |
|             | ``block_m`` or ``block_n`` is given                             |     |     |
| `half_gemm_ | the same of a plain matmul of 16-bit floats: bigger, since on   |256, | no  |
| tile`       | AMX tiles each chunk's scans and packing of ``w`` are amortized |512, |     |
|             | over more tile work (`HALF_GEMM_TILE`); off when ``block_m`` or |512  |     |
|             | ``block_n`` is given                                            |     |     |
| `vector_k`  | longest contraction a fused loop's local takes in one chunk     |256  | 0   |
|             | where its tile has one row (decoding's ``q . k`` per key): each |     |     |
|             | key's row is read once, whole, in memory order (`VECTOR_K`);    |     |     |
|             | off when ``block_k`` is given                                   |     |     |
| `whole_max` | longest state axis a fused loop with a contraction keeps      |512  |256  |
|             | whole (attention's head dimension); a longer one is tiled by    |     |     |
|             | ``block_n`` across the grid, each program recomputing the other |     |     |
|             | states (`WHOLE_MAX`; other loops: `CHEAP_RECOMPUTE_MAX`)        |     |     |
| `peel_ragged` | a fused loop over a static axis that is not a whole number of | yes | no  |
|             | chunks: the whole chunks unmasked, the last one masked on its   |     |     |
|             | own (`chunks.chunk_loop`; a GPU's masked loads are predicated)  |     |     |
| `shifted_exp` | f32 ``exp(x - max)`` (softmax, an online softmax's rescale) by | yes | yes |
|             | each backend's exp of an argument at most 0 (`shifted_exp.py`) |     |     |
| `flush_shifted_exp` | those of them no result can tell flushed below 2**-126  | no  | yes |
|             | (``l``'s terms, P rounded to f16) as ``exp2_ftz``: one ``ex2``  |     |     |

A kernel option of the same name (``rf.kernel(fn, block_m=32)``) overrides the default.
`workers` comes from the machine: the ``num_threads`` option or the core count on
the CPU; the device's SM count for GPU schedules, or 132 (an H200) when no device
is present to ask.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Callable

from ..ir.sizes import Size, SizeLike, SymbolicDecision, is_static, size_min


WHOLE_MAX: dict[str, int] = {"cpu": 512, "gpu": 256}
"""`ScheduleOptions.whole_max` by backend kind: the longest state axis that is neither the fused axis nor shared
by every state (attention's head dimension) a fused loop with a contraction among its locals keeps whole in
its tile; a longer one is tiled by ``block_n`` across an extra grid dimension (see `layout.py`), each of whose
programs recomputes the states without the axis: attention's whole ``q @ k^T`` and softmax once per 64
columns of the head dimension. Kept whole, head-256 attention's 64-row GPU tile holds a 64 x 256 f32
accumulator, 128 registers a thread at 4 warps: 255 registers and no spill on wgmma, 188 bytes of spills on
``mma.sync``. Measured (benchmarks/device_notes.md, run 13; docs/cpu-backend.md): on an H200 whole took
head-256 bf16 attention from 12.8 to 4.4 ms on wgmma and from 12.5 to 6.2 on ``mma.sync``; on the cpu f32
attention [1,8,1024,d] from 194 to 80 ms at d = 256 and from 680 to 155 at d = 512. A loop without a
contraction (a GEMM state's columns, whose programs recompute only per-row statistics) tiles beyond
`CHEAP_RECOMPUTE_MAX`."""

CHEAP_RECOMPUTE_MAX = 128
"""The longest state axis a fused loop without a contraction among its locals keeps whole (see `WHOLE_MAX`):
a quantized GEMM's output columns beyond it are tiled across the grid by ``block_n`` (the cpu: ``gemm_tile``'s
columns), each program recomputing its rows' absmax, which costs little next to its GEMM."""


@dataclass(frozen=True, slots=True)
class ScheduleOptions:
    """The knobs `schedule_program` reads (see the module docstring)."""

    block_m: int | None = 32
    block_n: int = 64
    block_k: int | None = 64
    pow2: bool = False
    split: int | None = None
    workers: int = 1
    skip_masked: bool = False
    whole_rows: bool = False
    dot_tile: tuple[int, int] | None = None   # (rows, chunk) of a fused loop with a contraction (cpu)
    row_tile: tuple[int, int] | None = None   # (elements, longest chunk) of a per-row loop's tile (cpu)
    gemm_tile: tuple[int, int, int] | None = None   # (rows, chunk, columns) of a fused GEMM state (cpu)
    half_gemm_tile: tuple[int, int, int] | None = None  # the same of a plain matmul of 16-bit floats (cpu)
    skip_exact: bool = False                  # skip dead chunks where a scan shows it exact (masked.py)
    peel_ragged: bool = False                 # a fused loop's ragged last chunk in a loop of its own (cpu)
    whole_max: int = CHEAP_RECOMPUTE_MAX      # longest state axis a contracting loop keeps whole
    vector_k: int = 0                         # longest one-row local contraction taken in one chunk (cpu)
    fast_exp: bool = False                    # f32 exp as exp2_ftz(x log2 e) (exprs.py, `_exp_as_exp2`)
    shifted_exp: bool = True                  # f32 exp(x - max) as UnaryOp.EXP_NONPOS (shifted_exp.py)
    flush_shifted_exp: bool = False           # those no result can tell flushed: exp2_ftz (a GPU's one ex2)
    # the exps `shifted_exp` applies to, and the flushable ones among them: derived from the program by
    # `schedule_program` (shifted_exp.py), not options
    shifted_exps: frozenset = field(default=frozenset(), compare=False, repr=False)
    flushable_exps: frozenset = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k", "workers", "split", "whole_max"):
            value = getattr(self, name)
            if value is None and name in ("block_m", "block_k", "split"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                from ..ir import ArgumentError

                raise ArgumentError(f"{name} must be a positive int, got {value!r}", op="schedule")

    def rows(self, per_row_states: bool = False) -> int:
        """Rows of a tile: `block_m`, or where that is None (the GPU default) `ROWS` for a tile whose fused
        states are one value or top-k list per row (`per_row_states`) or any other."""
        if self.block_m is not None:
            return self.block_m
        return ROWS[per_row_states]

    def columns(self) -> int:
        """The columns of a tile across the grid (a plain nest's, a matmul's, a grid-tiled state axis's):
        `block_n`, at most `GPU_COLUMNS_MAX` on the GPU (``pow2`` schedules)."""
        return min(self.block_n, GPU_COLUMNS_MAX) if self.pow2 else self.block_n

    def matmul_tile(self, half: bool) -> tuple[int, int, int] | None:
        """`gemm_tile`, or for a plain matmul of 16-bit floats (`half`) `half_gemm_tile` where it is set."""
        return self.half_gemm_tile if half and self.half_gemm_tile is not None else self.gemm_tile

    def k_block(self, narrow_product: bool = False) -> int:
        """`block_k`, or where that is None (the GPU default) `K_BLOCK` for a contraction of 16-bit or
        narrower floats (`narrow_product`: it runs on tensor cores) or any other reduced axis."""
        if self.block_k is not None:
            return self.block_k
        return K_BLOCK[narrow_product]

    def chunk(self, extent: int, narrow_product: bool = False) -> int:
        """The chunk length of a reduced axis of `extent`: ``tile(k_block(narrow_product), extent)``, except
        that with power-of-two tiles a smaller power of two that divides the axis (down to
        `MIN_DIVIDING_CHUNK`) is taken where that one would leave a masked remainder: a head dimension of
        96 is three chunks of 32, not 64 and a padded 64, and its contraction stays on tensor cores."""
        size = self.tile(self.k_block(narrow_product), extent)
        if isinstance(extent, Size):
            return size          # a run-time extent: whole blocks, the last one masked
        if self.pow2 and extent % size:
            smaller = size // 2
            while smaller >= MIN_DIVIDING_CHUNK:
                if extent % smaller == 0:
                    return smaller
                smaller //= 2
        return size

    def tile(self, block: int | Size, extent: int | Size) -> int:
        """The tile length covering an axis of `extent` in blocks of `block` (at least 1). A run-time
        extent takes whole blocks (masked past its end); a tile of a run-time length (a whole axis of
        unknown length) does not exist: `SymbolicDecision`."""
        if isinstance(block, Size):
            raise SymbolicDecision(f"a tile as long as the run-time extent {block}")
        size = max(1, size_min(extent, block))
        return 1 << (size - 1).bit_length() if self.pow2 else size


DOT_TILE = (256, 128)
"""(rows, chunk) of a cpu fused loop with a contraction (`layout.dot_tile`). Each chunk's K is transposed and V
laid out in panels once for all the rows of the tile, and K and V come from L3 once per tile: 256 rows, against
64, interleaved in one process on the 2-core AVX-512 host, 2 threads: attention [1,8,4096,64] 134 -> 120 ms,
[1,8,1024,64] 8.3 -> 7.8, [1,8,2048,128] 68.9 -> 61.6, [1,8,1024,256] 34.2 -> 30.1, RoPE attention [1,8,1024,64]
9.6 -> 8.5, linear cross-entropy 1024x512 @ 512x16000 62.2 -> 53.5 ms."""

MASKED_DOT_ROWS = 128
"""The most rows of a `DOT_TILE` whose loop stops at its mask (causal attention): a tile's chunks across the
diagonal are computed whole, for more rows the more rows it has. Causal [1,8,1024,64]: 6.1 ms at 64 rows, 5.8 at
128, 6.9 at 256; [1,8,4096,64]: 75.1, 70.6, 74.8 (same run as `DOT_TILE`'s)."""

DOT_ROWS_LEAST = 64
"""The fewest rows `DOT_TILE`'s are halved to for an idle worker's sake (the micro-kernel's blocks are 8 rows;
fewer than 64 and the per-chunk transposes dominate again)."""

VECTOR_K = 256
"""The longest contraction a cpu fused loop's local of one row takes whole (`ScheduleOptions.vector_k`): decoding's
``s = q . k`` for one query against a chunk of keys. In chunks of `block_k` (64) each key's 512-byte row (head dim
128) was read in two halves, one pass over the chunk's rows per half, and the loop ran at 11.5 GB/s a core,
bound by the reads; whole, the rows are one stream: decode [1,8,32768,128], 2 threads, interleaved in one
process, 12.3 -> 9.6-10.4 ms (torch's SDPA 9.0-9.8, its sum of k and v alone 9.5)."""

ROW_TILE = (8192, 4096)
"""The cpu's tile of a fused loop of per-row states (`ScheduleOptions.row_tile`): rows of up to 4096 elements
whole (a longer one in chunks of 4096), as many rows a tile as 8192 elements hold (32 KiB of f32, the L1), fewer
while the grid would leave a worker idle. The old 32 x 64 tile read 32 rows 256 bytes at a time, and its sweep
read them again from L3 (docs/cpu-backend.md, "Row tiles": softmax 1024 x 16384 18-24 -> 14 ms, RMSNorm
4096 x 16384 47-50 -> 29 ms on two cores)."""


ROW_TILE_LEAST = 2048
"""The fewest elements `ROW_TILE`'s rows are halved to for another worker's sake: less work than that (a
cached softmax of 4 x 16) costs less on the calling thread than handing half of it to a worker."""


GEMM_TILE = (256, 512, 512)
"""(rows, chunk, columns) of a cpu f32 GEMM: a plain matmul's tile and a fused GEMM state's (layer norm + GEMM, a
quantized GEMM; `ScheduleOptions.gemm_tile`). Each program packs its chunk of ``w`` into panels and carries its
rows' statistics and the accumulator's rescale once a chunk, work that scales with the blocks while the
micro-kernel's scales with their product. CPU time a call on the 2-core Xeon (all threads, medians of 5, the
tiles patched into the cpu pipeline in one process; 128 x 128 x 128 before): layer norm + GEMM 1024^3 18.1-18.4
-> 15.4-15.9 ms, 4096 x 1024 @ 1024 71.5-71.9 -> 62.0-64.7, the FP8 GEMM 1024 x 4096 @ 1024 80.5-82.5 -> 60.0-64.4,
a plain 1024^3 GEMM 14.3-14.7 -> 13.4-13.5; 256 x 256 x 256 and 512 x 512 x 512 within 5% of it, a 1024 chunk
worse (18.0, 74.0)."""

HALF_GEMM_TILE = (256, 512, 512)
"""(rows, chunk, columns) of a cpu matmul of 16-bit floats (`ScheduleOptions.half_gemm_tile`). On AMX tiles
(`codegen/host/amx.py`) each program scans and packs its blocks of both operands once a chunk, work that
scales with the blocks while the tiles' work scales with their product, and loads and stores its
accumulator tiles once a chunk. bf16 GEMMs on a Sapphire Rapids core, after ``A``'s tiles were packed
(one thread at 2048^3: 128 x 128 x 128 39.9 ms, 256 x 256 x 128 28.7, 256 x 256 x 256 26.7, 512 x 512 x 256
23.8, 256 x 512 x 512 22.3, 512 x 512 x 512 21.2; two threads, 1024^3 / 2048^3 / 4096^3: 256 x 256 x 128 2.0
/ 15.3 / 145 ms, 256 x 512 x 512 1.6 / 10.7 / 103, 512 x 512 x 512 1.7 / 10.8 / 105); without AMX (the FMA
micro-kernel widening bf16, one thread, 2048^3) 128.8 ms at 128 x 128 x 128 and 115.1 at 512 x 512 x 512."""


DEFAULTS: dict[str, ScheduleOptions] = {
    "cpu": ScheduleOptions(dot_tile=DOT_TILE, gemm_tile=GEMM_TILE, half_gemm_tile=HALF_GEMM_TILE,
                           row_tile=ROW_TILE, skip_exact=True,
                           peel_ragged=True, vector_k=VECTOR_K,
                           whole_max=WHOLE_MAX["cpu"]),
    "gpu": ScheduleOptions(block_m=None, block_n=64, block_k=None, pow2=True, whole_rows=True,
                           whole_max=WHOLE_MAX["gpu"], flush_shifted_exp=True),
}


K_BLOCK: dict[bool, int] = {False: 64, True: 128}
"""GPU chunk of a reduced axis when `block_k` is None, by whether it is a contraction of 16-bit or narrower
floats over a 2-d output (a `dot` for tensor cores; `reduce._narrow_dot`) or any other.

A head dimension in one chunk makes attention's q tile loop-invariant: loaded and made into mma fragments
once, before the key loop (measurements: docs/gpu-backend.md, "Why these defaults")."""

MIN_DIVIDING_CHUNK = 16
"""The shortest chunk `ScheduleOptions.chunk` takes to divide a reduced axis (an f16 mma's k)."""


ROWS: dict[bool, int] = {False: 64, True: 32}
"""GPU tile rows when `block_m` is None, by whether the tile's fused states are one value (or a top-k
list) per row (`layout.FusedLayout.per_row_states`).

64 rows suit tiles that feed tensor cores (16 rows per warp for 4 warps: attention's query rows); a row
softmax's tile feeds none, and 32 rows halve its code and registers with as much in flight per SM
(docs/gpu-backend.md, "Why these defaults")."""


GEMM_MIN_ROWS = 16
"""The fewest rows `gemm_rows` halves a GEMM tile to so that every worker has a program."""


def gemm_rows(rows: int, programs: Callable[[int], SizeLike], workers: int) -> int:
    """The rows of a cpu GEMM tile (`ScheduleOptions.gemm_tile`, a plain matmul's or a fused GEMM state's):
    `rows` halved, down to `GEMM_MIN_ROWS`, while ``programs(rows)`` (the grid's size with such tiles) is
    static and under `workers` (a short GEMM's few rows would leave a worker idle). A run-time grid keeps
    the tile: the kernel serves every length."""
    while rows > GEMM_MIN_ROWS:
        n = programs(rows)
        if not is_static(n) or n >= workers:
            break
        rows //= 2
    return rows


WIDE_ROWS = 128
"""GPU tile rows (``block_m`` None) of a fused loop that feeds tensor cores (`FusedLayout.feeds_tensor_cores`)
when its accumulator tile, rows times `FusedLayout.state_width`, stays within `ACC_TILE`: f16 attention at
head dimension 64 takes 128 query rows a block of 4 warps, 32 a warp, instead of 64, so a warp runs two
independent chains of mma, softmax and mma (docs/gpu-backend.md, "Why these defaults"). At head dimension
128 the accumulator alone would spill: 64 rows stay."""

ACC_TILE = 8192
"""The accumulator elements a block's tile may hold to take `WIDE_ROWS` rows (64 f32 a thread at 4 warps)."""

CHUNK_TILE = 8192
"""The most elements of the tile a GPU reduction materializes per chunk (its output tile times the chunk) where
`block_k` is None and the chunk is no `dot`: an int32 ``x1 @ x0`` of a vector and a 3-d array over symbolic
lengths took 64 x 64 x 64 lanes, 2048 a thread, and its SIMT lowering ran for more than 800 s (fuzz seed 101,
example 1216); an int32 GEMM took the same."""


def chunk_within_tile(size: int, tile_elements: int) -> int:
    """`size`, cut to the largest power of two whose chunk with a tile of `tile_elements` stays within
    `CHUNK_TILE`."""
    lanes = max(1, CHUNK_TILE // max(1, tile_elements))
    return min(size, 1 << (lanes.bit_length() - 1))


ONE_PASS_MAX = 16384
"""The longest fused axis `ScheduleOptions.whole_rows` takes in one chunk (after rounding to a power of two).

A row softmax walked in chunks reads its row twice; in one chunk the loop runs once (`cleanup.peel_single_trips`
inlines it) and the epilogue reuses the loaded tile. 16384 elements over 16 warps are 32 a thread; twice
that needs more registers than 16 warps allow (docs/gpu-backend.md, "Why these defaults")."""

ONE_PASS_TILE = 16384
"""Elements of a whole-rows tile: ``ONE_PASS_TILE // row`` rows of a shorter row (at least one row, at most
`ONE_PASS_ROWS`)."""

GPU_COLUMNS_MAX = 256
"""The most columns of a GPU tile across the grid (`ScheduleOptions.columns`); a larger ``block_n`` still
chunks fused rows. `compiler.SMALLER_TILES` retries a whole program with ``block_n=4096`` for a fused row too
long for shared memory, and every matmul and elementwise nest beside it took 4096-column tiles: an f32
64 x 4096 matmul tile is 2048 accumulators a thread (RMSNorm of 16384 columns beside an f32 GEMM compiled in
47 s, 1.6 s with this bound; fuzz seed 108, example 341, a 1.2M-line LLVM module)."""

ONE_PASS_ROWS = 1024
"""The most rows of a whole-rows tile. A row of one or two elements took 8192-16384 rows a tile, whose
reduction's layout conversion needs more shared memory than a block declares; the compile then retried the
whole program with `compiler.SMALLER_TILES`, whose ``block_n`` of 4096 made a matmul beside it a 64 x 4096
tile, 2048 accumulators a thread (a 1.2M-line LLVM module: fuzz seed 108, example 341, a symbolic grid, which
is taken to be large and never halves its rows)."""


GPU_PLANNING_SMS = 132
"""SMs a GPU schedule plans for when no device can be asked (an H200)."""


def gpu_workers() -> int:
    """The SM count of device 0, or `GPU_PLANNING_SMS` without a usable device."""
    try:
        from ..runtime.device import device_available, device_info

        if device_available():
            return max(1, int(device_info(0).sm_count))
    except Exception:  # no driver, a broken install: plan for the default GPU
        pass
    return GPU_PLANNING_SMS


def with_overrides(base: ScheduleOptions, overrides: Mapping[str, object],
                   workers: Callable[[], int]) -> ScheduleOptions:
    """`base` (a backend's defaults) with the options in `overrides` that name a `ScheduleOptions` field and
    are not None applied; ``workers()`` unless `overrides` gives ``workers``."""
    names = {f.name for f in fields(ScheduleOptions)}
    chosen = {k: v for k, v in overrides.items() if k in names and v is not None}
    if chosen.get("skip_masked") is False:
        chosen["skip_exact"] = False             # skip_masked=False: every chunk is computed
    if chosen.keys() & {"block_m", "block_n"}:
        chosen.setdefault("whole_rows", False)   # a tile the user chose is the tile
        chosen.setdefault("dot_tile", None)
        chosen.setdefault("row_tile", None)
        chosen.setdefault("gemm_tile", None)
        chosen.setdefault("half_gemm_tile", None)
    if "block_k" in chosen:
        chosen.setdefault("vector_k", 0)         # a chunk the user chose is the chunk
    if "workers" not in chosen:
        chosen["workers"] = workers()
    return replace(base, **chosen)


def cpu_workers(num_threads: int = 0) -> int:
    """Programs the CPU runs at once: `num_threads` (the kernel option), else the core count."""
    return num_threads or os.cpu_count() or 1


def options_for(target: str, overrides: Mapping[str, object] | None = None) -> ScheduleOptions:
    """The schedule options of `DEFAULTS[target]` (``cpu`` or ``gpu``) with `overrides` applied (kernel
    options, or ``workers``): a shortcut for tests and scripts. A kernel's own come from
    `KernelOptions.schedule_options` with its backend's defaults (`redfuser.backends`)."""
    given = overrides or {}
    workers = {"cpu": lambda: cpu_workers(int(given.get("num_threads") or 0)), "gpu": gpu_workers}[target]
    return with_overrides(DEFAULTS[target], given, workers)
