"""Latency and throughput of one uncontended acquire+release cycle, side by side.

What is measured
----------------
One client takes a lock nobody else wants and gives it back, over and over; each cycle
is timed with ``time.perf_counter_ns``. The systems, all in one run, on the same local
``redis-server`` nodes (started here with ``tenure.testing.LocalCluster``, 5 independent
masters, no persistence):

* **floor**: the two commands tenure itself sends (``SET key token NX PX`` and
  ``EVALSHA`` of tenure's compare-and-delete script), written to every node and then
  read back on bare redis-py connections. No lock library can do less work than this,
  so ``p50 / floor`` is what the library adds on top of the network and Redis.
  **floor (asyncio)** is the same on bare asyncio streams. On 5 nodes the **first
  majority** floors (blocking and asyncio, ``_floors.py``) decide each round at the
  first majority of replies, as a correct Redlock client may: the floor tenure is
  judged against there (its "own floor").
* **floor with tenure's scripts** (1 node): the floor's bare connection sending tenure's
  own acquire and release scripts, with a tenure client's arguments, in place of its two
  commands: what the scripts cost (their server time, their longer requests) before any
  client code, so ``p50 / floor`` of tenure splits into the scripts' share and the
  client's.
* **client CPU** per cycle of every system (``time.process_time``, best of 3 runs of
  3,000 untimed cycles), beside its latency, and the **server CPU** those cycles cost
  the nodes (the five nodes' CPU time over the same runs, from Linux's per-thread
  ``schedstat``): the scripts' work, which the client's figure leaves out and which
  the noise of the latencies hides.
* **tenure** sync (``Client``) and asyncio (``AsyncClient``), on 1 node and on 5.
* peers: redis-py's ``Lock`` and python-redis-lock (1 node), pottery's ``Redlock`` and
  aioredlock (5 nodes).
* a **frozen node** phase: node 5 is stopped with SIGSTOP (a GC pause, a frozen VM: the
  kernel still accepts connections, nothing answers). A Redlock client must keep
  working with 4 of 5 nodes at about its healthy speed. Peers run in a child process
  with a wall-clock budget and are killed by PID if they hang, so no peer can hang
  the benchmark.

Why side by side
----------------
Absolute microseconds depend on the machine, the kernel and whatever else is running
(on a shared VM the same loopback round trip swings between ~40 and ~200 µs from one
minute to the next). Only comparisons made in the same run, on the same nodes, at the
same moment mean anything. So every system is warmed up, then the systems take turns:
R rounds of N cycles each, run in chunks of ``--chunk`` cycles with the order rotating,
and each system's chunk p50 is compared with the floor's chunk p50 *of the same turn*.
The table reports the median over turns of that ratio (``p50 / floor``) and of that
difference (``µs over floor``: what the library itself adds per cycle, the figure that
moves least when the machine's round trips slow down).

Run ``python benchmarks/bench_lock.py`` (``--quick`` for a smoke run, ``--markdown``
to print the tables as Markdown). A full run also writes
``benchmarks/results/bench_lock.md`` with the machine and library versions.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import importlib.metadata
import math
import multiprocessing
import os
import platform
import secrets
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import redis

import tenure
from _common import (
    AsyncRunner,
    Runner,
    Stats,
    SyncCycle,
    SyncRunner,
    fmt,
    initialise,
    measure_cpu,
    no_retry,
    server_version,
    write_results,
)
from _common import table as _table
from _floors import COMPARE_AND_DELETE, AsyncMajorityFloor, MajorityFloor, Payloads
from tenure.testing import LocalCluster, LocalNode, Persistence

TTL_S = 10
TTL_MS = TTL_S * 1000
RESULTS = Path(__file__).resolve().parent / "results" / "bench_lock.md"
# Targets for tenure, as ratios of p50s against the floor each row is judged by
# (``own_floor``): the blocking client's, and the asyncio client's.
TARGET_VS_FLOOR = 1.15
TARGET_ASYNC_VS_FLOOR = 1.25
TARGET_FROZEN_VS_HEALTHY = 2.0
# Client CPU per cycle, against the same floor's.
TARGET_CPU_VS_FLOOR = 1.2
# tenure sync against redis-py's Lock on 1 node: at least this much faster (p50).
TARGET_VS_REDIS_PY = 0.85
# The floors a row is judged by (its "own floor"): the cheapest correct round on each
# node count, blocking or asyncio like the row. On 1 node a first majority is the one
# reply, so the read-all floors serve.
OWN_FLOOR = {
    (1, False): "floor",
    (1, True): "floor (asyncio)",
    (5, False): "floor, first majority",
    (5, True): "floor (asyncio), first majority",
}
ASYNC_SYSTEMS = frozenset(
    ["floor (asyncio)", "floor (asyncio), first majority", "tenure asyncio", "aioredlock"]
)
# Seconds a frozen-node child may run past its budget before it is killed.
KILL_GRACE_S = 5.0

Role = Literal["floor", "tenure", "peer"]
Address = tuple[str, int]


# --------------------------------------------------------------------------- results


# --------------------------------------------------------------------------- runners


@dataclass
class Subject:
    """One row of the table: a system, how to run it, and what it measured."""

    name: str
    nodes: int
    role: Role
    runner: Runner | None = None
    note: str = ""  # why it could not be measured, or what it did under a fault
    stats: Stats = field(default_factory=Stats)
    frozen: bool = False  # measured with node 5 stopped
    cpu_us: float = math.nan  # client CPU per cycle (best of --cpu-runs)
    server_us: float = math.nan  # the nodes' CPU per cycle, all five (healthy rows)

    @property
    def own_floor(self) -> str:
        return OWN_FLOOR[self.nodes, self.name in ASYNC_SYSTEMS]


@dataclass
class Env:
    """What the runner factories need: the nodes, the event loop, the release script."""

    nodes: list[LocalNode]
    loop: asyncio.AbstractEventLoop
    release_source: bytes
    release_sha: str

    def addresses(self, count: int) -> list[Address]:
        return [(n.host, n.port) for n in self.nodes[:count] if n.port is not None]

    def urls(self, count: int) -> list[str]:
        return [n.url for n in self.nodes[:count]]


def key_for(name: str) -> str:
    # A distinct key per system, so no system ever sees another's leftovers.
    return "bench:" + "".join(c if c.isalnum() else "-" for c in name.lower())


# --------------------------------------------------------------------------- systems


class RawConnection(Protocol):
    """The part of ``redis.Connection`` the floor uses (redis-py leaves it unannotated)."""

    def connect(self) -> None: ...

    def send_command(self, *args: object) -> None: ...

    def read_response(self) -> Any: ...

    def disconnect(self) -> None: ...


raw_connection = cast(Callable[..., RawConnection], redis.Connection)


def floor_runner(env: Env, count: int, key: str) -> Runner:
    """Tenure's two commands on bare connections: send to all nodes, then read all."""
    conns = [raw_connection(host=h, port=p, retry=no_retry()) for h, p in env.addresses(count)]
    for conn in conns:
        conn.connect()
    sha = env.release_sha

    def cycle() -> bool:
        token = secrets.token_hex(16)
        for conn in conns:
            conn.send_command("SET", key, token, "NX", "PX", TTL_MS)
        granted = [conn.read_response() for conn in conns]
        for conn in conns:
            conn.send_command("EVALSHA", sha, 1, key, token)
        released = [conn.read_response() for conn in conns]
        return all(r in (b"OK", "OK") for r in granted) and all(r == 1 for r in released)

    return SyncRunner(cycle, [conn.disconnect for conn in conns])


