"""Autotuning: try a few tile configurations of one kernel specialization, keep the fastest, remember it on disk.

A *candidate* is a `Config`: ``block_m``, ``block_n``, ``block_k``, ``num_warps``,
``split`` and (cuda) ``prefetch`` and ``min_blocks_per_sm`` (None: the kernel's own
value). Each backend has a small, fixed search space (`SPACES`): ``cpu`` (so the
machinery runs on every machine) and ``cuda``; its first entry is the empty config,
the untuned kernel. Options the
user set on the kernel are never tuned: they override every candidate.

Tuning off (the default, ``autotune=False``) compiles the fixed defaults of
`redfuser.schedule.options.DEFAULTS`: cpu ``block_m=32, block_n=64, block_k=64``;
GPU ``block_n=64``; ``block_k`` 128 for 16-bit contractions, else 64
(``options.K_BLOCK``); ``block_m`` 64, or 32 where every fused state is one value or
top-k list per row (``options.ROWS``), or whole rows of such a loop
(``options.ONE_PASS_MAX``), or 128 for attention's rows on tensor cores
(``options.WIDE_ROWS``); 4 warps (fewer for small tiles, up to 16 for a whole-row
tile: ``codegen.simt.plan.choose_warps``); ``split`` automatic. On (``rf.kernel(fn,
autotune=True)`` or ``REDFUSER_AUTOTUNE=1``), the first call of a specialization
compiles and times each candidate with the backend's timer -- `wall_clock` on the
cpu, `cuda_events` on the GPU (around the whole call, so host arrays add the same
copies to every candidate) -- printing one progress line to stderr, rewritten per
candidate, and compiles the fastest. Candidates that fail to compile (too much
shared memory...) are skipped.

Results live in ``<cache dir>/autotune/<digest>.json`` beside the compile cache.
The digest (`tuning_key`) covers the kernel's traced Loop IR (source locations
left out), argument shapes and dtypes, the options not tuned, the backend, the
device's name and RedFuser/LLVM versions (with a fingerprint of the sources),
so a restart reads the result and never re-tunes, and any change tunes anew.
Files are written atomically (temp file, then rename); a file that does not
parse or does not match its key is ignored with a `CacheWarning`, re-tuned and
rewritten. `using_timer` swaps the timer (deterministic fakes in tests).
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ..ir.errors import RedFuserError
from .cache import CacheKey, CacheWarning, read_regular
from .cache_entry import write_atomic

if TYPE_CHECKING:
    from ..kernel_options import KernelOptions

FORMAT = 1


@dataclass(frozen=True, slots=True)
class Config:
    """One candidate: the options it sets (None: the kernel's own value)."""

    block_m: int | None = None
    block_n: int | None = None
    block_k: int | None = None
    num_warps: int | None = None
    split: int | None = None
    prefetch: bool | None = None
    min_blocks_per_sm: int | None = None

    def options(self) -> dict[str, int | bool]:
        """The kernel options this candidate sets."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.options().items()) or "defaults"


TUNED = tuple(f.name for f in fields(Config))
"""The options a candidate may set: `Config`'s fields."""


SPACES: dict[str, tuple[Config, ...]] = {
    "cpu": (Config(), Config(block_m=16), Config(block_m=64), Config(block_n=128, block_k=128),
            Config(block_n=32, block_k=32), Config(block_m=64, block_n=128), Config(split=1)),
    "cuda": (Config(), Config(block_m=32), Config(block_m=128, num_warps=8), Config(block_n=128),
             Config(block_n=128, block_k=64, num_warps=8), Config(block_m=128, block_n=128, num_warps=8),
             Config(block_n=32, num_warps=2), Config(block_k=32), Config(split=1),
             Config(min_blocks_per_sm=3), Config(prefetch=True, min_blocks_per_sm=3),
             Config(prefetch=True, min_blocks_per_sm=4)),
}
"""The candidates per backend, the untuned kernel first (small on purpose: each costs a compile). The last
three cuda ones ran faster than the defaults for some tensor-core kernels and slower for others, so none
is a default (docs/gpu-backend.md, "Why these defaults")."""

Timer = Callable[[Callable[[], object], Config], float]
"""``timer(run, config)``: seconds one call of `run` takes (`config` names the candidate, for logs and fakes)."""


def wall_clock(run: Callable[[], object], config: Config, *, repeats: int = 5, budget_s: float = 0.5) -> float:
    """The median of up to `repeats` timed calls (after one warm-up), fewer when they exceed `budget_s`."""
    run()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats and (not times or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cuda_events(run: Callable[[], object], config: Config, *, repeats: int = 10) -> float:
    """The median of `repeats` calls timed by CUDA events on the default stream (after one warm-up)."""
    from .cuda_driver import call, driver, primary_context

    primary_context(0).make_current()
    run()
    call("cuCtxSynchronize")
    default_stream = driver.CUstream(0)   # where a call without ``stream=`` queues its work
    times = []
    for _ in range(repeats):
        start, end = call("cuEventCreate", 0), call("cuEventCreate", 0)
        try:
            call("cuEventRecord", start, default_stream)
            run()
            call("cuEventRecord", end, default_stream)
            call("cuEventSynchronize", end)
            times.append(float(call("cuEventElapsedTime", start, end)) / 1e3)
        finally:
            call("cuEventDestroy", start)
            call("cuEventDestroy", end)
    return statistics.median(times)


TIMERS: dict[str, Timer] = {"cpu": wall_clock, "cuda": cuda_events}
_override: list[Timer] = []


@contextlib.contextmanager
def using_timer(timer: Timer) -> Iterator[None]:
    """Time candidates with `timer` inside the ``with`` (any backend)."""
    _override.append(timer)
    try:
        yield
    finally:
        _override.pop()


def _gpu_name() -> str:
    from .device import device_info

    info = device_info(0)
    return f"{info.name} ({info.sm})"


def _host_name() -> str:
    import llvmlite.binding as llvm

    return f"{platform.machine()} {llvm.get_host_cpu_name()} x{os.cpu_count()}"


DEVICES: dict[str, Callable[[], str]] = {"cpu": _host_name, "cuda": _gpu_name}
"""Per backend in `SPACES`, what its timings depend on besides the code (beside `TIMERS`)."""


def device_name(backend: str) -> str:
    """What the timings depend on besides the code: the GPU's name, or the host CPU and its core count."""
    return DEVICES.get(backend, _host_name)()


def tuning_key(ir_text: str, specs: str, backend: str, device: str, fixed: Mapping[str, object]) -> CacheKey:
    """The key of one specialization's tuning (see the module docstring); versions come with `CacheKey`."""
    code = "\n".join(line for line in ir_text.splitlines() if not line.lstrip().startswith("#"))
    return CacheKey.build(artifact="autotune", stage=code, options={"specs": specs, "fixed": dict(fixed)},
                          target=f"{backend}/{device}")


@dataclass(frozen=True)
class Record:
    """One tuning's result as stored: the best config and every candidate's seconds (None: it failed)."""

    key: str
    kernel: str
    backend: str
    device: str
    best: Config
    timings: tuple[tuple[Config, float | None], ...]


class TuningStore:
    """The JSON files of tuning results in `folder`, one per key (see the module docstring)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.memory: dict[str, Record] = {}    # (the results of a store without a folder: REDFUSER_CACHE=0)

    def path(self, key: CacheKey) -> Path:
        assert self.folder is not None
        return self.folder / f"{key.digest}.json"

    def load(self, key: CacheKey, accept: Callable[[Config], object] | None = None) -> Record | None:
        """The stored result of `key`; None when there is none or it is unreadable (warned, then replaced):
        not a regular file (a FIFO hung the call, a link to /dev/zero read until memory ran out), not the
        format, or a best config that `accept` refuses with a `RedFuserError` (``num_warps: 7``: every call
        raised the options' error, naming options the user never set)."""
        if self.folder is None:
            return self.memory.get(key.digest)
        path = self.path(key)
        try:
            found = read_regular(path)
            if found is None:
                raise ValueError("not a regular file")
            data = json.loads(found[0].decode())
            if data.get("format") != FORMAT or data.get("key") != key.digest:
                raise ValueError("another format or key")
            best = _config(data["best"])
            timings = tuple((_config(c), None if s is None else float(s)) for c, s in data["timings"])
            if accept is not None:
                accept(best)
            return Record(key.digest, str(data["kernel"]), str(data["backend"]), str(data["device"]), best, timings)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RedFuserError) as err:
            warnings.warn(CacheWarning(f"autotune: ignoring unreadable {path} ({err}); tuning again"), stacklevel=3)
            return None

    def save(self, record: Record) -> Path | None:
        """Write `record` atomically and return where; an unwritable folder only warns and returns None (the
        result is then not remembered); a store without a folder keeps it in memory and returns None."""
        if self.folder is None:
            self.memory[record.key] = record
            return None
        path = self.folder / f"{record.key}.json"
        data = {"format": FORMAT, "key": record.key, "kernel": record.kernel, "backend": record.backend,
                "device": record.device, "best": record.best.options(),
                "timings": [[c.options(), s] for c, s in record.timings]}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_atomic(path, (json.dumps(data) + "\n").encode())
        except OSError as err:
            warnings.warn(CacheWarning(f"autotune: cannot write {path} ({err})"), stacklevel=3)
            return None
        return path


def _config(data: object) -> Config:
    """A stored config, checked (`ValueError` when it is not one: the file is then unreadable)."""
    if not isinstance(data, dict) or not all(
            k in TUNED and (isinstance(v, bool) if k == "prefetch" else
                            isinstance(v, int) and not isinstance(v, bool) and v >= 1) for k, v in data.items()):
        raise ValueError(f"not a config: {data!r}")
    return Config(**data)


_IN_MEMORY = TuningStore(None)


def default_store() -> TuningStore:
    """``<cache dir>/autotune`` (`redfuser.config.cache_dir`); with the cache off (``REDFUSER_CACHE=0``) one
    store in this process's memory, so that nothing is written to disk."""
    from .. import config  # local: config lives in the package that imports runtime

    return TuningStore(config.cache_dir() / "autotune") if config.cache_enabled() else _IN_MEMORY


def tune(kernel: str, key: CacheKey, candidates: tuple[Config, ...], measure: Callable[[Config], float], *,
         backend: str, device: str, store: TuningStore, progress: TextIO | None = None,
         accept: Callable[[Config], object] | None = None) -> Config:
    """The stored best config of `key` (that `accept` takes: `TuningStore.load`), else the fastest candidate by
    `measure` (then stored)."""
    found = store.load(key, accept)
    if found is not None:
        return found.best
    out = sys.stderr if progress is None else progress
    timings: list[tuple[Config, float | None]] = []
    best: tuple[float, Config] | None = None
    first_error: RedFuserError | None = None
    width = 0
    for n, config in enumerate(candidates, 1):
        head = f"autotune {kernel} [{backend}] {n}/{len(candidates)} {config}"
        out.write("\r" + f"{head}: ...".ljust(width))
        out.flush()
        width = len(head) + 5
        try:
            seconds: float | None = float(measure(config))
            result = f"{seconds * 1e3:.3f} ms"
        except RedFuserError as err:
            seconds, result = None, f"skipped ({str(err).splitlines()[0][:60]})"
            first_error = first_error or err
        timings.append((config, seconds))
        if seconds is not None and (best is None or seconds < best[0]):
            best = (seconds, config)
        shown = f" (best {best[0] * 1e3:.3f} ms)" if best is not None else ""
        line = f"{head}: {result}{shown}"
        out.write("\r" + line.ljust(width))
        out.flush()
        width = len(line)
    if best is None:
        out.write("\n")
        raise first_error  # type: ignore[misc] - every candidate failed: the untuned kernel's error
    path = store.save(Record(key.digest, kernel, backend, device, best[1], tuple(timings)))
    where = (f"saved to {path}" if path is not None else "kept in memory (the cache is off)"
             if store.folder is None else "not saved (see the warning)")
    out.write(f"\nautotune {kernel} [{backend}]: {best[1]} ({best[0] * 1e3:.3f} ms), {where}\n")
    out.flush()
    return best[1]


def wanted(options: KernelOptions) -> bool:
    """Whether a kernel with `options` tunes: its ``autotune`` option or ``REDFUSER_AUTOTUNE``."""
    from .. import config

    return options.autotune or config.autotune_enabled()


def tuned_options(kernel: str, ir_text: str, specs: str, backend: str, options: KernelOptions,
                  defaults: KernelOptions, prepare: Callable[[KernelOptions], Callable[[], object]], *,
                  measure: bool = True, store: TuningStore | None = None,
                  progress: TextIO | None = None) -> KernelOptions:
    """`options` with the tuned values for this specialization (see the module docstring): each candidate
    is ``dataclasses.replace(options, **config.options())``.

    `defaults` are the kernel's default options (a tuned option the user changed from its
    default stays fixed); ``prepare(options)`` compiles the kernel with `options` and
    returns a callable running it once on the arguments being tuned for. With
    ``measure=False`` (compiling without running) only a stored result is used.
    """
    given = asdict(options)
    fixed = {name: given[name] for name in TUNED if given[name] != getattr(defaults, name)}
    candidates = tuple(dict.fromkeys(replace(c, **fixed) for c in SPACES[backend]))
    store = store or default_store()
    try:
        device = device_name(backend)
    except RedFuserError:
        if measure:
            raise
        return options   # compiling for a GPU this machine does not have: nothing to look up
    untuned = {k: v for k, v in sorted(given.items()) if k not in TUNED and k != "autotune"}
    key = tuning_key(ir_text, specs, backend, device, {**untuned, **fixed})
    def accept(c: Config) -> KernelOptions:   # (the options' own check of a stored config: ArgumentError)
        return replace(options, **c.options())

    if not measure:
        found = store.load(key, accept)
        return replace(options, **found.best.options()) if found is not None else options
    timer = _override[-1] if _override else TIMERS[backend]
    best = tune(kernel, key, candidates, lambda c: timer(prepare(replace(options, **c.options())), c),
                backend=backend, device=device, store=store, progress=progress, accept=accept)
    return replace(options, **best.options())


__all__ = [
    "SPACES",
    "Config",
    "Record",
    "Timer",
    "TuningStore",
    "cuda_events",
    "default_store",
    "tune",
    "tuned_options",
    "tuning_key",
    "using_timer",
    "wall_clock",
    "wanted",
]
