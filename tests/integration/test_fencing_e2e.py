"""Fencing end to end: a paused holder's late writes are refused by every store, and
tokens strictly increase across competing processes, skewed counters and data loss."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, create_engine, select

import tenure
from tenure._core.config import NODE_FLOOR
from tenure.fencing import FencedStore, FencingGate
from tenure.fencing.sql import fenced_execute
from tenure.testing import LocalCluster
from tenure.testing._postgres import EmbeddedPostgres

TTL = 1.0
_ctx = multiprocessing.get_context("forkserver")

metadata = MetaData()
accounts = Table(
    "e2e_accounts",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("owner", String(50)),
    Column("fence_token", BigInteger, nullable=True),
)


@pytest.fixture(scope="module")
def postgres() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres() as server:
        yield server


@pytest.fixture(scope="module")
def store_node() -> Iterator[LocalCluster]:
    """A Redis that is not a lock node, for the fenced store."""
    with LocalCluster(1) as node:
        yield node


def _sql_urls(tmp: str, postgres: EmbeddedPostgres) -> dict[str, str]:
    return {"sqlite": f"sqlite:///{tmp}/e2e.db", "postgresql": postgres.url}


def _write_everywhere(
    token: int, who: str, store_url: str, sql_urls: dict[str, str]
) -> dict[str, str]:
    """Write ``who`` with ``token`` to the Redis store and each database; what each said."""
    outcome = {}
    with redis.Redis.from_url(store_url) as r:
        try:
            FencedStore(r).write("account-1", token, who)
            outcome["redis"] = "accepted"
        except tenure.StaleToken:
            outcome["redis"] = "stale"
    for name, url in sql_urls.items():
        engine = create_engine(url)
        try:
            with engine.begin() as conn:
                fenced_execute(conn, accounts, token, accounts.c.id == 1, values={"owner": who})
            outcome[name] = "accepted"
        except tenure.StaleToken:
            outcome[name] = "stale"
        finally:
            engine.dispose()
    return outcome


def _paused_holder(
    lock_urls: list[str], store_url: str, sql_urls: dict[str, str], key: str, ctl: Connection
) -> None:
    with tenure.Client(lock_urls) as client:
        lease = client.acquire(key, ttl=TTL)
        ctl.send(lease.fencing_token)
        ctl.recv()  # the test SIGSTOPs us here, past the TTL, then says "go"
        ctl.send(_write_everywhere(lease.fencing_token, "A (stale)", store_url, sql_urls))


def test_a_paused_holder_is_refused_by_every_store(
    shared5: LocalCluster,
    store_node: LocalCluster,
    postgres: EmbeddedPostgres,
    tmp_path: Any,
    key: str,
) -> None:
    sql_urls = _sql_urls(str(tmp_path), postgres)
    for url in sql_urls.values():
        engine = create_engine(url)
        metadata.drop_all(engine)
        metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(accounts.insert().values(id=1, owner="nobody", fence_token=None))
        engine.dispose()
    store_url = store_node.urls[0]
    ours, theirs = _ctx.Pipe()
    holder = _ctx.Process(
        target=_paused_holder, args=(shared5.urls, store_url, sql_urls, key, theirs)
    )
    holder.start()
    try:
        assert ours.poll(20)
        token_a = ours.recv()
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGSTOP)  # a GC pause, a frozen VM...
        # B takes the lock once A's lease has run out, and writes everywhere.
        with tenure.Client(shared5.urls) as client:
            lease_b = client.acquire(key, ttl=TTL, timeout=5.0)
            assert lease_b.fencing_token > token_a
            assert _write_everywhere(lease_b.fencing_token, "B", store_url, sql_urls) == {
                "redis": "accepted",
                "sqlite": "accepted",
                "postgresql": "accepted",
            }
            http_log = _http_gate_scenario(token_a, lease_b.fencing_token)
            lease_b.release()
        os.kill(holder.pid, signal.SIGCONT)
        ours.send("go")
        assert ours.poll(20)
        assert ours.recv() == {"redis": "stale", "sqlite": "stale", "postgresql": "stale"}
    finally:
        holder.join(10)
        if holder.is_alive():
            holder.kill()
    # The newer value survived everywhere.
    with redis.Redis.from_url(store_url) as r:
        assert FencedStore(r).read("account-1") == (b"B", lease_b.fencing_token)
    for url in sql_urls.values():
        engine = create_engine(url)
        with engine.connect() as conn:
            row = conn.execute(select(accounts.c.owner, accounts.c.fence_token)).one()
        engine.dispose()
        assert tuple(row) == ("B", lease_b.fencing_token)
    assert http_log == [("B", 200), ("A (stale)", 409)]


def _http_gate_scenario(token_a: int, token_b: int) -> list[tuple[str, int]]:
    """B writes through the gate, then A's late write with its old token; the statuses."""
    written: list[str] = []

    async def store(scope: Any, receive: Any, send: Any) -> None:
        # A store that cannot check tokens: it applies whatever reaches it.
        body = (await receive())["body"].decode()
        written.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def run() -> list[tuple[str, int]]:
        gate = FencingGate(store)
        transport = httpx.ASGITransport(app=gate)
        log = []
        async with httpx.AsyncClient(transport=transport, base_url="http://gate") as http:
            for who, token in (("B", token_b), ("A (stale)", token_a)):
                reply = await http.put(
                    "/accounts/1", content=who, headers={"Fencing-Token": str(token)}
                )
                log.append((who, reply.status_code))
        assert written == ["B"]  # the stale write never reached the store
        return log

    return asyncio.run(run())


def _competitor(urls: list[str], key: str, cycles: int, out: Connection) -> None:
    grants = []
    with tenure.Client(urls, max_ttl=2.0) as client:
        for _ in range(cycles):
            # The TTL bounds how long a process may be descheduled inside its critical
            # section (six of them beside the suite on 2 cores) before another's overlaps
            # it, and the grant order read below is no longer the sections' order: 2 s.
            with client.lock(key, ttl=2.0) as lease:
                grants.append((time.monotonic_ns(), lease.fencing_token))
    out.send(grants)


def test_tokens_strictly_increase_with_skewed_floors_and_a_restart(
    cluster5: LocalCluster, key: str
) -> None:
    # Skew: two nodes far ahead of the wall clock, one behind, two never used (blank).
    ahead = time.time_ns() // 1000 + 10**9
    for node, value in zip(cluster5.nodes[:3], (ahead, ahead + 5, 17), strict=True):
        with node.client() as c:
            c.set(NODE_FLOOR, value)
    workers, cycles = 6, 250
    pipes, procs = [], []
    for _ in range(workers):
        ours, theirs = _ctx.Pipe(duplex=False)
        proc = _ctx.Process(target=_competitor, args=(cluster5.urls, key, cycles, theirs))
        proc.start()
        pipes.append(ours)
        procs.append(proc)
    time.sleep(1.0)
    cluster5[4].restart(keep_data=False)  # a node loses its data mid-run
    grants: list[tuple[int, int]] = []
    try:
        for pipe in pipes:
            assert pipe.poll(120)
            grants.extend(pipe.recv())
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    assert len(grants) == workers * cycles
    tokens = [token for _, token in sorted(grants)]
    # Critical sections do not overlap, so grant order is their order: strictly increasing.
    assert all(a < b for a, b in itertools.pairwise(tokens))
    assert tokens[0] > ahead + 5  # above every counter a majority could have held
