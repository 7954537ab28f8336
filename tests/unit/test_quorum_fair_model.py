"""A model of fair waiting on a quorum ("q"): three fake nodes, up to four processes.

The nodes run the waiting paths of the scripts as mirrored in ``tenure.testing.fake``
(``acquire_wait_lua``, ``release_wait_lua``, ``handoff_lua``; checked against the real
scripts by ``test_the_fake_node_answers_like_redis``). The clients run the shipped
flows: each process has its own ``Flows`` (``tenure._core.flows``) with the model's
clocks injected, and each acquire or release call is the real ``Flows.acquire`` or
``Flows.release`` generator, suspended at the operation it yielded last. Every choice
around the core (one waiter id per acquire call, a ticket per call, the first attempt
of a process not queued until its listener runs, the "c" release of a failed attempt's
grants, the dequeue when a call ends without a lease, the hand-off token, what is
written when a call is interrupted) is the flow's; the model only decides *when* each
operation completes, as a driver would (``model_flows.Stepper``):

* ``Run``: the command goes on the client's wires to the nodes; the ``conclude`` rule
  resumes the flow once the round is decided, the ``deadline`` rule at its deadline
  (``stop_hearing``, then ``time_out`` if still undecided, as the drivers do), or
  throws an interrupt into it (a ``CancelledError`` or Ctrl-C mid-round);
* ``Send``: the command goes on the wires, and the flow goes on at once;
* ``Listen``: the process's listener files the notifications of this waiter in a
  ``ModelInbox`` (at once if it runs already, else once the ``attempt`` rule says its
  subscription is confirmed); ``Unlisten`` stops that; ``Depart`` registers the waiter
  in the process's ``waiting.Departed``, which declines a late notification by sending
  ``Flows.decline``;
* ``AwaitWake``: the listener wakes it once a majority of nodes notified it, or the
  ``wake`` rule ends the wait (True if anything was heard: the drivers' straggler
  timer; else the re-check timeout), or throws an interrupt into it;
* ``Sleep``: the back-off ends when the ``attempt`` rule says.

Only transport and time are fake. Every command is delivered by its own rule, in the
order of its connection (a node runs one connection's commands in order) but
interleaved freely with everything else, so a release can reach some nodes before an
attempt and others after it. A client has one connection per node, as the asyncio
client does, or in a pooled run two, each call (and each decline) writing on one of
them, as the blocking client's calls each borrow a set from its pool: a lease's release
may then overtake what its own call wrote before it. A round's late commands still run
after it was concluded; it reads the replies that come after it was decided (the sync
driver, when they are ready in the same select()) or not (the asyncio driver).
Notifications travel per node and client, and may arrive late, after the next attempt
(which drops them, as ``Slot.take`` does) or never. Wall clocks are arbitrary (they only
seed proposals, tickets and hand-off tokens); processes lose their notification
connections for a while or die (PUBLISH to them answers 0; a dead process's flow is
unwound and what it would write is dropped), and the dead are replaced by new ones that
know no tokens. Some runs are calm (whole rounds and releases only): busy runs are
mostly split votes, partial grants and their cleanups, calm ones mostly holds, waits
and hand-offs.

Invariants, after every step (times in model ms, the core's seconds are ms / 1000):

(a) mutual exclusion: at most one client holds a lease with ``now <= valid_until``;
(b) while a lease is valid, every node that granted it (or handed it over) still has
    the lock key naming the holder, and the key does not expire before the lease ends
    (nobody but the holder could shorten it, so this catches a too long validity at
    the grant, without waiting for the time to pass);
(c) fencing tokens strictly increase in the order leases are granted;
(d) while a lease is valid, the floor of every node that granted it equals its token
    (the token is committed by a majority, as docs/waiting.md argues; with one lock,
    nothing else raises a floor while the lock is held there), or is above it if
    another lease's release with "l" (an attempt of its call may still come) raised it
    there meanwhile, as it does whoever holds the lock;

and, at the end of a run, one of (e) liveness smoke: once everything in flight has been
delivered and every key and place has expired, a client that wants the lock, driven
alone, gets it within a few rounds (nothing is left stuck on the nodes); or (f) nothing
held for nobody: once every call has been brought to its end (holders release, waits
are interrupted) and everything in flight delivered, without time passing, no node
keeps a lock key, a queue entry or a place of any waiter, but those of a dead process
and those a hand-off reached after their process had forgotten their departure (a
notification later than a place's life). Throughout, a flow interrupted mid-operation
may yield only instant operations until the interrupt leaves it
(``flows.check_instant``).

The ``*Scheme`` subclasses at the end break the core or the scripts on purpose and
check that the model notices, so a model too weak to find anything cannot pass.
"""

from __future__ import annotations

import functools
import math
import random
from collections import deque
from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal, NoReturn

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tenure._core import commands
from tenure._core.acquire import Acquisition, Granted, LeaseState
from tenure._core.config import ClientConfig, LockSpec
from tenure._core.flows import (
    AwaitWake,
    Depart,
    Flow,
    Listen,
    Op,
    Run,
    Send,
    Sleep,
    Unlisten,
    WatchedLease,
)
from tenure._core.quorum import Round
from tenure._core.waiting import Departed, parse_wake, place_ms
from tenure._errors import TenureError
from tenure.testing.fake import (
    Bus,
    FakeNode,
    _zset,
    acquire_wait_lua,
    release_lua,
    release_wait_lua,
    seed_lua,
)

from .model_flows import Interrupt, ModelFlows, ModelInbox, ModelLease, Stepper, decode
from .stateful import find_settings, model_settings, run_state_machine_as_test

N = 3  # nodes
K = 4  # client processes at a time
LINKS = 2  # connections per client and node in a pooled run (the blocking client's sets)
CONFIG = ClientConfig.build([f"redis://node{i}" for i in range(N)], recheck=0.5)
NAMES = [f"node{i}" for i in range(N)]
SPEC = LockSpec.build(CONFIG, "qfair", 1.0, fair=True)
assert SPEC.wait_mode == "q"
KEYS = SPEC.keys
TTL_MS = SPEC.ttl_ms
PLACE_MS = place_ms(CONFIG.recheck, CONFIG.node_timeout)
PICK = st.integers(0, 2**16)  # index into whatever is eligible, modulo its length
LINK = st.integers(0, LINKS - 1)  # the set of connections a call writes on (pooled runs)
# A wall-clock reading is the model clock plus one of these (the unit is immaterial):
# in step, a little off, far behind (proposals then come from the floors), far ahead.
# Readings are drawn afresh for each step, so a clock may even run backwards: safety
# must not depend on wall clocks at all. A call's ticket is its first reading, so
# tickets tie often (calls begun at the same instant), and ties are ordered by waiter id.
SKEW = st.sampled_from([0, 0, 1, -1, 20, -20, 900, -5000, 10**6])
# Time steps (ms): mostly small, rarely long; 0: until the next key expires.
TIME = st.sampled_from(
    [1, 1, 2, 2, 5, 5, 5, 10, 10, 20, 20, 50, 50, 100] * 2 + [400, 1100, 1700, 0]
)

