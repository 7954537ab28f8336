"""One shared stock counter, decremented by 8 processes: a lock, optimistic, a single writer.

What is measured
----------------
The same work, done several ways, side by side in one run on the same local
``redis-server`` nodes (``tenure.testing.LocalCluster``: 5 lock nodes, and a separate data
node that holds the stock). The stock starts at a large number; 8 processes (forkserver)
wait on a barrier, then each performs ``--ops`` decrements:

* **DECR** (reference): ``DECR stock``, atomic in one command. The best possible when the
  operation is expressible as one Redis command; the other rows are for when it is not.
* **lock + GET + SET**: ``with client.lock(name, ttl=5): v = GET; SET v-1`` with a
  ``tenure.Client`` on 1 lock node and on 5; the processes compete (blocking acquire,
  tenure's default jittered back-off).
* **optimistic**: ``tenure.patterns.optimistic(client, [stock], fn)`` (``WATCH``, ``MGET``,
  ``MULTI``/``SET``/``EXEC``) with its default jittered retry (10 retries); conflicts
  are counted with ``OptimisticStats``. A call that gives up (``ConflictError``) is
  counted and made again, so every process still performs exactly ``--ops`` decrements.
* **single-writer stream**: the 8 processes ``StreamProducer.append("stock", {...})``;
  one ``StreamWorker`` process (P = 1 partition: there is one key, so one writer) applies
  each entry with ``GET`` + ``SET``. Measured: the producers' append latency, the
  end-to-end latency (append -> applied: the producer stamps ``time.monotonic_ns()`` into
  the payload, the worker subtracts it from its own ``monotonic_ns()`` after the ``SET``;
  same machine, same clock), and the throughput of *applied* decrements.

Per row: throughput (ops applied per second: all processes' operations / wall time from
the barrier to the last one done, median over rounds), latency p50 and p99 per operation
(``time.perf_counter_ns`` around each one, all processes and rounds pooled), the spread
of the per-process p50s, client CPU per operation (``time.process_time()``: user +
system, every thread, of each client process over its measured loop only, not start-up
or connections; summed over the processes and divided by the operations done, median
over rounds; both stream rows count the producers *and* the worker process, which
together do one decrement), when the first and the last process were done (how fair the
method is: medians over rounds, from the barrier; for the end-to-end row, when each
producer's last entry was applied), retries or conflicts, and a check that the stock
ends at exactly start - 8 x ops (OK / FAIL), for every round.

Method
------
As in ``bench_lock.py``, only comparisons made in the same run mean much. The 8 producer
processes and the worker process are started once and keep their connections; every row
is warmed up, then the rows take turns: R rounds, each row once per round, with the
order rotating. ``vs DECR`` columns are medians over rounds of (this row / the DECR row
of the same round), which cancels most of the machine's drift.

Run ``python benchmarks/bench_patterns.py`` (``--quick`` for a smoke run, ``--markdown``
to print Markdown). A full run writes ``benchmarks/results/bench_patterns.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib.metadata
import math
import multiprocessing
import os
import platform
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any, Literal

import redis
from redis.client import Pipeline

import tenure
from _common import fmt, initialise, no_retry, server_version, write_results
from _common import table as _table
from tenure._core.acquire import Acquisition
from tenure._core.quorum import Round
from tenure.patterns import (
    ConflictError,
    OptimisticStats,
    Plan,
    Reads,
    StreamProducer,
    StreamWorker,
    optimistic,
)
from tenure.testing import LocalCluster, Persistence

RESULTS = Path(__file__).resolve().parent / "results" / "bench_patterns.md"
PROCESSES = 8
START = 1_000_000_000  # the stock before every round; no row can run it down
LOCK_TTL_S = 5
STREAM_PARTITIONS = 1  # one key: one partition, one writer
STREAM_GROUP = "appliers"
STREAM_KEY = "stock"  # the resource key the producers append for
BARRIER_TIMEOUT_S = 60.0

Variant = Literal["decr", "lock1", "lock5", "optimistic", "stream"]
VARIANTS: tuple[Variant, ...] = ("decr", "lock1", "lock5", "optimistic", "stream")
LOCK_NODES: dict[Variant, int] = {"lock1": 1, "lock5": 5}

# _ctx is module-level so that the children (forkserver) find it too.
_ctx = multiprocessing.get_context("forkserver")


def data_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, protocol=2, retry=no_retry())


# --------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class Job:
    """One row's work for one round, as sent to every producer process."""

    variant: Variant
    stock: str  # the data node's key holding the stock
    ops: int
    prefix: str = ""  # stream rows: the streams' prefix (a fresh one per round)


