"""A hand-off that reaches a waiter after it gave up is declined at once.

A waiter that gives up sends a dequeue to every node; a node that dequeue missed keeps
its place until the place expires and may hand it the lock meanwhile, since the client's
notification connection is still subscribed. The client then sends the dequeue again to
that node, which passes the lock on (``tenure._core.waiting.Departed``), rather than leave
the node held by nobody for a whole TTL.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import tenure
from tenure._core.config import LockKeys
from tenure._core.flows import Depart
from tenure._core.waiting import Departed
from tenure.testing import LocalCluster, LocalNode

from .conftest import Api
from .queues import (
    GIVE_UP,
    first_queued,
    gave_up,
    put_back,
    release_losing_its_notification,
    watch_place,
)


@pytest.mark.parametrize("n", [1, 3])
def test_a_hand_off_to_a_waiter_that_gave_up_is_declined(
    api: Api, shared5: LocalCluster, key: str, n: int
) -> None:
    urls = shared5.urls[:n]
    keys = LockKeys.of(key)
    last = shared5[n - 1]
    holder = api.client(urls).acquire(key, ttl=30.0)
    waiter = api.client(urls)
    # Its queue entry and place, read while it waits (they go when it gives up).
    member, score, place = gave_up(waiter, last, key, GIVE_UP)
    with last.client() as c:
        assert c.zcard(keys.queue) == 0  # its dequeue reached every node
        # ... but say it had missed this one: the place is back, still live.
        put_back(c, keys, member, score, place)
        holder.release()  # this node hands the lock to the departed waiter
        # (The asyncio client reads its notifications only while its loop runs.)
        api.wait_until(
            lambda: c.get(keys.lock) is None, 2.0, "the node stayed held by a departed waiter"
        )
        assert c.zcard(keys.queue) == 0


def test_a_released_lease_whose_attempt_a_node_may_still_run_declines_its_hand_off(
    api: Api, cluster5: LocalCluster, key: str
) -> None:
    """An attempt a node did not answer in time may run there later: a frozen node runs
    what sits in its socket when it wakes, even on a connection the client gave up, and
    the call's lease may be released by then (on another connection). Where another
    client holds the lock at that moment, the attempt queues the call's waiter id, and
    that client's release hands the lock to it: its process ignored the notification
    (the id neither waits nor departed), so the node was held by nobody for the TTL.
    The lease's release now declines what still reaches its id, as a waiter that gave
    up does. Here the third node is frozen through the whole acquire and release, and
    the late run is played on the first node by putting the place back."""
    urls = cluster5.urls[:3]
    keys = LockKeys.of(key)
    first, frozen = cluster5[0], cluster5[2]
    holder = api.client(urls)
    client = api.client(urls)
    held = holder.acquire(key, ttl=30.0)
    # The client waits once: its notifications are set up, and its place shows its channel.
    _, ticket, place = gave_up(client, first, key, GIVE_UP)
    held.release()
    frozen.pause()
    try:
        # Granted by the two live nodes; the third has the attempt unread.
        lease = client.acquire(key, ttl=10.0, timeout=5.0)
        waiter = lease.token
        lease.release()
    finally:
        frozen.resume()
    # The attempt runs late on the first node: the lease's id is queued behind the holder.
    _late_in_line_is_declined(api, first, keys, waiter, ticket, place, holder, key)


def test_a_released_lease_whose_cleanup_a_node_may_still_run_declines_its_hand_off(
    api: Api, cluster5: LocalCluster, key: str
) -> None:
    """Fair on a quorum, a failed attempt's grants are released by a cleanup that puts
    the waiter back in line (a node that granted took it out), written before it waits
    and not awaited. The blocking client's calls borrow connections from a pool, so the
    lease the call then gets may be released on another connection than the cleanup's,
    and a node may run the cleanup after the release (seen under load, in
    ``test_random_interrupts.py``): the lease's id is queued there again, the next
    release there hands the lock to it, and its process ignored the notification, so
    the node was held by nobody for the TTL. Such a lease now lingers, as one whose
    attempt a node did not answer. Here the first node alone is free while the others
    are held, so the attempt is granted there and cleaned up; the lease comes by
    hand-off; and the late cleanup is played on the first node by putting the place
    back."""
    urls = cluster5.urls[:3]
    keys = LockKeys.of(key)
    first, second, third = cluster5[0], cluster5[1], cluster5[2]
    # No re-check while it waits (that attempt's answers could come in any order), and
    # time for the paused nodes below.
    client = api.client(urls, node_timeout=0.5, recheck=20.0)
    with tenure.Client(urls) as holder:
        held = holder.acquire(key, ttl=30.0)
        # It waits once: its notifications are set up, so its first attempt queues.
        earlier, _, _ = gave_up(client, first, key, GIVE_UP)
        with first.client() as c:
            c.delete(keys.lock)  # free on the first node alone (its key lost, say)
        watcher, seen, stop = watch_place(second, keys, other_than=earlier)
        also, seen_there, stop_there = watch_place(third, keys, other_than=earlier)

        def hand_over() -> None:
            watcher.join()  # until its attempt has queued it on the held nodes
            also.join()
            if seen and seen_there:
                # The first node hands the lock over last: its hand-off does not count
                # (that node granted the attempt rather than find the lock held), and
                # coming first it woke the client to a re-check rather than a lease.
                with first.client() as c:
                    c.execute_command("CLIENT", "PAUSE", 200)
                held.release()

        releaser = threading.Thread(target=hand_over)
        releaser.start()
        try:
            # The held nodes answer after the first, so the attempt's round hears all
            # three: its grant is not left unanswered (which alone made it linger).
            for node in (second, third):
                with node.client() as c:
                    c.execute_command("CLIENT", "PAUSE", 100)
            lease = client.acquire(key, ttl=10.0, timeout=5.0)
        finally:
            stop.set()
            stop_there.set()
            releaser.join()
        assert seen, "the client was never queued"
        assert seen_there, "the client was never queued on the third node"
        member, ticket, place = seen[0]
        assert member.decode() == lease.token
        lease.release()
        # The cleanup runs late on the first node: the lease's id is back in line.
        _late_in_line_is_declined(api, first, keys, lease.token, ticket, place, holder, key)


def test_a_hand_off_lost_with_the_notification_connection_is_declined_once_it_is_back(
    api: Api, shared5: LocalCluster, key: str
) -> None:
    """A release hands the lock to a waiter that departed (its place kept by a node its
    dequeue missed) and publishes to its process, which the node counts as received;
    the client's notification connection is lost before the message leaves the node
    (here killed in the release's own transaction). Nothing then declined the hand-off:
    the waiter no longer waits, so no re-check answers it, and the node was held by
    nobody for the TTL. Once the client is subscribed there again, every waiter that
    departed lately is declined on that node."""
    node = shared5.nodes[0]
    keys = LockKeys.of(key)
    client = api.client([node.url])
    with tenure.Client([node.url]) as holder:
        theirs = holder.acquire(key, ttl=30.0)
        member, ticket, place = gave_up(client, node, key, GIVE_UP)
        with node.client() as c:
            put_back(c, keys, member, ticket, place)
            # Handed to the departed waiter:
            assert release_losing_its_notification(node, holder, theirs, keys.lock) == member
            api.wait_until(
                lambda: c.get(keys.lock) is None,
                3.0,
                "the node stayed held by a departed waiter whose hand-off was lost",
            )
            assert c.zcard(keys.queue) == 0


def _late_in_line_is_declined(
    api: Api,
    node: LocalNode,
    keys: LockKeys,
    waiter: str,
    ticket: float,
    place: bytes,
    holder: Any,
    key: str,
) -> None:
    """A released lease's id is put back in ``node``'s queue (what a command of its
    call that the node runs late leaves), behind ``holder``'s new lease, whose release
    then hands the node the lock: its client declines it, and the node is free again."""
    held = holder.acquire(key, ttl=30.0)
    with node.client() as c:
        put_back(c, keys, waiter, ticket, place)
        held.release()  # the node hands the lock to the released lease's id
        api.wait_until(
            lambda: c.get(keys.lock) is None,
            2.0,
            "the node stayed held by the waiter id of a released lease",
        )
        assert c.zcard(keys.queue) == 0


class _Spy(Departed):
    """The listener's departed waiters, which let a test act when one departs
    (``on_add``), see when a notification to one has been answered (``answered``), and
    whether it was kept for later rather than declined at once (``kept``)."""

    __slots__ = ("answered", "kept", "on_add")

    def __init__(self, on_add: Callable[[str], None]) -> None:
        super().__init__()
        self.on_add = on_add
        self.answered = threading.Event()
        self.kept = False

    def add(self, waiter: str, *args: Any, **kwargs: Any) -> Any:
        kept = super().add(waiter, *args, **kwargs)
        self.on_add(waiter)
        return kept

    def decline(self, waiter: str, node: int, now: float) -> bool:
        try:
            return super().decline(waiter, node, now)
        finally:
            entry: Any = self._until.get(waiter)
            self.kept = entry is not None and len(entry) > 2 and node in (entry[2] or ())
            self.answered.set()


def test_a_notification_during_a_lingering_lease_release_does_not_lose_the_lease(
    cluster5: LocalCluster, key: str
) -> None:
    """A lease whose call left an attempt unanswered (``lingers``) declines what reaches
    its waiter id from its release on. A notification that came as the release began
    was declined at once: its dequeue deletes a lock key that holds the id, the lease's
    own, and ran ahead of the release on that node, so the release found the key gone
    and raised ``LeaseLost`` for a lease that was valid. (Seen under load: six processes
    contending on five nodes.) The declines now wait for the release round. Here the
    notification comes from the first node, published as a release publishes it, the
    moment the lease departs; the blocking client only: the test waits in the caller's
    thread for the listener to answer it."""
    urls = cluster5.urls[:3]
    first, frozen = cluster5[0], cluster5[2]
    told: list[str] = []

    def notify(waiter: str) -> None:
        if told:
            return
        told.append(waiter)
        with first.client() as c:
            assert c.publish(channel, f"W {waiter}") == 1
            assert spy.answered.wait(5.0), "the notification was not answered"
            if not spy.kept:
                # Declined at once: its dequeue goes out (again, if the first send found
                # no connection ready); the release goes once it has run, as it did
                # under load when it came first.
                deadline = time.monotonic() + 5.0
                while c.get(LockKeys.of(key).lock) is not None:
                    assert time.monotonic() < deadline, "the dequeue never ran"
                    time.sleep(0.01)

    spy = _Spy(notify)
    with tenure.Client(urls) as holder, tenure.Client(urls) as client:
        held = holder.acquire(key, ttl=30.0)
        _, _, place = gave_up(client, first, key, GIVE_UP)
        channel = place.split()[0]
        held.release()
        listener = client._notifications()
        listener.departed = listener._board.departed = spy
        frozen.pause()
        try:
            # Granted by the two live nodes; the third has the attempt unread: it lingers.
            lease = client.acquire(key, ttl=10.0, timeout=5.0)
            lease.release()  # LeaseLost here: "release confirmed by only 1 of 3 nodes"
        finally:
            frozen.resume()
    assert told == [lease.token]


async def until(
    predicate: Callable[[], bool], what: str, every: float = 0.005, within: float = 5.0
) -> None:
    """Poll ``predicate`` (the event loop running between polls) until it holds."""
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {within} s"
        await asyncio.sleep(every)


def test_a_waiter_cancelled_while_it_leaves_its_queues_declines_its_hand_off(
    cluster5: LocalCluster, key: str
) -> None:
    """A waiter that gives up waits for its dequeue's answers; cancelled meanwhile (an
    asyncio timeout around the call, a task group ending), it left without being
    recorded as departed, so a node that hands it the lock afterwards (one its dequeue
    missed, or one that runs a late attempt of the call) was held by nobody for the TTL.
    Here the third node is frozen while the waiter leaves, so its dequeue round waits;
    the task is cancelled then. The first node gets the waiter's place back afterwards."""
    urls = cluster5.urls[:3]
    keys = LockKeys.of(key)
    first, frozen = cluster5[0], cluster5[2]

    async def main() -> None:
        async with (
            tenure.AsyncClient(urls) as holder,
            # No fallback re-check while it waits: a re-check's round on the frozen node
            # would start that connection's stall clock early.
            tenure.AsyncClient(urls, node_timeout=0.7, recheck=20.0) as client,
        ):
            held = await holder.acquire(key, ttl=30.0)
            with first_queued(first, keys) as seen:
                began = time.monotonic()
                # Queued within 0.85 s, and given up at 1 s (0.3 s was too short to
                # queue in on a loaded machine).
                task = asyncio.create_task(client.acquire(key, ttl=10.0, timeout=1.0))
                await until(lambda: bool(seen), "the waiter queued")
            member, ticket, place = seen[0]
            # Frozen shortly before the waiter gives up, not so long before that its
            # connection is given up (after 1 s without an answer) and the node skipped.
            await asyncio.sleep(max(0.0, began + 0.85 - time.monotonic()))
            frozen.pause()
            try:
                with first.client() as c:
                    # It gives up at 1 s; its dequeue round, answered by the first node
                    # at once, then waits up to 0.7 s for the frozen one: cancelled there.
                    await until(lambda: not c.zcard(keys.queue), "the waiter left", 0.002)
                assert not task.done()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            finally:
                frozen.resume()
            with first.client() as c:
                put_back(c, keys, member, ticket, place)
                await held.release()  # the first node hands the lock to the waiter
                await until(
                    lambda: c.get(keys.lock) is None,
                    "the node no longer held by a cancelled waiter",
                    within=2.0,
                )

    asyncio.run(main())