# What a process's current call waits for: nothing (idle), the attempt rule (a back-off,
# or its listener's first subscription), a round, a notification, or it holds a lease.
State = Literal["idle", "ready", "round", "waiting", "holding", "dead"]
# The check at the end of a run: (e) or (f) (each changes what the other would look at).
Ending = Literal["liveness", "orphans"]


class Violation(AssertionError):
    """An invariant of the model failed; the message names which one."""


@dataclass(frozen=True)
class Command:
    """One script call on the wire from a client to a node, read back from the bytes a
    flow packed (``commands``)."""

    kind: Literal["acquire", "release", "delete"]  # delete: a plain compare-and-delete
    token: str
    arg: int = 0  # acquire: the proposal; release: the hand-off token P
    ticket: int = 0
    place: int = 0
    cleanup: bool = False
    fencing: int = 0  # release: the lease's token (0: a cleanup or a give-up)
    # A cleanup's place, as it puts its waiter back in line: (ticket, record, life ms).
    requeue: tuple[int, str, int] | None = None
    late: bool = False  # release: an attempt of the lease's call may still come ("l")

    @classmethod
    def read(cls, packed: bytes) -> Command:
        name, keys, args = decode(packed)
        if name == "acquire":
            assert keys == [KEYS.lock, KEYS.floor, KEYS.warm, KEYS.queue]
            token, proposal, mode, waiter, _, place, ticket = (
                args[i] for i in (0, 2, 6, 7, 8, 9, 10)
            )
            assert mode == "q"
            assert waiter == token  # a call's waiter id is its owner token
            return cls("acquire", token, int(proposal), int(ticket), int(place))
        assert name == "release", f"no {name} in this model (every node has its floor)"
        if len(keys) == 1:
            return cls("delete", args[0])
        assert args[1] == "q"
        assert args[5:6] in ([], ["c"], ["l"])
        assert len(args) in (5, 6, 9)
        requeue = (int(args[6]), args[7], int(args[8])) if len(args) == 9 else None
        return cls(
            "release",
            args[0],
            int(args[2]),
            cleanup=args[5:6] == ["c"],
            fencing=int(args[4]),
            requeue=requeue,
            late=args[5:6] == ["l"],
        )


@dataclass(frozen=True, eq=False)
class Wire:
    """A command on a connection, and the round its reply is tallied into (None: a
    ``Send``, whose reply is read and dropped)."""

    command: Command
    parse: commands.Command
    rnd: Round | None


@dataclass
class Lease:
    client: int
    waiter: str
    state: LeaseState
    granted_ms: int
    how: str
    ended_ms: int | None = None  # released or its process died: no longer relied on

    def valid(self, ms: int) -> bool:
        return self.ended_ms is None and ms / 1000 <= self.state.valid_until

    def last_ms(self) -> int:
        """The last model instant at which the lease is valid (as ``valid`` reads it)."""
        ms = int(self.state.valid_until * 1000)
        while (ms + 1) / 1000 <= self.state.valid_until:
            ms += 1
        while ms / 1000 > self.state.valid_until:
            ms -= 1
        return ms


@dataclass
class Client:
    """A client process (one per channel, one ``Flows``) and its current call."""

    name: str
    channel: str
    flows: ModelFlows
    alive: bool = True
    listening: bool = False  # its listener runs (after its first wait)
    calls: int = 0
    state: State = "idle"
    # The current call: its flow, suspended at ``flow.op``.
    call: Literal["acquire", "release", ""] = ""
    waiter: str = ""
    flow: Stepper | None = None
    inbox: ModelInbox | None = None  # registered by Listen, until Unlisten
    greedy: bool = False  # the pending round reads replies that came after it was decided
    how: str = "a round"  # how the lease it may return was got (for the story)
    skew: int = 0  # its wall clock reads the model clock plus this, for now
    lease: Lease | None = None
    held: ModelLease | None = None
    departed: Departed = field(default_factory=Departed)
    # Per connection (one set of them in a run that is not pooled) and node: commands
    # on the connection. ``link``: the set the current call writes on.
    wires: list[list[deque[Wire]]] = field(
        default_factory=lambda: [[deque() for _ in range(N)] for _ in range(LINKS)]
    )
    link: int = 0
    declines: int = 0  # declines sent so far (each takes the next set of a pool)
    # Per node: notifications on their way.
    mail: list[deque[str]] = field(default_factory=lambda: [deque() for _ in range(N)])

    def on_wire(self) -> list[tuple[int, int]]:
        """(node, set) of every connection with a command on it."""
        return [(i, k) for k, wires in enumerate(self.wires) for i in range(N) if wires[i]]

    @property
    def run(self) -> Run | None:
        """The round the call waits on, if it does."""
        op = self.flow.op if self.flow is not None else None
        return op if isinstance(op, Run) else None


