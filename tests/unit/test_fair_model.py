"""A model of fair mode on one node: arrivals, releases, re-checks, deaths, give-ups, time.

The fake node runs the waiting paths of the scripts (``tenure.testing.fake.acquire_wait_lua``,
``release_wait_lua``, ``handoff_lua``, line by line after ``acquire.lua``,
``release.lua`` and ``handoff.lua.inc``). The model keeps its own account of who asked
when, who is alive and whose place has expired, and checks after every step:

(a) at most one holder, and the lock key names it while it lives;
(b) fencing tokens strictly increase, hand-offs included;
(c) FIFO: a hand-off goes to the earliest requester still waiting with a live place and
    a live process; nobody alive is skipped.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tenure._core.config import LockKeys
from tenure.testing.fake import (
    Bus,
    FakeNode,
    acquire_listed,
    acquire_wait_lua,
    release_wait_lua,
    seed_lua,
)

KEYS = LockKeys.of("fair")
TTL_MS = 1000
PLACE_MS = 300


class FairModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.node = FakeNode()
        self.bus = Bus()
        self.now = 0
        seed_lua(self.node, KEYS, 0, 0, 0)  # a node in use: it has its floor
        self.count = 0
        self.queue: list[str] = []  # the model's own FIFO of waiting requesters
        self.place_until: dict[str, int] = {}
        self.alive: set[str] = set()
        self.holder: str | None = None
        self.last_token = 0

    # -- helpers ----------------------------------------------------------------------

    def _eligible(self, w: str) -> bool:
        return w in self.alive and self.place_until.get(w, -1) >= self.now

    def _granted(self, w: str, token: int, how: str) -> None:
        assert self.holder is None or self.node.get(KEYS.lock, self.now) is None, (
            f"{w} granted ({how}) while {self.holder} holds it"
        )
        assert token > self.last_token, f"token {token} after {self.last_token}"
        self.last_token = token
        self.holder = w
        if w in self.queue:
            self.queue.remove(w)

    def _deliver(self) -> None:
        """Apply the hand-offs published so far (a G message makes its waiter the holder)."""
        messages, self.bus.published = self.bus.published, []
        for _, message in messages:
            kind, w, *rest = message.split()
            assert kind == "G"
            first = next((q for q in self.queue if self._eligible(q)), None)
            assert w == first, f"handed to {w}, but {first} asked earlier and waits"
            self._granted(w, int(rest[0]), "hand-off")

    def _attempt(self, w: str) -> None:
        reply = acquire_listed(acquire_wait_lua(
            self.node, self.bus, KEYS, w, TTL_MS, self.last_token + 10_000, "f", w,
            f"ch:{w}", PLACE_MS, self.now,
        ))  # fmt: skip
        if reply[0] == 1:
            if self.queue and w != self.queue[0]:
                ahead = [q for q in self.queue[: self.queue.index(w)] if self._eligible(q)]
                assert not ahead or self.node.get(KEYS.lock, self.now) == w, (
                    f"{w} got the lock ahead of {ahead}"
                )
            self._granted(w, int(reply[1]), "attempt")
        else:
            if w not in self.queue:
                self.queue.append(w)
            self.place_until[w] = self.now + PLACE_MS
        self._deliver()

    # -- rules ------------------------------------------------------------------------

    @rule()
    def arrive(self) -> None:
        w = f"w{self.count}"
        self.count += 1
        self.alive.add(w)
        self.bus.listening.add(f"ch:{w}")
        self._attempt(w)

    @precondition(lambda self: self.holder is not None)
    @rule()
    def release(self) -> None:
        w = self.holder
        assert w is not None
        self.holder = None
        release_wait_lua(self.node, self.bus, KEYS, w, "f", 100, self.now)
        self._deliver()

    @precondition(lambda self: bool(self.queue))
    @rule(pick=st.integers(0, 50))
    def recheck(self, pick: int) -> None:
        w = self.queue[pick % len(self.queue)]
        if w in self.alive:
            self._attempt(w)

    @precondition(lambda self: bool(self.queue))
    @rule(pick=st.integers(0, 50))
    def die(self, pick: int) -> None:
        w = self.queue[pick % len(self.queue)]
        self.alive.discard(w)
        self.bus.listening.discard(f"ch:{w}")
        self.queue.remove(w)

    @precondition(lambda self: bool(self.queue))
    @rule(pick=st.integers(0, 50))
    def give_up(self, pick: int) -> None:
        w = self.queue[pick % len(self.queue)]
        if w not in self.alive:
            return
        self.queue.remove(w)
        release_wait_lua(self.node, self.bus, KEYS, w, "f", 100, self.now)
        self._deliver()

    @rule(ms=st.sampled_from([1, 50, 250, 400, 1200]))
    def advance(self, ms: int) -> None:
        self.now += ms
        if self.holder is not None and self.node.get(KEYS.lock, self.now) is None:
            self.holder = None  # the lease expired (its holder stopped using it: a model)
        for w in list(self.queue):
            if self.place_until.get(w, -1) < self.now:
                self.queue.remove(w)  # its place expired: it re-queues at its next look
                self.place_until.pop(w, None)

    @invariant()
    def lock_names_the_holder(self) -> None:
        value = self.node.get(KEYS.lock, self.now)
        assert value == self.holder  # nobody else's name, and none while nobody holds it


TestFairModel = FairModel.TestCase
TestFairModel.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
