"""Extending and releasing a lease, with a fake clock."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure import ConfigurationError, LeaseExpired, LeaseLost, OwnershipError
from tenure._core.acquire import LeaseState
from tenure._core.config import ClientConfig, LockSpec
from tenure._core.flows import RELEASE_PATIENCE, ExtendLease, Flows, Later, Pause, Run, Sleep
from tenure._core.lease import (
    _script_command,
    begin_extend,
    conclude_extend,
    conclude_release,
    worth_another_try,
)
from tenure._core.quorum import Failure, Round
from tenure._core.watchdog import KeepAlive
from tenure._lua import script

from .model_flows import ModelLease

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=300)

N = 5
NAMES = [f"node{i}" for i in range(N)]
CONFIG = ClientConfig.build([f"redis://h{i}" for i in range(N)], drift_factor=0.01, drift_floor=0.0)
SPEC = LockSpec.build(CONFIG, "res", 10.0)
DRIFT = 0.1


def lease(started: float = 0.0) -> LeaseState:
    return LeaseState(
        name="res",
        key=SPEC.key,
        token="tok",
        ttl=SPEC.ttl,
        started=started,
        valid_until=started + SPEC.ttl - SPEC.drift,
        granted=frozenset({0, 1, 2}),
        fencing_token=1_700_000_000_000_042,
    )


def tally(answers: str, started: float, n: int = N, quorum: int = 3) -> Round:
    """y = yes, n = no, u = failed, . = silent (then timed out)."""
    rnd = Round(n, quorum, started)
    for i, a in enumerate(answers):
        if a == "y":
            rnd.record(i, True)
        elif a == "n":
            rnd.record(i, False)
        elif a == "u":
            rnd.fail(i, Failure.UNREACHABLE, f"down{i}")
    rnd.time_out()
    return rnd


# --- extend -------------------------------------------------------------------------------


def test_spec_drift() -> None:
    assert SPEC.drift == pytest.approx(DRIFT)


@pytest.mark.parametrize("now", [9.9, 9.9 + 1e-9, 10.0, 50.0])
def test_begin_extend_refuses_an_expired_lease(now: float) -> None:
    held = lease(started=0.0)
    assert now >= held.valid_until
    with pytest.raises(LeaseExpired) as info:
        begin_extend(held, SPEC, now)
    error = info.value
    assert isinstance(error, LeaseLost)
    assert isinstance(error, OwnershipError)
    assert isinstance(error, RuntimeError)
    assert error.name == "res"
    assert "cannot extend" in str(error)


def test_begin_extend_opens_a_round_while_valid() -> None:
    rnd = begin_extend(lease(0.0), SPEC, 5.0)
    assert (rnd.started, rnd.needed, len(rnd.results)) == (5.0, 3, N)
    assert not rnd.decided


def test_conclude_extend_moves_validity_to_the_new_round() -> None:
    held = lease(0.0)
    rnd = begin_extend(held, SPEC, 5.0)
    for i in (1, 2, 4):
        rnd.record(i, True)
    result = conclude_extend(held, SPEC, rnd, 5.02, NAMES)
    assert isinstance(result, LeaseState)
    assert result.valid_until == 5.0 + SPEC.ttl - SPEC.drift
    assert result.started == 5.0
    assert result.granted == frozenset({1, 2, 4})
    assert (result.name, result.key, result.token) == (held.name, held.key, held.token)
    # Extending keeps the lease, and so its fencing token: only an acquisition mints one.
    assert result.fencing_token == held.fencing_token


def test_conclude_extend_with_a_new_ttl() -> None:
    held = lease(0.0)
    longer = LockSpec.build(CONFIG, "res", 30.0)
    rnd = tally("yyyyy", started=1.0)
    result = conclude_extend(held, longer, rnd, 1.01, NAMES)
    assert isinstance(result, LeaseState)
    assert result.ttl == 30.0
    assert result.valid_until == 1.0 + 30.0 - longer.drift


# The lease was granted by nodes 0, 1, 2; only nodes 3 and 4 may say "no" here.
@pytest.mark.parametrize("answers", ["yy...", "yyunn", "yuu..", "uuunn", "....."])
def test_conclude_extend_minority_loses_the_lease(answers: str) -> None:
    held = lease(0.0)
    rnd = tally(answers, started=2.0)
    result = conclude_extend(held, SPEC, rnd, 2.05, NAMES)
    assert isinstance(result, LeaseLost)
    assert not isinstance(result, LeaseExpired)
    message = str(result)
    silent = sum(a in "u." for a in answers)
    assert (
        f"confirmed by {answers.count('y')} of {N} nodes before a majority of 3 became "
        f"impossible ({silent} failed to answer)"
    ) in message
    assert result.name == "res"
    failed = {f"node{i}" for i, a in enumerate(answers) if a in "u."}
    assert set(result.node_errors) == failed


@pytest.mark.parametrize(
    ("answers", "dropped"),
    [
        ("nyyyy", "node0"),
        ("nnyyy", "node0, node1"),
        ("yynyy", "node2"),
        ("nnnnn", "node0, node1, node2"),
    ],
)
def test_conclude_extend_refused_by_a_granting_node_loses_the_lease(
    answers: str, dropped: str
) -> None:
    # A node that granted the lease says it is not ours before the lease ran out: it lost
    # its data (or evicted the key, or its clock jumped). Even with a majority of yeses
    # the assumptions behind the lease broke.
    held = lease(0.0)
    rnd = tally(answers, started=2.0)
    result = conclude_extend(held, SPEC, rnd, 2.05, NAMES)
    assert isinstance(result, LeaseLost)
    assert not isinstance(result, LeaseExpired)
    assert f"node(s) {dropped} no longer hold it" in str(result)


def test_conclude_extend_that_took_too_long_loses_the_lease() -> None:
    held = lease(0.0)
    rnd = tally("yyyyy", started=5.0)
    result = conclude_extend(held, SPEC, rnd, 5.0 + SPEC.ttl - SPEC.drift, NAMES)
    assert isinstance(result, LeaseLost)
    assert "took too long" in str(result)


@SETTINGS
@given(
    answers=st.text(alphabet="ynu.", min_size=N, max_size=N),
    started=st.floats(0, 9.8),
    elapsed=st.one_of(st.floats(0, 0.1), st.floats(0, 20)),
)
def test_conclude_extend_property(answers: str, started: float, elapsed: float) -> None:
    held = lease(0.0)
    rnd = tally(answers, started)
    now = started + elapsed
    result = conclude_extend(held, SPEC, rnd, now, NAMES)
    dropped = any(answers[i] == "n" for i in held.granted)
    ok = answers.count("y") >= 3 and started + SPEC.ttl - SPEC.drift - now > 0 and not dropped
    if ok:
        assert isinstance(result, LeaseState)
        assert result.valid_until == started + SPEC.ttl - SPEC.drift > now
        assert result == replace(
            held,
            started=started,
            valid_until=started + SPEC.ttl - SPEC.drift,
            granted=frozenset(i for i, a in enumerate(answers) if a == "y"),
        )
    else:
        assert isinstance(result, LeaseLost)


# --- release ------------------------------------------------------------------------------


@pytest.mark.parametrize("answers", ["yyy..", "yyyyy", "nyyuy"])
@pytest.mark.parametrize("now", [1.0, 9.95, 100.0])
def test_release_with_a_majority_is_clean(answers: str, now: float) -> None:
    rnd = tally(answers, started=now)
    assert conclude_release(lease(0.0), N, 3, rnd, now, NAMES) is None


@pytest.mark.parametrize("answers", ["yy...", "nnnnn", "yyuuu", "....."])
def test_release_without_a_majority_before_expiry_is_lease_lost(answers: str) -> None:
    rnd = tally(answers, started=3.0)
    error = conclude_release(lease(0.0), N, 3, rnd, 3.0, NAMES)
    assert isinstance(error, LeaseLost)
    assert not isinstance(error, LeaseExpired)
    assert f"only {answers.count('y')} of {N} nodes" in str(error)
    assert "(3 needed)" in str(error)
    assert set(error.node_errors) == {f"node{i}" for i, a in enumerate(answers) if a in "u."}


@pytest.mark.parametrize(
    ("answers", "unanswered"), [("yy...", True), ("yyuuu", True), ("yynnn", False)]
)
def test_release_says_whether_the_lease_was_proven_lost(answers: str, unanswered: bool) -> None:
    """Nodes that did not answer may still have held it; nodes that said no did not."""
    error = conclude_release(lease(0.0), N, 3, tally(answers, started=3.0), 3.0, NAMES)
    assert error is not None
    assert ("did not answer" in str(error)) == unanswered
    assert ("another client may have held it" in str(error)) == (not unanswered)


def test_release_decided_before_a_node_answered_does_not_count_it_as_a_no() -> None:
    """Refusals can decide a release before every node answered; a node not heard yet
    may still have held the lease, and the message must not say none did."""
    rnd = Round(3, 2, 3.0)
    rnd.record(0, False)
    rnd.record(1, False)
    assert rnd.decided
    error = conclude_release(lease(0.0), 3, 2, rnd, 3.0, NAMES[:3])
    assert isinstance(error, LeaseLost)
    message = str(error)
    assert "only 0 of the 2 nodes that answered still held it" in message
    assert "1 more not heard" in message
    assert "only 0 of 3 nodes" not in message


def test_a_no_from_a_node_that_never_granted_the_lease_is_no_sign_of_expiry() -> None:
    """Granted by nodes 0 and 2 of 3; at release node 0 is in its reconnect back-off and
    node 1, which never held the lease, says no: the round is decided before node 2,
    which holds it, answers. Nothing says the lease expired."""
    held = replace(lease(0.0), granted=frozenset({0, 2}))
    rnd = Round(3, 2, 3.0)
    rnd.fail(0, Failure.BACKING_OFF, "reconnecting")
    rnd.record(1, False)
    assert rnd.decided
    error = conclude_release(held, 3, 2, rnd, 3.0, NAMES[:3])
    assert isinstance(error, LeaseLost)
    message = str(error)
    assert "cannot be shown that the lease held to the end" in message
    assert "1 did not answer and 1 were not heard before the others decided it" in message
    assert "expired" not in message


@pytest.mark.parametrize("now", [9.9, 10.0, 1000.0])
def test_release_without_a_majority_after_expiry_is_lease_expired(now: float) -> None:
    rnd = tally("ynnnn", started=now)
    error = conclude_release(lease(0.0), N, 3, rnd, now, NAMES)
    assert isinstance(error, LeaseExpired)
    assert error.name == "res"


def test_release_single_node() -> None:
    single = replace(lease(0.0), granted=frozenset({0}))
    assert conclude_release(single, 1, 1, tally("y", 1.0, n=1, quorum=1), 1.0, ["a"]) is None
    error = conclude_release(single, 1, 1, tally("n", 1.0, n=1, quorum=1), 1.0, ["a"])
    assert isinstance(error, LeaseLost)


def test_a_release_waits_longer_for_slow_nodes_than_an_acquire() -> None:
    """Unconfirmed, a release raises LeaseLost: nodes that are only slow (a loaded
    machine) get several node timeouts to confirm it. Healthy nodes cost nothing extra:
    the round is decided at the first majority."""
    cfg = ClientConfig.build([f"redis://h{i}" for i in range(3)], node_timeout=0.05)
    spec = LockSpec.build(cfg, "res", 2.0)
    flows = Flows(cfg, ["a", "b", "c"], random.Random(0), clock=lambda: 10.0, wall_us=lambda: 1)
    state = LeaseState(spec.name, spec.key, "t", spec.ttl, 9.9, 11.8, frozenset({0, 1, 2}), 7)
    op = next(flows.release(ModelLease(state, spec)))
    assert isinstance(op, Run)
    assert RELEASE_PATIENCE >= 4
    assert op.deadline == pytest.approx(10.0 + RELEASE_PATIENCE * 0.05)
    for i in range(2):
        op.rnd.record(i, True, (1,))
    assert op.rnd.decided  # a majority: no waiting for the third


def _flows(clock: list[float]) -> tuple[Flows, LockSpec]:
    cfg = ClientConfig.build([f"redis://h{i}" for i in range(3)], node_timeout=0.05)
    flows = Flows(cfg, ["a", "b", "c"], random.Random(0), lambda: clock[0], lambda: 1)
    return flows, LockSpec.build(cfg, "res", 2.0)


def test_a_release_not_sent_to_nodes_still_connecting_goes_to_them_once_more() -> None:
    """A round that failed only for nodes not asked, their connections still being set
    up (a Cluster node reloading its slot map after a master died), is made again for
    them alone once the set-ups ended, the other answers standing: a second release
    where one ran would find the key gone and report the lease lost. Never after the
    lease's validity."""
    clock = [10.0]
    flows, spec = _flows(clock)
    state = LeaseState(spec.name, spec.key, "t", spec.ttl, 9.9, 11.8, frozenset({0, 1, 2}), 7)
    flow = flows.release(ModelLease(state, spec))
    first = next(flow)
    assert isinstance(first, Run)
    first.rnd.record(0, True)
    first.rnd.fail(1, Failure.CONNECTING, "the slot map is being reloaded")
    first.rnd.fail(2, Failure.CONNECTING, "the slot map is being reloaded")
    second = flow.send(None)
    assert isinstance(second, Run)
    assert list(second.targets or []) == [1, 2]
    assert second.begin_by == 11.8
    assert second.command is first.command
    assert second.rnd.results[0] is not None
    assert second.rnd.results[0].ok
    second.rnd.record(1, True)
    with pytest.raises(StopIteration):
        flow.send(None)  # released: a majority over both rounds
    # Past the validity: no second round, the lease is reported lost.
    clock[0] = 10.0
    flow = flows.release(ModelLease(state, spec))
    first = next(flow)
    assert isinstance(first, Run)
    for i in range(3):
        first.rnd.fail(i, Failure.CONNECTING, "still connecting")
    clock[0] = 11.9
    with pytest.raises(LeaseExpired):
        flow.send(None)