@dataclass
class ProcResult:
    """What one producer process measured in one job."""

    latencies_ns: list[int]
    start_ns: int  # time.monotonic_ns() right after the barrier
    end_ns: int  # time.monotonic_ns() after its last operation
    cpu_s: float = 0.0  # time.process_time() (every thread) from start_ns to end_ns
    attempts: int = 0  # lock: acquire attempts; optimistic: attempts
    conflicts: int = 0  # optimistic only
    gave_up: int = 0  # optimistic only: ConflictError raised (and the call made again)
    # Lock and optimistic rows: how many operations needed k attempts beyond the first
    # (failed acquires; conflicts), by k.
    extra_attempts: dict[int, int] = field(default_factory=dict)


@dataclass
class ApplyResult:
    """What the stream worker measured in one job."""

    e2e_ns: dict[int, list[int]]  # by producer index: applied - appended
    applied_at_ns: list[int]  # time.monotonic_ns() of each apply, in order
    applied_from: list[int]  # the producer index of each apply, in the same order
    stats: dict[str, int]  # the worker's WorkerStats
    # time.process_time() (every thread, the lease's watchdog too) from just before the
    # producers are started to the end of the worker's loop (see _LoopEnd).
    cpu_s: float = 0.0


# --------------------------------------------------------------------------- children

# Acquire attempts of this process's tenure clients, counted by wrapping
# Acquisition.begin (one call per attempt; ~0.1 µs against milliseconds per op).
_acquire_attempts = [0]


def _count_acquire_attempts() -> None:
    begin = Acquisition.begin

    def counting_begin(self: Acquisition, now: float) -> Round:
        _acquire_attempts[0] += 1
        return begin(self, now)

    Acquisition.begin = counting_begin  # type: ignore[method-assign]


class Conns:
    """A producer process's long-lived connections (warmed up, reused by every job)."""

    def __init__(self, lock_urls: Sequence[str], data_url: str) -> None:
        self.data = data_client(data_url)
        self.locks = {n: tenure.Client(lock_urls[:n]) for n in sorted(set(LOCK_NODES.values()))}
        self.producer: StreamProducer | None = None

    def close(self) -> None:
        self.data.close()
        for client in self.locks.values():
            client.close()


def _no_attempts() -> int:
    return 0


@dataclass
class Operation:
    """What one timed operation calls, for a job's row, and its attempt counters."""

    run: Callable[[], None]
    attempts: Callable[[], int] = _no_attempts  # attempts so far, in this process
    stats: OptimisticStats | None = None


def _operation(conns: Conns, index: int, job: Job) -> Operation:
    data, stock = conns.data, job.stock
    if job.variant == "decr":

        def decr() -> None:
            data.decr(stock)

        return Operation(decr)
    if job.variant in LOCK_NODES:
        # A lock name per row: the 1-node and 5-node clients share node 1.
        lock = conns.locks[LOCK_NODES[job.variant]].lock(f"stock:{job.variant}", ttl=LOCK_TTL_S)

        def locked() -> None:
            with lock:
                value = int(data.get(stock) or 0)
                data.set(stock, value - 1)

        return Operation(locked, lambda: _acquire_attempts[0])
    if job.variant == "optimistic":
        stats = OptimisticStats()

        def take_one(reads: Reads[Pipeline]) -> Plan[int]:
            left = reads.int(stock)
            return Plan(result=left - 1, writes={stock: left - 1})

        def optimistic_decrement() -> None:
            while True:
                try:
                    optimistic(data, [stock], take_one, stats=stats)
                    return
                except ConflictError:
                    pass  # counted in stats.gave_up; the decrement is still owed

        return Operation(optimistic_decrement, lambda: stats.attempts, stats)
    producer = StreamProducer(data, job.prefix, STREAM_PARTITIONS)
    monotonic_ns = time.monotonic_ns

    def append() -> None:
        producer.append(STREAM_KEY, {"op": "dec", "p": index, "t": monotonic_ns()})

    return Operation(append)