class QuorumFairModel(RuleBasedStateMachine):
    # Broken schemes replace these.
    ACQUISITION: ClassVar[type[Acquisition]] = Acquisition
    FLOWS: ClassVar[type[ModelFlows]] = ModelFlows

    def __init__(self) -> None:
        super().__init__()
        self.ms = 0
        self.nodes = [FakeNode() for _ in range(N)]
        listening: set[str] = set()
        self.buses = [Bus(listening=listening) for _ in range(N)]
        for node in self.nodes:
            # Nodes in use (they have their floor): no seeding in this model.
            seed_lua(node, KEYS, 0, 0, self.ms, retention_ms=SPEC.retention_ms)
        self.spawned = 0
        self.clients = [self._spawn() for _ in range(K)]
        self.leases: list[Lease] = []
        self.last_token = 0
        # By node: the holder of the lock when another lease's release with "l" raised
        # the floor there (invariant (d)).
        self.raised_over: list[str | None] = [None] * N
        self.story: list[str] = []
        self.failed = False
        self.active = K
        self.calm = False
        self.pooled = False
        self.ending: Ending = "liveness"
        # When each waiter departed is forgotten by its process (``Depart``), and the
        # waiters a notification reached after that (late past the place's life, which
        # is how long it is remembered): nothing declines it, and the node keeps the
        # lock for them until the TTL (invariant (f) excuses them).
        self.departures: dict[str, float] = {}
        self.forgotten: set[str] = set()

    @initialize(
        active=st.sampled_from([2, 3, 4, 4]),
        calm=st.sampled_from([False, False, True]),
        pooled=st.booleans(),
        ending=st.sampled_from(["liveness", "orphans"]),
    )
    def setup(
        self, active: int, calm: bool, pooled: bool = False, ending: Ending = "liveness"
    ) -> None:
        """How many of the K processes take part, and whether the run is calm: whole
        rounds and releases only (no command delivered on its own, no deadline, no
        process fault). Busy runs are mostly split votes, partial grants and their cleanups;
        calm ones are mostly holds, waits and hand-offs. ``pooled``: each call (and each
        decline) writes on one of ``LINKS`` connections per node, as the blocking client's
        pool of link sets has it, so a lease's release may overtake its call's commands;
        else one connection per node, as the asyncio client's. ``ending``: which check
        ends the run, (e) or (f)."""
        self.active = active
        self.calm = calm
        self.pooled = pooled
        self.ending = ending

    # --- what tests with a broken scheme override -------------------------------------

    def hand_off_token(self, p: int, node: int) -> int:
        """The token of a release's hand-off on ``node``: the same P on every node."""
        return p

    def node_acquire(self, i: int, command: Command, channel: str) -> list[int | str] | int:
        return acquire_wait_lua(
            self.nodes[i], self.buses[i], KEYS, command.token, TTL_MS, command.arg, "q",
            command.token, channel, command.place, self.ms, command.ticket, SPEC.retention_ms,
        )  # fmt: skip

    def node_release(self, i: int, command: Command) -> int:
        holder = self.nodes[i].get(KEYS.lock, self.ms)
        if command.late and holder not in (None, command.token):
            self.raised_over[i] = holder
        return release_wait_lua(
            self.nodes[i], self.buses[i], KEYS, command.token, "q",
            self.hand_off_token(command.arg, i), self.ms, command.cleanup, SPEC.retention_ms,
            command.fencing, command.requeue, command.late,
        )  # fmt: skip

    # --- helpers ------------------------------------------------------------------------

    def _spawn(self) -> Client:
        self.spawned += 1
        rng = random.Random(self.spawned)
        flows = self.FLOWS(CONFIG, NAMES, rng, clock=self._clock, wall_us=self._clock_us)
        flows.acquisition_type = self.ACQUISITION
        client = Client(f"p{self.spawned}", f"ch:p{self.spawned}", flows)
        # Its wall clock: the model's, plus the skew its current step drew.
        flows.wall_us = lambda: self._wall(client.skew)
        self.buses[0].listening.add(client.channel)  # subscribed on every node at once
        return client

    def _clock(self) -> float:
        return self.ms / 1000

    def _clock_us(self) -> int:
        return self.ms * 1000

    def _log(self, text: str) -> None:
        self.story.append(f"{self.ms:>6} ms  {text}")

    def _fail(self, message: str) -> NoReturn:
        self.failed = True  # hypothesis still runs teardown: not on a half-done step
        raise Violation(f"{message}\n{self._dump()}\n" + "\n".join(self.story[-80:]))

    def _dump(self) -> str:
        lines = []
        for i, node in enumerate(self.nodes):
            queue = [(int(s), m) for s, m in _zset(node, KEYS.queue, self.ms)]
            lines.append(
                f"node {i}: lock={node.get(KEYS.lock, self.ms)!r} "
                f"pttl={node.pttl(KEYS.lock, self.ms)} floor={node.get(KEYS.floor, self.ms)} "
                f"queue={queue}"
            )
        return "\n".join(lines)

    def _wall(self, skew: int) -> int:
        return max(0, self.ms + skew)

    def _with(self, states: tuple[State, ...]) -> list[int]:
        return [
            c
            for c, cl in enumerate(self.clients)
            if cl.state in states and (c < self.active or cl.state != "idle")
        ]

    def _pick(self, states: tuple[State, ...], pick: int) -> tuple[int, Client]:
        eligible = self._with(states)
        c = eligible[pick % len(eligible)]
        return c, self.clients[c]

    def _granted(self, c: int, client: Client, state: LeaseState, how: str) -> None:
        lease = Lease(c, client.waiter, state, self.ms, how)
        self._log(
            f"{client.waiter} GRANTED by {how}: token {state.fencing_token}, "
            f"nodes {sorted(state.granted)}, valid until {state.valid_until:.3f} s"
        )
        if state.fencing_token <= self.last_token:
            self._fail(
                f"(c) token order: {client.waiter} granted token {state.fencing_token} "
                f"after a lease with token {self.last_token}"
            )
        self.last_token = state.fencing_token
        self.leases.append(lease)
        client.lease = lease
        client.held = ModelLease(state, SPEC)
        client.state = "holding"
        self._check()

    # --- carrying out what a flow yields --------------------------------------------------

    def _put(
        self,
        client: Client,
        command: commands.Command,
        targets: object,
        rnd: Round | None,
        link: int | None = None,
    ) -> None:
        """Write ``command`` on the client's connections to ``targets`` (None: every node):
        those of set ``link``, by default the current call's."""
        read = Command.read(command.packed)
        nodes = range(N) if targets is None else targets
        assert isinstance(nodes, (range, list))
        k = client.link if link is None else link
        self._log(f"{client.waiter} writes {read} to {list(nodes)}" + (f" on set {k}" if k else ""))
        for i in nodes:
            client.wires[k][i].append(Wire(read, command, rnd))

    def _decline(self, client: Client, spec: LockSpec, waiter: str, node: int) -> None:
        """``waiting.Departed`` calls this: a notification reached a departed waiter."""
        send = client.flows.decline(spec, waiter, node)
        self._log(f"{client.name} declines a notification to {waiter} from node {node}")
        if send is not None:
            # On a set of its own (the blocking client's listener borrows one), which is
            # any set of the pool.
            client.declines += 1
            link = client.declines % LINKS if self.pooled else 0
            self._put(client, send.command, send.targets, None, link)

    def _go(self, c: int, op: Op | None) -> None:
        """Carry out what client ``c``'s flow yields, from ``op`` on, until it must wait
        for a rule (or its call ends)."""
        client = self.clients[c]
        flow = client.flow
        assert flow is not None
        while op is not None:
            if isinstance(op, Run):
                self._put(client, op.command, op.targets, op.rnd)
                if not op.rnd.decided:
                    client.state = "round"
                    return
                op = flow.send(None)  # waits for no node: on with it
            elif isinstance(op, Send):
                self._put(client, op.command, op.targets, None)
                op = flow.send(None)
            elif isinstance(op, Listen):
                client.inbox = ModelInbox(op.waiter, op.need)
                if op.timeout > 0 and not client.listening:
                    client.listening = True  # its subscription is confirmed at `attempt`
                    client.state = "ready"
                    return
                op = flow.send(client.inbox)
            elif isinstance(op, Unlisten):
                client.inbox = None
                op = flow.send(None)
            elif isinstance(op, Depart):
                decline = functools.partial(self._decline, client, op.spec, op.waiter)
                now = self.ms / 1000
                self.departures[op.waiter] = op.until
                for node in client.departed.add(op.waiter, decline, op.until, now, hold=op.hold):
                    decline(node)  # (the drivers do it in the background)
                op = flow.send(None)
            elif isinstance(op, AwaitWake):
                assert op.inbox is client.inbox
                client.state = "waiting"
                return
            elif isinstance(op, Sleep):
                client.state = "ready"
                return
            else:
                raise AssertionError(f"no such operation in an acquire or release: {op!r}")
        self._ended(c, client)

    def _ended(self, c: int, client: Client) -> None:
        """The call returned or raised."""
        flow = client.flow
        assert flow is not None
        assert flow.done
        client.flow = None
        assert client.inbox is None, "a call ended still listening"
        error = flow.error
        if error is not None and not isinstance(error, (Interrupt, TenureError)):
            raise error
        if client.call == "acquire" and isinstance(flow.result, LeaseState):
            self._granted(c, client, flow.result, client.how)
            client.call = ""
            return
        self._log(f"{client.waiter}'s {client.call} ends: {error!r}")
        client.state = "idle"
        client.call = ""
        client.lease = None
        client.held = None

    def _resume(self, c: int, value: object = None) -> None:
        client = self.clients[c]
        assert client.flow is not None
        if isinstance(client.flow.op, Listen):
            value = client.inbox  # the subscription is confirmed
        self._go(c, client.flow.send(value))

    def _interrupt(self, c: int) -> None:
        client = self.clients[c]
        assert client.flow is not None
        self._log(f"{client.waiter} is interrupted at {type(client.flow.op).__name__}")
        self._go(c, client.flow.throw(Interrupt("cancelled")))

    def _start(self, c: int, skew: int, link: int = 0) -> None:
        """An idle process begins an acquire call, on the connections of set ``link``."""
        client = self.clients[c]
        client.link = link if self.pooled else 0
        client.calls += 1
        client.waiter = f"{client.name}.{client.calls}"
        client.call = "acquire"
        client.how = "a round"
        client.lease = None
        client.skew = skew
        self._log(f"{client.waiter} starts (listening={client.listening})")
        flow = client.flows.acquire(
            SPEC,
            True,
            None,
            waiter=client.waiter,
            channel=client.channel,
            listening=client.listening,
        )
        client.flow = Stepper(flow)
        self._go(c, client.flow.start())

    def _attempt(self, c: int, skew: int, greedy: bool = False, link: int = 0) -> None:
        """The ``attempt`` rule: an idle process starts a call (on set ``link``), a ready
        one goes on."""
        client = self.clients[c]
        client.greedy = greedy
        client.skew = skew
        if client.state == "idle":
            self._start(c, skew, link)
        else:
            self._resume(c)

    def _conclude(self, c: int, skew: int) -> None:
        """The pending round returns to its flow (decided, or at its deadline)."""
        client = self.clients[c]
        run = client.run
        assert run is not None
        infos = [r.info if r is not None else None for r in run.rnd.results]
        self._log(f"{client.waiter} concludes {infos}")
        client.skew = skew
        self._resume(c)

    def _deadline(self, c: int, skew: int) -> None:
        client = self.clients[c]
        run = client.run
        assert run is not None
        end = math.ceil(run.deadline * 1000)
        if end > self.ms:
            self._advance(end - self.ms)
        run.rnd.stop_hearing()
        if not run.rnd.decided:
            run.rnd.time_out()
        self._conclude(c, skew)

    def _notify(self, c: int, i: int) -> None:
        client = self.clients[c]
        message = client.mail[i].popleft()
        wake = parse_wake(message.encode())
        assert wake is not None, message
        self._log(f"{client.name} hears {message!r} from node {i}")
        if not client.alive:
            return
        # The listener files it by waiter id, in the slot of a call still listening, or
        # declines it for a waiter that departed lately.
        inbox = client.inbox
        now = self.ms / 1000
        if inbox is not None and wake.waiter == inbox.waiter:
            inbox.put(i, wake)
        elif (
            not client.departed.decline(wake.waiter, i, now)
            and self.departures.get(wake.waiter, math.inf) <= now
        ):
            self.forgotten.add(wake.waiter)

    def _wake(self, c: int, heard: bool | None = None) -> None:
        """The wait ends: notified (True), or at its timeout (False); by default, True
        if anything was heard (the straggler timer) or the process was nudged."""
        client = self.clients[c]
        inbox = client.inbox
        assert inbox is not None
        if heard is None:
            heard = bool(inbox.wakes) or inbox.nudged
        grants = [(i, w.token) for i, w in inbox.wakes if w.handed_over]
        client.how = f"hand-off {grants}"
        self._log(f"{client.waiter} wakes ({heard}) with {grants}")
        self._resume(c, heard)
        if client.state != "holding":
            client.how = "a round"

    def _woken(self) -> None:
        """The listener wakes a waiter once a majority of nodes have notified it."""
        for c in self._with(("waiting",)):
            inbox = self.clients[c].inbox
            if inbox is not None and inbox.ready():
                self._wake(c, True)

    def _release(self, c: int, skew: int, link: int = 0) -> None:
        """The holder calls release (``Flows.release``) on set ``link``: it no longer
        relies on its lease."""
        client = self.clients[c]
        client.link = link if self.pooled else 0
        lease, held = client.lease, client.held
        assert lease is not None
        assert held is not None
        lease.ended_ms = self.ms
        self._log(f"{client.waiter} releases token {lease.state.fencing_token}")
        client.call = "release"
        client.skew = skew
        client.flow = Stepper(client.flows.release(held))
        self._go(c, client.flow.start())

    def _deliver(self, c: int, i: int, prompt: bool = False, link: int | None = None) -> None:
        """Run the next command of client ``c``'s connection to node ``i`` of set
        ``link`` (by default the current call's, if it has one waiting, else the first
        that has). ``prompt``: its notifications reach their listeners at once (unless
        others from that node are still on their way to them: a connection delivers in
        order)."""
        client = self.clients[c]
        if link is None:
            link = next(k for k in (client.link, *range(LINKS)) if client.wires[k][i])
        wire = client.wires[link][i].popleft()
        command = wire.command
        reply: list[int | str] | int
        if command.kind == "acquire":
            reply = self.node_acquire(i, command, client.channel)
        elif command.kind == "release":
            reply = self.node_release(i, command)
        else:
            reply = release_lua(self.nodes[i], KEYS.lock, command.token, self.ms)
        self._log(f"node {i} runs {client.name}'s {command}: {reply}")
        run = client.run
        # A reply is tallied into the round the flow waits on. Once decided, the asyncio
        # driver reads no more replies (they are owed); the sync one still reads those
        # ready in the same select(): ``greedy``.
        if (
            client.alive
            and run is not None
            and wire.rnd is run.rnd
            and (client.greedy or not run.rnd.decided)
        ):
            run.rnd.record(i, *wire.parse.parse(reply))
        for channel, message in self.buses[i].published:
            self._log(f"node {i} publishes {message!r} to {channel}")
            for d, other in enumerate(self.clients):
                if other.channel == channel:
                    other.mail[i].append(message)
                    if prompt and len(other.mail[i]) == 1:
                        self._notify(d, i)
        self.buses[i].published.clear()
        if prompt:
            self._woken()

    def _advance(self, ms: int) -> None:
        """Move the clock, stopping at every instant an invariant could break in between:
        when a valid lease's key expires on a node that granted it (nothing else goes
        wrong by time alone: leases and keys only end)."""
        end = self.ms + ms
        self._log(f"time +{ms}")
        stops = set()
        for lease in self.leases:
            if lease.valid(self.ms):
                for i in lease.state.granted:
                    entry = self.nodes[i].data.get(KEYS.lock)
                    if entry is not None and entry[1] is not None and self.ms <= entry[1] < end:
                        stops.add(entry[1] + 1)  # the first instant it is gone
        for t in sorted(stops):
            self.ms = t
            self._check()
        self.ms = end

    def _check(self) -> None:
        valid = [lease for lease in self.leases if lease.valid(self.ms)]
        if len(valid) > 1:
            self._fail(f"(a) mutual exclusion: at {self.ms} ms, valid leases {valid}")
        for lease in valid:
            for i in lease.state.granted:
                holder = self.nodes[i].get(KEYS.lock, self.ms)
                if holder != lease.waiter:
                    self._fail(
                        f"(b) node {i} holds {holder!r} at {self.ms} ms while the lease "
                        f"{lease} it granted is valid"
                    )
                # Only the holder may shorten its key (it does not), so a key that
                # expires before the lease ends is a violation of (b) already.
                expires = self.nodes[i].data[KEYS.lock][1]
                if expires is not None and expires < lease.last_ms():
                    self._fail(
                        f"(b) node {i}'s key expires at {expires} ms, before the lease "
                        f"{lease} it granted ends"
                    )
                floor = self.nodes[i].floor_of(KEYS, self.ms)
                token = lease.state.fencing_token
                raised = self.raised_over[i] == lease.waiter
                if floor != token and not (raised and floor is not None and floor > token):
                    self._fail(
                        f"(d) node {i} has floor {floor} at {self.ms} ms while the lease "
                        f"{lease} it granted is valid"
                    )

    # --- rules --------------------------------------------------------------------------
    #
    # Hypothesis draws rules about evenly (and switches some off per run), so the common
    # steps have more than one rule, rare faults share one, and ``round_at_once`` takes a
    # whole attempt in one step: without them a run rarely gets past its first grant.

    @precondition(lambda self: not self.calm and bool(self._with(("idle", "ready"))))
    @rule(pick=PICK, skew=SKEW, greedy=st.booleans(), link=LINK)
    def attempt(self, pick: int, skew: int, greedy: bool, link: int) -> None:
        """An idle process starts an acquire call, or a ready one goes on (its back-off
        ended, or its listener's subscription is confirmed): its next attempt is sent
        to every node, each delivered by ``deliver``."""
        c, _ = self._pick(("idle", "ready"), pick)
        self._attempt(c, skew, greedy, link)

    @precondition(lambda self: bool(self._with(("idle", "ready"))))
    @rule(
        pick=PICK,
        skew=SKEW,
        order=st.permutations(range(N)),
        reach=st.sampled_from([1, 2, 2, 3, 3, 3]),
        prompt=st.sampled_from([True, True, False]),
        greedy=st.booleans(),
        link=LINK,
    )
    def round_at_once(
        self,
        pick: int,
        skew: int,
        order: list[int],
        reach: int,
        prompt: bool,
        greedy: bool,
        link: int,
    ) -> None:
        """An attempt whose commands run at once on ``reach`` nodes, in ``order`` (behind
        whatever this client sent them before on the call's connection), concluded if
        that decided it."""
        c, _ = self._pick(("idle", "ready"), pick)
        self._attempt(c, skew, greedy, link)
        self._at_once(c, order[: N if self.calm else reach], prompt, skew)

    def _at_once(self, c: int, nodes: list[int], prompt: bool, skew: int) -> None:
        client = self.clients[c]
        for i in nodes:
            while client.wires[client.link][i]:
                self._deliver(c, i, prompt, client.link)
        run = client.run
        if run is not None and run.rnd.decided and client.state == "round":
            self._conclude(c, skew)

    def _deliverable(self) -> bool:
        return not self.calm and any(cl.on_wire() for cl in self.clients)

    def _deliver_some(self, pick: int, node: int, burst: int, prompt: bool) -> None:
        for _ in range(burst):
            ready = [(c, i, k) for c, cl in enumerate(self.clients) for i, k in cl.on_wire()]
            if not ready:
                return
            preferred = [(c, i, k) for c, i, k in ready if i == node] or ready
            c, i, k = preferred[pick % len(preferred)]
            self._deliver(c, i, prompt, k)

    @precondition(_deliverable)
    @rule(
        pick=PICK,
        node=st.integers(0, N - 1),
        burst=st.sampled_from([1, 1, 2, 4]),
        prompt=st.booleans(),
    )
    def deliver(self, pick: int, node: int, burst: int, prompt: bool) -> None:
        """The next command of a connection runs on its node (a few, with ``burst``)."""
        self._deliver_some(pick, node, burst, prompt)

    @precondition(_deliverable)
    @rule(pick=PICK, node=st.integers(0, N - 1), burst=st.sampled_from([1, 3, 8]))
    def deliver_more(self, pick: int, node: int, burst: int) -> None:
        self._deliver_some(pick, node, burst, prompt=True)

    def _decided(self) -> list[int]:
        return [
            c
            for c, cl in enumerate(self.clients)
            if cl.state == "round" and (run := cl.run) is not None and run.rnd.decided
        ]

    @precondition(lambda self: bool(self._decided()))
    @rule(pick=PICK, skew=SKEW)
    def conclude(self, pick: int, skew: int) -> None:
        """A decided round returns to its flow (maybe long after: a paused process)."""
        decided = self._decided()
        self._conclude(decided[pick % len(decided)], skew)

    def _undecided(self) -> list[int]:
        if self.calm:
            return []
        return [
            c
            for c, cl in enumerate(self.clients)
            if cl.state == "round" and (run := cl.run) is not None and not run.rnd.decided
        ]

    @precondition(lambda self: bool(self._undecided()))
    @rule(pick=PICK, skew=SKEW, interrupted=st.sampled_from([False, False, False, True]))
    def deadline(self, pick: int, skew: int, interrupted: bool) -> None:
        """An undecided round reaches its deadline: the silent nodes are failed (their
        commands still run later), then it returns to its flow. ``interrupted``: the call
        is interrupted mid-round instead (cancelled, or Ctrl-C): the flow writes its
        cleanup on the way out."""
        undecided = self._undecided()
        c = undecided[pick % len(undecided)]
        self.clients[c].skew = skew
        if interrupted:
            self._interrupt(c)
        else:
            self._deadline(c, skew)

    def _notifiable(self) -> bool:
        return any(any(cl.mail) for cl in self.clients)

    def _notify_some(self, pick: int, node: int, burst: int) -> None:
        for _ in range(burst):
            ready = [(c, i) for c, cl in enumerate(self.clients) for i in range(N) if cl.mail[i]]
            if not ready:
                return
            preferred = [(c, i) for c, i in ready if i == node] or ready
            self._notify(*preferred[pick % len(preferred)])

    @precondition(_notifiable)
    @rule(
        pick=PICK,
        node=st.integers(0, N - 1),
        burst=st.sampled_from([1, 1, 3]),
        prompt=st.sampled_from([True, True, False]),
    )
    def notify(self, pick: int, node: int, burst: int, prompt: bool) -> None:
        """Notifications reach their process's listener (in order per node). A waiter
        notified by a majority of nodes is woken; with ``prompt`` off its thread is slow
        to run, and ``wake`` picks it up later."""
        self._notify_some(pick, node, burst)
        if prompt:
            self._woken()

    @precondition(lambda self: bool(self._with(("waiting",))))
    @rule(pick=PICK, skew=SKEW, give_up=st.sampled_from([False] * 5 + [True]))
    def wake(self, pick: int, skew: int, give_up: bool) -> None:
        """The wait ends, with the notifications heard so far (the straggler timer) or
        none (the re-check). ``give_up``: the call is cancelled instead."""
        c, client = self._pick(("waiting",), pick)
        client.skew = skew
        if give_up:
            self._interrupt(c)
        else:
            self._wake(c)

    @precondition(lambda self: bool(self._with(("holding",))))
    @rule(
        pick=PICK,
        skew=SKEW,
        order=st.permutations(range(N)),
        reach=st.sampled_from([0, 0, 1, 2, 3, 3]),
        prompt=st.sampled_from([True, True, False]),
        link=LINK,
    )
    def release(
        self, pick: int, skew: int, order: list[int], reach: int, prompt: bool, link: int
    ) -> None:
        """The holder releases (maybe after its lease expired), one P for every node;
        the commands run at once on ``reach`` nodes, in ``order``, the others later."""
        c, _ = self._pick(("holding",), pick)
        self._release(c, skew, link)
        self._at_once(c, order[: N if self.calm else reach], prompt, skew)

    @precondition(lambda self: not self.calm)
    @rule(pick=PICK, kind=st.sampled_from(["die", "deaf", "deaf"]))
    def process(self, pick: int, kind: str) -> None:
        """A process fault. "die" (twice at most per run): what it sent still runs, its
        channel stops listening, its lease is no longer used, and a new process that
        knows no tokens takes its place. "deaf": its notification connections drop
        (PUBLISH to it answers 0, so releases skip its waiters and drop them from the
        queues) or, if down, come back: the listener then nudges every waiter of the
        process, since what was published meanwhile reached nobody."""
        c = pick % K
        client = self.clients[c]
        if kind == "deaf":
            listening = self.buses[0].listening
            if client.channel in listening:
                self._log(f"{client.name}'s notification connections drop")
                listening.discard(client.channel)
            else:
                self._log(f"{client.name}'s notification connections are back")
                listening.add(client.channel)
                if client.inbox is not None:
                    client.inbox.nudged = True
                if client.state == "waiting":
                    self._wake(c, True)
            return
        if self.spawned >= K + 2:
            return
        self._log(f"{client.name} dies in state {client.state}")
        client.alive = False
        self.buses[0].listening.discard(client.channel)
        if client.lease is not None:
            client.lease.ended_ms = self.ms
        if client.flow is not None:
            client.flow.abandon()  # what it would still write never leaves the process
            client.flow = None
        client.inbox = None
        client.state = "dead"
        for mail in client.mail:
            mail.clear()
        self.clients.append(client)  # past the first K: only its wire is still drained
        self.clients[c] = self._spawn()

    @rule(ms=TIME)
    def advance(self, ms: int) -> None:
        """Time passes: mostly a little (a hand-off is judged against half a TTL), now
        and then past a TTL or a place's life; 0: until the next lock key expires on
        some node, where a lease that outlives its keys would show (a holder may keep
        the lock that long)."""
        if ms == 0:
            ends = [e[1] for n in self.nodes if (e := n.data.get(KEYS.lock)) and e[1] is not None]
            ms = max(1, min((t for t in ends if t >= self.ms), default=self.ms) + 1 - self.ms)
        self._advance(ms)

    @precondition(lambda self: bool(self._with(("holding",))))
    @rule(pick=PICK)
    def hold_long(self, pick: int) -> None:
        """A holder keeps the lock until its key expires on a node that granted it: the
        instant a lease that outlives its keys would show."""
        _, client = self._pick(("holding",), pick)
        assert client.lease is not None
        ends = [
            e[1]
            for i in client.lease.state.granted
            if (e := self.nodes[i].data.get(KEYS.lock)) and e[1] is not None and e[1] >= self.ms
        ]
        if ends:
            self._advance(min(ends) + 1 - self.ms)

    @invariant()
    def safe(self) -> None:
        self._check()

    # --- (e) liveness smoke -------------------------------------------------------------

    def teardown(self) -> None:
        """The run's end check, (f) (``_no_orphans``) or (e): deliver everything, let
        every key and place expire, then drive one client that still wants the lock,
        alone, one synchronous step at a time: it gets it. (Alone: the others would sleep
        a random back-off between split attempts; driving them all in lockstep would be
        a livelock of the model's making.) At the end every flow still suspended is
        unwound."""
        try:
            if not self.failed:
                if self.ending == "orphans":
                    self._no_orphans()
                else:
                    self._liveness()
        finally:
            self.unwind()

    def unwind(self) -> None:
        """Unwind every flow still suspended, so that none is left to the collector."""
        for client in self.clients:
            if client.flow is not None:
                client.flow.abandon()
                client.flow = None

    def _liveness(self) -> None:
        wanting = [
            c
            for c in range(K)
            if self.clients[c].call == "acquire"
            and self.clients[c].state in ("ready", "round", "waiting")
        ]
        if not wanting:
            return
        c = wanting[0]
        client = self.clients[c]
        for d, other in enumerate(self.clients[:K]):
            if other.state == "holding":
                self._release(d, 0)
        self._drain()
        for d, other in enumerate(self.clients[:K]):
            if d != c and other.call == "release" and other.state == "round":
                self._finish_round(d)
        self._drain()
        self._advance(max(TTL_MS, PLACE_MS) + 1)
        before = len(self.leases)
        for _ in range(12):
            if client.state == "round":
                self._finish_round(c)
            elif client.state == "waiting":
                self._wake(c)
            elif client.state in ("ready", "idle"):
                # "idle": its call gave up (QuorumUnreachable after rounds the model let
                # time out); it still wants the lock, so it calls again.
                self._attempt(c, 0)
            else:
                break
            self._drain()
        if len(self.leases) == before and client.state != "holding":
            self._fail(f"(e) liveness: {client.waiter}, alone, never acquired a free lock")

    def _no_orphans(self) -> None:
        """(f) Every call is brought to its end (holders release, rounds conclude, waits
        are interrupted), and everything in flight is delivered, the
        declines it brings included, without time passing: then no node keeps a lock
        key, a queue entry or a place of any waiter, but those of a dead process and
        those a hand-off reached after their process forgot their departure."""
        for _ in range(40):
            self._drain()
            ending = False
            for c, client in enumerate(self.clients[:K]):
                if client.state == "holding":
                    self._release(c, 0)
                elif client.state == "round":
                    self._finish_round(c)
                elif client.state == "ready":
                    self._attempt(c, 0)  # (its wait, or its round, is interrupted next)
                elif client.state == "waiting":
                    self._interrupt(c)
                else:
                    continue
                ending = True
            if not ending:
                break
        else:
            self._fail("(f) the calls did not end")
        dead = {client.name for client in self.clients if not client.alive}
        for i, node in enumerate(self.nodes):
            queued = [waiter for _, waiter in _zset(node, KEYS.queue, self.ms)]
            places = [
                key.removeprefix(f"{KEYS.queue}:")
                for key in list(node.data)
                if key.startswith(f"{KEYS.queue}:") and node.get(key, self.ms) is not None
            ]
            if "next" in places:  # (a reservation, not a place: the reserved waiter)
                places.remove("next")
                places.append(node.get(f"{KEYS.queue}:next", self.ms) or "")
            left = [
                waiter
                for waiter in (node.get(KEYS.lock, self.ms), *queued, *places)
                if waiter is not None
                and waiter.split(".")[0] not in dead
                and waiter not in self.forgotten
            ]
            if left:
                self._fail(f"(f) node {i} keeps {left} for nobody, with nothing in flight")

    def _finish_round(self, c: int) -> None:
        run = self.clients[c].run
        assert run is not None
        if run.rnd.decided:
            self._conclude(c, 0)
        else:
            self._deadline(c, 0)

    def _drain(self) -> None:
        while True:
            wires = [(c, i, k) for c, cl in enumerate(self.clients) for i, k in cl.on_wire()]
            notes = [(c, i) for c, cl in enumerate(self.clients) for i in range(N) if cl.mail[i]]
            if not wires and not notes:
                return
            for c, i, k in wires:
                self._deliver(c, i, link=k)
            for c, i in notes:
                if self.clients[c].mail[i]:
                    self._notify(c, i)