@pytest.mark.parametrize(
    ("acquired", "again"),
    [
        ("yy.", True),  # not heard from when the acquire was decided: may hold the key
        ("yyy", True),
        ("yyn", False),  # refused the acquire: holds no key of the lease
        ("yyc", False),  # not asked by the acquire (its own set-up going on)
        (None, True),  # handed over: who holds it is not all known
    ],
)
def test_a_release_decided_without_a_node_still_connecting_is_sent_there_if_it_may_hold_the_key(
    acquired: str | None, again: bool
) -> None:
    """The blocking client's link sets: a lease may be released on another than the
    one that acquired it, whose connection to a node is still being set up. A majority
    decides the release, but a node that may hold the key would keep the lock for
    nobody until the TTL: the release goes to it once its set-up ended."""
    clock = [10.0]
    flows, spec = _flows(clock)
    acquired_in = None
    if acquired is not None:
        acquired_in = Round(3, 2, 9.9)
        for i, said in enumerate(acquired):
            if said == "c":
                acquired_in.fail(i, Failure.CONNECTING, "still connecting")
            elif said != ".":
                acquired_in.record(i, said == "y")
    state = LeaseState(
        spec.name, spec.key, "t", spec.ttl, 9.9, 11.8, frozenset({0, 1}), 7, acquired_in=acquired_in
    )
    flow = flows.release(ModelLease(state, spec))
    first = next(flow)
    assert isinstance(first, Run)
    first.rnd.record(0, True)
    first.rnd.record(1, True)
    first.rnd.fail(2, Failure.CONNECTING, "not connected yet when the round began")
    if not again:
        with pytest.raises(StopIteration):
            flow.send(None)
        return
    second = flow.send(None)
    assert isinstance(second, Run)
    assert list(second.targets or []) == [2]
    assert second.begin_by == 11.8
    # Decided by the answers carried over, it still waits for the node's set-up.
    assert second.rnd.decided
    assert second.rnd.set_up_wait(0, 1, 0, 10.0, 0.05) is None
    with pytest.raises(StopIteration):
        flow.send(None)


