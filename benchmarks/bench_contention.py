"""K processes contending for one key: throughput, hand-off latency, fairness.

What is measured
----------------
K worker processes (K = 2, 8, 32) loop on *one* key for ``--duration`` seconds each:
acquire (blocking), an empty critical section, release. Each worker records, per
critical section, ``time.monotonic_ns()`` when it asked, when it got the lock, and when it
began to release. ``CLOCK_MONOTONIC`` is one clock for the whole machine, so readings of
different processes compare. From those:

* **CS/s**: critical sections per second, all workers together;
* **hand-off p50/p99**: for consecutive critical sections held by *different* workers,
  where the next one was already waiting: from the release call of one to the lock being
  acquired by the other (what the lock adds between two holders);
* **wait p99/max**: time from asking to getting, per acquire;
* **min/max**: critical sections of the least and the most served worker (fairness: the
  target is min >= max / 2);
* **EVAL/CS** (tenure): scripts run per critical section on the nodes, from ``INFO
  commandstats`` deltas (PUBLISH and the other commands run inside the scripts are not
  client round trips and are not counted); **split/1k** (5 nodes): attempts per 1,000
  critical sections in which the votes split (some nodes granted, no majority, and no
  majority held by another either: the attempt backs off for a random time).

Systems, in one run on the same ``redis-server`` nodes (``tenure.testing.LocalCluster``, no
persistence): tenure ``Client`` with notified waiting (1 and 5 nodes), tenure fair mode
(1 node), tenure ``AsyncClient`` fair (1 node); peers on 1 node: redis-py's
``redis.lock.Lock`` (``blocking=True``, its default 0.1 s sleep between tries) and
python-redis-lock (``redis_lock.Lock``, ``BLPOP`` on a signal list).

Run ``python benchmarks/bench_contention.py`` (``--quick`` for a smoke run, ``--markdown``
to print Markdown). A full run writes ``benchmarks/results/contention.md``.
``--handoff-path`` instead times each stage of tenure's hand-off on 1 node at every K,
beside the same workers each locking a name of its own (``handoff_path``), and writes
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import datetime
import importlib.metadata
import itertools
import math
import multiprocessing
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import redis

import tenure
from _common import fmt, initialise, no_retry, server_cpu_s, server_version, table, write_results
from tenure._core.commands import pack
from tenure.testing import LocalCluster

RESULTS = Path(__file__).resolve().parent / "results" / "contention.md"
TTL_S = 10
_ctx = multiprocessing.get_context("forkserver")


@dataclass(frozen=True)
class System:
    name: str
    nodes: int
    kind: str  # tenure | tenure-unfair | tenure-async | redis-py | python-redis-lock


FAIR_1 = System("tenure (default: fair)", 1, "tenure")
PEER = System("python-redis-lock", 1, "python-redis-lock")
FAIR_5 = System("tenure (default: fair)", 5, "tenure")

SYSTEMS = [
    FAIR_1,
    System("tenure fair=False", 1, "tenure-unfair"),
    System("tenure asyncio (fair)", 1, "tenure-async"),
    System("redis-py Lock", 1, "redis-py"),
    PEER,
    FAIR_5,
    System("tenure fair=False", 5, "tenure-unfair"),
]
# The second table's systems: the targets' pairs (1 node vs the peer, 5 nodes vs 1).
IO_SYSTEMS = [FAIR_1, PEER, FAIR_5]

Record = tuple[int, int, int]  # asked, got, releasing (monotonic ns)


# --------------------------------------------------------------------------- workers


def _count_splits() -> list[int]:
    """Count attempts whose votes split, by wrapping the core (in this worker only)."""
    from tenure._core import acquire as core

    counter = [0]
    conclude = core.Acquisition.conclude

    def counting(self: Any, rnd: Any, token: str, now: float) -> Any:
        step = conclude(self, rnd, token, now)
        # A split vote: some nodes granted, no majority, and nobody holds a majority
        # either (the core then backs off at random rather than waiting).
        if 0 < rnd.yes < self.spec.quorum and isinstance(step, core.Retry):
            counter[0] += 1
        return step

    core.Acquisition.conclude = counting  # type: ignore[method-assign]
    return counter


Trace = tuple[list[int], list[int], list[int]]  # sent, readable, filed (monotonic ns)


def _trace_handoff_path() -> Trace:
    """Time the stages of a hand-off in this worker, by wrapping the blocking client's
    driver (in this worker only): when a request was written to a node, when a
    notification connection became readable, when a notification was filed for its
    waiter. Each wrapper costs a clock reading and an append."""
    from tenure._sync import links, notify

    sent: list[int] = []
    readable: list[int] = []
    filed: list[int] = []
    clock = time.monotonic_ns
    send, put, look = links.Link.send, notify.Slot.put, notify.readable  # type: ignore[attr-defined]

    def timed_send(self: Any, command: Any, now: float) -> None:
        send(self, command, now)
        sent.append(clock())

    def timed_look(socks: Any, timeout: float | None) -> list[Any]:
        got = look(socks, timeout)
        if got:
            readable.append(clock())
        return got

    def timed_put(self: Any, wake: Any, node: int = -1) -> None:
        filed.append(clock())
        put(self, wake, node)

    links.Link.send = timed_send  # type: ignore[method-assign]
    notify.readable = timed_look  # type: ignore[attr-defined]
    notify.Slot.put = timed_put  # type: ignore[method-assign]
    return sent, readable, filed


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _wait_start(start_at: Any) -> float:
    while start_at.value == 0.0:
        time.sleep(0.001)
    while time.monotonic() < start_at.value:
        time.sleep(0.0005)
    return float(start_at.value)


def worker(
    kind: str,
    urls: list[str],
    key: str,
    duration: float,
    ready: Any,
    start_at: Any,
    out: Connection,
    hold: float = 0.0,
    trace: bool = False,
) -> None:
    records: list[Record] = []
    splits = _count_splits()
    stages = _trace_handoff_path() if trace else None
    clock = time.monotonic_ns
    cpu = [0.0]  # this process's CPU seconds (every thread) in the measured loop
    if kind == "tenure-async":

        async def main() -> None:
            async with tenure.AsyncClient(urls) as client:
                lock = client.lock(key, ttl=TTL_S)
                for _ in range(100):  # connect (32 processes starting at once: retry)
                    try:
                        if await lock.acquire(blocking=False):
                            await lock.release()
                        break
                    except tenure.TenureError:
                        await asyncio.sleep(0.05)
                ready.release()
                end = _wait_start(start_at) + duration
                cpu[0] = -_cpu_seconds()
                while time.monotonic() < end:
                    asked = clock()
                    await lock.acquire()
                    got = clock()
                    if hold:
                        await asyncio.sleep(hold)
                    releasing = clock()
                    await lock.release()
                    records.append((asked, got, releasing))
                cpu[0] += _cpu_seconds()

        asyncio.run(main())
        out.send((records, splits[0], cpu[0], None))
        return
    if kind in ("tenure", "tenure-unfair"):
        client = tenure.Client(urls)
        lock: Any = client.lock(key, ttl=TTL_S, fair=False if kind == "tenure-unfair" else None)
        for _ in range(100):  # connect (32 processes starting at once: retry)
            try:
                if lock.acquire(blocking=False):
                    lock.release()
                break
            except tenure.TenureError:
                time.sleep(0.05)
    else:
        conn = redis.Redis.from_url(urls[0], retry=no_retry())
        for _ in range(100):  # connect (32 processes starting at once: retry)
            try:
                conn.ping()
                break
            except redis.RedisError:
                time.sleep(0.05)
        if kind == "redis-py":
            lock = conn.lock(key, timeout=TTL_S, blocking=True)
        else:
            import redis_lock

            lock = None
    ready.release()
    end = _wait_start(start_at) + duration
    cpu[0] = -_cpu_seconds()
    while time.monotonic() < end:
        if kind == "python-redis-lock":
            lock = redis_lock.Lock(conn, key, expire=TTL_S)  # its token is fixed per object
        asked = clock()
        lock.acquire()
        got = clock()
        if hold:
            time.sleep(hold)
        releasing = clock()
        lock.release()
        records.append((asked, got, releasing))
    cpu[0] += _cpu_seconds()
    out.send((records, splits[0], cpu[0], stages))


# --------------------------------------------------------------------------- one run


@dataclass
class Row:
    system: System
    k: int
    records: list[list[Record]] = field(default_factory=list)
    traces: list[Trace | None] = field(default_factory=list)  # per worker (--handoff-path)
    splits: int = 0
    evals: int = 0
    cpu_clients: float = 0.0  # CPU seconds of the workers in the measured loops
    cpu_servers: float = 0.0  # CPU seconds of the redis-server processes meanwhile
    elapsed: float = 0.0
    error: str = ""

    @property
    def cycles(self) -> int:
        return sum(len(r) for r in self.records)

    def handoffs(self) -> list[tuple[int, int, int, int]]:
        """(release call, its worker, acquired, the acquiring worker) of every hand-off:
        consecutive critical sections of different workers, the next one already waiting."""
        events = sorted(
            (got, rel, w, asked) for w, rs in enumerate(self.records) for asked, got, rel in rs
        )
        return [
            (rel, w, got, w2)
            for (_, rel, w, _), (got, _, w2, asked) in itertools.pairwise(events)
            if w2 != w and asked < rel and got >= rel
        ]

    def handoffs_us(self) -> list[float]:
        return [(got - rel) / 1000 for rel, _, got, _ in self.handoffs()]

    def handoff_stages_us(self) -> list[tuple[float, float, float, float]]:
        """Each traced hand-off (``--handoff-path``) in four stages, µs: the releasing
        worker's release call until its request was written; until the acquiring
        worker's notification connection was readable (the node's script, and both
        processes woken); until the notification was filed; until its acquire returned.
        Hand-offs without a notification in between (the lock was free when asked) are
        left out."""
        out = []
        for rel, w, got, w2 in self.handoffs():
            releaser, acquirer = self.traces[w], self.traces[w2]
            if releaser is None or acquirer is None:
                continue
            sent_at, (_, readable, filed) = releaser[0], acquirer
            i = bisect.bisect_left(sent_at, rel)
            j = bisect.bisect_right(filed, got) - 1
            if i == len(sent_at) or j < 0:
                continue
            sent, filed_at = sent_at[i], filed[j]
            r = bisect.bisect_right(readable, filed_at) - 1
            if r < 0 or not rel <= sent <= readable[r] <= filed_at <= got:
                continue
            out.append(
                (
                    (sent - rel) / 1000,
                    (readable[r] - sent) / 1000,
                    (filed_at - readable[r]) / 1000,
                    (got - filed_at) / 1000,
                )
            )
        return out

    def waits_ms(self) -> list[float]:
        return [(got - asked) / 1e6 for rs in self.records for asked, got, _ in rs]


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def server_counts(cluster: LocalCluster, n: int) -> tuple[int, float]:
    """Scripts run so far and CPU seconds used so far, summed over the first ``n`` nodes."""
    nodes = list(cluster)[:n]
    scripts = 0
    for node in nodes:
        with node.client() as c:
            stats = c.info("commandstats")
        # By EVAL, and by EVALSHA (the acquire; on one node, the release too).
        scripts += sum(
            int(stats.get(k, {}).get("calls", 0)) for k in ("cmdstat_eval", "cmdstat_evalsha")
        )
    return scripts, server_cpu_s(nodes)


def measure(
    cluster: LocalCluster,
    system: System,
    k: int,
    duration: float,
    hold: float = 0.0,
    *,
    trace: bool = False,
    own_names: bool = False,
) -> Row:
    """``own_names``: each worker locks a name of its own (no contention: the control)."""
    row = Row(system, k)
    urls = cluster.urls[: system.nodes]
    key = f"bench:contention:{system.kind}:{system.nodes}:{k}"
    ready = _ctx.Semaphore(0)
    start_at = _ctx.Value("d", 0.0)
    pipes, procs = [], []
    for i in range(k):
        parent_end, child_end = _ctx.Pipe(duplex=False)
        name = f"{key}:own:{i}" if own_names else key
        proc = _ctx.Process(
            target=worker,
            args=(system.kind, urls, name, duration, ready, start_at, child_end, hold, trace),
        )
        proc.start()
        pipes.append(parent_end)
        procs.append(proc)
    try:
        for _ in range(k):
            if not ready.acquire(timeout=60):
                raise RuntimeError("a worker did not start")
        start_at.value = time.monotonic() + 0.2
        time.sleep(0.2)
        scripts, cpu = server_counts(cluster, system.nodes)
        for pipe in pipes:
            if not pipe.poll(duration + 60):
                raise RuntimeError("a worker did not finish")
            records, splits, cpu_worker, stages = pipe.recv()
            row.records.append(records)
            row.traces.append(stages)
            row.splits += splits
            row.cpu_clients += cpu_worker
        scripts_after, cpu_after = server_counts(cluster, system.nodes)
        row.evals = scripts_after - scripts
        row.cpu_servers = cpu_after - cpu
        row.elapsed = duration
    except Exception as exc:
        row.error = f"{type(exc).__name__}: {exc}"
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return row


# --------------------------------------------------------------------------- floor

# A stand-in for release.lua's hand-off: set the lock, publish to the next holder.
_FLOOR_SCRIPT = "redis.call('SET', KEYS[1], ARGV[2]) return redis.call('PUBLISH', ARGV[1], 'G')"
_FLOOR_HANDOFFS = 2000


def _connect(address: str | int) -> Any:
    import socket

    if isinstance(address, str):  # a unix socket's path
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(address)
        return sock
    sock = socket.create_connection(("127.0.0.1", address))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _ping_pong(
    addresses: list[str | int],
    me: str,
    other: str,
    first: bool,
    ready: Any,
    start: Any,
    out: Any,
) -> None:
    """One of two players: on a majority of notifications, "release" to every node."""
    import select

    need = len(addresses) // 2 + 1
    cmd = [_connect(a) for a in addresses]
    sub = [_connect(a) for a in addresses]
    for sock in sub:
        sock.sendall(pack("SUBSCRIBE", me))
        sock.recv(4096)
    payload = pack("EVAL", _FLOOR_SCRIPT, 1, "floor", other, "x" * 32)
    ready.release()  # subscribed: the other's first notification cannot be lost
    start.wait()
    began = time.perf_counter_ns()
    if first:
        for sock in cmd:
            sock.sendall(payload)
    for _ in range(_FLOOR_HANDOFFS):
        got = 0
        while got < need:
            readable, _, _ = select.select(sub, [], [])
            for sock in readable:
                got += sock.recv(65536).count(b"message")
        replies, _, _ = select.select(cmd, [], [], 0)
        for sock in replies:
            sock.recv(65536)
        for sock in cmd:
            sock.sendall(payload)
    out.put(time.perf_counter_ns() - began)


def floor(cluster: LocalCluster, rounds: int, sizes: tuple[int, ...] = (1, 5)) -> dict[int, float]:
    """Median µs per hand-off of a bare ping-pong (raw sockets, a 1-line script, no
    client library): what 1 and 5 nodes (``sizes``) cost on this machine before any
    lock logic."""
    addresses: list[str | int] = [
        node.port if node.port is not None else str(node.unix_path) for node in cluster
    ]
    runs: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(rounds):
        for n in sizes:
            ready, start, out = _ctx.Semaphore(0), _ctx.Event(), _ctx.Queue()
            players = [
                _ctx.Process(
                    target=_ping_pong, args=(addresses[:n], a, b, a == "a", ready, start, out)
                )
                for a, b in (("a", "b"), ("b", "a"))
            ]
            for proc in players:
                proc.start()
            try:
                # Both subscribed before the first notification is sent (on a loaded
                # machine a fixed sleep was not always enough: the first was lost).
                for _ in players:
                    if not ready.acquire(timeout=60):
                        raise RuntimeError("a ping-pong player did not start")
                start.set()
                elapsed = out.get(timeout=60)  # the first player done: both passed the lock
            finally:
                # Also on failure: a player waits for notifications without a timeout,
                # and the interpreter would wait for it at exit.
                for proc in players:
                    proc.terminate()
                    proc.join()
            runs[n].append(elapsed / 1000 / (2 * _FLOOR_HANDOFFS))
    return {n: sorted(v)[len(v) // 2] for n, v in runs.items()}


# --------------------------------------------------------------------------- report

HEADER = [
    "system",
    "nodes",
    "K",
    "CS/s",
    "hand-off p50 µs",
    "hand-off p99 µs",
    "wait p99 ms",
    "wait max ms",
    "min/max per worker",
    "EVAL/CS",
    "split/1k",
    "CPU µs/CS",
]


def cells(row: Row) -> list[str]:
    s = row.system
    if row.error:
        return [s.name, str(s.nodes), str(row.k), row.error, *[""] * (len(HEADER) - 4)]
    counts = [len(r) for r in row.records]
    handoffs, waits = row.handoffs_us(), row.waits_ms()
    tenure_row = s.kind.startswith("tenure")
    return [
        s.name,
        str(s.nodes),
        str(row.k),
        fmt(row.cycles / row.elapsed),
        fmt(pct(handoffs, 0.5)),
        fmt(pct(handoffs, 0.99)),
        fmt(pct(waits, 0.99)),
        fmt(max(waits)),
        f"{min(counts)}/{max(counts)}",
        f"{row.evals / row.cycles:.2f}" if tenure_row and row.cycles else "",
        f"{1000 * row.splits / row.cycles:.1f}" if s.nodes > 1 and row.cycles else "",
        cpu_cell(row),
    ]


def cpu_cell(row: Row) -> str:
    """CPU per critical section: the workers' + the servers' (µs)."""
    if not row.cycles:
        return ""
    clients, servers = (1e6 * x / row.cycles for x in (row.cpu_clients, row.cpu_servers))
    return f"{clients:.0f}+{servers:.0f}"


def targets(rows: list[Row], *, throughput: bool = True) -> list[str]:
    def find(kind: str, nodes: int, k: int) -> Row | None:
        for r in rows:
            if r.system.kind == kind and r.system.nodes == nodes and r.k == k and not r.error:
                return r
        return None

    lines = []
    ks = sorted({r.k for r in rows})
    for k in ks:
        ours, peer = find("tenure", 1, k), find("python-redis-lock", 1, k)
        if ours is None or peer is None:
            continue
        a, b = pct(ours.handoffs_us(), 0.5), pct(peer.handoffs_us(), 0.5)
        ok = "met" if a <= b else "MISSED"
        lines.append(
            f"- K={k}, 1 node: tenure hand-off p50 {fmt(a)} µs vs python-redis-lock "
            f"{fmt(b)} µs (target: no slower): {ok}"
        )
    ours, peer = find("tenure", 1, max(ks)), find("python-redis-lock", 1, max(ks))
    if throughput and ours is not None and peer is not None:
        ratio = ours.cycles / max(peer.cycles, 1)
        ok = "met" if ratio >= 1.5 else "MISSED"
        lines.append(
            f"- K={max(ks)}, 1 node: tenure {ratio:.2f}x python-redis-lock's critical "
            f"sections/s (target: >= 1.5x): {ok}"
        )
    for r in rows:
        if r.system.kind.startswith("tenure") and not r.error:
            counts = [len(x) for x in r.records]
            ok = "met" if min(counts) * 2 >= max(counts) else "MISSED"
            lines.append(
                f"- {r.system.name}, {r.system.nodes} node(s), K={r.k}: least/most served "
                f"worker {min(counts)}/{max(counts)} (target: >= 1/2): {ok}"
            )
    for k in ks:
        for kind, label in (("tenure", "the default (fair)"), ("tenure-unfair", "fair=False")):
            one, five = find(kind, 1, k), find(kind, 5, k)
            if one is None or five is None:
                continue
            a, b = pct(one.handoffs_us(), 0.5), pct(five.handoffs_us(), 0.5)
            ok = "met" if b <= 1.5 * a else "MISSED"
            lines.append(
                f"- K={k}, {label}: 5-node hand-off p50 {fmt(b)} µs vs {fmt(a)} µs on 1 node: "
                f"{b / a:.2f}x (target <= 1.5x): {ok}"
            )
    return lines


def floor_lines(medians: dict[int, float]) -> list[str]:
    one, five = medians[1], medians[5]
    return [
        "Floor (no lock library: two processes pass a key back and forth over raw sockets, "
        "each release a 1-line script that publishes to the other, who goes on after a "
        "majority of notifications):",
        "",
        f"- 1 node {one:.0f} µs, 5 nodes {five:.0f} µs per hand-off: {five / one:.2f}x",
    ]


def load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan


def context(args: argparse.Namespace, version: str) -> list[str]:
    def v(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    return [
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs; 1-minute load average "
        f"{args.load_before:.2f} before the run, {load_average():.2f} after (other "
        "processes on the machine take the same cores)",
        f"- Python {platform.python_version()}; {version}; redis-py "
        f"{v('redis')}; python-redis-lock {v('python-redis-lock')}; tenure {v('tenure')}",
        f"- nodes on {'unix sockets' if args.unix else 'TCP loopback'}; "
        f"{args.duration:g} s per row, K in {args.k}; workers are separate processes "
        "(forkserver); empty critical sections; TTL 10 s",
    ]


PATH_HEADER = [
    "K",
    "CS/s",
    "hand-offs",
    "hand-off p50 µs",
    "release call -> written",
    "-> notification readable",
    "-> filed",
    "-> acquired",
    "worker CPU µs/CS",
    "own names: cycles/s",
    "own names: worker CPU µs/cycle",
]


def handoff_path(args: argparse.Namespace) -> str:
    """Where a hand-off's time goes: tenure's default (fair, blocking client, 1 node) at
    every K, its driver timed at each stage (``Row.handoff_stages_us``), beside the bare
    ping-pong's hand-off; and the workers' CPU per critical section beside the same K
    workers' CPU per cycle when each locks a name of its own (the wrappers installed in
    both). Writes nothing: the wrappers cost a little at every stage."""
    rows = []
    with LocalCluster(1, unix=args.unix) as cluster:
        initialise(cluster.urls)
        bare = floor(cluster, 1 if args.quick else 3, sizes=(1,))[1]
        for k in args.k:
            row = measure(cluster, FAIR_1, k, args.duration, trace=True)
            if row.error:
                raise RuntimeError(f"K={k}: {row.error}")
            # The control: the same K workers, each locking a name of its own.
            alone = measure(cluster, FAIR_1, k, args.duration, trace=True, own_names=True)
            if alone.error:
                raise RuntimeError(f"K={k}, own names: {alone.error}")
            stages = row.handoff_stages_us()
            rows.append(
                [
                    str(k),
                    fmt(row.cycles / row.elapsed),
                    fmt(len(stages)),
                    fmt(pct(row.handoffs_us(), 0.5)),
                    *(fmt(pct([s[n] for s in stages], 0.5)) for n in range(4)),
                    fmt(row.cpu_clients / row.cycles * 1e6),
                    fmt(alone.cycles / alone.elapsed),
                    fmt(alone.cpu_clients / alone.cycles * 1e6),
                ]
            )
            print("  ".join(rows[-1]), file=sys.stderr, flush=True)
    return "\n".join(
        [
            f"{FAIR_1.name}, 1 node: p50 of each stage of a hand-off, µs (the medians of "
            "the stages need not add up to the median of the whole)",
            "",
            table(PATH_HEADER, rows, lambda h: True, markdown=args.markdown),
            "",
            f"- bare ping-pong on the same node (no lock library): {bare:.0f} µs per hand-off",
        ]
    )


def run(args: argparse.Namespace) -> str:
    args.load_before = load_average()
    if args.handoff_path:
        return handoff_path(args)
    with LocalCluster(5, unix=args.unix) as cluster:
        initialise(cluster.urls)
        version = server_version(cluster[0])
        medians = floor(cluster, 1 if args.quick else 3)
        print(*floor_lines(medians), sep="\n", file=sys.stderr, flush=True)
        rows = measure_all(cluster, args, SYSTEMS, 0.0)
        pairs: list[Pair] = duel(cluster, args) if args.duel_runs and not args.only else []
        io_rows = (
            measure_all(cluster, args, IO_SYSTEMS, args.io_ms / 1000) if args.io_ms > 0 else []
        )

    def report(markdown: bool) -> str:
        def rows_table(rs: list[Row]) -> str:
            return table(HEADER, [cells(r) for r in rs], lambda h: h != "system", markdown=markdown)

        io_part = (
            [
                "",
                f"Critical sections of {args.io_ms:g} ms (the holder sleeps, as it would waiting "
                "for I/O; the CPU is no longer saturated, as it is with empty ones):",
                "",
                rows_table(io_rows),
                "",
                *targets(io_rows, throughput=False),
            ]
            if io_rows
            else []
        )
        return "\n".join(
            [
                "\n".join(context(args, version)),
                "",
                rows_table(rows),
                "",
                *(["Targets:", ""] if markdown else []),
                *targets(rows, throughput=not pairs),
                *duel_lines(args, pairs, markdown=markdown),
                "",
                *floor_lines(medians),
                *io_part,
            ]
        )

    if args.write:
        write_results(RESULTS, "bench_contention", "K processes on one key", report(True))
    return report(args.markdown)


def measure_all(
    cluster: LocalCluster, args: argparse.Namespace, systems: list[System], hold: float
) -> list[Row]:
    """Every system (of ``--only``) at every K, critical sections ``hold`` s long."""
    rows = []
    note = f" ({hold * 1000:g} ms CS)" if hold else ""
    for k in args.k:
        for system in systems:
            if args.only and system.kind not in args.only:
                continue
            row = measure(cluster, system, k, args.duration, hold)
            rows.append(row)
            print("  ".join(cells(row)) + note, file=sys.stderr, flush=True)
    return rows


@dataclass
class Pair:
    """One back-to-back pair of the throughput duel: tenure's run and the peer's."""

    first: str  # the kind that ran first
    ours: Row
    peer: Row

    @property
    def ratio(self) -> float:
        return rate(self.ours) / rate(self.peer)


def rate(row: Row) -> float:
    return row.cycles / row.elapsed


def duel(cluster: LocalCluster, args: argparse.Namespace) -> list[Pair]:
    """Critical sections per second of tenure and python-redis-lock at the largest K,
    in ``args.duel_runs`` back-to-back pairs of short runs, who goes first alternating:
    one row of each is at the mercy of whatever else the machine did in its seconds."""
    k = max(args.k)
    first, second = FAIR_1, PEER
    pairs = []
    for i in range(args.duel_runs):
        rows: dict[str, Row] = {}
        order = (first, second) if i % 2 == 0 else (second, first)
        for system in order:
            row = measure(cluster, system, k, args.duration / 2)
            if row.error:
                raise RuntimeError(f"{system.name}, K={k}: {row.error}")
            rows[system.kind] = row
        pairs.append(Pair(order[0].name, rows[first.kind], rows[second.kind]))
        print(
            f"pair {i + 1}: {rate(pairs[-1].ours):,.0f} vs {rate(pairs[-1].peer):,.0f} CS/s",
            file=sys.stderr,
        )
    return pairs


DUEL_TARGET = 1.5
DUEL_HEADER = [
    "pair",
    "first",
    "tenure CS/s",
    "python-redis-lock CS/s",
    "ratio",
    "tenure CPU µs/CS",
    "python-redis-lock CPU µs/CS",
]


def duel_lines(args: argparse.Namespace, pairs: list[Pair], *, markdown: bool) -> list[str]:
    """Every pair, then the verdict: the target must hold in each pair, not only in the
    median (a median of 5 hides two bad runs)."""
    if not pairs:
        return []
    rows = [
        [
            str(i + 1),
            p.first,
            fmt(rate(p.ours)),
            fmt(rate(p.peer)),
            f"{p.ratio:.2f}x",
            cpu_cell(p.ours),
            cpu_cell(p.peer),
        ]
        for i, p in enumerate(pairs)
    ]
    ratios = [p.ratio for p in pairs]
    worst, median = min(ratios), statistics.median(ratios)
    ok = "met" if worst >= DUEL_TARGET else "MISSED"
    return [
        "",
        f"Throughput duel at K={max(args.k)}, 1 node: back-to-back pairs of "
        f"{args.duration / 2:g} s runs, who goes first alternating (CPU: workers+servers):",
        "",
        table(DUEL_HEADER, rows, lambda h: h not in ("first",), markdown=markdown),
        "",
        f"- every pair >= {DUEL_TARGET:g}x python-redis-lock's critical sections per second: "
        f"lowest {worst:.2f}x, median {median:.2f}x, "
        f"{sum(r >= DUEL_TARGET for r in ratios)} of {len(ratios)} pairs (target: all): {ok}",
    ]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per row")
    parser.add_argument("--k", type=int, nargs="+", default=[2, 8, 32], help="process counts")
    parser.add_argument("--only", nargs="*", help="system kinds to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="1 s per row, writes nothing")
    parser.add_argument(
        "--duel-runs",
        type=int,
        default=5,
        help="pairs of runs for the throughput target at the largest K (0: none)",
    )
    parser.add_argument(
        "--io-ms",
        type=float,
        default=1.0,
        help="the second table's critical sections sleep this long (0: no second table)",
    )
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument(
        "--handoff-path",
        action="store_true",
        help="only time the stages of tenure's hand-off on 1 node, at every K, beside the "
        "same workers each locking a name of its own (writes nothing)",
    )
    parser.add_argument(
        "--unix", action="store_true", help="nodes on unix sockets, not TCP (writes nothing)"
    )
    args = parser.parse_args(argv)
    args.write = (
        not args.quick
        and not args.handoff_path
        and not args.only
        and args.k == [2, 8, 32]
        and not args.unix
        and args.io_ms == 1.0
        and args.duel_runs == 5
    )
    if args.quick:
        args.duration = 1.0
        args.duel_runs = min(args.duel_runs, 1)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    print(run(args))


if __name__ == "__main__":
    main()