MODEL_SETTINGS = model_settings(max_examples=300, stateful_step_count=80)


def test_quorum_fair_model() -> None:
    run_state_machine_as_test(QuorumFairModel, settings=MODEL_SETTINGS)


@pytest.mark.soak
@pytest.mark.timeout(3600)  # it takes about 10 minutes
def test_quorum_fair_model_soak() -> None:
    run_state_machine_as_test(
        QuorumFairModel,
        settings=settings(MODEL_SETTINGS, max_examples=20_000, stateful_step_count=150),
    )


# --- the model has teeth ----------------------------------------------------------------

# Measured over unseeded runs, the schemes searched for by default are found after a
# median of about 10 (TokenPerNode) and 15 (RoundOfOne) examples. RenewBelowFloor (a
# median of about 230, at most about 600 seen; over a minute derandomized) runs with
# ``--slow``, and the default run replays its attack
# (``test_a_lock_handed_over_is_renewed_only_above_the_floor``). Three take longer and
# run with the soak tests: HandOffFromOneNode (median about 160, over 1300 in some
# runs), ValidityFromNotification (median about 1200, at most about 2200 seen: it needs
# a hand-off lease whose notification came late) and HandOffBelowFloor (a lease, a
# waiter's look from before it and a low-floor give-up; half the runs of 3600 miss it).
# Of the checks at a run's end, (f) finds PlainDequeue at once (36 examples
# derandomized); NoLinger (a pooled run: a release that overtakes its call's cleanup on
# another connection) and NoDecline (a hand-off to a waiter gone) take about three
# minutes and one derandomized (19 s to 3 minutes unseeded), and run with the soak
# tests. A core that released a lease whose call left an attempt unanswered without "l"
# (the late attempt then takes the lock after the release) was not found in 20,000
# unseeded examples: the model reaches that history too rarely; a hand-driven call
# shows it instead (``test_waiting.py::
# test_a_release_raises_every_floor_above_a_late_attempt_that_could_grant``).
# The bound only matters if the search got much weaker.
FIND_SETTINGS = find_settings(MODEL_SETTINGS, max_examples=3000)