def test_an_extension_not_sent_to_nodes_still_connecting_asks_every_node_again() -> None:
    clock = [10.0]
    flows, spec = _flows(clock)
    state = LeaseState(spec.name, spec.key, "t", spec.ttl, 9.9, 11.8, frozenset({0, 1, 2}), 7)
    watched = ModelLease(state, spec)
    flow = flows.extend(watched, None)
    first = next(flow)
    assert isinstance(first, Run)
    assert first.begin_by == 11.8  # never begins after the validity it extends
    first.rnd.record(0, True)
    for i in (1, 2):
        first.rnd.fail(i, Failure.CONNECTING, "still connecting")
    clock[0] = 10.5
    second = flow.send(None)
    assert isinstance(second, Run)
    assert second.targets is None
    assert second.rnd.started == 10.5
    assert second.begin_by == 11.8
    for i in range(3):
        second.rnd.record(i, True)
    with pytest.raises(StopIteration):
        flow.send(None)
    assert watched._state.started == 10.5  # validity counts from the round that extended
    # A failure of another kind is no reason for a second round.
    flow = flows.extend(watched, None)
    first = next(flow)
    assert isinstance(first, Run)
    first.rnd.fail(0, Failure.UNREACHABLE, "refused")
    first.rnd.fail(1, Failure.CONNECTING, "still connecting")
    later = flow.send(None)
    assert isinstance(later, Later)  # lost: released when the validity ends
    assert later.at == watched._state.valid_until
    # Its flow run a little early (a loop's timer may be), it waits out the rest first.
    clock[0] = later.at - 0.0005
    sleep = next(later.flow)
    assert isinstance(sleep, Sleep)
    assert sleep.seconds == pytest.approx(0.0005)
    clock[0] = later.at
    assert isinstance(later.flow.send(None), Run)


