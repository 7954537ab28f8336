"""``tenure demo``: watch the lock keep a racy counter exact while nodes fail.

Theory of operation
-------------------
Five lock nodes (``LocalCluster``) and, apart from them, one *store* node that holds a
shared counter and is never faulted. Worker processes each loop on an unsafe
read-modify-write of that counter::

    value = GET counter        # read
    sleep(0..1 ms)             # widen the race window, as real work would
    SET counter value + 1      # write back, blind to anyone who wrote meanwhile

Only mutual exclusion makes this correct: two workers inside at once both read the same
value and one increment is lost. Each worker counts the increments it completed, so

    lost updates = sum of the workers' increments - the final counter.

Every worker also records ``(enter, exit)`` instants of each critical section with
``time.monotonic_ns()``. On one machine that clock is shared by all processes, so the
parent can sweep the sorted intervals of all workers and report the largest number of
critical sections that were ever open at the same instant: the maximum simultaneous
holders, measured rather than assumed.

During the locked run the parent injects faults on the lock nodes: at 1/3 of the run it
pauses node 2 (SIGSTOP: it accepts connections but answers nothing, like a frozen VM), at
1/2 it kills node 4 (SIGKILL: a crash), and near the end it resumes node 2, which then
executes the commands queued while it was frozen. Three of five nodes stay up, a
majority, so the lock must stay both live and safe. The run is then repeated for a third
of the time *without* the lock, on a fresh counter, to show that the race is real.

Workers are ``spawn``ed processes (no state inherited from the parent: each builds its
own tenure ``Client`` and redis connection) with SIGINT ignored, so Ctrl-C reaches only
the parent, which stops them, joins them (terminating stragglers, by their own
``Process`` handle) and closes the clusters.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import random
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

import redis

from ._errors import ConfigurationError, LeaseLost, LockTimeout, QuorumUnreachable
from ._sync.client import Client
from .local import LocalCluster, LocalNode

if TYPE_CHECKING:
    from multiprocessing.context import SpawnContext, SpawnProcess
    from multiprocessing.queues import Queue
    from multiprocessing.sharedctypes import Synchronized
    from multiprocessing.synchronize import Event

__all__ = ["RunResult", "WorkerReport", "max_overlap", "run_demo"]

LOCK_NAME = "demo-counter"
_RACE_WINDOW = 0.001  # seconds: the longest random pause between GET and SET
# A blocking acquire gives up after this long so the worker can notice the stop signal;
# it then simply tries again.
_ACQUIRE_TIMEOUT = 0.25
# After QuorumUnreachable (too many nodes failed at once), wait a little before retrying.
_UNAVAILABLE_PAUSE = 0.02
_READY_TIMEOUT = 60.0  # seconds for all workers to start (spawn imports tenure anew)
_COLLECT_TIMEOUT = 30.0  # seconds for workers to hand in their reports after the stop
_JOIN_TIMEOUT = 5.0
_TICK = 0.1  # seconds between progress updates / fault checks
_QUICK_WORKERS = 4
_QUICK_DURATION = 3.0
_CONTRAST_SHARE = 1 / 3  # the unlocked run lasts this fraction of the locked one
_CONTRAST_MIN = 0.5
_EXAMPLE_CHARS = 400


# --- what workers do (runs in the child processes) ------------------------------------


@dataclass(frozen=True)
class _WorkerSetup:
    """Everything a worker needs; plain values, pickled to the spawned child."""

    index: int
    lock_urls: tuple[str, ...]  # empty: no lock (the contrast run)
    store_url: str
    counter_key: str
    ttl: float
    parent_pid: int


@dataclass
class _Channels:
    """The shared objects of one run: start/stop signals, live counters, the report queue."""

    go: Event
    stop: Event
    ready: Synchronized[int]
    cycles: Synchronized[int]
    results: Queue[WorkerReport]

    @classmethod
    def create(cls, ctx: SpawnContext) -> _Channels:
        return cls(ctx.Event(), ctx.Event(), ctx.Value("i", 0), ctx.Value("q", 0), ctx.Queue())


@dataclass
class WorkerReport:
    """What one worker did; sent to the parent when it stops.

    Attributes:
        increments: read-modify-write cycles it completed.
        overran: critical sections that ended after the lease's validity.
        lost_on_release: releases that said the lease had been lost meanwhile.
        unavailable: acquisitions refused with ``QuorumUnreachable``.
        intervals: ``(enter_ns, exit_ns)`` of every critical section (monotonic clock).
        examples: the first message of each kind of lock error it saw, by error type.
        error: the unexpected exception that stopped it, if any.
    """

    index: int
    increments: int = 0
    overran: int = 0
    lost_on_release: int = 0
    unavailable: int = 0
    intervals: list[tuple[int, int]] = field(default_factory=list)
    examples: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def _worker_main(setup: _WorkerSetup, channels: _Channels) -> None:
    """Entry point of a worker process: loop on the counter until told to stop."""
    # Ctrl-C goes to the whole terminal process group; the parent alone decides to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    report = WorkerReport(setup.index)
    try:
        with contextlib.ExitStack() as stack:
            store = stack.enter_context(redis.Redis.from_url(setup.store_url, socket_timeout=5.0))
            store.ping()
            client = stack.enter_context(Client(setup.lock_urls)) if setup.lock_urls else None
            with channels.ready.get_lock():
                channels.ready.value += 1
            if _wait_for_go(setup, channels):
                _work(setup, channels, store, client, report)
    except Exception as exc:  # reported to the parent, which fails the run
        report.error = f"{type(exc).__name__}: {exc}"
    channels.results.put(report)


def _parent_alive(setup: _WorkerSetup) -> bool:
    # If the parent died without stopping us, we are reparented: stop rather than loop on.
    return os.getppid() == setup.parent_pid


def _wait_for_go(setup: _WorkerSetup, channels: _Channels) -> bool:
    while not channels.go.wait(0.5):
        if not _parent_alive(setup):
            return False
    return not channels.stop.is_set()


def _work(
    setup: _WorkerSetup,
    channels: _Channels,
    store: redis.Redis,
    client: Client | None,
    report: WorkerReport,
) -> None:
    rng = random.Random()
    while not channels.stop.is_set() and _parent_alive(setup):
        if client is None:
            _increment(store, setup.counter_key, rng, report, channels)
        else:
            _locked_cycle(client, setup, store, rng, report, channels)


def _locked_cycle(
    client: Client,
    setup: _WorkerSetup,
    store: redis.Redis,
    rng: random.Random,
    report: WorkerReport,
    channels: _Channels,
) -> None:
    """One attempt at the critical section under the lock, as a user would write it."""
    try:
        with client.lock(LOCK_NAME, ttl=setup.ttl, timeout=_ACQUIRE_TIMEOUT) as lease:
            _increment(store, setup.counter_key, rng, report, channels)
            # Work finished after the validity ended could have overlapped the next
            # holder: the lock promised nothing past that point.
            if lease.remaining <= 0:
                report.overran += 1
    except LockTimeout:
        pass  # busy: check the stop signal, then try again
    except QuorumUnreachable as exc:
        report.unavailable += 1
        report.examples.setdefault(type(exc).__name__, str(exc))
        time.sleep(_UNAVAILABLE_PAUSE)
    except LeaseLost as exc:
        report.lost_on_release += 1
        report.examples.setdefault(type(exc).__name__, str(exc))


def _increment(
    store: redis.Redis,
    key: str,
    rng: random.Random,
    report: WorkerReport,
    channels: _Channels,
) -> None:
    """The unsafe read-modify-write, timed for the overlap measurement."""
    enter = time.monotonic_ns()
    value = int(store.get(key) or 0)
    time.sleep(rng.random() * _RACE_WINDOW)
    store.set(key, value + 1)
    report.intervals.append((enter, time.monotonic_ns()))
    report.increments += 1
    with channels.cycles.get_lock():
        channels.cycles.value += 1


# --- measuring ------------------------------------------------------------------------


def max_overlap(intervals: Iterable[tuple[int, int]]) -> int:
    """The largest number of ``(start, end)`` intervals open at one instant.

    An interval that ends exactly when another starts does not overlap it.
    """
    events: list[tuple[int, int]] = []
    for start, end in intervals:
        events.append((start, 1))
        events.append((end, -1))
    # At equal instants -1 sorts before +1: exits are counted before entries.
    events.sort()
    open_now = highest = 0
    for _, delta in events:
        open_now += delta
        highest = max(highest, open_now)
    return highest


@dataclass
class RunResult:
    """The outcome of one run (with or without the lock)."""

    label: str
    locked: bool
    workers: int
    elapsed: float
    cycles: int
    max_holders: int
    lost_updates: int
    overran: int
    lost_on_release: int
    unavailable: int
    faults: list[str]
    errors: list[str]
    examples: dict[str, str] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.cycles / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def clean(self) -> bool:
        """What the locked run must achieve: work was done, exclusively, nothing lost."""
        return (
            self.cycles > 0 and self.max_holders == 1 and self.lost_updates == 0 and not self.errors
        )


def _summarise(
    label: str,
    locked: bool,
    workers: int,
    elapsed: float,
    reports: Sequence[WorkerReport],
    final_counter: int,
    faults: list[str],
    errors: list[str],
) -> RunResult:
    cycles = sum(r.increments for r in reports)
    return RunResult(
        label=label,
        locked=locked,
        workers=workers,
        elapsed=elapsed,
        cycles=cycles,
        max_holders=max_overlap(iv for r in reports for iv in r.intervals),
        lost_updates=cycles - final_counter,
        overran=sum(r.overran for r in reports),
        lost_on_release=sum(r.lost_on_release for r in reports),
        unavailable=sum(r.unavailable for r in reports),
        faults=faults,
        errors=errors + [f"worker {r.index}: {r.error}" for r in reports if r.error],
        examples={k: v for r in reversed(reports) for k, v in r.examples.items()},
    )


# --- progress display -----------------------------------------------------------------


class _Progress:
    """One status line on a terminal (rewritten with ``\\r``), or a line a second otherwise."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._interval = _TICK if self._tty else 1.0
        self._last = float("-inf")
        self._width = 0

    def update(self, text: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self._interval:
            return
        self._last = now
        if self._tty:
            # A line longer than the terminal wraps, and "\r" would then rewrite only
            # its last row: cut it to fit.
            text = text[: shutil.get_terminal_size().columns - 1]
            self._stream.write("\r" + text.ljust(self._width))
            self._width = max(self._width, len(text))
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def clear(self) -> None:
        """Erase the status line so that ordinary output starts on a clean line."""
        if self._tty and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
        self._width = 0
        self._last = float("-inf")


# --- faults ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fault:
    """One fault: at ``share`` of the run, ``action`` does to ``node`` what ``verb`` says."""

    share: float
    node: str
    verb: str  # "paused", as in "n2 paused"
    signal: str
    action: Callable[[], None]

    def describe(self, at: float) -> str:
        return f"t={at:.1f}s {self.node} {self.verb} ({self.signal})"


def _fault_plan(nodes: Sequence[LocalNode]) -> list[_Fault]:
    """Pause node 2 and kill node 4, as many of them as still leave a majority up."""
    tolerable = (len(nodes) - 1) // 2
    plan: list[_Fault] = []
    if tolerable >= 1:
        frozen = nodes[1]
        plan.append(_Fault(1 / 3, frozen.name, "paused", "SIGSTOP", frozen.pause))
        # Resumed before the end: the node then runs the commands queued while it was
        # frozen, and is not left stopped.
        plan.append(_Fault(0.85, frozen.name, "resumed", "SIGCONT", frozen.resume))
    if tolerable >= 2:
        crashed = nodes[3]
        plan.append(_Fault(1 / 2, crashed.name, "killed", "SIGKILL", crashed.kill))
    return sorted(plan, key=lambda f: f.share)


# --- running one phase (in the parent) ------------------------------------------------


@dataclass(frozen=True)
class _Phase:
    label: str
    workers: int
    duration: float
    lock_urls: tuple[str, ...]
    store: LocalNode
    counter_key: str
    ttl: float
    faults: list[_Fault]


def _run_phase(ctx: SpawnContext, phase: _Phase, progress: _Progress) -> RunResult:
    """Start the workers, let them race for ``phase.duration``, stop them and measure."""
    with phase.store.client() as store:
        store.delete(phase.counter_key)
    channels = _Channels.create(ctx)
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(_worker_setup(phase, i), channels),
            name=f"tenure-demo-worker-{i}",
            daemon=True,  # a last net: multiprocessing terminates daemons at our exit
        )
        for i in range(phase.workers)
    ]
    errors: list[str] = []
    try:
        for proc in procs:
            proc.start()
        _await_ready(channels, procs, progress, phase)
        channels.go.set()
        started = time.monotonic()
        injected = _drive(phase, channels, procs, progress, started)
        channels.stop.set()
        elapsed = time.monotonic() - started
        reports = _collect(channels, procs, errors)
    finally:
        channels.go.set()
        channels.stop.set()
        _reap(procs)
        channels.results.close()
        progress.clear()
    with phase.store.client() as store:
        final = int(store.get(phase.counter_key) or 0)
    return _summarise(
        phase.label, bool(phase.lock_urls), phase.workers, elapsed, reports, final, injected, errors
    )