class OneGrantAcquisition(Acquisition):
    def begin(self, now: float) -> Round:
        rnd = super().begin(now)
        rnd.needed = 1
        return rnd


class RoundOfOneScheme(QuorumFairModel):
    """A core that took one node's grant for a majority: two clients hold at once as
    soon as their grants land on different nodes."""

    ACQUISITION = OneGrantAcquisition


class LateValidityAcquisition(Acquisition):
    def transferred(self, token: str, grants: list[tuple[int, int]], now: float) -> Granted | None:
        got = super().transferred(token, grants, now)
        if got is None:
            return None
        spec = self.spec
        return Granted(replace(got.lease, started=now, valid_until=now + spec.ttl - spec.drift))


class ValidityFromNotificationScheme(QuorumFairModel):
    """A core that counted a hand-off's validity from the notification's arrival: the
    keys were set earlier, at the release, and expire before such a lease ends."""

    ACQUISITION = LateValidityAcquisition


class OneNodeAcquisition(Acquisition):
    def transferred(self, token: str, grants: list[tuple[int, int]], now: float) -> Granted | None:
        spec, self.spec = self.spec, replace(self.spec, quorum=1)
        try:
            return super().transferred(token, grants, now)
        finally:
            self.spec = spec


class HandOffFromOneNodeScheme(QuorumFairModel):
    """A core that took one node's hand-off for the lock (queues differ from node to
    node, so two waiters are each handed some of the nodes)."""

    ACQUISITION = OneNodeAcquisition