def _produce(conns: Conns, index: int, job: Job, ready: Barrier) -> ProcResult:
    result = ProcResult([], 0, 0)
    op = _operation(conns, index, job)
    run, attempts, extra = op.run, op.attempts, result.extra_attempts
    clock, out = time.perf_counter_ns, result.latencies_ns
    first = attempts()
    gc.collect()  # the previous job's garbage, outside this one's timing
    ready.wait(BARRIER_TIMEOUT_S)
    result.start_ns = time.monotonic_ns()
    cpu0 = time.process_time()
    for _ in range(job.ops):
        before = attempts()
        t0 = clock()
        run()
        out.append(clock() - t0)
        k = attempts() - before - 1
        extra[k] = extra.get(k, 0) + 1
    result.cpu_s = time.process_time() - cpu0
    result.end_ns = time.monotonic_ns()
    result.attempts = attempts() - first
    if op.stats is not None:
        result.conflicts, result.gave_up = op.stats.conflicts, op.stats.gave_up
    return result


def _producer_main(
    index: int, ready: Barrier, jobs: Connection, lock_urls: list[str], data_url: str
) -> None:
    """A producer process: run each job it is sent after the barrier; send the result."""
    _count_acquire_attempts()
    conns = Conns(lock_urls, data_url)
    try:
        while (job := jobs.recv()) is not None:
            try:
                jobs.send(("ok", _produce(conns, index, job, ready)))
            except Exception:
                jobs.send(("error", traceback.format_exc()))
    finally:
        conns.close()


class _LoopEnd(threading.Event):
    """The worker's stop event; notes the CPU time when its loop first sees it set.

    ``StreamWorker.run`` checks its stop event after each pass (the last batch handled
    and acknowledged), then releases its lease: noting the time here keeps that
    teardown out of the worker's CPU, as connection set-up is kept out of it.
    """

    cpu_s: float | None = None  # time.process_time() at the loop's end

    def is_set(self) -> bool:
        stop = super().is_set()
        if stop and self.cpu_s is None:
            self.cpu_s = time.process_time()
        return stop


def _apply(
    jobs: Connection, locks: tenure.Client, data: redis.Redis, job: Job, poll_interval: float
) -> ApplyResult:
    """Consume ``job.prefix``'s stream until every producer's entries are applied."""
    expected = job.ops * PROCESSES
    done = _LoopEnd()
    result = ApplyResult({p: [] for p in range(PROCESSES)}, [], [], {})
    applied_at, applied_from = result.applied_at_ns, result.applied_from
    e2e, monotonic_ns = result.e2e_ns, time.monotonic_ns

    def handler(key: str, payload: Mapping[str, bytes], token: int) -> None:
        # The single writer reads, computes and writes with nothing held: nobody else
        # writes this key. (A production handler would also fence and deduplicate.)
        value = int(data.get(job.stock) or 0)
        data.set(job.stock, value - 1)
        now = monotonic_ns()
        producer = int(payload["p"])
        e2e[producer].append(now - int(payload["t"]))
        applied_at.append(now)
        applied_from.append(producer)
        if len(applied_at) >= expected:
            done.set()

    worker = StreamWorker(
        locks,
        data,
        job.prefix,
        STREAM_PARTITIONS,
        STREAM_GROUP,
        "applier",
        handler,
        poll_interval=poll_interval,
    )
    # Own the partition (lease, fenced stream, consumer group) before anyone appends.
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while 0 not in worker.held:
        if time.monotonic() > deadline:
            raise TimeoutError("the stream worker could not take partition 0")
        worker.run_once()
    gc.collect()
    jobs.send(("ready", None))
    # From here the parent starts the producers; the few idle polls while they pass
    # their barrier are counted: a polling applier spends them in production too.
    cpu0 = time.process_time()
    worker.run(done)  # returns once everything is applied; releases the lease
    assert done.cpu_s is not None  # run() only returns normally once it saw done set
    result.cpu_s = done.cpu_s - cpu0
    result.stats = dict(vars(worker.stats))
    return result