def _worker_setup(phase: _Phase, index: int) -> _WorkerSetup:
    return _WorkerSetup(
        index=index,
        lock_urls=phase.lock_urls,
        store_url=phase.store.url,
        counter_key=phase.counter_key,
        ttl=phase.ttl,
        parent_pid=os.getpid(),
    )


def _await_ready(
    channels: _Channels, procs: Sequence[SpawnProcess], progress: _Progress, phase: _Phase
) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT
    while channels.ready.value < len(procs):
        dead = [p for p in procs if p.exitcode is not None]
        if dead:
            raise RuntimeError(_startup_failure(channels, dead[0]))
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers not ready after {_READY_TIMEOUT:.0f} s")
        progress.update(f"{phase.label}: starting {len(procs)} workers ...")
        time.sleep(0.02)


def _startup_failure(channels: _Channels, proc: SpawnProcess) -> str:
    """Why a worker died before the start: its report says, if it managed to send one."""
    why = f"exit code {proc.exitcode}"
    with contextlib.suppress(queue.Empty):
        report = channels.results.get(timeout=_TICK)
        why = report.error or why
    return f"{proc.name} failed during start-up: {why}"


def _drive(
    phase: _Phase,
    channels: _Channels,
    procs: Sequence[SpawnProcess],
    progress: _Progress,
    started: float,
) -> list[str]:
    """Wait out the run, injecting each fault when its time comes; what was injected."""
    pending = list(phase.faults)
    injected: list[tuple[float, _Fault]] = []
    while True:
        elapsed = time.monotonic() - started
        while pending and elapsed >= pending[0].share * phase.duration:
            fault = pending.pop(0)
            fault.action()
            injected.append((elapsed, fault))
        done = elapsed >= phase.duration or not any(p.is_alive() for p in procs)
        progress.update(_status(phase, elapsed, channels.cycles.value, injected), force=done)
        if done:
            return [fault.describe(at) for at, fault in injected]
        time.sleep(min(_TICK, max(phase.duration - elapsed, 0.0)))


