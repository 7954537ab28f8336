"""Sharded notifications on a Redis Cluster node (``waiting.ShardSubs``): which channel,
where it is subscribed, when it is subscribed again, and when it is let go."""

from __future__ import annotations

from tenure._core import commands
from tenure._core.config import ClientConfig, LockKeys, LockSpec
from tenure._core.slots import key_slot, routed_slot, slot_tag
from tenure._core.waiting import ShardSubs, WakeTally, route_of, sharded_refused, sharding

A, B, C = ("10.0.0.1", 7000), ("10.0.0.2", 7000), ("10.0.0.3", 7000)
PREFIX, SUFFIX = "tenure:wake:", "abc123"
CLASSIC = PREFIX + SUFFIX


def owner_a(slot: int) -> tuple[str, int]:
    return A


def confirm(subs: ShardSubs, where: tuple[str, int], slot: int, loads: int = 0) -> object:
    return subs.answered(where, [b"ssubscribe", subs.channel(slot).encode(), 1], None, loads)


def ended_at_a(loads: int, begun: int) -> ShardSubs:
    """A process subscribed to slot 7 at A by map ``loads``, whose subscription A then
    ended itself (the slot left it) when ``begun`` loads of the map had begun."""
    subs = ShardSubs(PREFIX, SUFFIX)
    subs.add(7)
    subs.plan(owner_a, loads)
    confirm(subs, A, 7, loads)
    event = subs.answered(A, [b"sunsubscribe", subs.channel(7).encode(), 0], None, begun)
    assert event.kind == "ended"
    return subs


def test_the_channel_of_a_slot_hashes_to_that_slot() -> None:
    subs = ShardSubs(PREFIX, SUFFIX)
    for slot in (0, 1, 5461, 16383):
        channel = subs.channel(slot)
        assert channel == f"tenure:wake:{{{slot_tag(slot)}}}:{SUFFIX}"
        assert key_slot(channel) == slot
    keys = LockKeys.of("orders:42", per_slot=True)
    assert key_slot(subs.channel(routed_slot(keys.lock))) == key_slot(keys.lock)


def test_sharded_channels_only_when_every_node_is_a_cluster_node() -> None:
    assert sharding([True])
    assert sharding([True, True, True])
    assert not sharding([True, False])  # a mixed set keeps the process channel
    assert not sharding([False])
    assert not sharding([])


def test_a_slot_is_subscribed_once_and_let_go_with_its_last_waiter() -> None:
    subs = ShardSubs(PREFIX, SUFFIX)
    subs.add(7)
    subs.add(7)
    assert subs.plan(owner_a) == [(A, "SSUBSCRIBE", subs.channel(7))]
    assert subs.plan(owner_a) == []  # asked already
    assert confirm(subs, A, 7).kind == "confirmed"  # type: ignore[attr-defined]
    assert subs.up(7)
    assert subs.supported is True
    subs.remove(7)
    assert subs.plan(owner_a) == []  # one waiter left
    subs.remove(7)
    assert subs.plan(owner_a) == [(A, "SUNSUBSCRIBE", subs.channel(7))]
    assert not subs.idle(A)
    reply = [b"sunsubscribe", subs.channel(7).encode(), 0]
    assert subs.answered(A, reply).kind == ""
    assert subs.idle(A)  # its connection may close
    assert subs.plan(owner_a) == []


def test_a_slot_wanted_again_while_it_is_let_go_is_subscribed_anew() -> None:
    # A waiter comes for the slot between the last one's unsubscribe and its answer (a
    # blocking acquire that got the lock at once unregisters, its neighbour registers).
    subs = ShardSubs(PREFIX, SUFFIX)
    subs.add(7)
    subs.plan(owner_a)
    confirm(subs, A, 7)
    subs.remove(7)
    assert subs.plan(owner_a) == [(A, "SUNSUBSCRIBE", subs.channel(7))]
    subs.add(7)
    # Ending: not a channel to record, nor one to wait for.
    assert subs.route(7, CLASSIC) == (CLASSIC, False)
    assert not subs.settled(7)
    assert subs.plan(owner_a) == []  # not before the unsubscribe is answered
    reply = [b"sunsubscribe", subs.channel(7).encode(), 0]
    assert subs.answered(A, reply).kind == "again"
    assert subs.plan(owner_a) == [(A, "SSUBSCRIBE", subs.channel(7))]
    assert confirm(subs, A, 7).kind == "confirmed"  # type: ignore[attr-defined]
    assert subs.route(7, CLASSIC) == (subs.channel(7), True)


