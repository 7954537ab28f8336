"""The pure parts of notified waiting: when to wait, how long, and transferred leases."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure import ConfigurationError
from tenure._core.acquire import HELD, Acquisition, GiveUp, Granted, LeaseState, Retry, Wait
from tenure._core.config import ClientConfig, LockSpec
from tenure._core.policy import wait_random, wait_random_exponential
from tenure._core.quorum import Round
from tenure._core.waiting import (
    DEPARTED_MAX,
    UNHEARD_DEPARTURE,
    Departed,
    Wake,
    parse_wake,
    place_ms,
)

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=300)
TTL = 10.0
COUNTER = 1_000


def make(
    n: int = 1,
    recheck: float = 0.5,
    timeout: float | None = None,
    fair: bool | None = None,
    *,
    blocking: bool = True,
) -> Acquisition:
    cfg = ClientConfig.build([f"redis://h{i}" for i in range(n)], recheck=recheck)
    spec = LockSpec.build(cfg, "res", TTL, fair=(n == 1 and recheck > 0) if fair is None else fair)
    return Acquisition(
        spec,
        wait_random(0.01, 0.02),
        random.Random(7),
        blocking=blocking,
        timeout=timeout,
        now=0.0,
        node_names=[f"n{i}" for i in range(n)],
        max_ttl_ms=60_000,
        recheck=recheck,
    )


def held_round(acq: Acquisition, now: float, pttls: list[int], granted: int = 0) -> Round:
    rnd = acq.begin(now)
    for i in range(granted):
        rnd.record(i, True, (1, COUNTER + 1, COUNTER + 1))
    for j, pttl in enumerate(pttls):
        rnd.record(granted + j, False, (HELD, COUNTER, COUNTER, pttl))
    return rnd


def test_held_lock_means_wait_not_back_off() -> None:
    acq = make()
    step = acq.conclude(held_round(acq, 0.0, [9_000]), "t", 0.001)
    assert isinstance(step, Wait)
    assert 0.25 <= step.timeout <= 0.5  # the fallback bound, jittered


@given(st.integers(0, 20_000), st.floats(0.01, 5.0))
@SETTINGS
def test_wait_never_sleeps_past_the_holders_expiry_or_the_fallback(
    pttl: int, recheck: float
) -> None:
    acq = make(recheck=recheck)
    step = acq.conclude(held_round(acq, 0.0, [pttl]), "t", 0.001)
    assert isinstance(step, Wait)
    assert step.timeout <= recheck
    assert step.timeout <= pttl / 1000 + 0.001
    assert step.timeout >= min(recheck / 2, pttl / 1000 + 0.001)


def test_the_pttl_is_read_after_the_floor() -> None:
    # {0, counter, floor, pttl}: a floor (any size) is not the holder's remaining TTL.
    acq = make(recheck=5.0)
    rnd = acq.begin(0.0)
    rnd.record(0, False, (HELD, COUNTER, 7, 200))
    step = acq.conclude(rnd, "t", 0.001)
    assert isinstance(step, Wait)
    assert step.timeout == pytest.approx(0.201)
    # Without a pttl (not queued: {0, counter, floor}) only the fallback bound applies.
    acq = make(recheck=5.0)
    rnd = acq.begin(0.0)
    rnd.record(0, False, (HELD, COUNTER, 7))
    step = acq.conclude(rnd, "t", 0.001)
    assert isinstance(step, Wait)
    assert 2.5 <= step.timeout <= 5.0


def test_wait_respects_the_callers_timeout() -> None:
    acq = make(timeout=0.1)
    step = acq.conclude(held_round(acq, 0.0, [9_000]), "t", 0.05)
    assert isinstance(step, Wait)
    assert step.timeout == pytest.approx(0.05)
    assert isinstance(acq.conclude(held_round(acq, 0.2, [9_000]), "t", 0.2), GiveUp)


def test_quorum_waits_for_the_node_that_frees_a_majority() -> None:
    # 5 nodes, all held: a majority (3) is free once 3 keys expired: the 3rd smallest PTTL.
    acq = make(n=5, recheck=2.0)
    step = acq.conclude(held_round(acq, 0.0, [400, 100, 300, 200, 900]), "t", 0.001)
    assert isinstance(step, Wait)
    assert step.timeout == pytest.approx(0.301)


def test_split_vote_backs_off_at_random() -> None:
    # Nobody holds a majority: waking on a release would only collide again.
    acq = make(n=5)
    step = acq.conclude(held_round(acq, 0.0, [9_000, 9_000], granted=2), "t", 0.001)
    assert isinstance(step, Retry)
    assert 0.01 <= step.sleep <= 0.02
    assert step.cleanup == frozenset({0, 1, 4})  # node 4 was not heard from: maybe ours


def test_no_notifications_means_back_off() -> None:
    acq = make(recheck=0.0)
    assert isinstance(acq.conclude(held_round(acq, 0.0, [9_000]), "t", 0.001), Retry)


def test_transferred_lease_counts_validity_from_the_last_look() -> None:
    acq = make()
    assert (
        acq.transferred("w", [(0, COUNTER + 1)], 0.0) is None
    )  # never looked: nothing to count from
    acq.conclude(held_round(acq, 2.0, [9_000]), "w", 2.001)
    got = acq.transferred("w", [(0, COUNTER + 1)], 2.3)
    assert isinstance(got, Granted)
    lease = got.lease
    assert lease.started == 2.0
    assert lease.valid_until == pytest.approx(2.0 + TTL - lease.ttl * 0.01 - 0.002)
    assert lease.fencing_token == COUNTER + 1
    assert lease.token == "w"
    assert acq.floor > COUNTER + 1


def test_stale_or_late_hand_off_is_not_trusted() -> None:
    acq = make()
    acq.conclude(held_round(acq, 2.0, [9_000]), "w", 2.001)
    # Not above the counter our last look saw: from before it.
    assert acq.transferred("w", [(0, COUNTER)], 2.1) is None
    # Less than half the TTL left: re-check (which renews the TTL) instead.
    assert acq.transferred("w", [(0, COUNTER + 1)], 2.0 + TTL / 2 + 0.1) is None


@given(st.floats(0.0, 100.0), st.floats(0.0, 20.0), st.integers(1, 50))
@SETTINGS
def test_transferred_validity_never_exceeds_the_key_lifetime(
    look: float, delay: float, bump: int
) -> None:
    """The hand-off set PX ttl at some instant after the look began: the lease must end
    no later than look + ttl - drift, whatever the delay before the notification."""
    acq = make()
    acq.conclude(held_round(acq, look, [9_000]), "w", look + 0.001)
    got = acq.transferred("w", [(0, COUNTER + bump)], look + delay)
    if got is not None:
        assert got.lease.valid_until <= look + TTL - got.lease.ttl * 0.01
        assert got.lease.valid_until - (look + delay) >= TTL / 2


def test_fair_is_the_default_on_one_node_and_on_a_quorum() -> None:
    quorum = ClientConfig.build(["redis://a", "redis://b", "redis://c"])
    assert LockSpec.build(quorum, "x", 1.0).wait_mode == "q"
    assert LockSpec.build(quorum, "x", 1.0, fair=False).wait_mode == "n"
    assert LockSpec.build(ClientConfig.build(["redis://a"]), "x", 1.0).wait_mode == "f"
    # Without notifications, or with wait_replicas, the default is not fair.
    assert LockSpec.build(ClientConfig.build(["redis://a"], recheck=0), "x", 1.0).wait_mode == "n"
    replicated = ClientConfig.build(["redis://a"], wait_replicas=1)
    assert LockSpec.build(replicated, "x", 1.0).wait_mode == "n"


def test_bad_fair_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="fair"):
        LockSpec.build(ClientConfig.build(["redis://a"]), "x", 1.0, fair="yes")
    with pytest.raises(ConfigurationError, match="fair"):
        LockSpec.build(ClientConfig.build(["redis://a"], recheck=0), "x", 1.0, fair=True)


@pytest.mark.parametrize("recheck", [-1, 0.001, 61, float("nan"), True])
def test_bad_recheck_is_refused(recheck: float) -> None:
    with pytest.raises(ConfigurationError, match="recheck"):
        ClientConfig.build(["redis://a"], recheck=recheck)


def test_wake_messages() -> None:
    assert parse_wake(b"W abc") == Wake("abc")
    assert parse_wake(b"G abc 17") == Wake("abc", 17)
    assert parse_wake(b"G abc 17").handed_over  # type: ignore[union-attr]
    assert not Wake("abc").handed_over
    for bad in (b"", b"X abc", b"G abc", b"G abc x", b"G abc 0", b"W", "W abc", None, b"\xff"):
        assert parse_wake(bad) is None


@given(st.floats(0.01, 60), st.floats(0.001, 60))
def test_a_place_outlives_several_rechecks(recheck: float, node_timeout: float) -> None:
    assert place_ms(recheck, node_timeout) >= 3 * recheck * 1000 - 1


def test_partial_grant_with_the_rest_held_is_a_split_not_a_wait() -> None:
    # 1 of 5 granted us, 4 "held": on a quorum those may be another waiter's partial
    # grant or a reservation for it; both waiting for a notification would stall.
    acq = make(n=5, fair=False)
    step = acq.conclude(held_round(acq, 0.0, [9_000] * 4, granted=1), "t", 0.001)
    assert isinstance(step, Retry)
    assert step.cleanup == frozenset({0})


def test_fair_on_a_quorum_waits_with_a_partial_grant_and_the_rest_held() -> None:
    # Fair on a quorum: no reservations, and a partial grant is passed on when released,
    # so "held" is followed by a notification. Our grant is released (with a hand-off).
    acq = make(n=5, fair=True)
    step = acq.conclude(held_round(acq, 0.0, [9_000] * 4, granted=1), "t", 0.001)
    assert isinstance(step, Wait)
    assert step.cleanup == frozenset({0})
    # A split with no majority held by anyone still backs off at random.
    step = acq.conclude(held_round(acq, 0.0, [9_000, 9_000], granted=2), "t", 0.001)
    assert isinstance(step, Retry)


def quorum_look(acq: Acquisition, counters: dict[int, int], now: float = 1.0) -> None:
    """A round in which ``counters``' nodes answered "held" (the others were silent)."""
    rnd = acq.begin(now)
    for i, counter in counters.items():
        rnd.record(i, False, (HELD, counter, counter, 9_000))
    assert isinstance(acq.conclude(rnd, "w", now + 0.001), Wait)