def scripts_runner(env: Env, count: int, key: str) -> Runner:
    """The floor's bare connection sending tenure's own scripts instead of its two
    commands: acquire.lua (the node's fencing floor, its replication history, the fair
    queue) and release.lua, by EVALSHA, with the arguments a tenure client sends for a
    non-blocking acquire of a free lock. No library around them: what any client of these
    scripts pays before its own code runs (1 node; the keys and settings are a tenure
    client's, so that the scripts take the way they take for tenure)."""
    from tenure._lua import script

    if count != 1:
        raise ValueError("the scripts' floor is measured on 1 node")
    with tenure.Client(env.urls(count)) as settings:
        spec = settings._specs.get(key, TTL_S, None)
        mark_ms = settings.config.max_ttl_ms
        hold_ms = settings._flows.hold_ms
        channel = settings._listener.channel  # where a queued waiter would be told
    keys = spec.keys
    mode = spec.mode
    (conn,) = [raw_connection(host=h, port=p, retry=no_retry()) for h, p in env.addresses(1)]
    conn.connect()
    conn.send_command("SCRIPT", "LOAD", script("acquire").wire)
    acquire_sha = conn.read_response()
    conn.send_command("SCRIPT", "LOAD", script("release").wire)
    release_sha = conn.read_response()
    mark = secrets.randbits(52) | 1  # only a blank node keeps it; these nodes are seeded

    def cycle() -> bool:
        token = secrets.token_hex(16)
        # A proposal from the wall clock in µs, as tenure's: above the node's floor.
        proposal = time.time_ns() // 1000
        for _ in range(2):
            conn.send_command(
                "EVALSHA", acquire_sha, 4, keys.lock, keys.floor, keys.warm, keys.queue,
                token, spec.ttl_ms, proposal, mark, mark_ms, spec.retention_ms,
                mode, token, channel, 0, proposal,
            )  # fmt: skip
            reply = conn.read_response()
            if reply == proposal:  # granted with the proposal as its token
                break
            status, number, _ = reply
            if status != -1:
                return False
            proposal = number + 1  # another client's grant raised the floor past it
        else:
            return False
        conn.send_command(
            "EVALSHA", release_sha, 3, keys.lock, keys.floor, keys.queue,
            token, mode, hold_ms, spec.retention_ms, proposal,
        )  # fmt: skip
        return bool(conn.read_response() == 1)

    return SyncRunner(cycle, [conn.disconnect])


