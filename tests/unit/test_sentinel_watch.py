"""The watch of a Sentinel-managed node (``_core/sentinel_watch.py``): on how many and
which Sentinels it subscribes, and when it gives one up."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenure._core.backoff import BACKOFF_MIN
from tenure._core.sentinel_watch import (
    PATIENCE,
    REFUSED_REST,
    WATCH_PING,
    Config,
    WatchPlan,
    master_config,
    watched,
)

S = [("10.0.0.1", 26379), ("10.0.0.2", 26379), ("10.0.0.3", 26379)]


@pytest.mark.parametrize("sentinels", range(1, 10))
def test_the_sentinels_watched_include_one_of_every_majority_and_no_more(sentinels: int) -> None:
    majority = sentinels // 2 + 1
    count = watched(sentinels)
    everyone = range(sentinels)
    for chosen in itertools.combinations(everyone, count):
        for voters in itertools.combinations(everyone, majority):
            assert set(chosen) & set(voters)
    # One fewer misses some majority (the one made of all the others).
    assert count - 1 + majority <= sentinels


def test_two_of_three_are_subscribed_on_first_in_the_order_asked() -> None:
    plan = WatchPlan(3, ask_timeout=0.3)
    assert plan.to_subscribe([S[2], S[0], S[1]], now=0.0) == [S[2], S[0]]
    plan.subscribed(S[2], 0.0)
    assert plan.to_subscribe([S[2], S[0], S[1]], now=0.0) == [S[0]]
    plan.subscribed(S[0], 0.0)
    assert plan.to_subscribe(S, now=0.0) == []
    assert sorted(plan.held()) == sorted([S[2], S[0]])


def test_a_failed_sentinel_rests_for_the_back_off_and_the_next_one_is_taken() -> None:
    plan = WatchPlan(3, ask_timeout=0.3)
    for s in S[:2]:
        plan.subscribed(s, 0.0)
    plan.failed(S[0], 1.0)
    assert plan.to_subscribe(S, now=1.0) == [S[2]]
    plan.failed(S[2], 1.0)  # the third one fails too: nothing free until a rest ends
    assert plan.to_subscribe(S, now=1.0) == []
    assert plan.to_subscribe(S, now=1.0 + BACKOFF_MIN) == [S[0]]
    # Each failure in a row doubles the rest; a subscription that came up resets it.
    plan.failed(S[0], 2.0)
    assert plan.to_subscribe(S, now=2.0 + BACKOFF_MIN) == [S[2]]
    assert plan.to_subscribe([S[0]], now=2.0 + BACKOFF_MIN) == []
    assert plan.to_subscribe([S[0]], now=2.0 + 2 * BACKOFF_MIN) == [S[0]]
    plan.subscribed(S[0], 3.0)
    plan.failed(S[0], 4.0)
    assert plan.to_subscribe([S[0]], now=4.0 + BACKOFF_MIN) == [S[0]]


def test_a_refused_subscription_rests_a_minute() -> None:
    plan = WatchPlan(3, ask_timeout=0.3)
    for s in S:
        plan.failed(s, 0.0, refused=True)
    assert plan.to_subscribe(S, now=REFUSED_REST - 0.01) == []
    assert plan.to_subscribe(S, now=REFUSED_REST) == S[:2]


def test_a_quiet_subscription_is_pinged_and_given_up_if_the_ping_goes_unanswered() -> None:
    plan = WatchPlan(3, ask_timeout=0.3)
    plan.subscribed(S[0], 0.0)
    plan.subscribed(S[1], 0.5)
    assert plan.due(WATCH_PING - 0.01) == ([], [])
    assert plan.due(WATCH_PING) == ([S[0]], [])
    plan.pinged(S[0], WATCH_PING)
    assert plan.due(WATCH_PING + 0.5) == ([S[1]], [])  # S[0]'s PING is not sent twice
    plan.pinged(S[1], WATCH_PING + 0.5)
    plan.heard(S[1], WATCH_PING + 0.6)  # S[1] answers: quiet from then on
    # The patience is a second at least, however short the ask timeout.
    assert plan.due(WATCH_PING + PATIENCE) == ([], [])
    assert plan.due(WATCH_PING + PATIENCE + 0.01) == ([], [S[0]])
    assert plan.due(2 * WATCH_PING + 0.61) == ([S[1]], [S[0]])


def test_the_patience_is_the_ask_timeout_when_longer() -> None:
    plan = WatchPlan(3, ask_timeout=2.5)
    plan.subscribed(S[0], 0.0)
    plan.pinged(S[0], WATCH_PING)
    assert plan.due(WATCH_PING + 2.5) == ([], [])
    assert plan.due(WATCH_PING + 2.51) == ([], [S[0]])


def test_an_announcement_is_as_good_as_a_pong() -> None:
    plan = WatchPlan(1, ask_timeout=0.3)
    plan.subscribed(S[0], 0.0)
    plan.heard(S[0], 1.5)
    assert plan.due(WATCH_PING + 1.0) == ([], [])
    assert plan.due(WATCH_PING + 1.5) == ([S[0]], [])


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["subscribed", "failed", "refused", "heard", "pinged"]),
            st.sampled_from(S),
            st.floats(0.0, 5.0),
        ),
        max_size=40,
    )
)
def test_never_more_held_than_watched_nor_a_held_or_resting_one_offered(
    steps: list[tuple[str, tuple[str, int], float]],
) -> None:
    plan = WatchPlan(3, ask_timeout=0.3)
    now = 0.0
    resting_until: dict[tuple[str, int], float] = {}
    for step, sentinel, later in steps:
        now += later
        offered = plan.to_subscribe(S, now)
        assert len(plan.held()) + len(offered) <= watched(len(S))
        assert not set(offered) & set(plan.held())
        assert all(resting_until.get(s, 0.0) <= now for s in offered)
        if step == "subscribed" and sentinel in offered:
            plan.subscribed(sentinel, now)
        elif step in ("failed", "refused") and sentinel in plan.held():
            plan.failed(sentinel, now, refused=step == "refused")
            resting_until[sentinel] = now + (REFUSED_REST if step == "refused" else BACKOFF_MIN)
        elif step == "heard":
            plan.heard(sentinel, now)
        elif step == "pinged":
            plan.pinged(sentinel, now)


# --- a failover announced while no subscription was up ------------------------------------

M0, M1, M2 = ("10.0.1.1", 6379), ("10.0.1.2", 6379), ("10.0.1.3", 6379)


def test_a_newer_epoch_moves_the_connections_and_an_older_one_not() -> None:
    plan = WatchPlan(3, ask_timeout=0.3)
    assert plan.told(Config(4, M0)) is None  # the reference: where the connections went
    assert plan.told(Config(4, M0)) is None  # the same configuration
    assert plan.told(Config(3, M1)) is None  # a Sentinel behind, naming an old master
    assert plan.told(Config(6, M1)) == M1  # a failover nobody announced
    assert plan.told(Config(6, M1)) is None  # heard once: the reference now
    assert plan.told(Config(5, M0)) is None  # behind that one
    # Failovers that ended where the connections are: they are told all the same (they
    # stay, and a connection set up from an older answer elsewhere is refused).
    assert plan.told(Config(8, M1)) == M1
    assert plan.told(Config(9, M2)) == M2


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("failover"), st.sampled_from([M0, M1, M2]), st.booleans()),
            st.tuples(st.just("answer"), st.integers(0, 20)),
        ),
        max_size=40,
    )
)
def test_the_connections_move_only_forward_and_reach_the_newest_master(
    steps: list[tuple[object, ...]],
) -> None:
    """Failovers, each announced (the connections follow the announcement) or not, and
    answers from Sentinels that know any prefix of them (a Sentinel behind the others
    knows an older one): every move goes to the master of a configuration newer than
    every one heard, and once a Sentinel that knows the newest failover answers, the
    connections are on its master."""
    history = [Config(0, M0)]
    plan = WatchPlan(3, ask_timeout=0.3)
    assert plan.told(history[0]) is None  # the reference
    newest_told = 0  # the newest configuration heard (its index)
    where = M0  # where the connections are
    for step in steps:
        if step[0] == "failover":
            _, master, announced = step
            assert isinstance(master, tuple)
            history.append(Config(history[-1].epoch + 1 + bool(announced), master))
            if announced:
                where = master
            continue
        assert isinstance(step[1], int)
        known = min(step[1], len(history) - 1)  # how far this Sentinel knows
        moved = plan.told(history[known])
        if known > newest_told:
            assert moved == history[known].master
            where = moved
        else:
            assert moved is None
        newest_told = max(newest_told, known)
        if known == len(history) - 1:
            assert where == history[-1].master


@pytest.mark.parametrize(
    ("reply", "config"),
    [
        # RESP2: field names and values, flat (the watch's connections speak RESP2)
        ([b"name", b"svc", b"ip", b"10.0.1.2", b"port", b"6379", b"config-epoch", b"7"], 7),
        # RESP3: a map
        ({b"ip": b"10.0.1.2", b"port": b"6379", b"config-epoch": b"0", b"num-slaves": b"1"}, 0),
        ({"ip": "10.0.1.2", "port": "6379", "config-epoch": "12"}, 12),
    ],
)
def test_a_sentinels_configuration_is_read_from_either_protocol(reply: object, config: int) -> None:
    assert master_config(reply) == Config(config, M1)


@pytest.mark.parametrize(
    "reply",
    [
        None,
        b"OK",
        [b"ip", b"10.0.1.2", b"port"],  # odd: not names and values
        [b"ip", b"10.0.1.2", b"port", b"6379"],  # no epoch
        [b"ip", b"10.0.1.2", b"port", b"0", b"config-epoch", b"1"],
        [b"ip", b"", b"port", b"6379", b"config-epoch", b"1"],
        [b"ip", b"10.0.1.2", b"port", b"6379", b"config-epoch", b"-1"],
        [[b"ip"], b"10.0.1.2"],  # a name that is not text
    ],
)
def test_a_reply_without_a_configuration_names_none(reply: object) -> None:
    assert master_config(reply) is None
