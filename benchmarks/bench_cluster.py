"""Distinct lock names per second: one plain node against a 3-master Redis Cluster.

What is measured
----------------
C asyncio tasks share one ``AsyncClient`` and each loops for ``--duration`` seconds on
names nobody used before (a lock per entity): acquire a fresh name, an empty critical
section, release. Two deployments side by side, in alternating rounds of one run:

* **1 node**: one plain node (``tenure.testing.LocalCluster(1)``), ``redis://``;
* **cluster**: a Redis Cluster of 3 masters without replicas
  (``tenure.testing.LocalRedisCluster``), given as one ``redis+cluster://`` node; each
  name's round goes to the master of its slot.

Both are one vote, with the defaults a user gets there (a client with a Cluster node is
never fair: docs/cluster-and-sentinel.md; the plain node is run with ``fair=False`` too,
so that the rows differ only in where the commands go). Reported: cycles per second,
client CPU per cycle (``time.process_time()``), server CPU per cycle (``INFO cpu`` of
every process, summed), and the cluster's rate over the single node's, per round.

What it does and does not say: on these 2 cores the client and every server share the
same CPU, so a cluster cannot go faster here than one node; the figure shows what
routing by slot costs the client (a slot lookup, one connection per master) and that
names spread over the masters (their server CPU splits three ways). Scaling out needs
cores, or hosts, for the masters and for the clients.

Run ``python benchmarks/bench_cluster.py`` (``--quick`` for a smoke run); a full run
writes ``benchmarks/results/bench_cluster.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import tenure
from _common import fmt, server_cpu_s, server_version, table, write_results
from tenure.testing import LocalCluster, LocalRedisCluster

RESULTS = Path(__file__).resolve().parent / "results" / "bench_cluster.md"
TTL = 10.0


async def _run(url: str, tasks: int, duration: float, prefix: str) -> tuple[int, float]:
    """Cycles done and client CPU seconds over ``duration``, ``tasks`` tasks."""
    counter = itertools.count()
    done = 0
    async with tenure.AsyncClient([url]) as client:
        # Connect (and load the cluster's slot map) before the clock starts.
        await (await client.acquire(f"{prefix}:warm", ttl=TTL, fair=False)).release()

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < stop:
                name = f"{prefix}:{next(counter)}"
                async with client.lock(name, ttl=TTL, fair=False):
                    pass
                done += 1

        cpu = time.process_time()
        stop = time.monotonic() + duration
        await asyncio.gather(*(worker() for _ in range(tasks)))
        return done, time.process_time() - cpu


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 short rounds")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.rounds = 0.5, 2
    load_before = os.getloadavg()[0]
    rows: dict[str, list[tuple[float, float, float]]] = {"1 node": [], "cluster": []}
    ratios: list[float] = []
    with LocalCluster(1) as one, LocalRedisCluster(masters=3, replicas=0) as cluster:
        deployments = {
            "1 node": (one.urls[0], list(one)),
            "cluster": (cluster.url, cluster.masters()),
        }
        version = server_version(next(iter(one)))
        for r in range(args.rounds):
            order = list(deployments) if r % 2 == 0 else list(reversed(deployments))
            got: dict[str, float] = {}
            for which in order:
                url, nodes = deployments[which]
                server = server_cpu_s(nodes)
                cycles, cpu = asyncio.run(_run(url, args.tasks, args.duration, f"b{r}{which[0]}"))
                server = server_cpu_s(nodes) - server
                rate = cycles / args.duration
                rows[which].append((rate, cpu / cycles * 1e6, server / cycles * 1e6))
                got[which] = rate
                print(f"  round {r + 1}/{args.rounds}: {which}: {rate:,.0f} names/s", flush=True)
            ratios.append(got["cluster"] / got["1 node"])
    header = ["deployment", "names/s", "client CPU µs/cycle", "server CPU µs/cycle", "vs 1 node"]
    body = []
    for which, runs in rows.items():
        rate, cpu, server = (statistics.median(x[k] for x in runs) for k in range(3))
        vs = (
            "-"
            if which == "1 node"
            else (f"{statistics.median(ratios):.2f}x (lowest {min(ratios):.2f}x)")
        )
        body.append([which, fmt(rate), fmt(cpu), fmt(server), vs])
    numeric = lambda h: h != "deployment" and h != "vs 1 node"  # noqa: E731
    text = table(header, body, numeric, markdown=args.markdown)
    setup = (
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC\n"
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs; load average "
        f"{load_before:.2f} before the run, {os.getloadavg()[0]:.2f} after\n"
        f"- Python {platform.python_version()}, {version}; cluster: 3 masters, no replicas\n"
        f"- method: {args.tasks} asyncio tasks, a fresh name per cycle, {args.rounds} rounds "
        f"of {args.duration} s per deployment, order alternating; medians over rounds; the "
        "ratio is per round\n"
    )
    print(text)
    print(setup)
    if not args.quick:
        md = table(header, body, numeric, markdown=True)
        write_results(RESULTS, "bench_cluster", "distinct names per second", f"{md}\n\n{setup}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