def _worker_main(jobs: Connection, lock_urls: list[str], data_url: str, poll: float) -> None:
    """The stream worker process: one ``StreamWorker`` run per stream job."""
    with tenure.Client(lock_urls) as locks, data_client(data_url) as data:
        while (job := jobs.recv()) is not None:
            try:
                jobs.send(("ok", _apply(jobs, locks, data, job, poll)))
            except Exception:
                jobs.send(("error", traceback.format_exc()))


# --------------------------------------------------------------------------- parent


class Fleet:
    """The 8 producer processes and the stream worker process, started once.

    Every child is ours; ``close()`` asks each to exit, then kills by PID (only those
    children) whatever has not exited within a few seconds.
    """

    def __init__(
        self, lock_urls: list[str], data_url: str, poll_interval: float, timeout: float
    ) -> None:
        self.timeout = timeout
        # Kept referenced: collecting it in the parent unlinks the children's semaphore.
        self.ready = _ctx.Barrier(PROCESSES)
        self.procs: list[BaseProcess] = []
        self.producers: list[Connection] = []
        for index in range(PROCESSES):
            ours, theirs = _ctx.Pipe()
            self._start(_producer_main, (index, self.ready, theirs, lock_urls, data_url))
            theirs.close()
            self.producers.append(ours)
        ours, theirs = _ctx.Pipe()
        self._start(_worker_main, (theirs, lock_urls, data_url, poll_interval))
        theirs.close()
        self.worker = ours

    def _start(self, target: Callable[..., None], args: tuple[Any, ...]) -> None:
        proc = _ctx.Process(target=target, args=args, daemon=True)
        self.procs.append(proc)
        proc.start()

    def _recv(self, conn: Connection, expect: str) -> Any:
        if not conn.poll(self.timeout):
            raise TimeoutError(f"no {expect!r} from a child within {self.timeout:.0f} s")
        kind, value = conn.recv()
        if kind == "error":
            raise RuntimeError(f"a child failed:\n{value}")
        if kind != expect:
            raise RuntimeError(f"a child sent {kind!r}, expected {expect!r}")
        return value

    def produce(self, job: Job) -> list[ProcResult]:
        for conn in self.producers:
            conn.send(job)
        return [self._recv(conn, "ok") for conn in self.producers]

    def stream(self, job: Job) -> tuple[list[ProcResult], ApplyResult]:
        self.worker.send(job)
        self._recv(self.worker, "ready")
        producers = self.produce(job)
        applied: ApplyResult = self._recv(self.worker, "ok")
        return producers, applied

    def close(self) -> None:
        for conn in [*self.producers, self.worker]:
            with contextlib.suppress(OSError):
                conn.send(None)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()  # SIGKILL to this child's PID only
                proc.join()
        for conn in [*self.producers, self.worker]:
            conn.close()


@dataclass
class RoundResult:
    """One row-group (a variant) in one round."""

    variant: Variant
    round: int
    procs: list[ProcResult]
    applied: ApplyResult | None
    final: int
    expected: int
    seconds: float


def run_variant(
    fleet: Fleet, data: redis.Redis, variant: Variant, ops: int, tag: str, r: int
) -> RoundResult:
    stock = f"stock:{variant}"
    data.set(stock, START)
    job = Job(variant, stock, ops, prefix=f"bench:{tag}")
    t0 = time.monotonic()
    applied = None
    if variant == "stream":
        procs, applied = fleet.stream(job)
        stream_keys = data.keys(f"{job.prefix}*")
        if stream_keys:
            data.delete(*stream_keys)
    else:
        procs = fleet.produce(job)
    seconds = time.monotonic() - t0
    final = int(data.get(stock) or 0)
    return RoundResult(variant, r, procs, applied, final, START - PROCESSES * ops, seconds)


