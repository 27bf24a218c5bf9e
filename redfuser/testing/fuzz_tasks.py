"""What the fuzzer does with one example, in whatever process runs it (a pool worker or the campaign's own).

Example ``i`` of seed ``S`` is reproducible from the two numbers alone, with ``--max-axis`` and ``--max-size``
where they are not the defaults (they bound the draws: `Config.drawing`):

- every `CASCADE_EVERY`-th example is a cascade of the fusion grammar
  (``draw_cascade(RandomDraw("redfuser-fuzz:S:i"))``), checked on ``interpret``
  for the fusion properties of `cascade_check` (soundness, completeness,
  reasons) and, for soundness, on the other backends too (with the float64
  bound of `cascade_check` at chunk 1, which covers every chunking; the
  simulator only takes cascades of at most `SIMULATE_CASCADE_ELEMENTS`);
- the others are whole-compiler programs (``draw_program(RandomDraw("redfuser-programs:S:i"))``),
  run on every backend and judged by `program_judge`.

`Result` is what comes back: plain data, so it crosses process boundaries.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field, replace

import numpy as np

import redfuser as rf

from .cascade_check import check, compare, error_bounds
from .cascades import Cascade, RandomDraw, draw_cascade
from .program import Program
from .program_grammar import draw_program
from .program_judge import Failure, run
from .program_oracle import GPU_BACKENDS, reference

CASCADE_EVERY = 8
SIMULATE_CASCADE_ELEMENTS = 4096


@dataclass(frozen=True)
class Config:
    """The campaign's knobs every example needs."""

    seed: int
    backends: tuple[str, ...]
    max_axis: int = 4096
    max_size: int = 256

    def drawing(self) -> str:
        """The options besides the seed that change what an example is (``--max-axis``, ``--max-size``), as
        the command line spells them, where they are not the defaults: a failure's rerun needs them too."""
        return "".join(f" --{name.replace('_', '-')} {value}" for name, value, default in
                       (("max_axis", self.max_axis, 4096), ("max_size", self.max_size, 256)) if value != default)


@dataclass
class Result:
    """One example's outcome (see the module docstring)."""

    index: int
    kind: str                                   # program | cascade
    description: str = ""
    label: str = ""
    failures: list[Failure] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)   # CPU seconds per backend, and "oracle"
    calls: int = 0
    judged: int = 0
    unsure: int = 0
    refusals: int = 0
    limits: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # LIMITS -> (elements, calls, differ)
    ops: tuple[str, ...] = ()
    cascade_status: dict[tuple[str, str, str], dict[str, int]] = field(default_factory=dict)


def is_cascade(index: int) -> bool:
    return index % CASCADE_EVERY == CASCADE_EVERY - 1


def program_example(seed: int, index: int, max_size: int = 256) -> Program:
    """Program example `index` of the campaign with `seed`."""
    return draw_program(RandomDraw(f"redfuser-programs:{seed}:{index}"), max_size)


def cascade_example(seed: int, index: int, max_axis: int = 4096) -> Cascade:
    """Cascade example `index` of the campaign with `seed` (the fusion fuzzer's own numbering)."""
    return draw_cascade(RandomDraw(f"redfuser-fuzz:{seed}:{index}"), max_axis)


def describe_example(config: Config, index: int) -> str:
    """Example `index` of `config` in one line, drawn without running it (a lost worker's example is named so)."""
    if is_cascade(index):
        return cascade_example(config.seed, index, config.max_axis).describe()
    return program_example(config.seed, index, config.max_size).describe()


def run_example(config: Config, index: int, progress=None) -> Result:
    """Draw example `index` and run it on every backend of `config`; `progress(backend)` before each."""
    if is_cascade(index):
        return _run_cascade(config, index, progress)
    start = time.process_time()
    p = program_example(config.seed, index, config.max_size)
    refs = {gpu: [reference(p, c, "simulate" if gpu else "cpu") for c in range(len(p.calls))]
            for gpu in {b in GPU_BACKENDS for b in config.backends}}
    result = Result(index, "program", p.describe(), p.label, ops=tuple(n.op for n in p.nodes))
    result.seconds["oracle"] = time.process_time() - start
    for backend in config.backends:
        if progress is not None:
            progress(backend)
        t = time.process_time()
        outcome = run(p, backend, refs[backend in GPU_BACKENDS])
        result.seconds[backend] = time.process_time() - t
        result.failures += outcome.failures
        result.calls += outcome.calls
        result.judged += outcome.judged
        result.unsure += outcome.unsure
        result.refusals += outcome.refusals
        for name, n in outcome.limit_elements.items():  # program_judge.LIMITS
            elements, calls, differ = result.limits.get(name, (0, 0, 0))
            result.limits[name] = (elements + n, calls + outcome.limit_calls[name],
                                   differ + outcome.limit_differ[name])
    return result


def _run_cascade(config: Config, index: int, progress) -> Result:
    c = cascade_example(config.seed, index, config.max_axis)
    result = Result(index, "cascade", c.describe(), "cascade")
    if progress is not None:
        progress("interpret")
    t = time.process_time()
    verdict = check(c)
    result.seconds["interpret"] = time.process_time() - t
    for r in c.reductions:
        key = ("separable" if r.separable else "non-separable", r.op, r.family)
        counts = result.cascade_status.setdefault(key, {})
        status = verdict.status.get(r.name, "ungrouped")
        counts[status] = counts.get(status, 0) + 1
    for f in verdict.failures:  # the fusion fuzzer's kinds, kept apart from the programs' ones
        kind = "exception" if f.kind == "crash" else f"cascade {f.kind}"
        result.failures.append(Failure(kind, "interpret", 0, f.message, "cascade"))
    elements = math.prod(c.data.shapes[0][1])
    for backend in config.backends:
        if backend == "interpret" or (backend == "simulate" and elements > SIMULATE_CASCADE_ELEMENTS):
            continue
        if progress is not None:
            progress(backend)
        t = time.process_time()
        result.failures += cascade_soundness(c, backend)
        result.seconds[backend] = time.process_time() - t
    return result


def cascade_soundness(c: Cascade, backend: str) -> list[Failure]:
    """The cascade's outputs on `backend` against its reference, under `cascade_check`'s bound at chunk 1."""
    arrays = c.data.build()
    args = [arrays[n] for n in c.inputs]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got = rf.kernel(c.function, backend=backend)(*args)
        except Exception as err:
            return [Failure("exception", backend, 0, f"{type(err).__name__}: {str(err).splitlines()[0][:300]}",
                            type(err).__name__)]
        want = c.function(*args)
        bounds = error_bounds(replace(c, chunk=1), arrays)
    got, want = (got, want) if len(c.returns) > 1 else ((got,), (want,))
    out = []
    for k, (name, a, e) in enumerate(zip(c.returns, got, want)):
        f = compare(np.asarray(a), np.asarray(e), bounds[name], c)
        if f is not None:   # (the worst element goes into the reproducer's assertion: `fuzz._cascade_reproducer`)
            index, allowed = f.worst if f.worst is not None else (None, 0.0)
            out.append(Failure("wrong value", backend, 0, f"cascade `{name}`: {f.message[:400]}", "cascade",
                               output=k, index=index, allowed=allowed))
    return out