def test_a_refused_unsubscribe_drops_the_connection() -> None:
    # Redis 8 serves SSUBSCRIBE at a replica of the slot's master, and answers
    # SUNSUBSCRIBE there MOVED, keeping the subscription: only closing ends it.
    subs = ShardSubs(PREFIX, SUFFIX)
    subs.add(7)
    subs.plan(lambda s: B)
    confirm(subs, B, 7)
    assert subs.plan(owner_a) == [
        (B, "SUNSUBSCRIBE", subs.channel(7)),
        (A, "SSUBSCRIBE", subs.channel(7)),
    ]
    event = subs.answered(B, None, "MOVED 7 10.0.0.1:7000")
    assert (event.kind, event.slot) == ("cut", 7)
    assert not subs.lost(B)  # the driver drops the connection: nothing else was there
    assert confirm(subs, A, 7).kind == "confirmed"  # type: ignore[attr-defined]


def test_the_route_is_sharded_only_once_the_subscription_is_confirmed() -> None:
    subs = ShardSubs(PREFIX, SUFFIX)
    subs.add(7)
    assert subs.route(7, CLASSIC) == (CLASSIC, False)
    subs.plan(owner_a)
    assert subs.route(7, CLASSIC) == (CLASSIC, False)  # asked, not confirmed
    confirm(subs, A, 7)
    assert subs.route(7, CLASSIC) == (subs.channel(7), True)


def test_route_of_a_driver_slot_or_any_inbox() -> None:
    tally = WakeTally()
    assert route_of(tally, CLASSIC) == (CLASSIC, False)
    tally.route = lambda: ("ch", True)
    assert route_of(tally, CLASSIC) == ("ch", True)
    tally.route = lambda: None
    assert route_of(tally, CLASSIC) == (CLASSIC, False)
    assert route_of(None, CLASSIC) == (CLASSIC, False)
    assert route_of(object(), CLASSIC) == (CLASSIC, False)  # the models' inboxes


def test_a_server_without_sharded_pub_sub_is_asked_once() -> None:
    subs = ShardSubs(PREFIX, SUFFIX)
    subs.add(7)
    subs.plan(owner_a)
    event = subs.answered(A, None, "ERR unknown command 'SSUBSCRIBE', with args beginning with:")
    assert event.kind == "unsupported"
    assert subs.supported is False
    assert subs.settled(7)  # nothing more to wait for: the process channel serves
    subs.add(8)
    assert subs.plan(owner_a) == []  # never asked again
    assert subs.route(8, CLASSIC) == (CLASSIC, False)
    assert sharded_refused("ERR Unknown command 'SSUBSCRIBE'")
    assert not sharded_refused("NOPERM this user has no permissions to access the channel")


def test_moved_names_the_new_owner() -> None:
    subs = ShardSubs(PREFIX, SUFFIX)
    subs.add(7)
    subs.plan(owner_a)
    event = subs.answered(A, None, "MOVED 7 10.0.0.2:7000")
    assert (event.kind, event.slot, event.to) == ("moved", 7, B)
    assert subs.plan(lambda s: B) == [(B, "SSUBSCRIBE", subs.channel(7))]


def test_another_error_drops_the_request() -> None:
    subs = ShardSubs(PREFIX, SUFFIX)
    subs.add(7)
    subs.plan(owner_a)
    event = subs.answered(A, None, "NOPERM no permissions to access a channel")
    assert event.kind == "refused"
    assert not subs.up(7)
    assert subs.supported is None


def test_an_ended_subscription_waits_for_a_slot_map_begun_since() -> None:
    # The server ends it when the slot leaves the node; the old map still names that
    # node, and a replica of the new master would accept it again: wait for a new map.
    subs = ended_at_a(3, 3)
    assert not subs.up(7)
    assert subs.reload_from(owner_a) == (A,)  # the map still names A: load a newer one
    assert subs.unplaced()
    assert subs.plan(owner_a, 3, A) == []  # the same map: not yet
    # A newer map that still names A, from a member that may not have heard yet: no;
    # from A itself, which knows the slot came back to it: yes.
    assert subs.plan(owner_a, 4, C) == []
    assert subs.reload_from(owner_a) == (A,)
    assert subs.plan(owner_a, 5, A) == [(A, "SSUBSCRIBE", subs.channel(7))]
    assert subs.reload_from(owner_a) is None
    confirm(subs, A, 7, 4)
    assert subs.up(7)