def _status(
    phase: _Phase, elapsed: float, cycles: int, injected: list[tuple[float, _Fault]]
) -> str:
    # Short enough for one terminal line: "n2 paused@2.0s", no signal names.
    faults = ", ".join(f"{f.node} {f.verb}@{at:.1f}s" for at, f in injected)
    return (
        f"{phase.label}: {min(elapsed, phase.duration):4.1f}/{phase.duration:.1f} s"
        f"  {cycles:7d} cycles  faults: {faults or ('none yet' if phase.faults else 'none')}"
    )


def _collect(
    channels: _Channels, procs: Sequence[SpawnProcess], errors: list[str]
) -> list[WorkerReport]:
    """Receive every worker's report; a worker that died without one becomes an error.

    Reports are read before joining: a child does not exit until its queued data has
    been taken from the pipe.
    """
    reports: dict[int, WorkerReport] = {}
    deadline = time.monotonic() + _COLLECT_TIMEOUT
    while len(reports) < len(procs):
        alive = any(p.is_alive() for p in procs)
        try:
            report = channels.results.get(timeout=_TICK)
        except queue.Empty:
            if not alive or time.monotonic() > deadline:
                break
            continue
        reports[report.index] = report
    for i, proc in enumerate(procs):
        if i not in reports:
            errors.append(f"worker {i} gave no report (exit code {proc.exitcode})")
    return [reports[i] for i in sorted(reports)]