def run_all(fleet: Fleet, data: redis.Redis, args: argparse.Namespace) -> list[RoundResult]:
    print(f"warming up ({args.warmup} ops per process per row)", file=sys.stderr)
    for variant in VARIANTS:
        check = run_variant(fleet, data, variant, args.warmup, f"warmup-{variant}", -1)
        if check.final != check.expected:
            print(f"  warm-up {variant}: stock {check.final}, expected {check.expected}")
    results = []
    for r in range(args.rounds):
        shift = r % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            res = run_variant(fleet, data, variant, args.ops, f"round{r}-{variant}", r)
            results.append(res)
            verdict = "OK" if res.final == res.expected else "FAIL"
            print(
                f"  round {r + 1}/{args.rounds} {variant}: {res.seconds:.1f} s, stock {verdict}",
                file=sys.stderr,
            )
    return results


# --------------------------------------------------------------------------- rows


def percentile(values: Sequence[int], q: float) -> int:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


@dataclass
class Measured:
    """One table row's figures in one round."""

    per_process: list[list[int]]  # latencies (ns), one list per producer process
    finished_ns: list[int]  # per producer: its last operation done, from the first start
    ops: int  # operations counted by the throughput
    wall_ns: int  # from the first producer's start to the last operation counted
    cpu_s: float  # CPU of every client process that did the variant's work (client_cpu_s)

    @property
    def latencies(self) -> list[int]:
        return [x for lats in self.per_process for x in lats]

    @property
    def ops_per_s(self) -> float:
        return self.ops / (self.wall_ns / 1e9)

    @property
    def cpu_us_per_op(self) -> float:
        return self.cpu_s / self.ops * 1e6


ROWS: list[tuple[str, Variant, str]] = [
    ("DECR (atomic, reference)", "decr", "ops"),
    ("lock + GET + SET, 1 lock node", "lock1", "ops"),
    ("lock + GET + SET, 5 lock nodes", "lock5", "ops"),
    ("optimistic (WATCH/MULTI/EXEC)", "optimistic", "ops"),
    ("single-writer stream: append", "stream", "append"),
    ("single-writer stream: append -> applied", "stream", "e2e"),
]


def client_cpu_s(res: RoundResult) -> float:
    """CPU seconds of the client processes doing ``res``'s work, in their measured loops.

    A stream decrement is done by two processes, so both stream rows count the
    producers' appends and the worker's applies: the cost of the decrement, not of half
    of it. (Each append is applied once, so both rows divide by the same count.)
    """
    producers = sum(p.cpu_s for p in res.procs)
    applier = res.applied.cpu_s if res.applied is not None else 0.0
    return producers + applier


def measured(res: RoundResult, kind: str) -> Measured:
    start = min(p.start_ns for p in res.procs)
    cpu = client_cpu_s(res)
    if kind == "e2e":
        assert res.applied is not None
        applied = res.applied
        per = [applied.e2e_ns[i] for i in range(PROCESSES)]
        last_applied = dict(zip(applied.applied_from, applied.applied_at_ns, strict=True))
        finished = [last_applied[i] - start for i in range(PROCESSES)]
        return Measured(per, finished, len(applied.applied_at_ns), max(finished), cpu)
    per = [p.latencies_ns for p in res.procs]
    finished = [p.end_ns - start for p in res.procs]
    return Measured(per, finished, sum(len(lats) for lats in per), max(finished), cpu)


@dataclass
class Row:
    name: str
    variant: Variant
    kind: str
    rounds: list[Measured] = field(default_factory=list)
    results: list[RoundResult] = field(default_factory=list)


def build_rows(results: Sequence[RoundResult]) -> list[Row]:
    rows = [Row(name, variant, kind) for name, variant, kind in ROWS]
    for row in rows:
        for res in sorted((r for r in results if r.variant == row.variant), key=lambda r: r.round):
            row.rounds.append(measured(res, row.kind))
            row.results.append(res)
    return rows


def us(ns: float) -> str:
    return fmt(ns / 1000)