def resp(*args: str | int) -> bytes:
    """One command in RESP, packed by hand: the asyncio floor uses no client library."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def floor_async_runner(env: Env, count: int, key: str) -> Runner:
    """The floor on bare asyncio streams: the least any asyncio client can do.

    Both replies are one line in RESP2 (``+OK`` and ``:1``), so ``readline`` parses them.
    """
    sha = env.release_sha
    streams = [
        env.loop.run_until_complete(asyncio.open_connection(h, p)) for h, p in env.addresses(count)
    ]

    async def cycle() -> bool:
        token = secrets.token_hex(16)
        for _, writer in streams:
            writer.write(resp("SET", key, token, "NX", "PX", TTL_MS))
        granted = [await reader.readline() for reader, _ in streams]
        for _, writer in streams:
            writer.write(resp("EVALSHA", sha, 1, key, token))
        released = [await reader.readline() for reader, _ in streams]
        return all(r == b"+OK\r\n" for r in granted) and all(r == b":1\r\n" for r in released)

    async def close() -> None:
        for _, writer in streams:
            writer.close()
            await writer.wait_closed()

    return AsyncRunner(env.loop, cycle, [close])


def majority_runner(env: Env, count: int, key: str) -> Runner:
    """The cheapest correct Redlock round, blocking: each of the two rounds decided at
    the first majority of replies (``_floors.MajorityFloor``)."""
    floor = MajorityFloor(env.addresses(count), Payloads(key, TTL_MS, env.release_sha))
    return SyncRunner(floor.cycle, [floor.close])


def majority_async_runner(env: Env, count: int, key: str) -> Runner:
    """The same on asyncio: one connection per node, a future per round."""
    floor = env.loop.run_until_complete(AsyncMajorityFloor.connect(env.addresses(count)))
    payloads = Payloads(key, TTL_MS, env.release_sha)
    return AsyncRunner(env.loop, partial(floor.cycle, payloads), [floor.close])


def tenure_runner(env: Env, count: int, key: str) -> Runner:
    client = tenure.Client(env.urls(count))

    def cycle() -> bool:
        # One attempt (blocking=False): a failed acquire raises LockTimeout and is
        # counted as a failure, rather than being hidden inside a retry.
        client.acquire(key, ttl=TTL_S, blocking=False).release()
        return True

    return SyncRunner(cycle, [client.close])


def tenure_async_runner(env: Env, count: int, key: str) -> Runner:
    client = tenure.AsyncClient(env.urls(count))

    async def cycle() -> bool:
        lease = await client.acquire(key, ttl=TTL_S, blocking=False)
        await lease.release()
        return True

    return AsyncRunner(env.loop, cycle, [client.aclose])


def redis_clients(addresses: Sequence[Address]) -> list[redis.Redis]:
    return [redis.Redis(host=h, port=p, retry=no_retry()) for h, p in addresses]


def redis_py_lock_runner(env: Env, count: int, key: str) -> Runner:
    (client,) = redis_clients(env.addresses(count))
    # redis-py draws a fresh token on every acquire, so one Lock object can be reused.
    lock = client.lock(key, timeout=TTL_S)

    def cycle() -> bool:
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    return SyncRunner(cycle, [client.close])


def python_redis_lock_runner(env: Env, count: int, key: str) -> Runner:
    import redis_lock

    (client,) = redis_clients(env.addresses(count))

    def cycle() -> bool:
        # python-redis-lock fixes the token when the Lock is built; a new Lock per cycle
        # gives each acquisition its own token, as the other systems do.
        lock = redis_lock.Lock(client, key, expire=TTL_S)
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    return SyncRunner(cycle, [client.close])


def pottery_runner(env: Env, count: int, key: str) -> Runner:
    from pottery import Redlock

    masters = redis_clients(env.addresses(count))
    # auto_release_time is in seconds in pottery 3 (it sends px=auto_release_time*1000).
    lock = Redlock(key=key, masters=set(masters), auto_release_time=TTL_S)

    def cycle() -> bool:
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    return SyncRunner(cycle, [m.close for m in masters])


def aioredlock_runner(env: Env, count: int, key: str) -> Runner:
    from aioredlock import Aioredlock

    manager = Aioredlock([{"host": h, "port": p} for h, p in env.addresses(count)])

    async def cycle() -> bool:
        lock = await manager.lock(key, lock_timeout=TTL_S)
        await manager.unlock(lock)
        return True

    return AsyncRunner(env.loop, cycle, [manager.destroy])


Factory = Callable[[Env, int, str], Runner]

# (name, nodes, role, factory), in table order.
SYSTEMS: list[tuple[str, int, Role, Factory]] = [
    ("floor", 1, "floor", floor_runner),
    ("floor with tenure's scripts", 1, "floor", scripts_runner),
    ("tenure sync", 1, "tenure", tenure_runner),
    ("floor (asyncio)", 1, "floor", floor_async_runner),
    ("tenure asyncio", 1, "tenure", tenure_async_runner),
    ("redis-py Lock", 1, "peer", redis_py_lock_runner),
    ("python-redis-lock", 1, "peer", python_redis_lock_runner),
    ("floor", 5, "floor", floor_runner),
    ("floor, first majority", 5, "floor", majority_runner),
    ("tenure sync", 5, "tenure", tenure_runner),
    ("floor (asyncio)", 5, "floor", floor_async_runner),
    ("floor (asyncio), first majority", 5, "floor", majority_async_runner),
    ("tenure asyncio", 5, "tenure", tenure_async_runner),
    ("pottery Redlock", 5, "peer", pottery_runner),
    ("aioredlock", 5, "peer", aioredlock_runner),
]


def describe_failure(name: str, exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
    if name == "aioredlock":
        return f"n/a: aioredis 1.3.1 fails on Python {platform.python_version()}: {text}"
    return f"n/a: {text}"


def build(env: Env, name: str, nodes: int, role: Role, factory: Factory) -> Subject:
    """Create a system's runner; a peer that cannot even start becomes an 'n/a' row."""
    subject = Subject(name, nodes, role)
    try:
        subject.runner = factory(env, nodes, key_for(f"{name}-{nodes}"))
    except Exception as exc:
        if role != "peer":
            raise  # tenure and the floor must run; a crash here is a finding, not a row
        subject.note = describe_failure(name, exc)
    return subject


