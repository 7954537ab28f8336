"""The common case takes the scripts' short way: what a free lock costs the server.

Every ``redis.call`` inside a script costs the node about a microsecond on Valkey 9 (a
third of that on Redis 6.2), on the critical path of every acquisition. An acquire of a
lock that is free and that nobody waits for, and its release, take the short ways of
``acquire.lua`` and ``release.lua``: nine calls in all, counted here by the node itself
(``INFO commandstats``), not timed. The long ways, which decide the same things one key
at a time, take twice as many; a change that sends the common case down them fails here.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tenure.testing import LocalCluster, LocalNode

from .conftest import Api, commands_run

CYCLES = 20

# acquire.lua: MGET (floor, history, warm-up), INFO, EXISTS (lock, queue, reservation),
# SET (the lock), SET (the floor), PEXPIRE (the history). release.lua: GET, DEL, EXISTS
# (queue, reservation).
SHORT_WAY = {"mget": 1, "info": 1, "exists": 2, "set": 2, "pexpire": 1, "get": 1, "del": 1}


@pytest.fixture(scope="module")
def node() -> Iterator[LocalNode]:
    with LocalCluster(1) as cluster:
        yield cluster.nodes[0]


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "not-fair"])
def test_a_free_lock_nobody_waits_for_costs_nine_calls_per_cycle(
    api: Api, node: LocalNode, fair: bool
) -> None:
    client = api.client([node.url])
    name = f"calls-{uuid.uuid4().hex}"
    client.acquire(name, ttl=5.0, fair=fair).release()  # the node is seeded, scripts cached
    with node.client() as c:
        c.config_resetstat()
    for _ in range(CYCLES):
        client.acquire(name, ttl=5.0, blocking=False, fair=fair).release()
    calls = commands_run(node)
    scripts = calls.pop("evalsha", 0) + calls.pop("eval", 0)
    assert scripts == 2 * CYCLES, calls
    assert calls == {k: v * CYCLES for k, v in SHORT_WAY.items()}