def retries_cell(row: Row) -> str:
    procs = [p for res in row.results for p in res.procs]
    ops = sum(len(p.latencies_ns) for p in procs)
    if row.variant in LOCK_NODES or row.variant == "optimistic":
        hist: dict[int, int] = {}
        for p in procs:
            for k, n in p.extra_attempts.items():
                hist[k] = hist.get(k, 0) + n
        extra = sum(p.attempts for p in procs) - ops
        ordered = sorted(hist)
        p99 = next(k for k in ordered if sum(hist[j] for j in ordered if j <= k) >= 0.99 * ops)
        spread = (
            f"{extra / ops:.2f} per op; {hist.get(0, 0) / ops:.1%} of ops none, "
            f"p99 {p99}, max {max(ordered)}"
        )
        if row.variant in LOCK_NODES:
            return f"failed acquires: {spread}"
        conflicts = sum(p.conflicts for p in procs)
        gave_up = sum(p.gave_up for p in procs)
        assert conflicts == extra, (conflicts, extra)
        return f"conflicts: {spread}; ConflictError {gave_up}x"
    if row.kind == "e2e":
        # How far the worker was behind when the last producer finished.
        backlogs = []
        for res in row.results:
            assert res.applied is not None
            end = max(p.end_ns for p in res.procs)
            backlogs.append(sum(t > end for t in res.applied.applied_at_ns))
        return f"backlog when the producers finished: {statistics.median(backlogs):,.0f} entries"
    return "-"


def stock_cell(row: Row) -> str:
    bad = [r for r in row.results if r.final != r.expected]
    if not bad:
        return f"OK ({len(row.results)} of {len(row.results)} rounds)"
    first = bad[0]
    return (
        f"FAIL in {len(bad)} of {len(row.results)} rounds "
        f"(round {first.round + 1}: {first.final:,}, expected {first.expected:,})"
    )


def table_rows(rows: Sequence[Row]) -> list[list[str]]:
    base = next(r for r in rows if r.variant == "decr")
    out = []
    for row in rows:
        pairs = list(zip(row.rounds, base.rounds, strict=True))
        throughput = statistics.median(m.ops_per_s for m in row.rounds)
        vs_decr = statistics.median(m.ops_per_s / b.ops_per_s for m, b in pairs)
        p50_vs = statistics.median(
            percentile(m.latencies, 0.5) / percentile(b.latencies, 0.5) for m, b in pairs
        )
        per_process = [percentile(lats, 0.5) for m in row.rounds for lats in m.per_process]
        first_done = statistics.median(min(m.finished_ns) for m in row.rounds) / 1e6
        last_done = statistics.median(max(m.finished_ns) for m in row.rounds) / 1e6
        everything = [x for m in row.rounds for x in m.latencies]
        cpu_us = statistics.median(m.cpu_us_per_op for m in row.rounds)
        out.append(
            [
                row.name,
                fmt(throughput),
                f"{vs_decr:.2f}x",
                us(percentile(everything, 0.5)),
                us(percentile(everything, 0.99)),
                f"{p50_vs:.1f}x",
                f"{us(min(per_process))} - {us(max(per_process))}",
                f"{cpu_us:.1f}",
                f"{first_done:,.0f} / {last_done:,.0f}",
                retries_cell(row),
                stock_cell(row),
            ]
        )
    return out


def per_round_rows(rows: Sequence[Row]) -> list[list[str]]:
    return [[row.name, *(fmt(m.ops_per_s) for m in row.rounds)] for row in rows]


MAIN_HEADER = [
    "variant",
    "ops/s",
    "ops/s vs DECR",
    "p50 µs",
    "p99 µs",
    "p50 vs DECR",
    "per-process p50 µs",
    "client CPU µs/op",
    "first / last process done, ms",
    "retries / conflicts",
    "final stock",
]
NUMERIC = frozenset(
    ["ops/s", "ops/s vs DECR", "p50 µs", "p99 µs", "p50 vs DECR", "client CPU µs/op"]
)


def _numeric(header: str) -> bool:
    return header in NUMERIC or header.startswith("round")


# --------------------------------------------------------------------------- report


def versions() -> str:
    found = []
    for dist in ("tenure", "redis", "hiredis"):
        try:
            found.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{dist} not installed")
    return ", ".join(found)


