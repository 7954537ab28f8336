"""Competing processes: mutual exclusion, and a crashed holder that blocks no one for long.

Workers are separate processes on one machine, so ``time.monotonic_ns()`` readings are
comparable across them: each critical section is recorded as [enter, exit] and the
intervals of all workers must never overlap. The shared counter is incremented with an
unsafe GET-then-SET on a node outside the lock's quorum, so any overlap would also show
up as a lost update.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest
import redis

import tenure
from tenure.testing import LocalCluster

from .conftest import Api

WORKERS = 8
CYCLES = 250  # per worker: 2,000 critical sections per API
TTL = 2.0

# forkserver: fork() from a possibly multi-threaded pytest process is unsafe (and warns on 3.12+).
_ctx = multiprocessing.get_context("forkserver")


@pytest.fixture(scope="module")
def counter_node() -> Iterator[LocalCluster]:
    with LocalCluster(1) as node:
        yield node


def _critical_section(store: redis.Redis) -> tuple[int, int]:
    enter = time.monotonic_ns()
    value = int(store.get("counter") or 0)
    store.set("counter", value + 1)
    return enter, time.monotonic_ns()


def _worker(flavour: str, urls: list[str], store_url: str, key: str, out: Connection) -> None:
    intervals = []
    with Api(flavour) as api, redis.Redis.from_url(store_url) as store:
        # Eight processes and five servers share the machine's cores with the rest of the
        # suite: a server may stall for longer than the default 50 ms node timeout, and a
        # release it leaves unconfirmed is rightly reported (LeaseLost). This test is about
        # exclusion, so give slow servers time to answer.
        client = api.client(urls, node_timeout=0.5)
        for _ in range(CYCLES):
            with client.lock(key, ttl=TTL) as lease:
                interval = _critical_section(store)  # blocking on purpose (asyncio too): tiny
                assert lease.remaining > 0, "critical section outlived its lease"
            intervals.append(interval)
    out.send(intervals)


def max_overlap(intervals: list[tuple[int, int]]) -> int:
    """The largest number of intervals open at one instant (sweep over sorted events)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    open_now = most = 0
    for _, step in events:
        open_now += step
        most = max(most, open_now)
    return most


def test_max_overlap_detects_overlap() -> None:
    assert max_overlap([(0, 10), (10, 20), (30, 40)]) == 1
    assert max_overlap([(0, 10), (5, 20), (6, 7)]) == 3


def test_mutual_exclusion_across_processes(
    api: Api, shared5: LocalCluster, counter_node: LocalCluster, key: str
) -> None:
    store_url = counter_node.urls[0]
    with redis.Redis.from_url(store_url) as store:
        store.delete("counter")
    pipes, procs = [], []
    for _ in range(WORKERS):
        parent_end, child_end = _ctx.Pipe(duplex=False)
        proc = _ctx.Process(
            target=_worker, args=(api.flavour, shared5.urls, store_url, key, child_end)
        )
        proc.start()
        pipes.append(parent_end)
        procs.append(proc)
    intervals: list[tuple[int, int]] = []
    per_worker = []
    try:
        for pipe in pipes:
            assert pipe.poll(120), "a worker made no progress"
            got = pipe.recv()
            per_worker.append(len(got))
            intervals.extend(got)
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    assert all(p.exitcode == 0 for p in procs)
    assert per_worker == [CYCLES] * WORKERS
    assert max_overlap(intervals) == 1
    with redis.Redis.from_url(store_url) as store:
        assert int(store.get("counter") or 0) == WORKERS * CYCLES  # no lost update


# The crashed holder's TTL, and how late after it someone may take over: the retry's
# back-off, and a loaded machine's late wake-ups (0.5 s was too little beside a CPU hog).
# A holder that blocked others for a TTL more would still be caught.
HOLDER_TTL = 2.0
TAKE_OVER = 1.0


def _holder(urls: list[str], key: str, out: Connection) -> None:
    client = tenure.Client(urls)
    lease = client.acquire(key, ttl=HOLDER_TTL)
    out.send((lease.acquired_at, lease.valid_until))
    time.sleep(60)  # holds until SIGKILLed


@pytest.mark.parametrize("n", [1, 5])
def test_crashed_holder_blocks_no_one_beyond_its_ttl(
    shared5: LocalCluster, key: str, n: int
) -> None:
    urls = shared5.urls[:n]
    parent_end, child_end = _ctx.Pipe(duplex=False)
    proc = _ctx.Process(target=_holder, args=(urls, key, child_end))
    proc.start()
    try:
        assert parent_end.poll(10)
        acquired_at, valid_until = parent_end.recv()
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
    finally:
        proc.join(5)
    with tenure.Client(urls) as client:
        lease = client.acquire(key, ttl=1.0, timeout=HOLDER_TTL + 5.0)
        got_it = time.monotonic()
        # Nobody takes over early: not before the dead holder's validity ended...
        assert lease.acquired_at >= valid_until
        # ...and someone does within its TTL plus the retry back-off.
        assert got_it - acquired_at <= HOLDER_TTL + TAKE_OVER
        assert got_it - killed_at <= HOLDER_TTL + TAKE_OVER
        lease.release()


def _use_inherited_client(client: tenure.Client, key: str, out: Connection) -> None:
    # The parent's connections were forgotten at fork: this opens the child's own.
    lease = client.acquire(key, ttl=TTL)
    lease.release()
    out.send(lease.token)


def test_a_client_survives_fork(shared5: LocalCluster, key: str) -> None:
    client = tenure.Client(shared5.urls)
    client.acquire(key, ttl=TTL).release()  # the parent has pooled connections now
    parent_end, child_end = multiprocessing.Pipe(duplex=False)
    proc = multiprocessing.get_context("fork").Process(
        target=_use_inherited_client, args=(client, key, child_end)
    )
    proc.start()
    assert parent_end.poll(10)
    token = parent_end.recv()
    proc.join(5)
    assert proc.exitcode == 0
    assert len(token) == 32
    # The parent's own connections were not disturbed by the child.
    client.acquire(key, ttl=TTL).release()
    client.close()


def _acquire_at_once(urls: list[str], name: str) -> None:
    with tenure.Client(urls) as client:
        client.acquire(name, ttl=1.0, blocking=False)


def test_a_worker_s_lock_timeout_reaches_its_process_pool(shared5: LocalCluster, key: str) -> None:
    """A pool's worker sends its error back by pickle: a tenure error could not be made
    again, and the pool broke (``BrokenProcessPool``) instead of raising it."""
    context = multiprocessing.get_context("spawn")  # no fork of this process's threads
    with (
        tenure.Client(shared5.urls) as client,
        client.acquire(key, ttl=30.0),
        concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool,
    ):
        future = pool.submit(_acquire_at_once, shared5.urls, key)
        with pytest.raises(tenure.LockTimeout, match="held by another client"):
            future.result(timeout=60)
        assert pool.submit(os.getpid).result(timeout=60) > 0  # the pool goes on
