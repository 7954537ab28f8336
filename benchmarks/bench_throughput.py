"""Throughput at concurrency: many tasks or threads, each locking its own name.

What is measured
----------------
C asyncio tasks (C = 1, 8, 16, 256) share one client, and each loops for ``--duration``
seconds on a lock name of its own: acquire, an empty critical section, release. Nobody
contends, so this is the rate at which one process can take and give back locks, and
the client CPU each cycle costs. On 1 node and on 5 (``tenure.local.LocalCluster``,
TCP loopback, no persistence), all in one run:

* **floor (raw, pipelined)**: no library. One asyncio connection per node shared by all
  tasks; each cycle sends a pre-encoded ``SET name token NX PX 10000`` (only the token
  is spliced in) to every node, decides at the first majority of replies, then
  ``EVALSHA`` of a compare-and-delete script the same way (``_floors.py``). Concurrent
  tasks' requests are pipelined on the connections. No asyncio client can do less.
* **tenure asyncio**: ``async with lock:`` on ``AsyncClient(urls).lock(name, ttl=10)``,
  one lock object per task, the defaults a user gets (fair, blocking).
* **tenure sync, 8 threads**: ``with lock:`` on a shared ``Client``, 8 threads (compared
  with the floor and aioredlock at C = 8).
* **aioredlock**: ``await manager.lock(name, lock_timeout=10)`` then ``unlock``, one
  ``Aioredlock`` manager shared by the tasks.

The rows take turns: R rounds, and in each round every row runs once, the order
rotating. Ratios are taken between rows of the same round (seconds apart), and the
table gives their median and their lowest: the machine is shared, and a burst of load
lands on a row, not on a ratio of neighbours.

Targets: tenure at C >= 16 reaches >= 75% of the floor's cycles per second, and >= 3x
aioredlock's, on 1 node and on 5.

Run ``python benchmarks/bench_throughput.py`` (``--quick`` for a smoke run); a full run
writes ``benchmarks/results/bench_throughput.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import importlib.metadata
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import tenure
from _common import fmt, initialise, server_cpu_s, server_version, table, write_results
from _floors import COMPARE_AND_DELETE, AsyncMajorityFloor, Payloads
from tenure.testing import LocalCluster, Persistence

TTL_S = 10
TTL_MS = TTL_S * 1000
RESULTS = Path(__file__).resolve().parent / "results" / "bench_throughput.md"
CONCURRENCY = (1, 8, 16, 256)
THREADS = 8
TARGET_VS_FLOOR = 0.75  # at C >= 16
TARGET_VS_AIOREDLOCK = 3.0  # at C >= 16
JUDGED_FROM = 16

Cycle = Callable[[], Awaitable[bool]]


@dataclass
class Run:
    """One row's run: cycles done, seconds, client CPU seconds, failures."""

    cycles: int
    elapsed: float
    cpu: float
    failures: int
    error: str = ""
    server_cpu: float = 0.0  # CPU seconds of the row's redis-server processes meanwhile

    @property
    def server_cpu_us(self) -> float:
        return 1e6 * self.server_cpu / self.cycles if self.cycles else float("nan")

    @property
    def rate(self) -> float:
        return self.cycles / self.elapsed if self.elapsed else 0.0

    @property
    def cpu_us(self) -> float:
        return 1e6 * self.cpu / self.cycles if self.cycles else float("nan")


@dataclass
class Row:
    system: str
    nodes: int
    c: int
    start: Callable[[float], Run]  # runs the row for that many seconds
    runs: list[Run] = field(default_factory=list)
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.system}, {self.nodes} node{'s' if self.nodes > 1 else ''}, C={self.c}"


# --------------------------------------------------------------------------- runners


async def _tasks(makers: Sequence[Callable[[], Cycle]], duration: float) -> Run:
    """Each maker's cycle looped by a task of its own until ``duration`` is up."""
    loop = asyncio.get_running_loop()
    counts = [0] * len(makers)
    failures = [0]
    errors: list[str] = []

    async def task(i: int, cycle: Cycle, end: float) -> None:
        while loop.time() < end:
            try:
                ok = await cycle()
            except Exception as exc:
                ok = False
                errors.append(f"{type(exc).__name__}: {exc}")
            failures[0] += not ok
            counts[i] += 1

    cycles = [make() for make in makers]
    gc.collect()
    cpu0, t0 = time.process_time(), time.perf_counter()
    end = loop.time() + duration
    await asyncio.gather(*(task(i, cycle, end) for i, cycle in enumerate(cycles)))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return Run(sum(counts), elapsed, cpu, failures[0], errors[0] if errors else "")


def async_row(
    loop: asyncio.AbstractEventLoop, system: str, nodes: int, c: int, maker: Callable[[int], Cycle]
) -> Row:
    def start(duration: float) -> Run:
        makers = [lambda i=i: maker(i) for i in range(c)]
        return loop.run_until_complete(_tasks(makers, duration))

    return Row(system, nodes, c, start)