def test_quorum_hand_off_needs_one_token_from_a_majority_of_looked_at_nodes() -> None:
    acq = make(n=5, fair=True)
    quorum_look(acq, {0: 10, 1: 10, 2: 10, 3: 12})
    f = 20
    got = acq.transferred("w", [(0, f), (1, f), (3, f)], 1.1)
    assert isinstance(got, Granted)
    assert got.lease.granted == frozenset({0, 1, 3})
    assert got.lease.fencing_token == f
    assert got.lease.started == 1.0
    assert acq.floor > f
    # Two tokens (two releases' hand-offs): neither is committed by a majority.
    assert acq.transferred("w", [(0, f), (1, f), (2, f + 1)], 1.1) is None
    # Node 4 was not looked at: its hand-off may predate our look, so it does not count.
    assert acq.transferred("w", [(0, f), (1, f), (4, f)], 1.1) is None
    # A token not above the counter a node showed is a stale notification there.
    assert acq.transferred("w", [(0, f), (1, f), (3, 12)], 1.1) is None


def test_a_fair_quorum_waiter_hears_every_node_before_it_waits() -> None:
    # Its look must cover the nodes whose hand-offs will wake it, and the first majority
    # of hand-offs may come from any nodes: a failed attempt is decided once all answered.
    acq = make(n=5, fair=True)
    rnd = acq.begin(0.0)
    for i in range(3):
        rnd.record(i, False, (HELD, COUNTER, COUNTER, 9_000))
    assert rnd.impossible
    undecided = rnd.decided
    rnd.record(3, False, (HELD, COUNTER, COUNTER, 9_000))
    rnd.record(4, False, (HELD, COUNTER + 1, COUNTER + 1, 9_000))
    assert not undecided
    assert rnd.decided
    assert isinstance(acq.conclude(rnd, "w", 0.001), Wait)
    f = COUNTER + 50
    got = acq.transferred("w", [(4, f), (3, f), (0, f)], 0.1)
    assert isinstance(got, Granted)
    assert got.lease.granted == frozenset({0, 3, 4})
    # A success is still decided at the first majority.
    won = acq.begin(1.0)
    for i in range(3):
        won.record(i, True, (1, COUNTER + 2, COUNTER + 2))
    assert won.decided
    # Others decide a failed round at once: a non-blocking attempt, or not fair.
    for other in (make(n=5, fair=False), make(n=5, fair=True, blocking=False)):
        quick = other.begin(0.0)
        for i in range(3):
            quick.record(i, False, (HELD, COUNTER, COUNTER, 9_000))
        assert quick.decided