class AnyTokensAcquisition(Acquisition):
    def transferred(self, token: str, grants: list[tuple[int, int]], now: float) -> Granted | None:
        top = max((f for _, f in grants), default=0)
        return super().transferred(token, [(i, top) for i, _ in grants], now)


class TokenPerNodeScheme(QuorumFairModel):
    """Each node minting its own hand-off token (as on one node: floor + 1, here P
    plus the node's index), and a core that took the highest of a majority of them:
    the token is committed on one node only, and a later majority can propose below."""

    ACQUISITION = AnyTokensAcquisition

    def hand_off_token(self, p: int, node: int) -> int:
        return p + 10 * node


class PlainDequeueFlows(ModelFlows):
    def dequeue(self, spec: LockSpec, waiter: str) -> commands.Command:
        return commands.release(spec.key, waiter)


class PlainDequeueScheme(QuorumFairModel):
    """A core whose waiter left its queues with a plain compare-and-delete: a lock
    handed to it is freed, but its queue entry and place stay."""

    FLOWS = PlainDequeueFlows


class NoDeclineFlows(ModelFlows):
    def decline(self, spec: LockSpec, waiter: str, node: int) -> Send | None:
        return None


class NoDeclineScheme(QuorumFairModel):
    """A core that declined nothing that reached a departed waiter: a node that handed
    it the lock holds the lock for nobody until the TTL."""

    FLOWS = NoDeclineFlows