def test_a_decline_that_does_not_reach_its_node_is_sent_again(
    api: Api, cluster5: LocalCluster, key: str
) -> None:
    """A hand-off comes on the notification connection; the decline goes on a command
    connection, which may be lost (a node just back from a freeze, whose connections the
    client gave up), in its reconnect back-off, or refused (a node at its connection
    limit) at that moment. It was dropped then, and the node held by nobody for the
    TTL; it is sent again until it reaches the node. Here the waiter's command
    connections are closed by the node, which then takes no new connection for 0.3 s
    (``maxclients``) while its notification connection stays up."""
    node = cluster5[0]
    urls = [node.url]
    keys = LockKeys.of(key)
    holder = api.client(urls)
    held = holder.acquire(key, ttl=30.0)
    with node.client() as c:
        before = {entry["id"] for entry in c.client_list()}
    waiter = api.client(urls)
    member, ticket, place = gave_up(waiter, node, key, GIVE_UP)
    with node.client() as c:
        me = str(c.client_id())
        commands = [
            entry["id"]
            for entry in c.client_list()
            if entry["id"] not in before and entry["id"] != me and "P" not in entry["flags"]
        ]
        assert commands, "no command connection of the waiter's client"
        limit = c.config_get("maxclients")["maxclients"]
        for client_id in commands:
            c.client_kill_filter(_id=client_id)
        c.config_set("maxclients", c.info("clients")["connected_clients"])
        try:
            put_back(c, keys, member, ticket, place)
            held.release()  # hands the lock to the departed waiter
            api.idle(0.3)  # its declines are refused meanwhile
        finally:
            c.config_set("maxclients", limit)
        api.wait_until(
            lambda: c.get(keys.lock) is None, 3.0, "the node stayed held by a departed waiter"
        )