def test_split_back_off_restarts_after_a_wait() -> None:
    # The back-off grows with consecutive split votes only: after a wait, it is short.
    cfg = ClientConfig.build([f"redis://h{i}" for i in range(5)])
    spec = LockSpec.build(cfg, "res", TTL, fair=False)
    acq = Acquisition(
        spec,
        wait_random_exponential(initial=0.001, maximum=10.0),
        random.Random(1),
        blocking=True,
        timeout=None,
        now=0.0,
        node_names=[f"n{i}" for i in range(5)],
        max_ttl_ms=60_000,
        recheck=0.5,
    )
    for _ in range(12):  # many waits
        assert isinstance(acq.conclude(held_round(acq, 0.0, [9_000] * 5), "t", 0.0), Wait)
    step = acq.conclude(held_round(acq, 0.0, [9_000, 9_000], granted=2), "t", 0.0)
    assert isinstance(step, Retry)
    assert step.sleep <= 0.001


# --- departed waiters ---------------------------------------------------------------------


def test_a_departed_waiter_is_declined_until_its_time_and_then_forgotten() -> None:
    declined: list[tuple[str, int]] = []
    departed = Departed()
    departed.add("a", lambda node: declined.append(("a", node)), until=10.0, now=0.0)
    departed.add("b", lambda node: declined.append(("b", node)), until=2.0, now=1.0)
    assert departed.decline("a", 1, now=5.0)
    assert not departed.decline("b", 2, now=5.0)  # past its time: not declined
    assert not departed.decline("c", 0, now=5.0)  # never departed
    assert declined == [("a", 1)]
    departed.add("c", lambda node: None, until=30.0, now=11.0)  # "a" and "b" expired
    assert list(departed._until) == ["c"]


