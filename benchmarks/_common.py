"""What the benchmark scripts share: timing runners, their statistics, and tables.

Imported by ``bench_lock.py``, ``bench_throughput.py``, ``bench_fencing.py``,
``bench_patterns.py`` and ``bench_overload.py`` (run as
``python benchmarks/<script>.py``, so this directory is on ``sys.path``).
"""

from __future__ import annotations

import asyncio
import gc
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from redis.backoff import NoBackoff
from redis.retry import Retry

import tenure
from tenure.testing import LocalNode

__all__ = [
    "AsyncCycle",
    "AsyncRunner",
    "Measurable",
    "Runner",
    "Stats",
    "SyncCycle",
    "SyncRunner",
    "best_cpu_us",
    "fmt",
    "initialise",
    "measure_cpu",
    "no_retry",
    "server_cpu_ns",
    "server_cpu_s",
    "server_version",
    "table",
    "write_results",
]


def no_retry() -> Retry:
    # redis-py retries silently by default; a benchmark (and a lock) must see each
    # failure once, as it happens, not after a hidden back-off.
    return Retry(NoBackoff(), 0)


@dataclass
class Stats:
    """Everything measured for one row: per-cycle latencies and the batches' wall time."""

    latencies_ns: list[int] = field(default_factory=list)
    elapsed_ns: int = 0
    failures: int = 0
    first_error: str = ""
    # p50 of each turn's chunk, in turn order: every row runs a chunk in every turn, so
    # two rows' lists line up, and chunks of one turn ran seconds apart at most.
    turn_p50s: list[int] = field(default_factory=list)

    @property
    def cycles(self) -> int:
        return len(self.latencies_ns)

    def percentile_us(self, q: float) -> float:
        """Nearest-rank percentile, in microseconds."""
        ordered = sorted(self.latencies_ns)
        rank = max(math.ceil(q * len(ordered)) - 1, 0)
        return ordered[rank] / 1000

    def paired_ratio(self, base: Stats) -> float:
        """Median over turns of (our chunk p50 / ``base``'s chunk p50 in the same turn).

        A burst of load from another process moves both chunks of a turn together, so
        this ratio holds still where the ratio of the pooled p50s drifts with the load.
        """
        pairs = zip(self.turn_p50s, base.turn_p50s, strict=True)
        return statistics.median(a / b for a, b in pairs)

    def paired_excess_us(self, base: Stats) -> float:
        """Median over turns of (our chunk p50 - ``base``'s), in µs: the time a library
        adds per cycle. Unlike the ratio, it hardly moves when the machine's round trips
        slow down (on a shared VM they swing 4x from minute to minute)."""
        pairs = zip(self.turn_p50s, base.turn_p50s, strict=True)
        return statistics.median(a - b for a, b in pairs) / 1000

    def ops_per_s(self) -> float:
        return self.cycles / (self.elapsed_ns / 1e9) if self.elapsed_ns else 0.0

    def fail(self, exc: BaseException) -> None:
        self.failures += 1
        if not self.first_error:
            self.first_error = f"{type(exc).__name__}: {exc}"


class Runner(Protocol):
    def batch(self, n: int, stats: Stats) -> None: ...

    def cpu(self, n: int) -> float:
        """CPU seconds of this process (every thread) for ``n`` cycles, untimed."""
        ...

    def close(self) -> None: ...


SyncCycle = Callable[[], bool]
AsyncCycle = Callable[[], Awaitable[bool]]


class SyncRunner:
    """Runs a blocking cycle function ``n`` times in this thread."""

    def __init__(self, cycle: SyncCycle, closers: Sequence[Callable[[], object]] = ()) -> None:
        self._cycle = cycle
        self._closers = closers

    def batch(self, n: int, stats: Stats) -> None:
        cycle, clock, out = self._cycle, time.perf_counter_ns, stats.latencies_ns
        start = clock()
        for _ in range(n):
            t0 = clock()
            try:
                ok = cycle()
            except Exception as exc:
                stats.fail(exc)
            else:
                stats.failures += not ok
            out.append(clock() - t0)
        stats.elapsed_ns += clock() - start

    def cpu(self, n: int) -> float:
        cycle = self._cycle
        start = time.process_time()
        for _ in range(n):
            # try/except, not contextlib.suppress: no context manager's cost per cycle.
            try:  # noqa: SIM105
                cycle()
            except Exception:  # counted by the timed batches; here only CPU matters
                pass
        return time.process_time() - start

    def close(self) -> None:
        for closer in self._closers:
            closer()


