"""The fuzzer's campaign and command line: ``python -m redfuser fuzz --backend all --examples N --seed S``.

A campaign runs examples ``0 .. N-1`` of seed ``S`` (`fuzz_tasks`: most are
whole-compiler programs of `program_grammar`, run on every chosen backend and
judged against the numpy body by `program_judge`; every eighth is a cascade of
the fusion grammar, checked for fusion soundness, completeness and reasons).
Examples run in ``--jobs`` worker processes (`fuzz_pool`; ``0``: in this
process), so a crash or a hang is one failure, not the end of the campaign.

It prints a summary (examples, time and throughput per backend, calls and
elements judged, the ops and idioms drawn, the fusion grammar's table, failures
by signature, and how many elements the oracle left unjudged as known limits
of the fusion engine) and, for the first failure of each signature, shrinks it and
prints a runnable reproducer script (``--out``: also written to files). The
exit code is 1 when anything failed, 2 for a bad command line.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import cascade_repro
from .cascade_check import Failure as CascadeFailure
from .cascade_check import check, tolerance_scale
from .cascades import Cascade
from .fuzz_pool import Pool
from .fuzz_tasks import Config, Result, cascade_example, is_cascade, program_example, run_example
from .program import Program
from .program_judge import Failure
from .program_judge import run as judge_program
from .program_repro import reproducer
from .program_shrink import shrink

PROFILE_EXAMPLES = {"ci": 25, "fuzz": 2500, "long": 115000}

DEFAULT_TIMEOUT = 300.0
"""Seconds one example may run on one backend in a worker (``--timeout``)."""
"""Examples per run when ``--examples`` is not given (``long``: the campaign of issue 18, 100 625 programs on every
backend and 14 375 cascades, about 4 hours with ``--jobs 2`` on an idle 2-core machine)."""
HOST_BACKENDS = ("interpret", "cpu", "simulate")
PROGRESS_EVERY = 1000
"""Without ``--verbose``, a line on stderr every this many examples (a long campaign runs for hours)."""
LIMIT_TEXT = {"precondition": "an earlier result of a fused cascade infinite, NaN or a zero divisor (oracle rule 6)",
              "expansion": "a fused sum whose expanded terms are infinite or overflow (oracle rule 4)"}
"""The summary's words for each of `program_judge.LIMITS` (unsure, never judged; counted over every backend)."""
STATUSES = ("fused", "refused", "blocked", "unpaired", "ungrouped", "dead")
example = cascade_example  # the fusion fuzzer's name for a cascade example


@dataclass
class Campaign:
    """Counts, timings and failures of one run."""

    config: Config
    jobs: int = 0
    examples: int = 0
    programs: int = 0
    seconds: float = 0.0
    backend_seconds: Counter = field(default_factory=Counter)
    calls: int = 0
    judged: int = 0
    unsure: int = 0
    refusals: int = 0
    limit_elements: Counter = field(default_factory=Counter)   # program_judge.LIMITS -> unsure elements
    limit_calls: Counter = field(default_factory=Counter)
    limit_differ: Counter = field(default_factory=Counter)     # ... of them computed otherwise than numpy
    limit_examples: dict[str, list[int]] = field(default_factory=dict)
    ops: Counter = field(default_factory=Counter)
    labels: Counter = field(default_factory=Counter)
    by_family: dict[tuple[str, str, str], Counter] = field(default_factory=dict)
    failures: list[tuple[int, Failure]] = field(default_factory=list)

    def record(self, r: Result) -> None:
        self.examples += 1
        self.programs += r.kind == "program"
        self.backend_seconds.update(r.seconds)
        self.calls += r.calls
        self.judged += r.judged
        self.unsure += r.unsure
        self.refusals += r.refusals
        for name, (elements, calls, differ) in r.limits.items():
            self.limit_elements[name] += elements
            self.limit_calls[name] += calls
            self.limit_differ[name] += differ
            self.limit_examples.setdefault(name, []).append(r.index)
        self.ops.update(r.ops)
        self.labels.update(x for x in r.label.split("+") if x)
        for key, counts in r.cascade_status.items():
            self.by_family.setdefault(key, Counter()).update(counts)
        self.failures += [(r.index, f) for f in r.failures]
        self.failures.sort(key=lambda e: e[0])   # (by example: the first and the one shrunk, whatever --jobs did)

    def summary(self) -> str:
        c = self.config
        rate = self.examples / self.seconds if self.seconds else 0.0
        lines = [f"RedFuser fuzzer: {self.examples} examples ({self.programs} programs, "
                 f"{self.examples - self.programs} cascades), seed {c.seed}{c.drawing()}, "
                 f"backends {', '.join(c.backends)}, "
                 f"{self.jobs or 'no'} worker process{'es' if self.jobs != 1 else ''}, {self.seconds:.1f} s "
                 f"({rate:.2f} examples/s)",
                 "CPU seconds per example: " + ", ".join(
                     f"{b} {self.backend_seconds[b] / max(self.examples, 1):.3f}" for b in ("oracle",) + c.backends)]
        total = self.judged + self.unsure
        lines.append(f"programs: {self.calls} calls ({self.refusals} refused by numpy and the kernel alike), "
                     f"{self.judged} elements judged, {self.unsure} unsure ({100 * self.unsure / max(total, 1):.2f}%)")
        for name, what in LIMIT_TEXT.items():
            n, calls, where = self.limit_elements[name], self.limit_calls[name], self.limit_examples.get(name, [])
            lines.append(f"known fusion limits: {n} element{'s' if n != 1 else ''} in {calls} call"
                         f"{'s' if calls != 1 else ''} (docs/fusion.md, "
                         f"'Limits'): {what}" + (f"; {self.limit_differ[name]} of them computed otherwise than "
                                                 f"numpy; examples {', '.join(map(str, sorted(where)[:8]))}"
                                                 if where else ""))
        lines.append("ops: " + ", ".join(f"{op} {n}" for op, n in self.ops.most_common()))
        if self.labels:
            lines.append("idioms: " + ", ".join(f"{x} {n}" for x, n in self.labels.most_common()))
        if self.by_family:
            lines += _cascade_table(self.by_family)
        lines += _failure_lines(self.failures)
        return "\n".join(lines)