def test_departed_waiters_are_capped_oldest_first() -> None:
    departed = Departed()
    for i in range(DEPARTED_MAX + 5):
        departed.add(f"w{i}", lambda node: None, until=1000.0, now=0.0)
    assert len(departed._until) == DEPARTED_MAX
    assert not departed.decline("w0", 0, now=1.0)
    assert departed.decline(f"w{DEPARTED_MAX + 4}", 0, now=1.0)


def test_a_departure_that_holds_keeps_what_comes_until_it_departs_again() -> None:
    """A released lease's id departs with ``hold`` while its release round runs: what
    reaches it meanwhile is kept (each node once) and handed back when it departs again
    without ``hold``; from then on, declined as it comes."""
    declined: list[int] = []
    departed = Departed()
    assert departed.add("w", declined.append, until=10.0, now=0.0, hold=True) == []
    assert departed.decline("w", 2, now=1.0)  # answered (kept), not dropped
    assert departed.decline("w", 0, now=1.0)
    assert departed.decline("w", 2, now=1.0)
    assert declined == []
    assert departed.add("w", declined.append, until=10.0, now=2.0) == [2, 0]
    assert departed.decline("w", 1, now=3.0)
    assert declined == [1]
    # Departing again hands back nothing more: the kept nodes were given once.
    assert departed.add("w", declined.append, until=10.0, now=4.0) == []
    assert not departed.decline("w", 1, now=11.0)  # past its time