class NoLingerFlows(ModelFlows):
    def _release_rounds(self, lease: WatchedLease, *, mark: bool) -> Flow[Round]:
        lease._state = replace(lease._state, lingers=False)
        return (yield from super()._release_rounds(lease, mark=mark))


class NoLingerScheme(QuorumFairModel):
    """A core that released a lease whose call may still have its waiter id queued
    somewhere like any other: a cleanup of its call that a node runs after the release
    (on another connection) queues the id again, the next release hands it the lock,
    and nobody declines it."""

    FLOWS = NoLingerFlows


class HandOffBelowFloorScheme(QuorumFairModel):
    """A release script that handed the lock over with P whatever the node's floor:
    a node's floor goes down, and a later lease can get a token already used."""

    def node_release(self, i: int, command: Command) -> int:
        node = self.nodes[i]
        floor = node.get(KEYS.floor, self.ms)
        node.set(KEYS.floor, 0, self.ms)  # nothing for P to beat
        released = super().node_release(i, command)
        if node.get(KEYS.floor, self.ms) == "0" and floor is not None:
            node.set(KEYS.floor, floor, self.ms)  # nothing handed over: as it was
        return released


class RenewBelowFloorScheme(QuorumFairModel):
    """An acquire script that renewed a lock handed to the caller with any proposal,
    even one not above the floor (at least the hand-off's token)."""

    def node_acquire(self, i: int, command: Command, channel: str) -> list[int | str] | int:
        node = self.nodes[i]
        if node.get(KEYS.lock, self.ms) == command.token:
            node.pexpire(KEYS.lock, TTL_MS, self.ms)
            floor = int(node.get(KEYS.floor, self.ms) or 0)
            node.set(KEYS.floor, max(floor, command.arg), self.ms, px=SPEC.retention_ms)
            return [1, command.arg, max(floor, command.arg)]
        return super().node_acquire(i, command, channel)


