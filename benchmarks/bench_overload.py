"""Overload is not an outage: a busy client on a busy machine, on a new node set.

What is measured
----------------
A client far busier than its nodes, beside a CPU hog (a process spinning in a loop on
the same 2 cores), locks its own names in a loop: 256 asyncio tasks, or 8 threads with
the blocking client, on 5 nodes started fresh for each row (a new node set, as on the
day a service is deployed, when every client meets blank nodes at once). Every node is
up the whole time, so every failure is the client's: a healthy node reported as failed
(``QuorumUnreachable``), a refusal of a free lock (``LockTimeout``: blocking acquires
wait, so only non-blocking ones may be refused), or a node set left warming up (nodes
seeded after a "data loss" that never happened: they grant nothing for ``max_ttl``). It
gets slower; the table says whether it stays correct, and what each cycle cost the
client in CPU (``time.process_time`` of this process, every thread, while the workers
ran, over the cycles done: failed ones cost CPU too but are not counted as cycles).

Run ``python benchmarks/bench_overload.py`` (``--quick`` for 3 s rows, ``--markdown``
for Markdown, ``--hogs 2`` for two spinning processes instead of one). A full run of the
default setup writes ``benchmarks/results/bench_overload.md``; another writes only to
``--output``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import tenure
from _common import fmt, server_version, table, write_results
from tenure._core.config import NODE_WARM
from tenure.testing import LocalCluster

RESULTS = Path(__file__).parent / "results" / "bench_overload.md"
NAMES_PER_WORKER = 7  # each worker cycles over a few names of its own


class Tally:
    """Cycles and failures by kind, from any thread."""

    def __init__(self) -> None:
        self.cycles = 0
        self.errors: collections.Counter[str] = collections.Counter()
        self.first: dict[str, str] = {}
        self.cpu = 0.0  # this process's CPU seconds (every thread) while the workers ran
        self._lock = threading.Lock()

    def done(self) -> None:
        with self._lock:
            self.cycles += 1

    def failed(self, exc: Exception) -> None:
        kind = type(exc).__name__
        with self._lock:
            self.errors[kind] += 1
            self.first.setdefault(kind, str(exc))


def run_async(urls: list[str], tasks: int, blocking: bool, seconds: float) -> Tally:
    tally = Tally()

    async def main() -> None:
        async with tenure.AsyncClient(urls) as client:
            end = time.monotonic() + seconds

            async def worker(k: int) -> None:
                i = 0
                while time.monotonic() < end:
                    i += 1
                    name = f"overload:{k}:{i % NAMES_PER_WORKER}"
                    try:
                        lease = await client.acquire(name, ttl=5.0, blocking=blocking)
                        await lease.release()
                    except tenure.TenureError as exc:
                        tally.failed(exc)
                    else:
                        tally.done()

            start = time.process_time()
            await asyncio.gather(*(worker(k) for k in range(tasks)))
            tally.cpu = time.process_time() - start

    asyncio.run(main())
    return tally


def run_sync(urls: list[str], threads: int, blocking: bool, seconds: float) -> Tally:
    tally = Tally()
    with tenure.Client(urls) as client:
        end = time.monotonic() + seconds

        def worker(k: int) -> None:
            i = 0
            while time.monotonic() < end:
                i += 1
                name = f"overload:{k}:{i % NAMES_PER_WORKER}"
                try:
                    client.acquire(name, ttl=5.0, blocking=blocking).release()
                except tenure.TenureError as exc:
                    tally.failed(exc)
                else:
                    tally.done()

        workers = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
        start = time.process_time()
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        tally.cpu = time.process_time() - start
    return tally


def warming(cluster: LocalCluster) -> int:
    """Nodes sitting out a warm-up at the end of the row."""
    count = 0
    for node in cluster:
        with node.client() as c:
            count += bool(c.exists(NODE_WARM))
    return count


Row = tuple[str, str, Callable[[list[str], int, bool, float], Tally], int, bool]
ROWS: list[Row] = [
    ("asyncio", "256 tasks", run_async, 256, True),
    ("asyncio", "256 tasks", run_async, 256, False),
    ("blocking", "8 threads", run_sync, 8, True),
    ("blocking", "8 threads", run_sync, 8, False),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per row")
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--hogs", type=int, default=1, help="spinning processes beside it")
    parser.add_argument("--quick", action="store_true", help="3 s rows, writes nothing")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument(
        "--output", type=Path, default=None, help=f"default: {RESULTS} (default setup only)"
    )
    args = parser.parse_args()
    seconds = 3.0 if args.quick else args.seconds
    hogs = "a CPU hog (one process spinning)" if args.hogs == 1 else f"{args.hogs} CPU hogs"

    header = [
        "client",
        "workers",
        "acquire",
        "cycles",
        "cycles/s",
        "client CPU µs/cycle",
        "QuorumUnreachable",
        "LockTimeout",
        "other errors",
        "nodes warming at the end",
    ]
    rows: list[list[str]] = []
    notes: list[str] = []
    server = ""
    load_before = os.getloadavg()[0]
    for client, workers, run, count, blocking in ROWS:
        mode = "blocking" if blocking else "non-blocking"
        print(f"{client}, {workers}, {mode}: {seconds:g} s beside {hogs}", file=sys.stderr)
        with LocalCluster(args.nodes) as cluster:
            server = server or server_version(cluster[0])
            spinning = [
                subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(args.hogs)
            ]
            try:
                tally = run(cluster.urls, count, blocking, seconds)
            finally:
                for hog in spinning:
                    hog.kill()
                    hog.wait()
            left_warming = warming(cluster)
        errors = tally.errors
        other = sum(
            n for kind, n in errors.items() if kind not in ("QuorumUnreachable", "LockTimeout")
        )
        rows.append(
            [
                client,
                workers,
                mode,
                f"{tally.cycles:,}",
                fmt(tally.cycles / seconds),
                fmt(tally.cpu / tally.cycles * 1e6) if tally.cycles else "-",
                str(errors["QuorumUnreachable"]),
                str(errors["LockTimeout"]),
                str(other),
                f"{left_warming} of {args.nodes}",
            ]
        )
        for kind, text in tally.first.items():
            notes.append(f"- {client}, {workers}, {mode}, first {kind}: {text[:300]}")

    numeric = set(header) - {"client", "workers", "acquire", "nodes warming at the end"}
    body = table(header, rows, lambda h: h in numeric, markdown=args.markdown or not args.quick)
    setup = [
        "",
        "## Setup",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs; 1-minute load average "
        f"{load_before:.2f} before the run",
        f"- Python {platform.python_version()}, {server} ({args.nodes} local nodes, fresh for "
        "each row, TCP loopback, persistence none)",
        f"- tenure {tenure.__version__}, default settings (node timeout 50 ms, fair mode); "
        f"{seconds:g} s per row, each worker cycling over {NAMES_PER_WORKER} names of its own, "
        f"TTL 5 s; {hogs} beside the client throughout",
    ]
    report = "\n".join(
        [
            f"## A busy client beside {hogs}, on a new node set",
            "",
            body,
            *(["", *notes] if notes else []),
            *setup,
        ]
    )
    print(report)
    # The results file holds the default run (one hog, 5 nodes, 10 s rows); another
    # setup is written only where --output says.
    default = args.hogs == 1 and args.nodes == 5 and args.seconds == 10.0
    output = args.output or (RESULTS if default else None)
    if not args.quick and output is not None:
        write_results(output, "bench_overload", "overload is not an outage", report)
        print(f"wrote {output}", file=sys.stderr)


if __name__ == "__main__":
    main()
