"""The lock's behaviour against real redis-server processes, for both APIs."""

from __future__ import annotations

import asyncio
import copy
import multiprocessing
import pickle
import time
from typing import Any

import pytest

import tenure
from tenure.testing import LocalCluster

from .conftest import Api, holders, released_everywhere

# The asyncio half again on uvloop (uvicorn's default loop): tests/integration/conftest.py.
ALSO_ON_UVLOOP = True

TTL = 2.0


@pytest.mark.parametrize("n", [1, 5])
def test_acquire_release_cycle(api: Api, shared5: LocalCluster, key: str, n: int) -> None:
    client = api.client(shared5.urls[:n])
    lock = client.lock(key, ttl=TTL)
    assert lock.acquire() is True
    lease = lock.lease
    assert lease.valid
    assert 0 < lease.remaining <= TTL
    assert len(lease.nodes) >= n // 2 + 1
    assert lock.locked() is True
    # Only the holder's token is on the nodes, under the documented key.
    values = holders(shared5, lease.key)[:n]
    assert values.count(lease.token.encode()) >= n // 2 + 1
    lock.release()
    assert lock.locked() is False
    released_everywhere(shared5, lease.key)


def test_second_client_is_refused_while_held(api: Api, shared5: LocalCluster, key: str) -> None:
    a, b = api.client(shared5.urls), api.client(shared5.urls)
    with a.lock(key, ttl=TTL) as lease:
        assert lease.valid
        assert b.lock(key, ttl=TTL).acquire(blocking=False) is False
        started = time.monotonic()
        assert b.lock(key, ttl=TTL).acquire(timeout=0.2) is False
        assert 0.2 <= time.monotonic() - started < 2.0  # gave up at its timeout, not later
        with pytest.raises(tenure.LockTimeout), b.lock(key, ttl=TTL, blocking=False):
            pass
    # Released: the other client gets it at once.
    b.acquire(key, ttl=TTL, blocking=False).release()


def test_blocking_acquire_waits_for_release_by_expiry(
    api: Api, shared5: LocalCluster, key: str
) -> None:
    a, b = api.client(shared5.urls), api.client(shared5.urls)
    first = a.acquire(key, ttl=0.3)
    second = b.acquire(key, ttl=TTL, timeout=3.0)
    # No early takeover: the second lease began after the first one's validity ended.
    assert second.acquired_at >= first.valid_until
    with pytest.raises(tenure.LeaseLost):
        first.release()  # it had expired: the caller must learn it
    second.release()


def test_failed_quorum_leaves_no_key_of_ours(api: Api, shared5: LocalCluster, key: str) -> None:
    client = api.client(shared5.urls)
    name = f"tenure:{{{key}}}:lock"  # the documented key of lock `key`
    # A stranger holds three of five nodes; we can win at most two.
    for node in shared5.nodes[:3]:
        with node.client() as c:
            c.set(name, b"stranger", px=10_000)
    with pytest.raises(tenure.LockTimeout):
        client.acquire(key, ttl=TTL, blocking=False)
    # Right after: our two grants were released, the stranger's keys untouched.
    assert holders(shared5, name) == [b"stranger"] * 3 + [None, None]
    for node in shared5.nodes[:3]:
        with node.client() as c:
            c.delete(name)


def test_tokens_are_unique_and_random(api: Api, shared5: LocalCluster, key: str) -> None:
    client = api.client(shared5.urls[:1])
    tokens = []
    for _ in range(300):
        lease = client.acquire(key, ttl=TTL)
        tokens.append(lease.token)
        lease.release()
    assert len(set(tokens)) == len(tokens)
    assert all(len(t) == 32 and int(t, 16) >= 0 for t in tokens)  # 128 bits, hex


def test_extend_moves_validity_and_ttl(api: Api, shared5: LocalCluster, key: str) -> None:
    client = api.client(shared5.urls)
    lease = client.acquire(key, ttl=1.0)
    before = lease.valid_until
    lease.extend(5.0)
    assert lease.valid_until > before + 3.5
    with shared5[0].client() as c:
        assert 4000 < c.pttl(lease.key) <= 5000
    lease.release()


@pytest.mark.parametrize(
    "ttl",
    [0, -1, -1e308, float("nan"), float("inf"), True, "5", 0.05, 61, 1e308, 2**1100],
    ids=repr,
)
def test_a_refused_extend_names_ttl_and_leaves_the_lease_as_it_was(
    api: Api, shared5: LocalCluster, key: str, ttl: Any
) -> None:
    # 1e308 s is a finite float, but infinite once counted in milliseconds: it escaped
    # as a bare OverflowError instead of the error naming ``ttl`` and its range.
    client = api.client(shared5.urls[:3])
    lease = client.acquire(key, ttl=TTL)
    before = (lease.valid_until, lease.ttl)
    with pytest.raises(tenure.ConfigurationError) as info:
        lease.extend(ttl)
    assert info.value.parameter == "ttl"
    assert (lease.valid_until, lease.ttl) == before
    assert lease.valid
    assert lease.lost_error is None
    with pytest.raises(tenure.ConfigurationError) as info:
        client.acquire(key, ttl=ttl, blocking=False)
    assert info.value.parameter == "ttl"
    lease.release()