def test_a_hand_off_that_crosses_a_dequeue_lost_on_a_dead_connection_is_declined(
    api: Api, cluster5: LocalCluster, key: str
) -> None:
    """A waiter that gives up stops listening and sends its dequeue; it was recorded as
    departed only once the dequeue's answers were in. A hand-off notified in between
    reached no listener and no departed waiter and was dropped, and a dequeue that went
    out on a connection the node had closed unnoticed never passed the lock on: the node
    was held by nobody for the whole TTL. Here the holder releases (handing the lock to
    the waiter) and the node closes the waiter's command connections, both just as the
    waiter's dequeue is about to be written."""
    node = cluster5[0]
    urls = [node.url]
    keys = LockKeys.of(key)
    holder = tenure.Client(urls)  # blocking: callable from the hook under either driver
    admin = node.client()
    try:
        held = holder.acquire(key, ttl=10.0)
        before = {entry["id"] for entry in admin.client_list()}
        waiter = api.client(urls)
        flows = waiter._flows
        dequeue = flows.dequeue
        crossed: list[str] = []

        def crossing(spec: Any, who: str) -> Any:
            # Runs in the waiter's flow, after it stopped listening, before its dequeue
            # is written (synchronously: no notification is read in between).
            if not crossed:
                crossed.append(who)
                held.release()  # hands the lock to the waiter, which is leaving
                me = str(admin.client_id())
                for entry in admin.client_list():
                    # The waiter's command connections (not its subscription: "P").
                    if entry["id"] not in before | {me} and "P" not in entry["flags"]:
                        admin.client_kill_filter(_id=entry["id"])
            return dequeue(spec, who)

        flows.dequeue = crossing
        assert waiter.lock(key, ttl=10.0).acquire(timeout=GIVE_UP) is False
        assert crossed, "the waiter never left its queue"
        api.wait_until(
            lambda: admin.get(keys.lock) is None,
            3.0,
            "the node stayed held by the waiter that left",
        )
    finally:
        admin.close()
        holder.close()