def _cascade_table(by_family: dict[tuple[str, str, str], Counter]) -> list[str]:
    total: Counter = Counter()
    for counts in by_family.values():
        total.update(counts)
    lines = [f"cascade reductions: {sum(total.values())}: " + ", ".join(f"{s} {total[s]}" for s in STATUSES),
             f"  {'label':<14} {'op':<7} {'family':<34} " + " ".join(f"{s:>9}" for s in STATUSES)]
    for (label, op, family), counts in sorted(by_family.items()):
        lines.append(f"  {label:<14} {op:<7} {family[:34]:<34} " + " ".join(f"{counts[s]:>9}" for s in STATUSES))
    return lines


def _failure_lines(failures: list[tuple[int, Failure]]) -> list[str]:
    groups: dict[tuple, list[tuple[int, Failure]]] = {}
    for index, f in failures:
        groups.setdefault(f.signature(), []).append((index, f))
    lines = [f"failures: {len(failures)}" + (f" ({len(groups)} signatures)" if failures else "")]
    for sig, items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        index, f = items[0]
        lines.append(f"  {len(items):5d} x {' / '.join(x for x in sig if x)}: first example {index}: {f.message[:240]}")
    return lines


def run(config: Config, examples: int, jobs: int = 0, verbose: bool = False, pool: Pool | None = None,
        first: int = 0) -> Campaign:
    """Run examples ``first .. first+examples-1`` of `config` (in `pool`'s workers; without one, here)."""
    campaign = Campaign(config, jobs if pool is not None else 0)
    start = time.monotonic()
    indices = range(first, first + examples)
    results = pool.examples(indices) if pool is not None else (run_example(config, i) for i in indices)
    for r in results:
        campaign.record(r)
        if verbose:
            print(f"{r.index:6d} {'FAIL' if r.failures else 'ok  '} {r.kind:8s} {r.description[:150]}", flush=True)
            for f in r.failures:   # at once: a long campaign's reproducers come only at its end
                print(f"{'':6s}   {f.kind} on {f.backend}: {f.message[:400]}", flush=True)
        elif campaign.examples % PROGRESS_EVERY == 0:
            print(f"{campaign.examples}/{examples} examples, {len(campaign.failures)} failures, "
                  f"{time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    campaign.seconds = time.monotonic() - start
    return campaign


def reproducers(campaign: Campaign, shrink_budget: int = 300, limit: int = 5,
                pool: Pool | None = None) -> list[tuple[str, str]]:
    """(title, script) for the first failure of each signature (at most `limit`), shrunk (budget 0: as found)."""
    out: list[tuple[str, str]] = []
    seen: set[tuple] = set()
    c = campaign.config
    for index, f in campaign.failures:
        if f.signature() in seen or len(out) >= limit or f.backend == "fuzzer":
            continue
        seen.add(f.signature())
        if is_cascade(index):
            script = _cascade_reproducer(c, index, f, shrink_budget)
        else:
            script = _program_reproducer(c, index, f, shrink_budget, pool)
        if script:
            out.append((f"{f.kind} on {f.backend} (example {index})", script))
    return out


def _program_reproducer(c: Config, index: int, f: Failure, budget: int, pool: Pool | None) -> str:
    """Shrink program example `index` while it fails like `f`, in a worker when there is a pool (a candidate
    may crash the process), and print it."""
    p = program_example(c.seed, index, c.max_size)

    def failures(q: Program) -> list[Failure]:
        return pool.judge(q, f.backend).failures if pool is not None else judge_program(q, f.backend).failures

    def fails(q: Program) -> bool:
        try:
            return any(g.signature() == f.signature() for g in failures(q))
        except Exception:  # the oracle cannot run this candidate
            return False

    original, tried, note = p, 0, ""
    if budget:
        p, tried = shrink(p, fails, budget=min(budget, 40) if f.kind in ("crash", "timeout") else budget)
    confirmed = None
    for candidate in ([p, original] if p is not original else [p]):  # in a fresh worker: earlier tasks may matter
        if pool is not None:
            pool.fresh()
        found = [g for g in failures(candidate) if g.signature() == f.signature()]
        if found:
            confirmed = candidate, found[0]
            break
    if confirmed is None:
        p, note = original, ("\n\nNOT CONFIRMED: this program did not fail again in a fresh process; the failure "
                             "depends on what the worker ran before it (a cache, or memory an earlier kernel wrote)")
    else:
        p, f = confirmed
        if p is original and tried:
            note = "\n\n(The shrunk program did not fail in a fresh process: printed as drawn.)"
    shrunk = f", shrunk in {tried} tries)" if tried and p is not original else ")"
    origin = f" (seed {c.seed}{c.drawing()}, example {index}" + shrunk
    return reproducer(p, f, origin + note)


def _cascade_reproducer(c: Config, index: int, f: Failure, budget: int) -> str:
    cascade: Cascade = cascade_example(c.seed, index, c.max_axis)
    # a cascade that crashed or hung its worker is printed as drawn: checking it again here, in the
    # campaign's own process, would crash or hang the campaign (a segfaulting kernel ended it, no reproducer)
    kind = f.kind.removeprefix("cascade ") if f.kind.startswith("cascade ") else "soundness"
    lost = f.kind in ("crash", "timeout")
    target = None if lost else next((g for g in check(cascade).failures if g.kind == kind), None)
    if f.backend != "interpret" or target is None:
        # (the worst element the campaign found, so that the script asserts its value: without it a wrong value
        # on cpu printed both arrays and exited 0; found by a helper)
        name = cascade.returns[min(f.output, len(cascade.returns) - 1)]
        worst = (f.index, f.allowed) if f.index is not None else None
        scale = None if lost else tolerance_scale(cascade, name)
        target = CascadeFailure("soundness", name, f.message, worst, scale)
        origin = f" (seed {c.seed}{c.drawing()}, example {index}, on {f.backend})"
        text = cascade_repro.reproducer(cascade, target, origin)
        return re.sub(r'backend="interpret", interpret_chunk=\d+', f'backend="{f.backend}"', text)
    tried = 0
    if budget:
        cascade, tried = cascade_repro.shrink(cascade, cascade_repro.same_failure(target), budget=budget)
        again = check(cascade).failures
        target = next((g for g in again if g.kind == target.kind), target)
    origin = f" (seed {c.seed}{c.drawing()}, example {index}" + (f", shrunk in {tried} tries)" if tried else ")")
    return cascade_repro.reproducer(cascade, target, origin)


# ---------------------------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------------------------
def _count(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def backends_here() -> tuple[str, ...]:
    """The host backends, and ``cuda`` where a device is present."""
    from redfuser import backends

    return HOST_BACKENDS + (("cuda",) if backends.BACKENDS["cuda"].usable() is None else ())


def parser() -> argparse.ArgumentParser:
    """The ``fuzz`` command's argument parser."""
    p = argparse.ArgumentParser(
        prog="redfuser fuzz",
        description="Random programs over RedFuser's whole op subset (dtypes, casts, masks, top-k, quantization, "
                    "matmul, static scalars, views, kernel options), run on each backend and judged against the "
                    "numpy body; every eighth example a cascade of the fusion grammar, checked for fusion "
                    "soundness, completeness and reasons. Failures are shrunk and printed as runnable scripts.",
        epilog="The long campaign: python -m redfuser fuzz --profile long --seed 1 --jobs 2 --timeout 1800 --out repro/ "
               "(docs/testing.md, 'The fuzzer').")
    p.add_argument("--backend", default="all", choices=("all", *HOST_BACKENDS, "cuda"),
                   help="run every program on this backend, or on all that run here (default: all: interpret, "
                        "cpu, simulate, and cuda with a device)")
    p.add_argument("--examples", type=_count(1), default=None, help="how many examples (default: from --profile)")
    p.add_argument("--seed", type=int, default=0, help="campaign seed (example i is reproducible from it)")
    p.add_argument("--first", type=_count(0), default=0,
                   help="number of the first example (--first 117 --examples 1 reruns example 117 alone)")
    p.add_argument("--profile", choices=sorted(PROFILE_EXAMPLES), default="ci",
                   help="default size: ci (25 examples), fuzz (2500) or long (115000: 100 625 programs)")
    p.add_argument("--jobs", type=_count(0), default=1,
                   help="worker processes (default 1; 0 runs in this process: a crash ends the campaign and "
                        "--timeout cannot stop a hang, so re-run a timed-out example with --jobs 1)")
    p.add_argument("--max-axis", type=_count(1), default=4096, help="longest reduced axis of a cascade")
    p.add_argument("--max-size", type=_count(1), default=256, help="elements of a program's typical array")
    p.add_argument("--timeout", type=_seconds, default=None,
                   help="seconds one example may run on one backend, in a worker process (--jobs 1 or more; "
                        f"default {DEFAULT_TIMEOUT:.0f})")
    p.add_argument("--recycle", type=_count(0), default=2000,
                   help="a worker process is replaced after this many examples (0: never)")
    p.add_argument("--shrink-budget", type=_count(0), default=300, help="candidates tried when shrinking (0: off)")
    p.add_argument("--reproducers", type=_count(0), default=5, help="print at most this many (one per signature)")
    p.add_argument("--out", type=Path, default=None, help="also write each reproducer to this folder")
    p.add_argument("--verbose", action="store_true", help="print one line per example")
    return p


def main(argv: list[str] | None = None) -> int:
    """``fuzz`` command line: run a campaign, print the summary and reproducers; 1 when something failed."""
    p = parser()
    ns = p.parse_args(argv)
    here = backends_here()
    if ns.backend != "all" and ns.backend not in here:
        p.error(f"backend {ns.backend!r} cannot run here (runs here: {', '.join(here)})")
    if ns.jobs == 0 and ns.timeout is not None:
        p.error("--timeout needs a worker process to stop (--jobs 1 or more): in this process (--jobs 0) a "
                "hanging example cannot be stopped")
    if ns.out is not None:      # before the campaign: a folder that cannot be made must not cost its hours
        try:
            ns.out.mkdir(parents=True, exist_ok=True)
            if not os.access(ns.out, os.W_OK):
                raise PermissionError("not writable")
        except OSError as err:
            p.error(f"--out {str(ns.out)!r} is not a folder reproducers can be written to ({err})")
    config = Config(ns.seed, here if ns.backend == "all" else (ns.backend,), ns.max_axis, ns.max_size)
    examples = ns.examples if ns.examples is not None else PROFILE_EXAMPLES[ns.profile]
    timeout = DEFAULT_TIMEOUT if ns.timeout is None else ns.timeout
    pool = Pool(ns.jobs, config, timeout, ns.recycle) if ns.jobs else None
    try:
        campaign = run(config, examples, ns.jobs, ns.verbose, pool, ns.first)
        print(campaign.summary(), flush=True)
        for n, (title, script) in enumerate(reproducers(campaign, ns.shrink_budget, ns.reproducers, pool)):
            print(f"\n---- reproducer: {title} ----\n{script}", flush=True)
            if ns.out is not None:
                ns.out.mkdir(parents=True, exist_ok=True)
                (ns.out / f"fuzz_repro_{n}.py").write_text(script)
    finally:
        if pool is not None:
            pool.close()
    return 1 if campaign.failures else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