def _reap(procs: Sequence[SpawnProcess]) -> None:
    """Join our workers; terminate, then kill, any that do not stop (by their handle)."""
    deadline = time.monotonic() + _JOIN_TIMEOUT
    for proc in procs:
        if proc.pid is not None:
            proc.join(max(deadline - time.monotonic(), 0.0))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(1.0)
        if proc.is_alive():
            proc.kill()
            proc.join()


# --- the report -----------------------------------------------------------------------

_COLUMNS = ("run", "workers", "cycles", "cycles/s", "max holders", "lost updates", "overran lease")


def _table(results: Sequence[RunResult]) -> list[str]:
    rows = [_COLUMNS] + [
        (
            r.label,
            str(r.workers),
            str(r.cycles),
            f"{r.rate:.0f}",
            str(r.max_holders),
            str(r.lost_updates),
            str(r.overran) if r.locked else "-",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = []
    for row in rows:
        # The label column reads left to right; numbers line up on their last digit.
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
    return lines


def _notes(locked: RunResult, unlocked: RunResult) -> list[str]:
    notes = []
    if locked.unavailable:
        notes.append(f"acquisitions refused as quorum unreachable: {locked.unavailable}")
        notes.append(_example(locked, "QuorumUnreachable"))
    if locked.lost_on_release:
        notes.append(f"releases that found the lease already lost: {locked.lost_on_release}")
        notes.append(_example(locked, "LeaseLost") or _example(locked, "LeaseExpired"))
    if locked.overran:
        notes.append(f"critical sections that outlived their lease: {locked.overran}")
    if unlocked.cycles and unlocked.lost_updates == 0:
        notes.append("the race did not show without the lock this time (try more workers)")
    notes += [f"error ({r.label}): {e}" for r in (locked, unlocked) for e in r.errors]
    return [n for n in notes if n]


def _example(result: RunResult, kind: str) -> str:
    """The first such error seen, cut short: enough to tell what the nodes said."""
    text = result.examples.get(kind, "")
    if len(text) > _EXAMPLE_CHARS:
        text = text[: _EXAMPLE_CHARS - 3] + "..."
    return f"  e.g. {kind}: {text}" if text else ""


def _verdict(locked: RunResult, unlocked: RunResult) -> str:
    faults = ", ".join(f.split(" ", 1)[1] for f in locked.faults)
    faults = f"through {faults}" if faults else "with no faults injected"
    if locked.clean:
        contrast = (
            f"without it {unlocked.lost_updates} of {unlocked.cycles} updates were lost"
            if unlocked.cycles
            else "the run without it did no work"
        )
        return (
            f"PASS: with the lock the counter stayed exact ({locked.cycles} cycles, at most one "
            f"holder at a time) {faults}; {contrast}."
        )
    why = []
    if locked.cycles == 0:
        why.append("no cycle completed")
    if locked.max_holders > 1:
        why.append(f"{locked.max_holders} holders at once")
    if locked.lost_updates:
        why.append(f"{locked.lost_updates} lost updates")
    if locked.errors:
        why.append(f"{len(locked.errors)} worker errors")
    return f"FAIL: the locked run was not clean: {', '.join(why)}."


# --- entry point ----------------------------------------------------------------------


def _check(workers: int, duration: float, nodes: int, ttl: float) -> None:
    if workers < 1:
        raise ConfigurationError("workers", f"must be at least 1, got {workers}")
    if not duration > 0:
        raise ConfigurationError(
            "duration", f"must be a positive number of seconds, got {duration}"
        )
    if nodes < 1 or nodes % 2 == 0:
        raise ConfigurationError("nodes", f"must be an odd number of at least 1, got {nodes}")
    if not ttl > 0:
        raise ConfigurationError("ttl", f"must be a positive number of seconds, got {ttl}")


def run_demo(
    workers: int = 8,
    duration: float = 6.0,
    nodes: int = 5,
    ttl: float = 2.0,
    quick: bool = False,
    out: TextIO | None = None,
    progress: TextIO | None = None,
) -> int:
    """Race worker processes on a counter with and without the lock, under faults.

    Args:
        workers: worker processes per run.
        duration: seconds of the locked run (the unlocked one lasts a third of it).
        nodes: lock nodes (odd); node 2 is paused and node 4 killed while a majority
            would still remain.
        ttl: lock TTL in seconds.
        quick: a short run for CI: at most 4 workers and 3 seconds.
        out: where the report goes (default ``sys.stdout``).
        progress: where the live status line goes (default ``sys.stderr``).

    Returns:
        0 if the locked run was clean (cycles done, at most one holder at any instant,
        no lost update), else 1.

    Raises:
        ConfigurationError: a parameter is out of range, or no redis-server was found.
        LocalNodeError: a redis-server failed to start.
    """
    out = sys.stdout if out is None else out
    if quick:
        workers, duration = min(workers, _QUICK_WORKERS), min(duration, _QUICK_DURATION)
    _check(workers, duration, nodes, ttl)
    status = _Progress(sys.stderr if progress is None else progress)
    ctx = multiprocessing.get_context("spawn")
    with LocalCluster(nodes) as cluster, LocalCluster(1) as store_cluster:
        store = store_cluster.nodes[0]
        print(
            f"tenure demo: {workers} worker processes, lock on {nodes} node{'s' * (nodes > 1)} "
            f"(majority {nodes // 2 + 1}), ttl {ttl:g} s; counter on a separate node",
            file=out,
            flush=True,
        )
        locked = _run_phase(
            ctx,
            _Phase(
                "with lock",
                workers,
                duration,
                tuple(cluster.urls),
                store,
                "demo:counter:locked",
                ttl,
                _fault_plan(cluster.nodes),
            ),
            status,
        )
        _describe(locked, out)
        contrast = max(duration * _CONTRAST_SHARE, _CONTRAST_MIN)
        unlocked = _run_phase(
            ctx,
            _Phase("without lock", workers, contrast, (), store, "demo:counter:unlocked", ttl, []),
            status,
        )
        _describe(unlocked, out)
    print(file=out)
    for line in _table([locked, unlocked]):
        print(line, file=out)
    print(file=out)
    for note in _notes(locked, unlocked):
        print(note if note.startswith(" ") else f"note: {note}", file=out)
    print(_verdict(locked, unlocked), file=out, flush=True)
    return 0 if locked.clean else 1


def _describe(result: RunResult, out: TextIO) -> None:
    faults = "; ".join(result.faults) if result.faults else "no faults"
    print(
        f"{result.label}: {result.elapsed:.1f} s, {result.cycles} cycles; {faults}",
        file=out,
        flush=True,
    )