# The rarer bugs take up to 20,000 examples to show: they run with the soak tests.
_RARE = (pytest.mark.soak, pytest.mark.timeout(1800))


@pytest.mark.parametrize(
    ("machine", "violated", "examples"),
    [
        pytest.param(RoundOfOneScheme, r"\((a|b|c|d)\) ", None, id="RoundOfOneScheme"),
        pytest.param(TokenPerNodeScheme, r"\((c|d)\) ", None, id="TokenPerNodeScheme"),
        pytest.param(PlainDequeueScheme, r"\(f\) ", None, id="PlainDequeueScheme"),
        pytest.param(
            RenewBelowFloorScheme,
            r"\((c|d)\) ",
            None,
            id="RenewBelowFloorScheme",
            # Its search takes a minute or more; the default run replays the attack
            # (``test_a_lock_handed_over_is_renewed_only_above_the_floor``).
            marks=pytest.mark.slow,
        ),
        pytest.param(
            HandOffFromOneNodeScheme,
            r"\((a|b|c|d)\) ",
            20_000,
            id="HandOffFromOneNodeScheme",
            marks=_RARE,
        ),
        pytest.param(
            ValidityFromNotificationScheme,
            r"\(b\) ",
            20_000,
            id="ValidityFromNotificationScheme",
            marks=_RARE,
        ),
        pytest.param(
            HandOffBelowFloorScheme,
            r"\((c|d)\) ",
            20_000,
            id="HandOffBelowFloorScheme",
            marks=_RARE,
        ),
        pytest.param(NoDeclineScheme, r"\(f\) ", 20_000, id="NoDeclineScheme", marks=_RARE),
        pytest.param(NoLingerScheme, r"\(f\) ", 20_000, id="NoLingerScheme", marks=_RARE),
    ],
)
def test_model_catches_a_broken_scheme(
    machine: type[QuorumFairModel], violated: str, examples: int | None
) -> None:
    found = FIND_SETTINGS if examples is None else settings(FIND_SETTINGS, max_examples=examples)
    with pytest.raises(Violation, match=violated):
        run_state_machine_as_test(machine, settings=found)


# --- a history the random search takes long to reach, replayed step by step ---------------


@pytest.mark.parametrize("machine", [QuorumFairModel, RenewBelowFloorScheme])
def test_a_lock_handed_over_is_renewed_only_above_the_floor(
    machine: type[QuorumFairModel],
) -> None:
    """A waiter handed the lock by nodes whose tokens differ takes it with an ordinary
    round, and a node that handed it over renews it there only for a proposal above its
    floor. Renewing for any proposal (the planted ``RenewBelowFloorScheme``), the round
    is granted a token a lease already had. (The planted scheme must fail here, the
    real scripts must not. The random search finds that bug too, but takes a minute or
    more: ``--slow``.)

        p1..p4: first attempts, proposal 1; p3 is granted nodes 1 and 2, p2 node 0
        p2:     too few grants: its cleanup hands node 0 to p4, the head there (token 2)
        p3:     granted (token 1), releases with P = 2: nodes 1 and 2 hand it to p2
        p2:     granted by that hand-off (token 2), releases with P = 3: node 1 hands it
                to p4 (token 3)
        p4:     woken by nodes 0 and 1, with tokens 2 and 3: not one token of a majority,
                so it asks again, proposing 2, and nodes 0 and 1 hold the lock for it
                with floors 2 and 3: "too low" (the planted scheme: renewed, and the
                round granted token 2, p2's)
    """
    model = machine()
    p1, p2, p3, p4 = range(4)
    try:
        model.setup(active=4, calm=False)
        run = functools.partial(model._deliver, prompt=True)
        for c in (p1, p2, p3, p4):
            model._attempt(c, 0)
        for c in (p3, p2, p4, p1):
            run(c, 2)
        for c, i in ((p3, 1), (p2, 0), (p1, 1), (p3, 0), (p2, 1)):
            run(c, i)
        # p2 got node 0 alone: the cleanup of that grant goes there, then its next attempt.
        model._conclude(p2, 0)
        model._attempt(p2, 0)
        run(p1, 0)
        run(p2, 1)
        run(p4, 1)
        run(p4, 0)
        model._conclude(p4, 0)  # held everywhere: it queues with its next attempt
        model._attempt(p4, 0)
        model._at_once(p4, [0, 1, 2], True, 0)
        run(p2, 0)  # the cleanup: node 0 is handed to p4, the head of its queue
        assert model.nodes[0].get(KEYS.lock, model.ms) == "p4.1"
        assert model.nodes[0].floor_of(KEYS, model.ms) == 2
        run(p2, 0)  # p2's next attempt: held on nodes 0 and 2, it queues there
        run(p2, 2)
        for c in (p1, p2, p3):
            model._conclude(c, 0)
        assert model.leases[-1].waiter == "p3.1"
        assert model.leases[-1].state.fencing_token == 1
        model._release(p3, 0)
        model._at_once(p3, [0, 1, 2], True, 0)  # nodes 1 and 2 hand the lock to p2
        assert model.leases[-1].waiter == "p2.1"
        assert model.leases[-1].state.fencing_token == 2
        model._release(p2, 0)  # with P = 3; its commands run below
        assert model.clients[p4].state == "waiting"
        run(p2, 0)
        run(p2, 1)  # node 1 hands the lock to p4 with 3: woken, with 2 from node 0
        assert model.clients[p4].state == "round"
        run(p4, 0)
        run(p2, 2)
        run(p4, 1)
        run(p4, 2)
        assert [model.nodes[i].get(KEYS.lock, model.ms) for i in range(N)] == ["p4.1"] * N
        if machine is QuorumFairModel:
            model._conclude(p4, 0)
            # "Too low" everywhere: asked again, above every floor.
            assert model.clients[p4].lease is None
            model._at_once(p4, [0, 1, 2], True, 0)
            assert model.leases[-1].waiter == "p4.1"
            assert model.leases[-1].state.fencing_token == 4
        else:
            with pytest.raises(Violation, match=r"\(c\) token order: p4\.1 granted token 2"):
                model._conclude(p4, 0)
    finally:
        model.unwind()