def test_a_map_whose_load_was_under_way_when_a_subscription_ended_is_not_newer() -> None:
    # Map 3 in use, load 4 under way (asked before the failover reached its source):
    # the old master ends the subscription, then load 4 ends, still naming it. Placed
    # there, the subscription would be at a replica of the slot's new master.
    subs = ended_at_a(3, 4)
    assert subs.plan(owner_a, 4, A) == []
    assert subs.reload_from(owner_a) == (A,)  # asked again, of A first
    assert subs.plan(lambda s: B, 5, C) == [(B, "SSUBSCRIBE", subs.channel(7))]


def test_a_reload_asks_first_the_masters_that_ended_subscriptions() -> None:
    subs = ShardSubs(PREFIX, SUFFIX)
    owners = {7: A, 9: B}
    for slot in owners:
        subs.add(slot)
    subs.plan(owners.get, 1)
    confirm(subs, A, 7, 1)
    confirm(subs, B, 9, 1)
    assert subs.reload_from(owners.get) is None  # nothing ended
    subs.answered(A, [b"sunsubscribe", subs.channel(7).encode(), 0], None, 1)
    subs.lost(B, 1)
    # B's connection was lost: that tells nothing of B's view (B may be down), so it
    # is not asked first; A ended a subscription itself, on learning of the change.
    assert subs.reload_from(owners.get) == (A,)
    assert subs.reload_from(lambda s: C) is None  # both moved on
    subs.remove(7)
    assert subs.reload_from(owners.get) == ()  # B's slot alone: a reload, no preference


def test_an_ended_subscription_follows_a_map_that_names_another_master() -> None:
    subs = ended_at_a(3, 3)
    assert subs.reload_from(lambda s: B) is None  # a MOVED put it at B: no load needed
    assert subs.plan(lambda s: B, 3) == [(B, "SSUBSCRIBE", subs.channel(7))]


def test_a_lost_connection_takes_its_subscriptions() -> None:
    subs = ShardSubs(PREFIX, SUFFIX)
    subs.add(7)
    subs.add(9)
    subs.plan(owner_a, 1)
    confirm(subs, A, 7, 1)
    assert subs.lost(A, 1) is True  # slot 7 was up: its waiters re-check
    assert not subs.up(7)
    assert subs.idle(A)
    assert subs.plan(owner_a, 1) == []  # the master may have failed: a newer map
    planned = subs.plan(owner_a, 2, C)  # from any member: A itself told nothing
    assert sorted(c for _, _, c in planned) == sorted([subs.channel(7), subs.channel(9)])


def test_an_unwanted_end_is_ignored() -> None:
    subs = ShardSubs(PREFIX, SUFFIX)
    reply = [b"sunsubscribe", subs.channel(7).encode(), 0]
    assert subs.answered(A, reply).kind == ""
    assert subs.answered(A, [b"smessage", b"x", b"W w"]).kind == ""


def test_a_sharded_place_is_marked_in_the_acquire_arguments() -> None:
    cfg = ClientConfig.build(["redis+cluster://127.0.0.1:7000"], recheck=0.5)
    spec = LockSpec.build(cfg, "res", 10.0, fair=False)
    plain = commands.WaitArgs("n", "w", CLASSIC, 1000, 0)
    sharded = commands.WaitArgs("n", "w", "tenure:wake:{1bz}:abc", 1000, 0, sharded=True)
    assert not commands.acquire(spec, "t", 5, 1, 100, plain).packed.endswith(b"$1\r\ns\r\n")
    assert commands.acquire(spec, "t", 5, 1, 100, sharded).packed.endswith(b"$1\r\ns\r\n")


def test_a_subscription_follows_the_slot_map() -> None:
    # A map that now names another master (a MOVED seen by a round, a reload) moves the
    # subscription there: one at a replica of the slot's master would not be counted.
    subs = ShardSubs(PREFIX, SUFFIX)
    subs.add(7)
    subs.plan(owner_a)
    confirm(subs, A, 7)
    assert subs.plan(lambda s: B) == [
        (A, "SUNSUBSCRIBE", subs.channel(7)),
        (B, "SSUBSCRIBE", subs.channel(7)),
    ]
    assert not subs.up(7)
    confirm(subs, B, 7)
    assert subs.up(7)
    # The old master's answer to the SUNSUBSCRIBE leaves the new subscription alone.
    assert subs.answered(A, [b"sunsubscribe", subs.channel(7).encode(), 0]).kind == ""
    assert subs.up(7)
    assert subs.idle(A)
    assert subs.plan(lambda s: B) == []