def floor_maker(floor: AsyncMajorityFloor, prefix: str, release_sha: str) -> Callable[[int], Cycle]:
    def maker(i: int) -> Cycle:
        payloads = Payloads(f"{prefix}:{i}", TTL_MS, release_sha)

        async def cycle() -> bool:
            return await floor.cycle(payloads)

        return cycle

    return maker


def tenure_maker(client: tenure.AsyncClient, prefix: str) -> Callable[[int], Cycle]:
    def maker(i: int) -> Cycle:
        lock = client.lock(f"{prefix}:{i}", ttl=TTL_S)

        async def cycle() -> bool:
            async with lock:
                pass
            return True

        return cycle

    return maker


def aioredlock_maker(manager: object, prefix: str) -> Callable[[int], Cycle]:
    def maker(i: int) -> Cycle:
        name = f"{prefix}:{i}"

        async def cycle() -> bool:
            lock = await manager.lock(name, lock_timeout=TTL_S)  # type: ignore[attr-defined]
            await manager.unlock(lock)  # type: ignore[attr-defined]
            return True

        return cycle

    return maker


def threads_row(client: tenure.Client, nodes: int, prefix: str) -> Row:
    def start(duration: float) -> Run:
        counts = [0] * THREADS
        failures = [0]
        errors: list[str] = []
        go = threading.Barrier(THREADS + 1)
        end = [0.0]

        def work(i: int) -> None:
            lock = client.lock(f"{prefix}:{i}", ttl=TTL_S)
            go.wait()
            while time.monotonic() < end[0]:
                try:
                    with lock:
                        pass
                except Exception as exc:
                    failures[0] += 1
                    errors.append(f"{type(exc).__name__}: {exc}")
                counts[i] += 1

        threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        gc.collect()
        cpu0, t0 = time.process_time(), time.perf_counter()
        end[0] = time.monotonic() + duration
        go.wait()
        for t in threads:
            t.join()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        return Run(sum(counts), elapsed, cpu, failures[0], errors[0] if errors else "")

    return Row("tenure sync, threads", nodes, THREADS, start)


# --------------------------------------------------------------------------- method