def test_what_a_lost_read_may_have_held_is_declined_for_every_departed_waiter() -> None:
    """A notification from a node lost (its connection lost, or cut by an interrupt in
    the thread reading it) may have been a hand-off to any waiter departed lately: each
    is declined on that node, those whose time is over excepted, and one whose release
    round is still under way (``hold``) keeps the node until it departs again."""
    declined: list[tuple[str, int]] = []
    departed = Departed()
    assert not len(departed)

    def decliner(waiter: str) -> Callable[[int], None]:
        return lambda node: declined.append((waiter, node))

    for waiter, until in (("a", 10.0), ("b", 2.0), ("c", 10.0)):
        departed.add(waiter, decliner(waiter), until, now=0.0)
    departed.add("d", decliner("d"), 10.0, now=0.0, hold=True)
    assert len(departed) == 4
    departed.decline_all(1, now=5.0)
    assert declined == [("a", 1), ("c", 1)]
    assert departed.add("d", lambda node: None, 10.0, now=6.0) == [1]


def _give_up_hold(dequeue_answered_by: list[bool]) -> float:
    """How long a waiter that queued on three nodes and then timed out is declined, when
    the nodes answered its dequeue as ``dequeue_answered_by`` says: its last ``Depart``
    (the first, before the dequeue goes out, holds for as long as an unheard one)."""
    from tenure._core.flows import AwaitWake, Depart, Flows, Listen, Run

    from .model_flows import ModelInbox

    config = ClientConfig.build([f"redis://node{i}" for i in range(3)], recheck=0.5)
    spec = LockSpec.build(config, "r", TTL)
    now = [0.0]
    flows = Flows(
        config, ["a", "b", "c"], random.Random(0), clock=lambda: now[0], wall_us=lambda: 1
    )
    flow = flows.acquire(spec, True, 0.2, waiter="w", channel="ch", listening=False)
    op = next(flow)
    departs: list[float] = []
    while True:
        result: object = None
        if isinstance(op, Depart):
            departs.append(op.until - now[0])
        elif isinstance(op, Run) and op.targets is None:  # an attempt: held everywhere
            for i in range(3):
                op.rnd.record(i, False, (0, 5, 5, 8000))
        elif isinstance(op, Run):  # the dequeue
            for i, answered in enumerate(dequeue_answered_by):
                if answered:
                    op.rnd.record(i, True)
            op.rnd.time_out()
        elif isinstance(op, Listen):
            result = ModelInbox("w", 2)
        elif isinstance(op, AwaitWake):
            now[0] += 0.3  # nothing heard: past the call's timeout
            result = False
        try:
            op = flow.send(result)
        except StopIteration:
            break
    # Departed before the dequeue goes out (a hand-off notified meanwhile is declined),
    # for as long as an unanswered dequeue needs; then for as long as its answers say.
    assert len(departs) == 2
    config_hold = place_ms(config.recheck, config.node_timeout) / 1000 + UNHEARD_DEPARTURE
    assert departs[0] == pytest.approx(config_hold)
    return departs[-1]


def test_a_waiter_whose_dequeue_a_node_missed_is_declined_for_much_longer() -> None:
    """A node that did not answer the dequeue may run an attempt of the call that sat in
    its socket when it wakes, renewing the place: a hand-off to the departed waiter can
    come long after ``place_ms``."""
    config = ClientConfig.build([f"redis://node{i}" for i in range(3)], recheck=0.5)
    short = place_ms(config.recheck, config.node_timeout) / 1000
    assert _give_up_hold([True, True, True]) == pytest.approx(short)
    assert _give_up_hold([True, True, False]) == pytest.approx(short + UNHEARD_DEPARTURE)


class _FairCall(NamedTuple):
    lease: LeaseState
    release: list[str]  # the ARGV of its release, from the fifth on
    proposals: list[int]  # of its attempts, in order
    cleanups: int  # commands sent to some nodes only, not awaited