def test_round_again_keeps_the_answers_of_nodes_that_were_asked() -> None:
    rnd = Round(5, 3, 1.0)
    rnd.record(0, True)
    rnd.record(1, False)
    rnd.fail(2, Failure.UNREACHABLE, "refused")
    rnd.fail(3, Failure.CONNECTING, "still connecting")
    assert rnd.connecting() == [3]
    again = rnd.again(2.0, [3])
    assert again.started == 2.0
    assert again.yes == 1
    assert again.failed == 1
    assert again.results[3] is None
    assert again.results[4] is None


@pytest.mark.parametrize(
    ("answers", "again"),
    [
        ("yy...", True),  # silent nodes: the granting ones keep it until its validity ends
        ("yuu..", True),
        ("uuunn", True),  # "no" only from nodes that never granted it
        ("yyyyy", True),  # a majority, but the round took too long (below)
        ("nyyyy", False),  # a granting node said it is not ours: the lease broke
        ("yynuu", False),
    ],
)
def test_a_failed_extension_is_worth_another_try_unless_a_granting_node_dropped_it(
    answers: str, again: bool
) -> None:
    held = lease(0.0)
    rnd = tally(answers, started=2.0)
    now = 2.0 + SPEC.ttl if answers == "yyyyy" else 2.05
    assert isinstance(conclude_extend(held, SPEC, rnd, now, NAMES), LeaseLost)
    assert worth_another_try(held, rnd) is again


