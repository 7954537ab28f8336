"""An interrupt thrown into a flow leaves it with only instant cleanup behind it.

``KeyboardInterrupt`` and asyncio's ``CancelledError`` must not wait for anything on
their way out (``flows.INSTANT``), and ``drive`` refuses a flow that breaks the rule.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from tenure._core import commands
from tenure._core.acquire import LeaseState, Refused
from tenure._core.config import ClientConfig, LockSpec
from tenure._core.flows import (
    INSTANT,
    AwaitWake,
    Depart,
    Flow,
    Flows,
    Listen,
    Op,
    Run,
    Send,
    Sleep,
    drive,
)
from tenure._core.quorum import Round
from tenure._core.waiting import Departed

from .model_flows import Interrupt, ModelInbox, ModelLease

CONFIG = ClientConfig.build([f"redis://node{i}" for i in range(3)], recheck=0.5)
SPEC = LockSpec.build(CONFIG, "interrupted", 1.0)


def _flows() -> Flows:
    return Flows(CONFIG, ["a", "b", "c"], random.Random(0), clock=lambda: 0.0, wall_us=lambda: 1)


def _held_everywhere(flow: Flow[Any], op: Op) -> Op:
    """Answer the attempt ``op`` with "held" by every node (a waiting acquirer's round)."""
    assert isinstance(op, Run)
    for i in range(3):
        op.rnd.record(i, False, (0, 5, 5, 800))
    return flow.send(None)


def _until(flow: Flow[Any], kind: type[Op]) -> Op:
    """Run ``flow`` (every operation completing at once) up to its first ``kind``."""
    op = next(flow)
    inbox = ModelInbox("w", 2)
    while not isinstance(op, kind):
        if isinstance(op, Run) and op.targets is None:  # an attempt (cleanups have targets)
            op = _held_everywhere(flow, op)
        elif isinstance(op, Run):
            op.rnd.time_out()
            op = flow.send(None)
        else:
            op = flow.send(inbox if isinstance(op, Listen) else None)
    return op


def _acquire(flows: Flows, listening: bool) -> Flow[LeaseState | Refused]:
    return flows.acquire(SPEC, True, None, waiter="w", channel="ch", listening=listening)


def _unwind(flow: Flow[Any], exc: BaseException) -> list[Op]:
    """Throw ``exc`` in; the operations the flow yields before it leaves (each done)."""
    ops: list[Op] = []

    def run() -> None:
        op = flow.throw(exc)
        while True:
            ops.append(op)
            op = flow.send(None)

    with pytest.raises(type(exc)) as left:
        run()
    assert left.value is exc
    return ops


INTERRUPTS: list[Callable[[], BaseException]] = [KeyboardInterrupt, lambda: Interrupt("cancel")]


@pytest.mark.parametrize("interrupt", INTERRUPTS, ids=["KeyboardInterrupt", "cancelled"])
@pytest.mark.parametrize(
    ("listening", "at"),
    [(False, Run), (True, Run), (True, AwaitWake)],
    ids=["first attempt", "queued attempt", "waiting"],
)
def test_an_interrupted_acquire_writes_its_cleanup_without_waiting(
    interrupt: Callable[[], BaseException], listening: bool, at: type[Op]
) -> None:
    flow = _acquire(_flows(), listening)
    _until(flow, at)
    ops = _unwind(flow, interrupt())
    assert ops, "an interrupted attempt writes a release where its grant may have landed"
    assert all(isinstance(op, INSTANT) for op in ops), ops
    if listening:
        # It queued: it leaves its queues, and declines what still reaches it.
        assert any(isinstance(op, Send) for op in ops)


@pytest.mark.parametrize("interrupt", INTERRUPTS, ids=["KeyboardInterrupt", "cancelled"])
def test_an_interrupted_release_writes_it_again_and_leaves(
    interrupt: Callable[[], BaseException],
) -> None:
    """Interrupted in its round, perhaps before anything was written: the lease is
    marked released (neither the caller nor its watchdog releases it again), so the
    release goes out once more, only written, to every node that had not answered; its
    keys held the lock for nobody until the TTL."""
    flows = _flows()
    state = LeaseState(SPEC.name, SPEC.key, "t", SPEC.ttl, 0.0, 0.9, frozenset({0, 1, 2}), 7)
    lease = ModelLease(state, SPEC)
    flow = flows.release(lease)
    first = next(flow)
    assert isinstance(first, Run)
    first.rnd.record(1, True)  # the second node answered before the interrupt
    ops = _unwind(flow, interrupt())
    assert len(ops) == 1, ops
    assert isinstance(ops[0], Send)
    assert sorted(ops[0].targets) == [0, 2]
    assert ops[0].command.key == SPEC.key
    assert lease.released


def _lingering() -> ModelLease:
    """A lease whose call left an attempt some node may still run (``lingers``)."""
    state = LeaseState(
        SPEC.name, SPEC.key, "w", SPEC.ttl, 0.0, 0.9, frozenset({0, 1, 2}), 7, lingers=True
    )
    return ModelLease(state, SPEC)


def test_a_lingering_lease_declines_what_comes_during_its_release_only_after_it() -> None:
    """A notification that reaches a lingering lease's id during its release round is
    declined once the round is over: its dequeue deletes a lock key holding that id, the
    lease's own, so sent at once it could run ahead of the release on that node, and the
    release would report the lease lost although it was valid."""
    flows = _flows()
    lease = _lingering()
    departed = Departed()
    declined: list[int] = []
    flow = flows.release(lease)
    op = next(flow)
    now = 0.0
    while not isinstance(op, Run):
        assert isinstance(op, Depart)
        assert departed.add(op.waiter, declined.append, op.until, now, hold=op.hold) == []
        op = flow.send(None)
    assert departed.decline("w", 1, now)  # reaches the id while the release is out
    for i in range(3):
        op.rnd.record(i, True)
    assert declined == []  # not before the round is over
    op = flow.send(None)
    assert isinstance(op, Depart)
    assert not op.hold
    declined.extend(departed.add(op.waiter, declined.append, op.until, now))
    with pytest.raises(StopIteration):
        flow.send(None)
    assert lease.loss is None
    assert declined == [1]


@pytest.mark.parametrize("interrupt", INTERRUPTS, ids=["KeyboardInterrupt", "cancelled"])
def test_an_interrupted_release_of_a_lingering_lease_stops_holding_its_declines(
    interrupt: Callable[[], BaseException],
) -> None:
    flows = _flows()
    lease = _lingering()
    flow = flows.release(lease)
    first = next(flow)
    assert isinstance(first, Depart)
    assert first.hold
    assert isinstance(flow.send(None), Run)
    ops = _unwind(flow, interrupt())
    assert all(isinstance(op, INSTANT) for op in ops), ops
    assert isinstance(ops[-1], Depart)
    assert not ops[-1].hold


def _rude() -> Flow[None]:
    """A flow that breaks the rule: it waits (sleeps) while an interrupt propagates."""
    try:
        yield Run(commands.exists("k"), Round(1, 1, 0.0), 1.0)
    except BaseException:
        yield Sleep(1.0)
        raise


def _polite() -> Flow[None]:
    try:
        yield Run(commands.exists("k"), Round(1, 1, 0.0), 1.0)
    except BaseException:
        yield Send(commands.exists("k"), Round.cleanup(1, frozenset(), 0.0), [0])
        raise


def _interrupting(op: Op) -> None:
    if isinstance(op, Run):
        raise KeyboardInterrupt
    if isinstance(op, Sleep):
        raise AssertionError("drive carried out a sleep while interrupted")


def test_drive_refuses_a_flow_that_waits_while_interrupted() -> None:
    with pytest.raises(RuntimeError, match="yielded Sleep while being interrupted"):
        drive(_rude(), _interrupting)


def test_drive_lets_instant_cleanup_through() -> None:
    with pytest.raises(KeyboardInterrupt):
        drive(_polite(), _interrupting)