def context_lines(args: argparse.Namespace, redis_version: str, load_before: float) -> list[str]:
    load = f"load average {load_before:.2f} before the run, {os.getloadavg()[0]:.2f} after"
    return [
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, {platform.machine()}; {load}",
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"{redis_version}: 5 lock nodes and 1 data node (the stock, the "
        "stream), TCP loopback, persistence none",
        f"- libraries: {versions()}; redis-py clients with protocol 2 and retries off",
        f"- method: {PROCESSES} processes (multiprocessing forkserver, started once, "
        f"connections kept), a barrier before every row; {args.warmup} warm-up ops per "
        f"process per row, then {args.rounds} rounds of {args.ops} ops per process per row "
        "(row order rotating); ops/s and the 'vs DECR' ratios are medians over rounds, "
        "latencies are pooled over processes and rounds",
        "- client CPU: time.process_time() (user + system, every thread) of each client "
        "process over its measured loop only, summed over the processes, per operation, "
        f"median over rounds; both stream rows count the {PROCESSES} producers' appends and "
        "the worker process's applies (from just before the producers start, idle polls "
        "included, to the end of its loop, before it releases its lease)",
        f"- settings: lock TTL {LOCK_TTL_S} s, blocking acquire with tenure's defaults "
        "(fair: waiters queued, the lock handed over in FIFO order by the release; a "
        "split vote backs off, full jitter 2 ms doubling to 100 ms); optimistic with its defaults "
        "(10 retries, full jitter 2 ms doubling to 100 ms); stream: 1 partition, 1 worker "
        f"process, batch_size 100, poll_interval {args.poll_interval * 1000:g} ms, "
        "lease_ttl 10 s (5 lock nodes); the worker applies each entry with GET + SET",
    ]


@dataclass
class Report:
    main: list[list[str]]
    per_round: list[list[str]]
    rounds: int
    context: list[str]


def render(report: Report, markdown: bool) -> str:
    table = partial(_table, numeric=_numeric, markdown=markdown)
    heading = "## " if markdown else ""
    round_header = ["variant", *(f"round {r + 1}" for r in range(report.rounds))]
    parts = [
        f"{heading}8 processes decrementing one stock counter",
        table(MAIN_HEADER, report.main),
        f"{heading}ops/s by round",
        table(round_header, report.per_round),
        f"{heading}Setup",
        "\n".join(report.context),
    ]
    return "\n\n".join(parts)


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--ops", type=int, default=500, help="decrements per process per row")
    parser.add_argument("--rounds", "-r", type=int, default=5, help="rounds (each row once)")
    parser.add_argument("--warmup", type=int, default=50, help="warm-up ops per process per row")
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=0.005,
        help="the stream worker's poll interval when idle, seconds (default 0.005)",
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds a row may take before aborting"
    )
    parser.add_argument("--quick", action="store_true", help="ops=100, rounds=2 (smoke run)")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help=f"where to write the Markdown results (default: {RESULTS}, full runs only)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.ops, args.rounds, args.warmup = 100, 2, 20
    if args.output is None and not args.quick:
        args.output = RESULTS
    return args


def run(args: argparse.Namespace) -> str:
    load_before = os.getloadavg()[0]
    with (
        LocalCluster(5, persistence=Persistence.NONE) as lock_nodes,
        LocalCluster(1, persistence=Persistence.NONE) as data_nodes,
    ):
        initialise(lock_nodes.urls)
        data_node = data_nodes[0]
        fleet = Fleet(lock_nodes.urls, data_node.url, args.poll_interval, args.timeout)
        try:
            with data_client(data_node.url) as data:
                results = run_all(fleet, data, args)
        finally:
            fleet.close()
        context = context_lines(args, server_version(data_node), load_before)
    rows = build_rows(results)
    report = Report(table_rows(rows), per_round_rows(rows), args.rounds, context)
    if args.output is not None:
        write_results(
            args.output,
            "bench_patterns",
            "one stock counter, 8 processes: lock, optimistic, single writer",
            render(report, markdown=True),
        )
        print(f"wrote {args.output}", file=sys.stderr)
    return render(report, args.markdown)


def main(argv: Sequence[str] | None = None) -> None:
    print(run(parse_args(argv)))


if __name__ == "__main__":
    main()