@pytest.mark.parametrize("dropped", [False, True])
def test_a_watchdogs_try_that_is_not_its_last_leaves_the_lease_as_it_was(dropped: bool) -> None:
    # A watchdog's try that failed for silent nodes early enough for another to end
    # before the last third of the validity returns its failure, the lease neither marked
    # lost nor released; a node that granted it and dropped it is a loss at any try, and
    # so is a failure of an extension by hand, or of a try that ended too late for
    # another (judged when it ended: 11.8 - 2/3 - 0.05 here).
    policy = KeepAlive()
    for retry, ended in ((policy, 10.05), (None, 10.05), (policy, 11.09)):
        clock = [10.0]
        flows, spec = _flows(clock)
        state = LeaseState(spec.name, spec.key, "t", spec.ttl, 9.9, 11.8, frozenset({0, 1, 2}), 7)
        watched = ModelLease(state, spec)
        flow = flows.extend(watched, None, retry)
        rnd = next(flow)
        assert isinstance(rnd, Run)
        rnd.rnd.record(0, True)
        if dropped:
            rnd.rnd.record(1, False)
        else:
            rnd.rnd.fail(1, Failure.UNREACHABLE, "refused")
        rnd.rnd.fail(2, Failure.UNREACHABLE, "refused")
        clock[0] = ended
        if retry is None or ended > 11.0 or dropped:
            assert isinstance(flow.send(None), Later | Run)  # the loss: its release
            assert watched.loss is not None
            continue
        with pytest.raises(StopIteration) as done:
            flow.send(None)
        assert isinstance(done.value.value, LeaseLost)
        assert watched.loss is None
        assert not watched.released
        assert watched._state == state