def test_extend_never_resurrects(api: Api, shared5: LocalCluster, key: str) -> None:
    client = api.client(shared5.urls)
    lease = client.acquire(key, ttl=5.0)
    # The key vanishes from a majority (as if expired there) while our clock says valid.
    for node in shared5.nodes[:3]:
        with node.client() as c:
            c.delete(lease.key)
    with pytest.raises(tenure.LeaseLost):
        lease.extend()
    assert not lease.valid
    released_everywhere(shared5, lease.key)  # not re-created; the rest released


def test_extend_after_validity_is_refused(api: Api, shared5: LocalCluster, key: str) -> None:
    client = api.client(shared5.urls)
    lease = client.acquire(key, ttl=0.2)
    while lease.remaining > 0:
        time.sleep(0.02)
    with pytest.raises(tenure.LeaseExpired):
        lease.extend()
    with shared5[0].client() as c:
        deadline = time.monotonic() + 2
        while c.exists(lease.key) and time.monotonic() < deadline:
            time.sleep(0.01)
    released_everywhere(shared5, lease.key)


def test_a_strangers_token_is_never_released(api: Api, shared5: LocalCluster, key: str) -> None:
    client = api.client(shared5.urls)
    lease = client.acquire(key, ttl=TTL)
    # Our lease expired and a stranger took the lock on every node.
    for node in shared5:
        with node.client() as c:
            c.set(lease.key, b"stranger", px=10_000)
    with pytest.raises(tenure.LeaseLost) as info:
        lease.release()
    assert "expired during the critical section" in str(info.value)
    assert holders(shared5, lease.key) == [b"stranger"] * 5
    for node in shared5:
        with node.client() as c:
            c.delete(lease.key)


def test_a_lease_tenure_released_for_its_loss_tells_its_holder_of_the_loss(
    api: Api, shared5: LocalCluster, key: str
) -> None:
    # Every node lost the key: the extension finds a majority "not ours", marks the lease
    # lost and releases it at once (nothing keeps others out). The holder's own release
    # and extend then hear of the loss, not that it released the lease already.
    client = api.client(shared5.urls)
    lease = client.acquire(key, ttl=TTL)
    for node in shared5:
        with node.client() as c:
            c.delete(lease.key)
    with pytest.raises(tenure.LeaseLost) as found:
        lease.extend()
    assert lease.released
    for again in (lease.release, lease.extend, lease.release):
        with pytest.raises(tenure.LeaseLost) as info:
            again()
        assert info.value is found.value
    released_everywhere(shared5, lease.key)


def test_release_errors(api: Api, shared5: LocalCluster, key: str) -> None:
    client = api.client(shared5.urls)
    lock = client.lock(key, ttl=TTL)
    with pytest.raises(tenure.NotHeld):
        lock.release()
    lease = client.acquire(key, ttl=TTL)
    lease.release()
    with pytest.raises(tenure.NotHeld, match="already released"):
        lease.release()
    with pytest.raises(tenure.NotHeld):
        lease.extend()
    # check() said seconds were left: the lease protects nothing once released.
    assert not lease.valid
    with pytest.raises(tenure.NotHeld, match="released"):
        lease.check()


def test_leases_of_different_locks_coexist(api: Api, shared5: LocalCluster, key: str) -> None:
    client = api.client(shared5.urls)
    a = client.acquire(key + "-a", ttl=TTL)
    b = client.acquire(key + "-b", ttl=TTL)
    assert a.token != b.token
    b.release()
    a.release()


def test_scripts_reloaded_after_script_flush(api: Api, shared5: LocalCluster, key: str) -> None:
    client = api.client(shared5.urls)
    client.acquire(key, ttl=TTL).release()  # scripts cached
    for node in shared5:
        with node.client() as c:
            c.script_flush()
    lease = client.acquire(key, ttl=TTL)
    lease.extend()  # by EVAL, and the acquire's EVALSHA fell back to EVAL: no round failed
    lease.release()
    # A node whose NOSCRIPT to the release came after the majority's answers is sent the
    # EVAL form when that is read: by the asyncio client as it comes, by the blocking
    # client at the link's next use (here: cycles on another name).
    deadline = time.monotonic() + 10.0
    while holders(shared5, lease.key) != [None] * 5:
        assert time.monotonic() < deadline, holders(shared5, lease.key)
        client.acquire(f"{key}-next", ttl=TTL).release()


