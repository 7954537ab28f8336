"""A model of the whole algorithm: K clients, N fake nodes, a fake clock, interleaved rounds.

Each fake node is a dict ``key -> (token, expires_at)`` that implements exactly what the
real commands do (``SET NX PX``, compare-and-delete, compare-and-expire), evaluated at the
fake time the request reaches it. Clients drive the real core (``Acquisition``, ``Round``,
``begin_extend`` / ``conclude_extend``, ``conclude_release``); only the transport is faked.

A round is not atomic: each request is delivered by its own rule, so other clients' rounds,
time steps and node failures interleave with it, and a request still in flight when its
round is concluded may reach its node later ("orphan"), as on a real network.

Assumptions of the model (those under which the core promises safety): no node loses its
data, no clock jumps or skews (drift_factor = drift_floor = 0), tokens are unique per
attempt. Invariants:

* at any fake time at most one client holds a lease with ``valid_until > now``;
* the intervals during which clients hold leases never overlap (a stronger form of the
  above that also covers instants the clock jumped over);
* while a lease is valid, every node that granted it still stores its token.

The last two tests break the core's arithmetic on purpose and check that the model
notices, so a model too weak to find anything cannot pass silently.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Literal

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tenure import LeaseExpired
from tenure._core.acquire import Acquisition, GiveUp, Granted, LeaseState, Retry
from tenure._core.config import ClientConfig, LockSpec
from tenure._core.lease import begin_extend, conclude_extend, conclude_release
from tenure._core.policy import wait_random
from tenure._core.quorum import Failure, Round

K = 3  # clients
TTL = 1.0
NODE_TIMEOUT = 0.1
PICK = st.integers(0, 2**16)  # index into whatever is eligible, modulo its length

Kind = Literal["acquire", "extend"]


class FakeNode:
    """One Redis master: keys with absolute expiry times on the (shared, unskewed) clock."""

    def __init__(self) -> None:
        self.store: dict[str, tuple[str, float]] = {}
        self.down_until_ms = 0

    def holder(self, key: str, now: float) -> str | None:
        entry = self.store.get(key)
        if entry is None or now >= entry[1]:
            return None
        return entry[0]

    def set_nx_px(self, key: str, token: str, ttl_ms: int, now: float) -> bool:
        if self.holder(key, now) is not None:
            return False
        self.store[key] = (token, now + ttl_ms / 1000)
        return True

    def compare_and_delete(self, key: str, token: str, now: float) -> bool:
        if self.holder(key, now) != token:
            return False
        del self.store[key]
        return True

    def compare_and_expire(self, key: str, token: str, ttl_ms: int, now: float) -> bool:
        if self.holder(key, now) != token:
            return False
        self.store[key] = (token, now + ttl_ms / 1000)
        return True


@dataclass
class InFlight:
    """A round a client is waiting on: requests not yet delivered are ``pending``."""

    kind: Kind
    rnd: Round
    token: str
    pending: set[int]


@dataclass
class ModelClient:
    acquisition: Acquisition | None = None
    op: InFlight | None = None
    lease: LeaseState | None = None
    wake_at: float = 0.0


@dataclass
class Holding:
    """A span of fake time during which a client relies on its lease."""

    client: int
    start: float
    end: float
    facts: list[str] = field(default_factory=list)


class LockModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ms = 0  # the fake clock, in whole milliseconds
        self.nodes: list[FakeNode] = []
        self.clients = [ModelClient() for _ in range(K)]
        self.orphans: list[tuple[int, Kind, str]] = []
        self.holdings: list[Holding] = []
        self.tokens = 0
        self.rng = random.Random(0)

    @property
    def now(self) -> float:
        return self.ms / 1000

    @initialize(n=st.sampled_from([3, 5, 1]))
    def setup(self, n: int) -> None:
        self._setup(n)

    def _setup(self, n: int) -> None:
        config = ClientConfig.build(
            [f"redis://node{i}" for i in range(n)],
            node_timeout=NODE_TIMEOUT,
            drift_factor=0.0,
            drift_floor=0.0,
        )
        self.spec = self.break_spec(LockSpec.build(config, "model", TTL))
        self.names = [f"node{i}" for i in range(n)]
        self.nodes = [FakeNode() for _ in range(n)]

    def break_spec(self, spec: LockSpec) -> LockSpec:
        """Tests that check the model has teeth override this to break the core's maths."""
        return spec

    # --- helpers ------------------------------------------------------------------------

    def _new_token(self, client: int) -> str:
        self.tokens += 1
        return f"c{client}-t{self.tokens}"

    def _execute(self, node: int, kind: Kind | Literal["release"], token: str) -> bool:
        key, ttl_ms, now = self.spec.key, self.spec.ttl_ms, self.now
        target = self.nodes[node]
        if kind == "acquire":
            return target.set_nx_px(key, token, ttl_ms, now)
        if kind == "extend":
            return target.compare_and_expire(key, token, ttl_ms, now)
        return target.compare_and_delete(key, token, now)

    def _up(self, node: int) -> bool:
        return self.ms >= self.nodes[node].down_until_ms

    def _release_on(self, nodes: frozenset[int] | range, token: str) -> Round:
        rnd = Round(len(self.nodes), self.spec.quorum, self.now)
        for i in nodes:
            if self._up(i):
                rnd.record(i, self._execute(i, "release", token))
            else:
                rnd.fail(i, Failure.UNREACHABLE, "down")
        rnd.time_out()
        return rnd

    def _stop_holding(self, client: int) -> None:
        for h in self.holdings:
            if h.client == client and h.end > self.now:
                h.end = self.now

    def _start_holding(self, client: int, lease: LeaseState, how: str) -> None:
        new = Holding(client, self.now, lease.valid_until, [f"{how} at {self.now}: {lease}"])
        assert new.start < new.end
        for h in self.holdings:
            if h.client != client and h.start < new.end and new.start < h.end:
                raise AssertionError(
                    f"two clients hold the lock at once: client {h.client} during "
                    f"[{h.start}, {h.end}) {h.facts} and client {client} during "
                    f"[{new.start}, {new.end}) {new.facts}"
                )
        self.holdings.append(new)

    def _eligible_to_start(self) -> list[int]:
        return [c for c, s in enumerate(self.clients) if s.op is None and s.lease is None]

    def _holders(self) -> list[int]:
        return [c for c, s in enumerate(self.clients) if s.op is None and s.lease is not None]

    # --- rules --------------------------------------------------------------------------

    @precondition(lambda self: self.nodes and self._eligible_to_start())
    @rule(pick=PICK, blocking=st.booleans(), timeout=st.none() | st.integers(0, 3000))
    def start_acquire(self, pick: int, blocking: bool, timeout: int | None) -> None:
        eligible = self._eligible_to_start()
        c = eligible[pick % len(eligible)]
        state = self.clients[c]
        # A client backing off sleeps until it wakes up: the clock moves on meanwhile.
        self.ms = max(self.ms, math.floor(state.wake_at * 1000))
        while self.now < state.wake_at:
            self.ms += 1
        if state.acquisition is None:
            state.acquisition = Acquisition(
                self.spec,
                wait_random(0.0, 0.2),
                self.rng,
                blocking=blocking,
                timeout=None if timeout is None else timeout / 1000,
                now=self.now,
                node_names=self.names,
            )
        rnd = state.acquisition.begin(self.now)
        state.op = InFlight("acquire", rnd, self._new_token(c), set(range(len(self.nodes))))

    @precondition(lambda self: self._holders())
    @rule(pick=PICK)
    def start_extend(self, pick: int) -> None:
        holders = self._holders()
        c = holders[pick % len(holders)]
        state = self.clients[c]
        assert state.lease is not None
        try:
            rnd = begin_extend(state.lease, self.spec, self.now)
        except LeaseExpired:
            assert self.now >= state.lease.valid_until
            self._release(c)
            return
        state.op = InFlight("extend", rnd, state.lease.token, set(range(len(self.nodes))))

    def _in_flight(self) -> list[tuple[int, InFlight]]:
        return [(c, s.op) for c, s in enumerate(self.clients) if s.op is not None]

    def _undelivered(self) -> list[tuple[int, InFlight]]:
        return [(c, op) for c, op in self._in_flight() if op.pending]

    def _ready(self) -> list[tuple[int, InFlight]]:
        """Rounds the driver may conclude: decided, or past their deadline."""
        return [
            (c, op)
            for c, op in self._in_flight()
            if op.rnd.decided or self.now >= op.rnd.started + NODE_TIMEOUT
        ]

    @precondition(lambda self: self._undelivered())
    @rule(pick=PICK, node_pick=PICK, latency=st.integers(0, 40))
    def deliver(self, pick: int, node_pick: int, latency: int) -> None:
        """After ``latency`` ms, one request reaches its node, which executes it at once."""
        self.ms += latency
        waiting = self._undelivered()
        _, op = waiting[pick % len(waiting)]
        self._deliver_one(op, node_pick)

    def _deliver_one(self, op: InFlight, node_pick: int) -> None:
        pending = sorted(op.pending)
        node = pending[node_pick % len(pending)]
        op.pending.discard(node)
        up = self._up(node)
        answer = self._execute(node, op.kind, op.token) if up else None
        if op.rnd.decided:
            return  # the driver stopped reading once the round was decided
        if answer is None:
            op.rnd.fail(node, Failure.UNREACHABLE, "connection refused")
        else:
            op.rnd.record(node, answer)

    @precondition(lambda self: self._undelivered())
    @rule(pick=PICK, order=st.randoms(use_true_random=False))
    def deliver_all(self, pick: int, order: random.Random) -> None:
        """Every request of one round arrives, in some order, with no time passing."""
        waiting = self._undelivered()
        _, op = waiting[pick % len(waiting)]
        for node_pick in [order.randrange(2**16) for _ in range(len(op.pending))]:
            self._deliver_one(op, node_pick)

    @precondition(lambda self: self._ready())
    @rule(pick=PICK)
    def conclude(self, pick: int) -> None:
        ready = self._ready()
        c, op = ready[pick % len(ready)]
        state = self.clients[c]
        state.op = None
        if not op.rnd.decided:
            op.rnd.time_out()
        # Requests still on the wire may reach their node later.
        self.orphans.extend((node, op.kind, op.token) for node in sorted(op.pending))
        if op.kind == "acquire":
            self._conclude_acquire(c, op)
        else:
            self._conclude_extend(c, op)

    def _conclude_acquire(self, c: int, op: InFlight) -> None:
        state = self.clients[c]
        assert state.acquisition is not None
        step = state.acquisition.conclude(op.rnd, op.token, self.now)
        if isinstance(step, Granted):
            lease = step.lease
            assert lease.token == op.token
            assert len(lease.granted) >= self.spec.quorum
            assert lease.valid_until > self.now
            state.lease = lease
            state.acquisition = None
            self._start_holding(c, lease, "acquired")
            return
        self._release_on(step.cleanup, op.token)
        if isinstance(step, Retry):
            assert step.sleep >= 0
            state.wake_at = self.now + step.sleep
        else:
            assert isinstance(step, GiveUp)
            state.acquisition = None

    def _conclude_extend(self, c: int, op: InFlight) -> None:
        state = self.clients[c]
        assert state.lease is not None
        result = conclude_extend(state.lease, self.spec, op.rnd, self.now, self.names)
        if isinstance(result, LeaseState):
            assert result.valid_until > self.now
            state.lease = result
            self._start_holding(c, result, "extended")
        else:
            self._release(c)

    def _release(self, c: int) -> None:
        state = self.clients[c]
        lease = state.lease
        assert lease is not None
        self._stop_holding(c)
        rnd = self._release_on(range(len(self.nodes)), lease.token)
        outcome = conclude_release(
            lease, len(self.nodes), self.spec.quorum, rnd, self.now, self.names
        )
        if self.now < lease.valid_until and all(self._up(i) for i in lease.granted):
            # Nobody can have removed our token from a granting node while it was valid.
            assert outcome is None, outcome
        state.lease = None

    @precondition(lambda self: self._holders())
    @rule(pick=PICK)
    def release(self, pick: int) -> None:
        holders = self._holders()
        self._release(holders[pick % len(holders)])

    @precondition(lambda self: self.orphans)
    @rule(pick=PICK)
    def deliver_orphan(self, pick: int) -> None:
        node, kind, token = self.orphans.pop(pick % len(self.orphans))
        if self._up(node):
            self._execute(node, kind, token)

    @rule(step=st.integers(0, 100) | st.integers(0, 1500))
    def advance_time(self, step: int) -> None:
        self.ms += step

    @precondition(
        lambda self: (
            self.nodes
            and sum(not self._up(i) for i in range(len(self.nodes)))
            <= len(self.nodes) - self.spec.quorum
        )
    )
    @rule(pick=PICK, duration=st.integers(0, 2500))
    def node_goes_down(self, pick: int, duration: int) -> None:
        """A node crashes or is cut off, and comes back (with its data) ``duration`` ms later."""
        node = self.nodes[pick % len(self.nodes)]
        node.down_until_ms = max(node.down_until_ms, self.ms + duration)

    # --- invariants ---------------------------------------------------------------------

    @invariant()
    def at_most_one_valid_lease(self) -> None:
        valid = [
            (c, s.lease)
            for c, s in enumerate(self.clients)
            if s.lease is not None and s.lease.valid_until > self.now
        ]
        assert len(valid) <= 1, f"at {self.now}: {valid}"

    @invariant()
    def granting_nodes_keep_the_token_while_valid(self) -> None:
        for s in self.clients:
            lease = s.lease
            if lease is None or lease.valid_until <= self.now:
                continue
            for i in lease.granted:
                holder = self.nodes[i].holder(self.spec.key, self.now)
                assert holder == lease.token, (i, holder, lease)


MODEL_SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=250,
    stateful_step_count=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_model_mutual_exclusion() -> None:
    run_state_machine_as_test(LockModel, settings=MODEL_SETTINGS)


# --- the model has teeth ----------------------------------------------------------------

FIND_SETTINGS = settings(
    MODEL_SETTINGS,
    max_examples=1000,
    phases=[Phase.generate],
    report_multiple_bugs=False,
)


class QuorumOfOne(LockModel):
    """A core that counted one yes as enough would let two clients win."""

    def break_spec(self, spec: LockSpec) -> LockSpec:
        return replace(spec, quorum=1)

    @initialize(n=st.just(3))  # with one node, a quorum of one is right
    def setup(self, n: int) -> None:
        self._setup(n)


class ValidityTooLong(LockModel):
    """A core that promised validity beyond the key's TTL would overlap holders."""

    def break_spec(self, spec: LockSpec) -> LockSpec:
        return replace(spec, drift=-0.3)


@pytest.mark.parametrize("machine", [QuorumOfOne, ValidityTooLong], ids=lambda m: m.__name__)
def test_model_catches_a_broken_core(machine: type[LockModel]) -> None:
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine, settings=FIND_SETTINGS)