class AsyncRunner:
    """Runs an async cycle ``n`` times inside one coroutine, so the event loop is entered
    once per batch, not once per cycle (which would time the loop's start-up)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        cycle: AsyncCycle,
        closers: Sequence[Callable[[], Awaitable[object]]] = (),
    ) -> None:
        self._loop = loop
        self._cycle = cycle
        self._closers = closers

    async def _batch(self, n: int, stats: Stats) -> None:
        cycle, clock, out = self._cycle, time.perf_counter_ns, stats.latencies_ns
        start = clock()
        for _ in range(n):
            t0 = clock()
            try:
                ok = await cycle()
            except Exception as exc:
                stats.fail(exc)
            else:
                stats.failures += not ok
            out.append(clock() - t0)
        stats.elapsed_ns += clock() - start

    def batch(self, n: int, stats: Stats) -> None:
        self._loop.run_until_complete(self._batch(n, stats))

    async def _cpu(self, n: int) -> float:
        cycle = self._cycle
        start = time.process_time()
        for _ in range(n):
            try:  # noqa: SIM105 (as above)
                await cycle()
            except Exception:  # counted by the timed batches; here only CPU matters
                pass
        return time.process_time() - start

    def cpu(self, n: int) -> float:
        return self._loop.run_until_complete(self._cpu(n))

    def close(self) -> None:
        for closer in self._closers:
            self._loop.run_until_complete(closer())


def server_cpu_ns(pids: Sequence[int]) -> int | None:
    """The CPU time the processes ``pids`` have used so far, every thread, in ns (Linux's
    ``/proc/<pid>/task/<tid>/schedstat``, whose first field is the time on a CPU); None
    where that cannot be read (another system, a process gone)."""
    total = 0
    try:
        for pid in pids:
            for task in Path(f"/proc/{pid}/task").iterdir():
                total += int((task / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total


def server_cpu_s(nodes: Sequence[LocalNode]) -> float:
    """The CPU seconds the ``nodes`` have used so far, as each reports it (``INFO cpu``,
    user + system, summed): where a benchmark reads the nodes over the network, as on a
    machine without Linux's ``/proc`` (``server_cpu_ns`` reads the kernel's count)."""
    total = 0.0
    for node in nodes:
        with node.client() as c:
            info = c.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def best_cpu_us(
    runners: Sequence[Runner], cycles: int, runs: int, servers: Sequence[int] = ()
) -> list[tuple[float, float]]:
    """Client and server CPU per cycle of each runner, in µs: the best of ``runs`` runs
    of ``cycles`` cycles each. Client: ``time.process_time`` (this process, every
    thread). Server: the CPU time of the server processes ``servers`` (``server_cpu_ns``;
    NaN when there are none or it cannot be read), which is the scripts' and commands'
    work the client's figure leaves out. The runners take turns so that a burst of load
    elsewhere touches them all. The best, not the median: other processes only ever add
    to a run's CPU (cache misses, migrations)."""
    best = [math.inf] * len(runners)
    best_server = [math.inf if servers else math.nan] * len(runners)
    for _ in range(runs):
        for i, runner in enumerate(runners):
            gc.collect()
            before = server_cpu_ns(servers) if servers else None
            best[i] = min(best[i], runner.cpu(cycles) / cycles * 1e6)
            after = server_cpu_ns(servers) if before is not None else None
            if before is None or after is None:
                best_server[i] = math.nan
            elif not math.isnan(best_server[i]):
                best_server[i] = min(best_server[i], (after - before) / cycles / 1e3)
    return list(zip(best, best_server, strict=True))


class Measurable(Protocol):
    """A row whose runner's client CPU per cycle ``measure_cpu`` fills in, and the
    servers' CPU per cycle when they are given."""

    runner: Runner | None
    cpu_us: float
    server_us: float


def measure_cpu(
    rows: Sequence[Measurable], cycles: int, runs: int, servers: Sequence[int] = ()
) -> None:
    """Set ``cpu_us`` (and ``server_us``, for the server processes ``servers``) of every
    row with a runner: ``best_cpu_us`` over them, taking turns."""
    live = [(row, row.runner) for row in rows if row.runner is not None]
    cpus = best_cpu_us([runner for _, runner in live], cycles, runs, servers)
    for (row, _), (cpu, server) in zip(live, cpus, strict=True):
        row.cpu_us, row.server_us = cpu, server


def fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def table(
    header: list[str], rows: list[list[str]], numeric: Callable[[str], bool], *, markdown: bool
) -> str:
    """A plain-text or Markdown table; columns whose header is ``numeric`` align right."""
    right = [numeric(h) for h in header]
    if markdown:
        align = ["---:" if r else "---" for r in right]
        out = [header, align, *rows]
        return "\n".join("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in out)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)
        ).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def server_version(node: LocalNode) -> str:
    """The server and its version, e.g. ``Valkey 9.1.2`` or ``Redis 6.2.14`` (Valkey's
    ``redis_version`` is the Redis it is compatible with, not its own)."""
    with node.client() as c:
        info = c.info("server")
    if "valkey_version" in info:
        return f"Valkey {info['valkey_version']}"
    return f"Redis {info['redis_version']}"


def write_results(path: Path, script: str, title: str, body: str) -> None:
    """Write ``body`` to ``path`` under ``title``, naming the script that wrote it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    intro = (
        f"# {script}: {title}\n\n"
        f"Written by `python benchmarks/{script}.py`; see `benchmarks/README.md`.\n\n"
    )
    path.write_text(intro + body + "\n")


def initialise(urls: Sequence[str]) -> None:
    """Use the node set once as a whole before anything uses a part of it.

    Runs use the first node alone and then all five. A set whose other nodes are blank
    when it is first used whole sits out a warm-up of ``max_ttl`` (docs/fencing.md,
    growing a node set), which would be measured as failures.
    """
    with tenure.Client(list(urls)) as client:
        client.acquire("bench:set-up", ttl=1.0).release()