@pytest.mark.parametrize("busy_for", [None, 0.5, 5.0])
def test_a_watchdog_stops_extending_while_its_holder_is_stuck(busy_for: float | None) -> None:
    # A holder may say how long its current step has run (busy_since, the streams'
    # handler call): past max_busy the watchdog stops extending and the lease runs out
    # at its validity, reported lost then, so that others may take it. A step that is
    # younger, or no step at all, keeps the lease extended.
    clock = [10.0]
    flows, spec = _flows(clock)  # ttl 2: the watchdog wakes every 2/3 s
    busy_since = None if busy_for is None else 10.7 - busy_for
    policy = KeepAlive(max_busy=3.0, busy_since=lambda: busy_since)
    state = LeaseState(spec.name, spec.key, "t", spec.ttl, 10.0, 11.9, frozenset({0, 1, 2}), 7)
    watched = ModelLease(state, spec)
    flow = flows.watchdog(watched, policy)
    wake = next(flow)
    assert isinstance(wake, Pause)
    assert wake.until == pytest.approx(10.0 + 2.0 / 3)
    clock[0] = 10.7
    op = flow.send(False)
    if busy_for != 5.0:
        assert isinstance(op, ExtendLease)
        return
    assert isinstance(op, Pause)  # no extension: wait for the validity's end
    assert op.until == 11.9
    assert watched.loss is None  # valid until then: a step that returns may still ack
    clock[0] = 11.9
    with pytest.raises(StopIteration):
        flow.send(False)
    loss = watched.lost_error  # (not watched.loss: mypy holds it None from above)
    assert isinstance(loss, LeaseExpired)
    assert "max_busy=3s" in str(loss)


@pytest.mark.parametrize("woken", ["early", "on time", "by an extension by hand"])
def test_a_watchdog_woken_early_at_its_give_up_reports_the_cap_not_a_pause(woken: str) -> None:
    # A loop's timer may run up to its clock's resolution early (uvloop's: a millisecond).
    # Woken so at the end of a capped lease's validity, the watchdog decided again, and,
    # at or past that end by then, reported the lease lost as if its holder had been
    # paused, not held for max_hold. It waits out the rest now; a lease the holder
    # extended by hand meanwhile is judged again, never reported lost while valid.
    clock = [10.0]
    flows, spec = _flows(clock)  # ttl 2: the watchdog wakes 2/3 s after a grant
    state = LeaseState(spec.name, spec.key, "t", spec.ttl, 10.0, 11.9, frozenset({0, 1, 2}), 7)
    watched = ModelLease(state, spec)
    flow = flows.watchdog(watched, KeepAlive(max_hold=2.5))
    assert isinstance(next(flow), Pause)
    clock[0] = 10.7  # 10.7 + 2 is past the cap of 12.5: no extension
    op = flow.send(False)
    assert isinstance(op, Pause)
    assert op.until == 11.9
    if woken == "by an extension by hand":
        clock[0] = 11.0
        watched._state = replace(state, started=11.0, ttl=1.0, valid_until=11.99)
        op = flow.send(False)
        assert isinstance(op, Pause)
        assert op.until == pytest.approx(11.0 + 1.0 / 3)
        assert watched.loss is None
        return
    if woken == "early":
        clock[0] = 11.9 - 0.0005
        op = flow.send(False)
        assert isinstance(op, Pause)
        assert op.until == 11.9
        assert watched.loss is None
    clock[0] = 11.9 + 0.001
    with pytest.raises(StopIteration):
        flow.send(False)
    loss = watched.lost_error
    assert isinstance(loss, LeaseExpired)
    assert "max_hold=2.5s" in str(loss)


@pytest.mark.parametrize(
    ("options", "parameter"),
    [({"max_busy": 0.0, "busy_since": lambda: None}, "max_busy"), ({"max_busy": 1.0}, "max_busy")],
)
def test_a_stuck_holders_limit_is_checked(options: dict[str, object], parameter: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        KeepAlive(**options)  # type: ignore[arg-type]
    assert info.value.parameter == parameter


@pytest.mark.parametrize(
    ("error", "command"),
    [
        # Redis 7 and Valkey name the command; the line is that of the pcall's raise.
        (
            "ERR ACL failure in script: User np has no permissions to run the 'publish' "
            "command script: on @user_script:115.",
            "PUBLISH",
        ),
        # A channel refused: only PUBLISH touches one in tenure's scripts.
        (
            "ERR ACL failure in script: No permissions to access a channel script: on "
            "@user_script:115.",
            "PUBLISH",
        ),
        # Nothing to go by.
        ("ERR something else", "a command"),
    ],
)
def test_the_command_a_release_refused_is_named(error: str, command: str) -> None:
    assert _script_command("release", error) == command


def test_on_redis_6_2_the_refused_call_is_the_last_line_named() -> None:
    # 6.2 gives the raise's line first, then the refused call's inside it.
    lines = script("release").wire.splitlines()
    publish = next(i for i, line in enumerate(lines, 1) if b'redis.call("PUBLISH"' in line)
    error = (
        "Error running script (call to f_x): @user_script:60: @user_script: "
        f"{publish}: The user executing the script can't run this command or subcommand"
    )
    assert _script_command("release", error) == "PUBLISH"