def measure(
    cluster: LocalCluster, rows: Sequence[Row], rounds: int, duration: float, warmup: float
) -> None:
    for row in rows:
        try:
            row.start(warmup)
        except Exception as exc:
            row.note = f"n/a: {type(exc).__name__}: {exc}".splitlines()[0][:160]
    live = [r for r in rows if not r.note]
    for r in range(rounds):
        shift = r * max(len(live) // rounds, 1) % max(len(live), 1)
        for row in live[shift:] + live[:shift]:
            before = server_cpu_s(cluster.nodes[: row.nodes])
            result = row.start(duration)
            result.server_cpu = server_cpu_s(cluster.nodes[: row.nodes]) - before
            row.runs.append(result)
        print(f"  round {r + 1}/{rounds} done", file=sys.stderr, flush=True)


def paired(row: Row, base: Row | None) -> list[float]:
    """Per round: row's rate / base's rate (both ran in that round)."""
    if base is None or not base.runs or not row.runs:
        return []
    return [a.rate / b.rate for a, b in zip(row.runs, base.runs, strict=True) if b.rate]


def ratio_cell(ratios: list[float], target: float | None, judged: bool) -> str:
    if not ratios:
        return "-"
    median, low = statistics.median(ratios), min(ratios)
    text = f"{median:.2f}x (lowest {low:.2f}x)"
    if target is not None and judged:
        text += f" (target >= {target:g}x: {'ok' if low >= target else 'MISSED'})"
    return text


HEADER = [
    "system",
    "nodes",
    "C",
    "cycles/s",
    "CPU µs/cycle",
    "server CPU µs/cycle",
    "vs floor",
    "vs aioredlock",
    "failed",
    "notes",
]


def report_rows(rows: Sequence[Row]) -> list[list[str]]:
    by = {(r.system, r.nodes, r.c): r for r in rows}
    out = []
    for row in rows:
        if not row.runs:
            out.append([row.system, str(row.nodes), str(row.c), *["-"] * 6, row.note])
            continue
        is_tenure = row.system.startswith("tenure")
        judged = is_tenure and row.c >= JUDGED_FROM
        floor = by.get(("floor (raw, pipelined)", row.nodes, row.c))
        peer = by.get(("aioredlock", row.nodes, row.c))
        vs_floor = "-" if row is floor else ratio_cell(paired(row, floor), TARGET_VS_FLOOR, judged)
        vs_peer = (
            "-" if row is peer else ratio_cell(paired(row, peer), TARGET_VS_AIOREDLOCK, judged)
        )
        failures = sum(r.failures for r in row.runs)
        errors = [r.error for r in row.runs if r.error]
        out.append(
            [
                row.system,
                str(row.nodes),
                str(row.c),
                fmt(statistics.median(r.rate for r in row.runs)),
                f"{statistics.median(r.cpu_us for r in row.runs):.1f}",
                f"{statistics.median(r.server_cpu_us for r in row.runs):.1f}",
                vs_floor,
                vs_peer,
                str(failures),
                "; ".join([*([row.note] if row.note else []), *errors[:1]])[:160],
            ]
        )
    return out


def versions() -> str:
    found = []
    for dist in ("tenure", "redis", "hiredis", "aioredlock", "aioredis"):
        try:
            found.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{dist} not installed")
    return ", ".join(found)


def context(args: argparse.Namespace, version: str, load_before: float) -> list[str]:
    load = f"load average {load_before:.2f} before the run, {os.getloadavg()[0]:.2f} after"
    return [
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs; {load}",
        f"- Python {platform.python_version()}, redis-server {version} (local nodes, TCP "
        "loopback, persistence none)",
        f"- libraries: {versions()}",
        f"- method: every row warmed up {args.warmup:g} s, then {args.rounds} rounds of "
        f"{args.duration:g} s per row, order rotating; cycles/s and CPU are medians over "
        "rounds; ratios are per round (rows of the same round), median and lowest; client "
        "CPU is time.process_time() of this process over the row's run, per cycle; server "
        "CPU is the nodes' INFO cpu (user + system) over the same run, summed over nodes",
    ]


# --------------------------------------------------------------------------- main


def build_rows(
    cluster: LocalCluster,
    loop: asyncio.AbstractEventLoop,
    sha: str,
    closers: list[Callable[[], None]],
) -> list[Row]:
    rows: list[Row] = []
    for nodes in (1, 5):
        addresses = [(n.host, n.port) for n in cluster.nodes[:nodes] if n.port is not None]
        urls = cluster.urls[:nodes]
        floor = loop.run_until_complete(AsyncMajorityFloor.connect(addresses))
        closers.append(partial(loop.run_until_complete, floor.close()))
        aclient = tenure.AsyncClient(urls)
        closers.append(partial(loop.run_until_complete, aclient.aclose()))
        sclient = tenure.Client(urls)
        closers.append(sclient.close)
        manager: Any = None
        note = ""
        try:
            from aioredlock import Aioredlock

            manager = Aioredlock([{"host": h, "port": p} for h, p in addresses])
            closers.append(partial(loop.run_until_complete, manager.destroy()))
        except Exception as exc:
            note = f"n/a: {type(exc).__name__}: {exc}"
        for c in CONCURRENCY:
            prefix = f"bench:tp:{nodes}:{c}"
            rows.append(
                async_row(
                    loop, "floor (raw, pipelined)", nodes, c, floor_maker(floor, f"{prefix}:f", sha)
                )
            )
            if c != THREADS:
                rows.append(
                    async_row(
                        loop, "tenure asyncio", nodes, c, tenure_maker(aclient, f"{prefix}:t")
                    )
                )
            else:
                rows.append(threads_row(sclient, nodes, f"{prefix}:s"))
            if manager is not None:
                rows.append(
                    async_row(
                        loop, "aioredlock", nodes, c, aioredlock_maker(manager, f"{prefix}:a")
                    )
                )
            else:
                rows.append(Row("aioredlock", nodes, c, lambda d: Run(0, 0, 0, 0), note=note))
    return rows


def run(args: argparse.Namespace) -> str:
    load_before = os.getloadavg()[0]
    source = COMPARE_AND_DELETE
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    closers: list[Callable[[], None]] = []
    with LocalCluster(5, persistence=Persistence.NONE) as cluster:
        initialise(cluster.urls)
        sha = ""
        for node in cluster.nodes:
            with node.client() as c:
                sha = str(c.script_load(source))
        try:
            rows = build_rows(cluster, loop, sha, closers)
            print(f"measuring: {args.rounds} rounds x {args.duration:g} s per row", file=sys.stderr)
            measure(cluster, rows, args.rounds, args.duration, args.warmup)
            version = server_version(cluster[0])
        finally:
            for close in reversed(closers):
                try:
                    close()
                except Exception as exc:  # closing must not hide the results
                    print(f"  closing: {type(exc).__name__}: {exc}", file=sys.stderr)
            loop.close()

    def render(markdown: bool) -> str:
        heading = "## " if markdown else ""
        cells = report_rows(rows)
        return "\n\n".join(
            [
                f"{heading}Uncontended acquire + release at concurrency C (own name per task)",
                table(
                    HEADER,
                    cells,
                    lambda h: (
                        h in ("nodes", "C", "cycles/s", "CPU µs/cycle", "server CPU µs/cycle")
                    ),
                    markdown=markdown,
                ),
                f"{heading}Setup",
                "\n".join(context(args, version, load_before)),
            ]
        )

    if args.output is not None:
        write_results(args.output, "bench_throughput", "throughput at concurrency", render(True))
        print(f"wrote {args.output}", file=sys.stderr)
    return render(args.markdown)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per row per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (rows take turns)")
    parser.add_argument("--warmup", type=float, default=0.3, help="warm-up seconds per row")
    parser.add_argument("--quick", action="store_true", help="0.5 s, 2 rounds, writes nothing")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--output", type=Path, default=None, help=f"default: {RESULTS}")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.rounds, args.warmup = 0.5, 2, 0.1
    if args.output is None and not args.quick:
        args.output = RESULTS
    return args


def main(argv: Sequence[str] | None = None) -> None:
    print(run(parse_args(argv)))


if __name__ == "__main__":
    main()