@pytest.mark.parametrize(
    ("option", "value", "parameter"),
    [
        ("ttl", 0, "ttl"),
        ("ttl", -1, "ttl"),
        ("ttl", 0.05, "ttl"),  # too small for the 50 ms node timeout
        ("timeout", -2, "timeout"),
    ],
)
def test_bad_arguments_name_the_parameter(
    api: Api, shared5: LocalCluster, key: str, option: str, value: Any, parameter: str
) -> None:
    client = api.client(shared5.urls)
    kwargs: dict[str, Any] = {"ttl": TTL, option: value}
    with pytest.raises(tenure.ConfigurationError) as info:
        client.acquire(key, **kwargs)
    assert info.value.parameter == parameter
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("nodes", "parameter"),
    [
        ([], "nodes"),
        (["redis://127.0.0.1:1", "redis://127.0.0.1:2"], "nodes"),
        (["http://127.0.0.1:6379"], "nodes[0]"),
        (["redis://127.0.0.1:99999"], "nodes[0]"),
        (["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:1"], "nodes[2]"),
    ],
)
def test_bad_node_lists(api: Api, nodes: list[str], parameter: str) -> None:
    with pytest.raises(tenure.ConfigurationError) as info:
        api.client(nodes)
    assert info.value.parameter == parameter


def test_unix_socket_nodes(api: Api, key: str) -> None:
    with LocalCluster(3, unix=True) as cluster:
        client = api.client(cluster.urls)
        with client.lock(key, ttl=TTL) as lease:
            assert len(lease.nodes) >= 2
        # The first round connects; the release to a node still connecting is queued and
        # written once it is up. Closing the client waits for it (the loop must run). A
        # node outside the release's first majority may run it a moment after: waited for.
        api.close_clients()
        released_everywhere(cluster, lease.key)


@pytest.mark.parametrize("denied", ["-set", "-@scripting"])
def test_acl_refusal_is_a_clear_error(
    api: Api, cluster5: LocalCluster, key: str, denied: str
) -> None:
    node = cluster5[0]
    with node.client() as c:
        c.execute_command("ACL", "SETUSER", "nolocks", "on", ">pw", "~*", "+@all", denied)
    client = api.client([f"redis://nolocks:pw@127.0.0.1:{node.port}"])
    with pytest.raises(tenure.ServerUnsupported) as info:
        client.acquire(key, ttl=TTL, timeout=2.0)
    assert "can't run this command" in str(info.value) or "no permissions" in str(info.value)


def test_all_nodes_unreachable(api: Api, key: str) -> None:
    with LocalCluster(3) as cluster:
        urls = cluster.urls
    client = api.client(urls)  # every node is gone: connection refused
    started = time.monotonic()
    with pytest.raises(tenure.QuorumUnreachable) as info:
        client.acquire(key, ttl=TTL)
    assert time.monotonic() - started < 2.0  # at once, not after retries
    assert len(info.value.node_errors) >= 2  # decided as soon as a majority failed


def test_a_copy_of_a_lease_or_a_lock_is_itself_and_neither_pickles(
    shared5: LocalCluster, key: str
) -> None:
    """A copy of a lease was a second object of it, with a "released" of its own:
    released through both, the second release told a valid lease lost."""

    def check(lock: Any, lease: Any) -> None:
        for thing in (lock, lease):
            assert copy.copy(thing) is thing
            assert copy.deepcopy({"held": thing})["held"] is thing
            with pytest.raises(TypeError, match="cannot be pickled"):
                pickle.dumps(thing)

    with tenure.Client(shared5.urls) as client:
        lock = client.lock(key, ttl=5.0)
        lock.acquire()
        lease = lock.lease
        assert lease is not None
        check(lock, lease)
        copy.copy(lease).release()
        with pytest.raises(tenure.NotHeld):
            lease.release()

    async def main() -> None:
        async with tenure.AsyncClient(shared5.urls) as client:
            lock = client.lock(key + "-async", ttl=5.0)
            await lock.acquire()
            lease = lock.lease
            assert lease is not None
            check(lock, lease)
            await copy.copy(lease).release()

    asyncio.run(main())


def test_a_copy_of_a_client_is_itself_and_pickling_one_says_what_to_do(
    shared5: LocalCluster, key: str
) -> None:
    """A client handed to a spawned process (or a process pool's task) failed with
    "cannot pickle '_thread.lock' object", naming neither the client nor the fix; and a
    copy was a second object sharing the first one's connections, so closing the copy
    closed the original."""
    clients: list[tenure.Client | tenure.AsyncClient] = [
        tenure.Client(shared5.urls),
        tenure.AsyncClient(shared5.urls),
    ]
    for client in clients:
        kind = type(client).__name__
        assert copy.copy(client) is client
        assert copy.deepcopy({"client": client})["client"] is client
        with pytest.raises(TypeError, match=f"a {kind} belongs to the process.*make a {kind}"):
            pickle.dumps(client)
        # What a user meets: the spawned child's arguments are pickled by start().
        child = multiprocessing.get_context("spawn").Process(target=print, args=(client,))
        with pytest.raises(TypeError, match=f"a {kind} belongs to the process"):
            child.start()
    sync, asyncio_client = clients
    assert isinstance(sync, tenure.Client)
    assert isinstance(asyncio_client, tenure.AsyncClient)
    with copy.copy(sync):  # leaving the copy's block closes the client itself
        pass
    assert sync.closed
    asyncio.run(asyncio_client.aclose())