def test_a_hand_off_filed_after_the_last_wait_is_declined_when_its_dequeue_is_lost(
    cluster5: LocalCluster, key: str
) -> None:
    """A hand-off filed in a waiter's slot after its last wait ended and before it
    departed was dropped with the slot when it stopped listening; with its dequeue lost
    too (a connection the node had closed unnoticed), the node was held by nobody for
    the whole TTL. Here the holder releases, handing the lock to the waiter, and the
    notification is filed just before the waiter departs; its dequeue is then lost.
    (Blocking client: its listener thread files while the waiter's thread runs; the
    asyncio client files only between the flow's waits.)"""
    node = cluster5[0]
    urls = [node.url]
    keys = LockKeys.of(key)
    holder = tenure.Client(urls)
    admin = node.client()
    waiter = tenure.Client(urls)
    try:
        held = holder.acquire(key, ttl=10.0)
        perform_now = waiter._perform_now
        filed: list[int] = []
        dropped: list[str] = []
        caller = threading.get_ident()

        def crossing(op: Any) -> None:
            if isinstance(op, Depart) and not filed:
                slots = waiter._listener._board.slots
                slot = slots[op.waiter]
                held.release()  # hands the lock to the waiter, whose last wait ended
                deadline = time.monotonic() + 2.0
                while not slot.wakes and time.monotonic() < deadline:
                    time.sleep(0.001)
                filed.append(len(slot.wakes))
            perform_now(op)

        def lost(spec: Any, who: str) -> Any:
            # The waiter's own dequeue is lost: it leaves another queue entry, one never
            # there (a decline's, from another thread, goes out as it is).
            if threading.get_ident() == caller:
                dropped.append(who)
                who = "never-queued"
            return dequeue(spec, who)

        waiter._perform_now = crossing  # type: ignore[method-assign]
        dequeue = waiter._flows.dequeue
        waiter._flows.dequeue = lost  # type: ignore[method-assign,assignment]
        assert waiter.lock(key, ttl=10.0).acquire(timeout=GIVE_UP) is False
        assert filed == [1], "the hand-off was not filed before the waiter departed"
        assert dropped, "the waiter never left its queue"
        deadline = time.monotonic() + 3.0
        while admin.get(keys.lock) is not None:
            assert time.monotonic() < deadline, "the node stayed held by the waiter that left"
            time.sleep(0.01)
    finally:
        waiter.close()
        admin.close()
        holder.close()