# --------------------------------------------------------------------------- method


def warm_up(subjects: Sequence[Subject], cycles: int) -> None:
    """Fill caches and connection pools; a peer failing every cycle is dropped as 'n/a'."""
    for s in subjects:
        if s.runner is None:
            continue
        scratch = Stats()
        try:
            s.runner.batch(cycles, scratch)
        except Exception as exc:
            scratch.fail(exc)
            scratch.failures = cycles
        if scratch.failures >= cycles and s.role == "peer":
            s.note = describe_failure(s.name, RuntimeError(scratch.first_error))
            close_quietly(s)
        elif scratch.failures:
            # Kept as a finding (for tenure, a bug) rather than aborting the whole run.
            s.note = f"{scratch.failures} of {cycles} warm-up cycles failed: {scratch.first_error}"


def measure(subjects: Sequence[Subject], rounds: int, iterations: int, chunk: int) -> None:
    """R rounds; in each, every system runs N cycles, in chunks that take turns.

    The machine may be shared (other processes come and go for seconds at a time), so
    systems alternate every ``chunk`` cycles rather than every N: a burst of noise then
    lands on all of them. The order rotates so that none always follows the same one.
    """
    live = [s for s in subjects if s.runner is not None]
    for r in range(rounds):
        for turn, start in enumerate(range(0, iterations, chunk)):
            n = min(chunk, iterations - start)
            shift = (r + turn) % len(live) if live else 0
            for s in live[shift:] + live[:shift]:
                assert s.runner is not None
                # Collect the previous system's garbage now, not inside this one's timing.
                gc.collect()
                before = s.stats.cycles
                s.runner.batch(n, s.stats)
                s.stats.turn_p50s.append(sorted(s.stats.latencies_ns[before:])[(n - 1) // 2])
        print(f"  round {r + 1}/{rounds} done", file=sys.stderr)


def close_quietly(subject: Subject) -> None:
    runner, subject.runner = subject.runner, None
    if runner is None:
        return
    try:
        runner.close()
    except Exception as exc:  # closing must not hide the results of a whole run
        print(f"  closing {subject.name}: {type(exc).__name__}: {exc}", file=sys.stderr)


# --------------------------------------------------------------------------- frozen node


@dataclass
class ChildReport:
    """What a peer did against the frozen cluster, as seen from the parent."""

    done: int = 0
    failed: int = 0
    latencies_ns: list[int] = field(default_factory=list)
    elapsed_ns: int = 0
    threads_before: int = 0
    threads_after: int = 0
    hung: bool = False
    error: str = ""


def _pottery_frozen(addresses: list[Address], cycles: int, budget: float, pipe: Any) -> None:
    from pottery import Redlock

    masters = redis_clients(addresses)
    lock = Redlock(key=key_for("pottery-frozen"), masters=set(masters), auto_release_time=TTL_S)

    def cycle() -> bool:
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    _child_loop(cycle, cycles, budget, pipe)


def _aioredlock_frozen(addresses: list[Address], cycles: int, budget: float, pipe: Any) -> None:
    from aioredlock import Aioredlock

    loop = asyncio.new_event_loop()
    manager = Aioredlock([{"host": h, "port": p} for h, p in addresses])

    def cycle() -> bool:
        async def once() -> None:
            lock = await manager.lock(key_for("aioredlock-frozen"), lock_timeout=TTL_S)
            await manager.unlock(lock)

        loop.run_until_complete(once())
        return True

    _child_loop(cycle, cycles, budget, pipe)


def _child_loop(cycle: SyncCycle, cycles: int, budget: float, pipe: Any) -> None:
    """Run up to ``cycles`` cycles or ``budget`` seconds, reporting progress after each
    cycle so that the parent knows how far a peer got if it has to kill it."""
    threads_before = threading.active_count()
    latencies: list[int] = []
    failed = 0
    error = ""
    stop_at = time.monotonic() + budget
    start = time.perf_counter_ns()
    while len(latencies) < cycles and time.monotonic() < stop_at:
        t0 = time.perf_counter_ns()
        try:
            failed += not cycle()
        except Exception as exc:
            failed += 1
            error = error or f"{type(exc).__name__}: {exc}"
        latencies.append(time.perf_counter_ns() - t0)
        # Outside the timed section; a few µs against the peers' milliseconds per cycle.
        pipe.send(("progress", len(latencies), failed))
    elapsed = time.perf_counter_ns() - start
    threads_after = threading.active_count()
    pipe.send(("done", latencies, elapsed, failed, threads_before, threads_after, error))


def frozen_child(
    peer: str, addresses: list[Address], cycles: int, budget: float, pipe: Any
) -> None:
    """Entry point of the child process."""
    try:
        runner = {"pottery Redlock": _pottery_frozen, "aioredlock": _aioredlock_frozen}[peer]
        runner(addresses, cycles, budget, pipe)
    except Exception as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        pipe.close()
        # Hung worker threads would block a normal exit (concurrent.futures joins them).
        os._exit(0)


def run_frozen_peer(peer: str, addresses: list[Address], cycles: int, budget: float) -> ChildReport:
    """Run a peer against the frozen cluster in a child; kill it by PID if it overruns."""
    ctx = multiprocessing.get_context("spawn")  # no inherited sockets, threads or loops
    parent_end, child_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=frozen_child, args=(peer, addresses, cycles, budget, child_end))
    proc.start()
    child_end.close()
    report = ChildReport()
    deadline = time.monotonic() + budget + KILL_GRACE_S
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not parent_end.poll(remaining):
                report.hung = True
                break
            try:
                message = parent_end.recv()
            except EOFError:
                report.error = report.error or f"child exited with {proc.exitcode}"
                break
            if not apply_message(report, message):
                break
    finally:
        if proc.is_alive():
            proc.kill()  # SIGKILL to this child's PID only
        proc.join()
        parent_end.close()
    return report


def apply_message(report: ChildReport, message: tuple[Any, ...]) -> bool:
    """Fold one message from the child into ``report``; False once it is the last one."""
    kind = message[0]
    if kind == "progress":
        report.done, report.failed = message[1], message[2]
        return True
    if kind == "done":
        _, report.latencies_ns, report.elapsed_ns, report.failed = message[:4]
        report.threads_before, report.threads_after, report.error = message[4:]
        report.done = len(report.latencies_ns)
    else:
        report.error = message[1]
    return False


def describe_child(report: ChildReport, cycles: int, budget: float) -> str:
    if report.hung:
        return (
            f"hangs: {report.done} of {cycles} cycles done in {budget + KILL_GRACE_S:.0f} s, killed"
        )
    parts = [f"fails {report.failed} of {report.done}"]
    if report.done < cycles:
        parts.append(f"only {report.done} of {cycles} cycles in the {budget:.0f} s budget")
    leaked = report.threads_after - report.threads_before
    if leaked:
        parts.append(f"leaves {leaked} threads running")
    if report.error:
        parts.append(report.error.splitlines()[0][:120])
    return "; ".join(parts)


def frozen_phase(
    env: Env, cluster: LocalCluster, tenure_subjects: Sequence[Subject], args: argparse.Namespace
) -> list[Subject]:
    """Freeze node 5, measure tenure on the 4 live nodes, then try the peers on it."""
    frozen = [Subject(s.name, s.nodes, s.role, s.runner, frozen=True) for s in tenure_subjects]
    cluster[4].pause()
    try:
        warm_up(frozen, args.warmup)
        measure(frozen, args.rounds, args.iterations, args.chunk)
        measure_cpu(frozen, args.cpu_cycles, args.cpu_runs)
        for peer in ("pottery Redlock", "aioredlock"):
            print(f"  {peer} against the frozen node ({args.budget:.0f} s budget)", file=sys.stderr)
            report = run_frozen_peer(peer, env.addresses(5), args.iterations, args.budget)
            subject = Subject(peer, 5, "peer", frozen=True)
            subject.stats = Stats(report.latencies_ns, report.elapsed_ns, report.failed)
            subject.note = describe_child(report, args.iterations, args.budget)
            frozen.append(subject)
    finally:
        cluster[4].resume()
    for s in frozen:
        s.runner = None  # the runners belong to the healthy subjects, closed with them
    return frozen


# --------------------------------------------------------------------------- report


def ratio_cell(ratio: float, target: float | None) -> str:
    if target is None:
        return f"{ratio:.2f}x"
    verdict = "ok" if ratio <= target else "MISSED"
    return f"{ratio:.2f}x (target <= {target:g}x: {verdict})"


def short(text: str, limit: int = 80) -> str:
    """A table cell's worth of a long message; the full text goes under the tables."""
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def row_name(s: Subject) -> str:
    name = f"{s.name}, {s.nodes} node{'s' if s.nodes > 1 else ''}"
    return f"{name}, 1 frozen" if s.frozen else name


def cpu_cell(s: Subject, base: Subject | None, target: float | None) -> str:
    if math.isnan(s.cpu_us) or base is None or base is s or math.isnan(base.cpu_us):
        return "-"
    return ratio_cell(s.cpu_us / base.cpu_us, target)


def healthy_rows(subjects: Sequence[Subject]) -> list[list[str]]:
    by_name = {(s.name, s.nodes): s for s in subjects if s.stats.cycles}
    rows = []
    for s in subjects:
        if not s.stats.cycles:
            rows.append([row_name(s), *["-"] * 9, s.note or "not run"])
            continue
        floor = by_name[("floor", s.nodes)].stats
        own = by_name.get((s.own_floor, s.nodes))
        is_async = s.name in ASYNC_SYSTEMS
        target = None
        if s.role == "tenure":
            target = TARGET_ASYNC_VS_FLOOR if is_async else TARGET_VS_FLOOR
        cpu_target = TARGET_CPU_VS_FLOOR if s.role == "tenure" else None
        own_ratio = "-"
        if own is not None and own is not s:
            own_ratio = ratio_cell(s.stats.paired_ratio(own.stats), target)
        notes = [short(s.note)] if s.note else []
        if own is not None and own is not s:
            notes.append(f"own floor: {s.own_floor}")
        if s.stats.failures:
            notes.append(short(s.stats.first_error))
        rows.append(
            [
                row_name(s),
                fmt(s.stats.percentile_us(0.5)),
                fmt(s.stats.percentile_us(0.99)),
                fmt(s.stats.ops_per_s()),
                "-" if math.isnan(s.cpu_us) else f"{s.cpu_us:.1f}",
                "-" if math.isnan(s.server_us) else f"{s.server_us:.1f}",
                f"{s.stats.paired_excess_us(floor):+.0f}",
                ratio_cell(s.stats.paired_ratio(floor), None),
                own_ratio,
                cpu_cell(s, own, cpu_target),
                str(s.stats.failures),
                "; ".join(notes),
            ]
        )
    return rows


def verdict_lines(subjects: Sequence[Subject]) -> list[str]:
    """The targets that compare two rows other than a row and its own floor."""
    by_name = {(s.name, s.nodes): s for s in subjects if s.stats.cycles}
    ours, peer = by_name.get(("tenure sync", 1)), by_name.get(("redis-py Lock", 1))
    if ours is None or peer is None:
        return []
    ratio = ours.stats.paired_ratio(peer.stats)
    ok = "ok" if ratio <= TARGET_VS_REDIS_PY else "MISSED"
    return [
        f"- tenure sync, 1 node, p50 against redis-py's Lock (paired): {ratio:.2f}x, "
        f"{abs(1 - ratio) * 100:.0f}% {'faster' if ratio <= 1 else 'slower'} (target: >= "
        f"{(1 - TARGET_VS_REDIS_PY) * 100:.0f}% faster, <= {TARGET_VS_REDIS_PY:g}x): {ok}"
    ]


def frozen_rows(frozen: Sequence[Subject], healthy: Sequence[Subject]) -> list[list[str]]:
    """Each system against its own healthy 5-node p50; tenure must also never fail."""
    by_name = {s.name: s for s in healthy if s.nodes == 5}
    rows = []
    for s in frozen:
        base = by_name.get(s.name)
        if not s.stats.cycles:
            rows.append([row_name(s), "-", "-", "-", "-", "-", "-", s.note])
            continue
        p50 = s.stats.percentile_us(0.5)
        is_tenure = s.role == "tenure"
        cpu = "-" if math.isnan(s.cpu_us) else f"{s.cpu_us:.1f}"
        ratio = "-"
        if base is not None and base.stats.cycles:
            target = TARGET_FROZEN_VS_HEALTHY if is_tenure else None
            ratio = ratio_cell(p50 / base.stats.percentile_us(0.5), target)
        failed = f"{s.stats.failures} of {s.stats.cycles}"
        if is_tenure:
            failed += f" (target 0: {'ok' if s.stats.failures == 0 else 'MISSED'})"
        notes = [short(s.note)] if s.note else []
        if s.stats.failures and s.stats.first_error:
            notes.append(short(s.stats.first_error))
        rows.append(
            [
                row_name(s),
                fmt(p50),
                fmt(s.stats.percentile_us(0.99)),
                fmt(s.stats.ops_per_s()),
                cpu,
                ratio,
                failed,
                "; ".join(notes),
            ]
        )
    return rows


def error_lines(subjects: Sequence[Subject]) -> list[str]:
    """The full text of each system's first error and note, which the cells cut short."""
    lines = []
    for s in subjects:
        for text in (s.note, s.stats.first_error):
            if text and len(text) > len(short(text)):
                lines.append(f"- {row_name(s)}: {text}")
    return lines


_COMMON = ["system", "p50 µs", "p99 µs", "ops/s", "CPU µs/cycle"]
HEALTHY_HEADER = [
    *_COMMON,
    "server CPU µs/cycle",
    "µs over floor",
    "p50 / floor",
    "p50 / own floor",
    "CPU / own floor",
    "failed",
    "notes",
]
FROZEN_HEADER = [*_COMMON, "p50 / own healthy p50", "failed", "notes"]
# Columns of numbers, aligned right; the rest (names, verdicts, notes) align left.
NUMERIC = frozenset([*_COMMON[1:], "server CPU µs/cycle", "µs over floor"])


def versions() -> dict[str, str]:
    found = {}
    for dist in (
        "tenure",
        "redis",
        "hiredis",
        "pottery",
        "aioredlock",
        "aioredis",
        "python-redis-lock",
    ):
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = "not installed"
    return found


def context_lines(args: argparse.Namespace, redis_version: str, load_before: float) -> list[str]:
    libs = ", ".join(f"{k} {v}" for k, v in versions().items())
    # Other processes competing for the CPUs stretch every wait for a reply, which
    # inflates all latencies and squeezes the ratios towards 1; record how busy it was.
    load = f"load average {load_before:.2f} before the run, {os.getloadavg()[0]:.2f} after"
    return [
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, {platform.machine()}; {load}",
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"{redis_version} (5 local nodes over TCP loopback, persistence none)",
        f"- libraries: {libs}",
        f"- method: {args.warmup} warm-up cycles, then {args.rounds} rounds of "
        f"{args.iterations} cycles per system (in turns of {args.chunk}, order rotating); "
        f"frozen-node peers in a child process with a {args.budget:.0f} s budget",
        f"- client CPU: time.process_time() over {args.cpu_cycles} untimed cycles per "
        f"system, best of {args.cpu_runs} runs taken in turns (this process, every thread; "
        "the servers are other processes)",
        "- server CPU: the five nodes' CPU time over the same runs (Linux "
        "/proc/<pid>/task/*/schedstat, every thread), per cycle, best of the runs; the "
        "scripts' and commands' work, and the nodes' own background work (their timers: "
        "about 1.5 ms of CPU a second per idle node on the machine of the README's runs, "
        "2-5 µs per cycle)",
    ]


@dataclass
class Report:
    healthy: list[list[str]]
    verdicts: list[str]
    frozen: list[list[str]]
    errors: list[str]
    context: list[str]


def render(report: Report, markdown: bool) -> str:
    table = partial(_table, numeric=NUMERIC.__contains__, markdown=markdown)
    heading = "## " if markdown else ""
    parts = [
        f"{heading}Uncontended acquire + release, healthy nodes",
        table(HEALTHY_HEADER, report.healthy),
        "\n".join(report.verdicts),
        f"{heading}Node 5 of 5 frozen (SIGSTOP)",
        table(FROZEN_HEADER, report.frozen),
    ]
    if report.errors:
        parts += [f"{heading}Errors and notes in full", "\n".join(report.errors)]
    parts += [f"{heading}Setup", "\n".join(report.context)]
    return "\n\n".join(parts)


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", "-n", type=int, default=2000, help="cycles per round")
    parser.add_argument("--rounds", "-r", type=int, default=5, help="rounds per system")
    parser.add_argument(
        "--chunk", type=int, default=250, help="cycles a system runs before the next takes over"
    )
    parser.add_argument("--warmup", type=int, default=200, help="warm-up cycles per system")
    parser.add_argument("--budget", type=float, default=10.0, help="seconds per frozen peer")
    parser.add_argument("--cpu-cycles", type=int, default=3000, help="cycles per client-CPU run")
    parser.add_argument("--cpu-runs", type=int, default=3, help="client-CPU runs (the best counts)")
    parser.add_argument(
        "--quick", action="store_true", help="N=300, R=2, CPU 2 x 500 (a smoke run)"
    )
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help=f"where to write the Markdown results (default: {RESULTS}, full runs only)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.iterations, args.rounds = 300, 2
        args.cpu_cycles, args.cpu_runs = 500, 2
    if args.output is None and not args.quick:
        args.output = RESULTS
    return args


def run(args: argparse.Namespace) -> str:
    load_before = os.getloadavg()[0]
    source = COMPARE_AND_DELETE
    loop = asyncio.new_event_loop()
    subjects: list[Subject] = []
    with LocalCluster(5, persistence=Persistence.NONE) as cluster:
        initialise(cluster.urls)
        try:
            with cluster[0].client() as c:
                sha = str(c.script_load(source))
            for node in cluster.nodes[1:]:
                with node.client() as c:
                    c.script_load(source)
            env = Env(cluster.nodes, loop, source, sha)
            subjects = [build(env, *system) for system in SYSTEMS]
            print(f"warming up ({args.warmup} cycles each)", file=sys.stderr)
            warm_up(subjects, args.warmup)
            print(f"measuring: {args.rounds} rounds x {args.iterations} cycles", file=sys.stderr)
            measure(subjects, args.rounds, args.iterations, args.chunk)
            print(f"client CPU: {args.cpu_runs} x {args.cpu_cycles} cycles", file=sys.stderr)
            pids = [node.pid for node in cluster.nodes]
            servers = [pid for pid in pids if pid is not None]
            measure_cpu(subjects, args.cpu_cycles, args.cpu_runs, servers)
            print("freezing node 5", file=sys.stderr)
            tenure5 = [s for s in subjects if s.role == "tenure" and s.nodes == 5]
            frozen = frozen_phase(env, cluster, tenure5, args)
            context = context_lines(args, server_version(cluster[0]), load_before)
        finally:
            for s in subjects:
                close_quietly(s)
            loop.close()
    report = Report(
        healthy_rows(subjects),
        verdict_lines(subjects),
        frozen_rows(frozen, subjects),
        error_lines([*subjects, *frozen]),
        context,
    )
    if args.output is not None:
        write_results(
            args.output,
            "bench_lock",
            "acquire + release, side by side",
            render(report, markdown=True),
        )
        print(f"wrote {args.output}", file=sys.stderr)
    return render(report, args.markdown)


def main(argv: Sequence[str] | None = None) -> None:
    print(run(parse_args(argv)))


if __name__ == "__main__":
    main()
