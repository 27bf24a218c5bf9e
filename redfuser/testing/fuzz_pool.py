"""Worker processes for the fuzzer: examples run in parallel, and a crash or a hang costs one example.

Each worker is a spawned process (`multiprocessing`, ``spawn``: a fresh
interpreter, never a fork of one holding LLVM and thread pools) connected by a
pipe. It runs one task at a time -- an example (`fuzz_tasks.run_example`) or one
program on one backend (for the shrinker) -- and says which backend it starts
before each, so that when the process dies (a segmentation fault in generated
code) or outlives the timeout (it is then killed), the campaign records a
``crash`` or ``timeout`` failure for that example and backend and starts a new
worker. Workers compile with the on-disk cache off (``REDFUSER_CACHE=0`` in their
own environment): a campaign of 100 000 programs would otherwise leave as many
cache entries behind. A worker is replaced after `recycle` examples, so a long
campaign's processes stay small (the in-memory cache alone grows to 256 MB).
"""
from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

from .fuzz_tasks import Config, Result, describe_example, is_cascade, run_example
from .program import Program
from .program_judge import Failure, Outcome, run


def _worker(conn: Connection, config: Config) -> None:  # pragma: no cover - runs in the child
    os.environ["REDFUSER_CACHE"] = "0"
    conn.send(("ready", None))     # (its start-up, imports included, is not its first task's time)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        tag, payload = message
        try:
            if tag == "example":
                result = run_example(config, payload, progress=lambda b: conn.send(("progress", b)))
                conn.send(("done", result))
            else:
                program, backend = payload
                conn.send(("progress", backend))
                conn.send(("done", run(program, backend)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


STARTUP_SECONDS = 120.0
"""How long a new worker may take to start before its first task's time counts (`Pool._limit`)."""


@dataclass
class _Slot:
    process: multiprocessing.process.BaseProcess
    conn: Connection
    task: tuple | None = None
    backend: str = ""
    since: float = 0.0
    history: list = field(default_factory=list)   # examples this process ran before (a crash may need them)
    ready: bool = False       # it has started (until then a task's time is its start-up's: `STARTUP_SECONDS`)


class Pool:
    """`jobs` worker processes; use as a context manager."""

    def __init__(self, jobs: int, config: Config, timeout: float = 300.0, recycle: int = 2000) -> None:
        self.config, self.timeout, self.recycle = config, timeout, recycle
        self._context = multiprocessing.get_context("spawn")
        self.slots = [self._start() for _ in range(max(1, jobs))]

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> _Slot:
        ours, theirs = self._context.Pipe()
        process = self._context.Process(target=_worker, args=(theirs, self.config), daemon=True)
        process.start()
        theirs.close()
        return _Slot(process, ours)

    def close(self) -> None:
        for slot in self.slots:
            try:
                slot.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for slot in self.slots:
            slot.process.join(timeout=5)
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join()

    def fresh(self) -> None:
        """A new process for worker 0 (nothing earlier tasks left in memory or caches)."""
        self._restart(0)

    def _restart(self, k: int) -> None:
        old = self.slots[k]
        if old.task is None and old.process.is_alive():  # idle: asked to stop
            try:
                old.conn.send(None)
                old.process.join(timeout=5)
            except (BrokenPipeError, OSError):
                pass
        if old.process.is_alive():
            old.process.kill()
        old.process.join()
        old.conn.close()
        self.slots[k] = self._start()

    # -- running tasks -----------------------------------------------------------------------------
    def _give(self, k: int, task: tuple) -> None:
        slot = self.slots[k]
        slot.task, slot.backend, slot.since = task, "", time.monotonic()
        if task[0] == "example":
            slot.history.append(task[1])
        slot.conn.send(task)

    def _lost(self, k: int, why: str) -> tuple[tuple, Failure]:
        """The worker of slot `k` died or hung: the failure to record for its task; a fresh worker."""
        slot = self.slots[k]
        kind = "timeout" if why == "timeout" else "crash"
        if kind == "crash":
            slot.process.join(timeout=5)  # reap it, for its exit code
        code = slot.process.exitcode
        message = (f"the worker ran {self.timeout:g} s on this backend and was killed" if kind == "timeout" else
                   f"the worker process died (exit code {code}{_signal_name(code)})")
        if len(slot.history) > 1:
            message += (f"; it had run {len(slot.history) - 1} examples before ({_ranges(slot.history[:-1])}): "
                        "rerun them in one process (--jobs 0) if this one alone does not fail")
        failure = Failure(kind, slot.backend or "?", 0, message, kind)
        task = slot.task
        self._restart(k)
        return task, failure

    def _limit(self, slot: _Slot) -> float:
        """Seconds a slot's task may run: the timeout, and `STARTUP_SECONDS` more while its worker has not
        started (a spawned process imports numpy, LLVM and RedFuser first: 1-1.5 s, more on a loaded machine,
        and with a short ``--timeout`` every first example of a new worker was a timeout)."""
        return self.timeout if slot.ready else self.timeout + STARTUP_SECONDS

    def _poll(self) -> Iterator[tuple[int, tuple, object]]:
        """(slot, task, answer) for each finished task; answer is a Result/Outcome, a Failure, or an error text."""
        busy = {slot.conn: k for k, slot in enumerate(self.slots) if slot.task is not None}
        for conn in wait(list(busy), timeout=1.0):
            k = busy[conn]
            slot = self.slots[k]
            try:
                tag, payload = conn.recv()
            except (EOFError, OSError):
                task, failure = self._lost(k, "crash")
                yield k, task, failure
                continue
            if tag == "ready":
                slot.ready, slot.since = True, time.monotonic()
                continue
            if tag == "progress":
                slot.backend, slot.since = payload, time.monotonic()
                continue
            if time.monotonic() - slot.since > self._limit(slot):
                # it outlived the timeout, though its answer came before this poll looked (a poll waits up to
                # a second): a timeout all the same, as it would be a moment later
                task, failure = self._lost(k, "timeout")
                yield k, task, failure
                continue
            task, slot.task = slot.task, None
            yield k, task, payload if tag == "done" else f"the fuzzer itself failed:\n{payload}"
        now = time.monotonic()
        for k, slot in enumerate(self.slots):
            if slot.task is not None and now - slot.since > self._limit(slot):
                task, failure = self._lost(k, "timeout")
                yield k, task, failure

    def examples(self, indices: Iterable[int]) -> Iterator[Result]:
        """Run the examples (in any order); a lost worker gives a Result holding its crash or timeout."""
        todo = deque(indices)
        while todo or any(s.task is not None for s in self.slots):
            for k, slot in enumerate(self.slots):
                if slot.task is None and todo:
                    if self.recycle and len(slot.history) >= self.recycle:
                        self._restart(k)   # bounds what a process accumulates (its compile cache is 256 MB)
                    self._give(k, ("example", todo.popleft()))
            for _, task, answer in self._poll():
                if isinstance(answer, Result):
                    yield answer
                else:
                    failure = answer if isinstance(answer, Failure) else Failure("exception", "fuzzer", 0, answer,
                                                                                 "fuzzer")
                    # (named as a finished example is: the line of a lost one said only its kind)
                    yield Result(task[1], "cascade" if is_cascade(task[1]) else "program",
                                 describe_example(self.config, task[1]), failures=[failure])

    def judge(self, program: Program, backend: str) -> Outcome:
        """Run one program on one backend in a worker (for shrinking crashes); a lost worker is its failure."""
        self._give(0, ("judge", (program, backend)))
        while True:
            for k, _, answer in self._poll():
                if k != 0:
                    continue
                if isinstance(answer, Outcome):
                    return answer
                failure = answer if isinstance(answer, Failure) else Failure("exception", "fuzzer", 0, answer)
                return Outcome([failure])


def _ranges(xs: list[int]) -> str:
    """``3-7, 9``: a sorted list of ints as ranges."""
    out: list[str] = []
    for x in sorted(xs):
        if out and x == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{x}"
        else:
            out.append(str(x))
    return ", ".join(out)


def _signal_name(code: int | None) -> str:
    if code is None or code >= 0:
        return ""
    import signal

    try:
        return f", {signal.Signals(-code).name}"
    except ValueError:
        return ""
