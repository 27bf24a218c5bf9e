"""The fusion fuzzer's campaign: ``python -m redfuser fuzz --examples N --seed S``.

Example ``i`` of seed ``S`` is the cascade `draw_cascade` builds from
``RandomDraw("redfuser-fuzz:S:i")`` (the grammar of `redfuser.testing.cascades`),
so any example can be rebuilt from the seed and its number alone. Each one is
lowered and run on the ``interpret`` backend in chunks of a few elements and
checked for the three properties of `redfuser.testing.cascade_check`
(soundness against the numpy reference under the documented tolerance rule,
completeness on the grammar, reasons for refusals).

The campaign prints a summary (examples, reductions fused / refused by family
and by the grammar's label, failures by kind) and, for the first failure of
each signature (kind, op and family of the failing reduction), shrinks it and
prints a self-contained reproducer script. The exit
code is 1 when anything failed. A long campaign: ``--examples 5000 --seed 1``
(any seed; seeds are independent campaigns), or ``--profile fuzz``.
"""
from __future__ import annotations

import argparse
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .cascade_check import KINDS, Failure, check
from .cascade_repro import reproducer, same_failure, shrink
from .cascades import Cascade, RandomDraw, draw_cascade

PROFILE_EXAMPLES = {"ci": 25, "fuzz": 2500}
"""Examples per run when ``--examples`` is not given (the hypothesis profiles' sizes)."""
STATUSES = ("fused", "refused", "blocked", "unpaired", "ungrouped", "dead")


def example(seed: int, index: int, max_axis: int = 4096) -> Cascade:
    """Example `index` of the campaign with `seed`."""
    return draw_cascade(RandomDraw(f"redfuser-fuzz:{seed}:{index}"), max_axis)


@dataclass
class Campaign:
    """Counts and failures of one run."""

    seed: int
    examples: int = 0
    seconds: float = 0.0
    by_family: dict[tuple[str, str, str], Counter] = field(default_factory=dict)
    failures: list[tuple[int, Cascade, Failure]] = field(default_factory=list)

    def record(self, index: int, c: Cascade, status: dict[str, str], failures: list[Failure]) -> None:
        self.examples += 1
        for r in c.reductions:
            key = ("separable" if r.separable else "non-separable", r.op, r.family)
            self.by_family.setdefault(key, Counter())[status.get(r.name, "ungrouped")] += 1
        self.failures += [(index, c, f) for f in failures]

    def totals(self) -> Counter:
        out: Counter = Counter()
        for counts in self.by_family.values():
            out.update(counts)
        return out

    def summary(self) -> str:
        total = self.totals()
        lines = [f"RedFuser fusion fuzzer: {self.examples} examples, seed {self.seed}, {self.seconds:.1f} s",
                 f"reductions: {sum(total.values())}: " + ", ".join(f"{s} {total[s]}" for s in STATUSES),
                 ("  (refused: its own body; blocked: reads an unfused result; unpaired: fewer than two of its group "
                  "fuse; dead: not needed by any output)"),
                 f"{'label':<14} {'op':<7} {'family':<34} " + " ".join(f"{s:>9}" for s in STATUSES)]
        for (label, op, family), counts in sorted(self.by_family.items()):
            lines.append(f"{label:<14} {op:<7} {family[:34]:<34} " + " ".join(f"{counts[s]:>9}" for s in STATUSES))
        kinds = Counter(f.kind for _, _, f in self.failures)
        lines.append(f"failures: {len(self.failures)}" +
                     (" (" + ", ".join(f"{k} {kinds[k]}" for k in KINDS if kinds[k]) + ")" if self.failures else ""))
        for index, c, f in self.failures[:40]:
            lines.append(f"  example {index}: {f.kind}: {f.message[:300]}")
            lines.append(f"    {c.describe()[:300]}")
        if len(self.failures) > 40:
            lines.append(f"  ... and {len(self.failures) - 40} more")
        return "\n".join(lines)


def run(examples: int, seed: int, max_axis: int = 4096, verbose: bool = False) -> Campaign:
    """Check `examples` cascades of campaign `seed`."""
    campaign = Campaign(seed)
    start = time.monotonic()
    for i in range(examples):
        c = example(seed, i, max_axis)
        verdict = check(c)
        campaign.record(i, c, verdict.status, verdict.failures)
        if verbose:
            print(f"{i:5d} {'FAIL' if verdict.failures else 'ok  '} {c.describe()[:150]}", flush=True)
    campaign.seconds = time.monotonic() - start
    return campaign


def signature(c: Cascade, f: Failure) -> tuple[str, ...]:
    """Failures with one signature are likely one bug: the kind and the failing reduction's op and family."""
    r = next((x for x in c.reductions if x.name == f.reduction), None)
    if r is None:
        return (f.kind, f.message.split(":")[0])
    return (f.kind, r.op, r.family, "nan" if "NaN positions" in f.message else "")


def reproducers(campaign: Campaign, shrink_budget: int = 150, limit: int = 5) -> list[tuple[str, str]]:
    """(title, script) for the first failure of each signature (at most `limit`), shrunk (budget 0: as found)."""
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, ...]] = set()
    for index, c, f in campaign.failures:
        key = signature(c, f)
        if key in seen or len(out) >= limit:
            continue
        seen.add(key)
        tried = 0
        if shrink_budget:
            c, tried = shrink(c, same_failure(f), budget=shrink_budget)
            verdict = check(c, soundness=True)
            f = next((g for g in verdict.failures if g.kind == f.kind and (not f.reduction or g.reduction == f.reduction)), f)
        origin = f" (seed {campaign.seed}, example {index}" + (f", shrunk in {tried} tries)" if tried else ")")
        out.append((f"{f.kind} (example {index})", reproducer(c, f, origin)))
    return out


def main(argv: list[str] | None = None) -> int:
    """``fuzz`` command line: run a campaign, print the summary and reproducers; 1 when something failed."""
    parser = argparse.ArgumentParser(
        prog="redfuser fuzz",
        description="Random cascaded reductions, fused and run on the interpret backend, checked against the numpy "
                    "reference (soundness), the grammar's separability labels (completeness) and for reasons.")
    parser.add_argument("--examples", type=int, default=None, help="how many cascades (default: from --profile)")
    parser.add_argument("--seed", type=int, default=0, help="campaign seed (example i is reproducible from it)")
    parser.add_argument("--profile", choices=sorted(PROFILE_EXAMPLES), default="ci",
                        help="default size: ci (25 examples) or fuzz (2500)")
    parser.add_argument("--max-axis", type=int, default=4096, help="longest reduced axis to draw")
    parser.add_argument("--shrink-budget", type=int, default=150, help="candidates tried when shrinking (0: off)")
    parser.add_argument("--reproducers", type=int, default=5, help="print at most this many (one per signature)")
    parser.add_argument("--out", type=Path, default=None, help="also write each reproducer to this folder")
    parser.add_argument("--verbose", action="store_true", help="print one line per example")
    ns = parser.parse_args(argv)
    examples = ns.examples if ns.examples is not None else PROFILE_EXAMPLES[ns.profile]
    campaign = run(examples, ns.seed, ns.max_axis, ns.verbose)
    print(campaign.summary())
    for n, (title, script) in enumerate(reproducers(campaign, ns.shrink_budget, ns.reproducers)):
        print(f"\n---- reproducer: {title} ----\n{script}")
        if ns.out is not None:
            ns.out.mkdir(parents=True, exist_ok=True)
            (ns.out / f"fuzz_repro_{n}.py").write_text(script)
    return 1 if campaign.failures else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