def _fair_call(attempts: list[list[bool | None]], *, handed: bool = False) -> _FairCall:
    """A fair quorum call driven by hand, and its lease's release: each attempt of
    ``attempts`` answered per node (True granted, False held, None not heard when its
    round ended), the call waiting after each failed one; with ``handed``, the lease
    comes by a hand-off after the last attempt, from the first two nodes that answered
    it "held", with the token 90 (below every proposal: the wall clock, from 100 up)."""
    from tenure._core.flows import AwaitWake, Flows, Listen, Run

    from .model_flows import ModelInbox, ModelLease, decode

    config = ClientConfig.build([f"redis://node{i}" for i in range(3)], recheck=0.5)
    spec = LockSpec.build(config, "r", TTL)
    wall = [99]

    def wall_us() -> int:
        wall[0] += 1
        return wall[0]

    flows = Flows(config, ["a", "b", "c"], random.Random(0), clock=lambda: 0.0, wall_us=wall_us)
    flow = flows.acquire(spec, True, None, waiter="w", channel="ch", listening=True)
    op = next(flow)
    inbox = ModelInbox("w", 2)
    proposals: list[int] = []
    cleanups = 0
    while True:
        result: object = None
        if isinstance(op, Listen):
            result = inbox
        elif isinstance(op, Run) and op.targets is None:  # an attempt
            proposal = int(decode(op.command.packed)[2][2])
            for i, answer in enumerate(attempts[len(proposals)]):
                if answer is not None:
                    granted = (1, proposal, proposal)
                    op.rnd.record(i, answer, granted if answer else (HELD, 5, 5, 8000))
            proposals.append(proposal)
        elif isinstance(op, Run):
            cleanups += 1
        elif isinstance(op, AwaitWake) and handed and len(proposals) == len(attempts):
            held = [i for i, answer in enumerate(attempts[-1]) if answer is False]
            for i in held[:2]:
                inbox.put(i, Wake("w", 90))
            result = True
        elif isinstance(op, AwaitWake):
            result = False  # nothing heard: a re-check, the next attempt
        try:
            op = flow.send(result)
        except StopIteration as done:
            lease = done.value
            break
    assert len(proposals) == len(attempts)
    assert isinstance(lease, LeaseState)
    releasing = flows.release(ModelLease(lease, spec))
    release = next(releasing)
    while not isinstance(release, Run):  # (a lingering lease departs first)
        release = releasing.send(None)
    return _FairCall(lease, decode(release.command.packed)[2][4:], proposals, cleanups)


def test_a_lease_whose_call_left_a_cleanup_unawaited_lingers() -> None:
    """Fair on a quorum, a failed attempt's grants are released by a cleanup that puts
    the waiter back in line, written before it waits and not awaited. A node may run it
    after the lease's release, which goes on another connection (the blocking client's
    calls borrow theirs from a pool), and queue the lease's id again: the lease lingers,
    as one whose attempt a node did not answer, and its release declines what still
    reaches the id. A call whose every command was answered leaves nothing behind."""
    split = _fair_call([[True, False, False]], handed=True)  # granted by the first alone
    assert (split.lease.fencing_token, split.cleanups) == (90, 1)
    assert split.lease.lingers
    held = _fair_call([[False, False, False]], handed=True)
    assert (held.lease.fencing_token, held.cleanups) == (90, 0)
    assert not held.lease.lingers


def test_a_release_raises_every_floor_above_a_late_attempt_that_could_grant() -> None:
    """An attempt some node had not answered may still run there after the lease's
    release (which may go on another connection) and grant the lock there for its TTL.
    A release that finds no key raises the node's floor to the lease's token, which
    refuses a late attempt proposing no more. That is enough for a lease its call's
    first attempt granted; after more attempts or a hand-off, the node may hold the key
    from those, and the late attempt may propose more than the lease's token: the
    release then raises every floor ("l") to the highest late proposal (ARGV[5])."""
    # Granted by the first attempt: only the token (no "l").
    call = _fair_call([[True, True, None]])
    assert call.release == [str(call.proposals[0])]
    # Granted by a re-check, the first attempt answered everywhere: no attempt is late.
    call = _fair_call([[False, False, False], [True, True, True]])
    assert call.release == [str(call.proposals[1])]
    # Granted by a re-check not heard from everywhere: "l", its proposal.
    call = _fair_call([[False, False, False], [True, True, None]])
    assert call.release == [str(call.proposals[1]), "l"]
    # Handed over (token 90) after an attempt not heard from everywhere: "l", above 90.
    call = _fair_call([[False, False, None]], handed=True)
    assert call.release == [str(call.proposals[0]), "l"]
    call = _fair_call([[False, False, False]], handed=True)
    assert call.release == ["90"]
