"""A model of the whole algorithm: K clients, N fake nodes, several locks, a fake clock.

Each fake node (``tenure.testing.fake.FakeNode``) is one Redis server holding the keys of every
lock (``NAMES``) and its own floor and warm-up marker, and runs exactly what the scripts
do (``acquire.lua``, ``seed.lua``, ``release.lua``, ``extend.lua``), at the fake time a
request reaches it, with Redis's expiry rules (``PX``: the locks, the warm-up marker, and
the floors, kept for a retention of ``RETENTION_MS``). The clients run the shipped
flows: each has its own ``Flows`` (``tenure._core.flows``, with the model's clocks
injected; it keeps the client's floor across calls, for every name), and each acquire,
extend or release call is the real ``Flows.acquire`` / ``extend`` / ``release``
generator, suspended at the operation it yielded last (``model_flows.Stepper``). The
nodes run exactly the bytes the flows packed (``tenure.testing.fake.eval_packed``), and the
commands' own ``parse`` reads the replies. Every decision (proposals, seeding, cleanup,
back-off, immediate retries, releasing a lease whose extension failed) is the flow's;
only the transport and the clocks are fake, and the rules decide when each operation
completes:

* an attempt's or an extension's round is driven request by request: each request is
  delivered by its own rule, and the ``conclude`` rule returns the round to its flow
  once it is decided or its deadline passed (the silent nodes then failed, as the
  drivers do);
* a cleanup release or a seed the flow writes goes on the wire (``loose``) and the flow
  goes on at once, as if the nodes stayed silent; it arrives later, or never;
* a lease's release is sent and answered at once (nothing rides on its delay);
* a back-off (``Sleep``) ends when the client's next acquire step comes, the clock
  moved on to its end.

So rounds, seeds, releases, time steps, restarts and partitions interleave freely. A
request can be lost before it runs, or run with its reply lost; one still in flight
when its round is concluded may arrive later ("orphan"). A connection delivers in
order: what a client wrote to a node before runs before what it writes there later
(the flows rely on it: a call's attempts share one owner token, and its cleanup
release is written ahead of its next attempt, not awaited). A node that restarts loses
its connections: whatever was sent to it before is lost. A client may conclude a round
long after its last reply (a paused process). ``acquire_at_once`` is the common fast
case: a whole acquire call (attempts, cleanup, seeding, immediate retries) with nothing
in between, reading replies like the sync driver (every ready reply, even after the
round is decided) or like the asyncio driver (none once it is decided).

Each acquisition takes one of the lock names; the nodes start blank (a new node set) or
with a floor (a set used before: the floor counts as a grant of the first name made
before the run), so the other names are first used mid-run, whatever the nodes are doing
then. Faults: nodes cut off
for a while (they keep their data; their keys still expire), nodes that restart without
their data, nodes flushed (``FLUSHALL``: every key gone, connections kept), a node's
floor deleted by hand (its locks stay), time passing beyond the retention, so that
floors expire (all of them, when the whole set sits idle that long), and failovers:
every node has an asynchronous replica that catches up when a rule says so, and a
failover puts the replica in the node's place (``FakeNode.promote``), losing whatever it
had not received (a grant, a release, a seed), connections included, under a new
replication ID. A failover is a data loss like a restart (the assumption below counts
it), except on a single node, where nothing else could vouch for the past and the
warm-up alone must keep mutual exclusion (its tokens then rest on the clocks, as after
any loss of the whole history).

Each client proposes tokens from its own wall clock, with a fixed skew; some clocks are
far behind (proposals then come from what the client learned from the nodes), some far
ahead. Like the drivers, a client keeps its floor across acquisitions, for every name.

Assumptions (under which the core promises safety; see ``_core/acquire.py``):

* a node may lose its data (restart without persistence, flush, failover), but within
  any window of ``max_ttl`` at most a minority of the nodes do (``_may_lose``); so a
  single node never does, but for a failover;
* no clock jumps; clock *rates* are equal (drift 0), wall clocks are arbitrary;
* owner tokens are unique per acquire call (a call's waiter id, as the flows make it).

Invariants, per lock name:

(a) at any fake time at most one client holds a lease with ``valid_until > now`` (and,
    stronger, the spans during which clients rely on leases never overlap);
(b) fencing tokens strictly increase in the order leases are granted: if lease ``a`` was
    granted before the round that granted ``b`` began, ``token(b) > token(a)``;
(c) fencing tokens are unique;

(b) and (c) as long as the history of ``a`` survives. The model keeps its own account
of what each node remembers, from the scripts' replies, not from the node's keys: the
highest token it committed (a grant) or was seeded with since it last lost its data,
forgotten ``RETENTION_MS`` after its last grant, extension or seed there (when the
scripts' floor expires). The history of ``a`` is *lost* if at some instant between the
grant of ``a`` and that of ``b`` no node, up or down, remembers a token as high as
``a``'s. That happens when the whole node set sat idle past the retention, or when its
nodes lost their data one after another (each loss within the assumption) while idle:
nothing is left anywhere to tell what was granted. Across such a loss tokens restart
from the proposers' wall clocks, and the model asserts only what the clocks give: if the
wall clock of ``b``'s proposer, when it proposed, was past ``token(a)``, then
``token(b) > token(a)``. For tokens that came from the clocks, that is: when the clocks'
skew difference is smaller than the time between the two grants, which is at least the
idle time. With the model's huge skews (``SKEWS``) it often is not, and a lower token
follows (``test_history_expired_on_every_node_restarts_tokens_from_the_clock`` replays
both cases). Mutual exclusion (a) holds across it all the same.

The ``*Scheme`` subclasses at the end change the nodes or the core (an ``Acquisition``
the flows are given, ``ACQUISITION``) on purpose (a
majority of one, validity past the TTL, per-node ``INCR`` counters, a restarted node
that votes at once, a node that grants a token equal to its floor, a floor a grant does
not raise, a seed without warm-up, a seed from the lowest floor) and check that the model
notices, so a model too weak to find anything cannot pass silently. The ``*Focus`` machines they
build on switch off the rules an attack does not need, or start where it begins.

The replayed tests at the end pin, step by step, histories the random search does not
reach in CI time: a stale seed that the observation marks make harmless; the token
order when the history is lost everywhere (by restarts, by the retention); the floor of
one node keeping it when the others expired; extensions keeping the floors; and, as a
strict xfail, a single restart while another node is down, where the core seeds from
a stale floor and the token order breaks although a node remembers (a documented limit:
the random search does not reach it in CI time, a soak run might).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterator
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

from tenure import LeaseExpired
from tenure._core import commands
from tenure._core.acquire import (
    GRANTED,
    HELD,
    SILENT_ASKS,
    TOO_LOW,
    Acquisition,
    Granted,
    LeaseState,
    Retry,
    Step,
)
from tenure._core.config import NODE_FLOOR, NODE_REPLID, ClientConfig, LockKeys, LockSpec
from tenure._core.flows import SEED_PATIENCE, Flow, Later, Op, Run, Sleep
from tenure._core.policy import wait_random
from tenure._core.quorum import Failure, Round
from tenure._errors import TenureError
from tenure.testing.fake import Bus, FakeNode, acquire_listed, eval_packed

from .model_flows import ModelFlows, ModelLease, Stepper, decode
from .stateful import find_settings, model_settings, run_state_machine_as_test

K = 3  # clients
TTL_MS = 1000
MAX_TTL_MS = 1500
# Short, so that floors expire within a run (the client's floor is 1 hour).
RETENTION_MS = 3 * MAX_TTL_MS
NODE_TIMEOUT = 0.1
# How long a node is seen blank beside nodes with a floor before it is seeded with a
# warm-up (it may be a node of a new set that another client is seeding).
PATIENCE_MS = round(SEED_PATIENCE * NODE_TIMEOUT * 1000)
NAMES = ("a", "b", "c")  # the lock names; only the first has a history at the start
NAME = st.integers(0, len(NAMES) - 1)
PICK = st.integers(0, 2**16)  # index into whatever is eligible, modulo its length
# Bit masks of nodes whose requests are lost: mostly none or one, sometimes any.
LOST = st.sampled_from([0, 0, 0, 1, 2, 4, 8, 16]) | st.integers(0, 31)

BASE_US = 1_000_000_000_000  # the true wall clock at fake time 0, in µs
# Wall-clock skews of the clients, in µs: in step, a little off, far ahead, and so far
# behind that their clocks propose nothing useful (their tokens come from the nodes).
SKEWS = st.sampled_from([0, 0, 2_000, -2_000, -3_000_000, 10**9, -BASE_US, -(2 * BASE_US)])

# Where the nodes' floors start: a new node set, one
# used before, one whose floors are ahead of every wall clock (its first proposals are
# all too low).
HISTORY = st.sampled_from([None, 1, BASE_US - 10**9, BASE_US + 10**10])

Kind = Literal["acquire", "extend", "release", "seed"]


class Violation(AssertionError):
    """An invariant of the model failed; the message names which one."""


@dataclass
class Message:
    """A request on the wire to ``node``, sent while the node was in ``epoch``: the
    bytes a flow packed (``packed``), and what the model reads from them."""

    node: int
    epoch: int
    kind: Kind
    packed: bytes
    client: int = -1
    seq: int = 0  # the order messages were written in
    name: int = 0  # index into NAMES (a seed is the node's, whatever lock found it blank)
    token: str = ""
    proposal: int = 0
    mark: int = 1
    floor: int = 0
    warm_ms: int = 0
    marks: frozenset[int] = frozenset()


@dataclass
class InFlight:
    """A round a client's flow waits on: its requests not yet delivered are ``pending``."""

    kind: Literal["acquire", "extend"]
    rnd: Round
    command: commands.Command
    token: str
    proposal: int
    began: int  # event number of the round's start
    pending: dict[int, Message]
    wall_us: int = 0  # the proposer's wall clock when it proposed
    losses: dict[int, int] = field(default_factory=dict)  # node -> its data losses when sent


@dataclass
class ModelClient:
    """A client (its own ``Flows``, keeping its floor across calls) and its current call,
    a flow suspended at the operation it yielded last."""

    skew_us: int
    flows: ModelFlows
    name: int = 0  # the lock of its current acquisition or lease
    call: Literal["acquire", "extend", "release", ""] = ""
    flow: Stepper | None = None
    op: InFlight | None = None  # the round its flow waits on
    last: InFlight | None = None  # its latest acquire round (what a lease comes from)
    last_extend: InFlight | None = None  # the round of its current extension
    held: ModelLease | None = None
    lease_losses: dict[int, int] = field(default_factory=dict)  # node -> its losses at grant
    wake_at: float = 0.0  # a flow that sleeps (back-off) wakes up then

    @property
    def lease(self) -> LeaseState | None:
        return None if self.held is None else self.held._state


@dataclass
class Holding:
    """A span of fake time during which a client relies on its lease."""

    client: int
    name: int
    start: float
    end: float
    facts: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Grant:
    client: int
    name: int
    token: int
    requested: int  # event number when the granting round began
    granted: int  # event number when the client learned it was granted
    at_ms: int
    wall_us: int  # the proposer's wall clock when it proposed


class LockModel(RuleBasedStateMachine):
    # Families of rules; the tests that check the model has teeth switch some off, to
    # search the faults that matter to them faster.
    WIPES: ClassVar[bool] = True  # nodes may restart without their data, or be flushed
    PARTITIONS: ClassVar[bool] = True  # nodes may be cut off (and keep their data)
    STEPWISE: ClassVar[bool] = True  # rounds may be driven request by request
    EXTENDS: ClassVar[bool] = True  # holders may extend their leases
    DELETES: ClassVar[bool] = True  # a node's floor may be deleted by hand
    IDLES: ClassVar[bool] = True  # time may jump past the retention
    FAILOVERS: ClassVar[bool] = True  # a node's lagging replica may take its place
    NAMES_IN_USE: ClassVar[int] = len(NAMES)  # acquisitions take the first this many
    NAMES_USED_BEFORE: ClassVar[int] = 1  # with a history, these names were granted before
    # The core the clients run (broken schemes plant another), and whether its tokens
    # are the proposals (a grant's token is what the client proposed).
    ACQUISITION: ClassVar[type[Acquisition]] = Acquisition
    TOKEN_IS_PROPOSAL: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.ms = 0  # the fake clock, in whole milliseconds (all clocks share its rate)
        self.nodes: list[FakeNode] = []
        self.replicas: list[dict[str, tuple[str, int | None]]] = []  # what each one has
        self.epochs: list[int] = []  # per node: restarts (its connections are lost)
        self.losses: list[int] = []  # per node: restarts and flushes (its data is lost)
        self.down_until: list[int] = []
        self.lost_at: list[tuple[int, int]] = []  # (ms, node) of every data loss
        # The model's own account of each node's history: the highest token it committed
        # or was seeded with since it last lost its data, and until when it keeps it.
        self.remembers: list[tuple[int, int] | None] = []
        self.forgotten: set[int] = set()  # indexes of grants whose history was lost
        self.clients: list[ModelClient] = []
        self.loose: list[Message] = []  # orphans, seeds and cleanup releases on the wire
        # Flows a client runs in the background from a time on (``Later``): (at, client,
        # flow). A failed extension's release, from the lease's validity's end.
        self.later: list[tuple[float, int, Flow[object]]] = []
        self.holdings: list[Holding] = []
        self.grants: list[Grant] = []
        self.events = 0
        self.tokens = 0
        self.rng = random.Random(0)
        self.story: list[str] = []  # what happened, for the failure message
        self._at_once: int | None = None  # inside acquire_at_once: its mask of lost nodes
        self.written = 0

    @property
    def now(self) -> float:
        return self.ms / 1000

    @initialize(
        n=st.sampled_from([3, 5, 1]),
        skews=st.lists(SKEWS, min_size=K, max_size=K),
        history=HISTORY,
    )
    def setup(self, n: int, skews: list[int], history: int | None) -> None:
        self._setup(n, skews, history)

    def _setup(self, n: int, skews: list[int], history: int | None = None) -> None:
        """``history``: every node's floor at the start (None: a node set never used)."""
        config = ClientConfig.build(
            [f"redis://node{i}" for i in range(n)],
            node_timeout=NODE_TIMEOUT,
            drift_factor=0.0,
            drift_floor=0.0,
            max_ttl=MAX_TTL_MS / 1000,
            retention=RETENTION_MS / 1000,
            retry=wait_random(0.0, 0.2),
            recheck=0,  # no notifications in this model: a blocked acquirer backs off
        )
        self.max_ttl_ms = config.max_ttl_ms
        self.specs = [
            self.break_spec(LockSpec.build(config, name, TTL_MS / 1000)) for name in NAMES
        ]
        self.spec = self.specs[0]  # what every lock shares: quorum, TTL, retention
        assert self.spec.retention_ms == RETENTION_MS
        self.names = [f"node{i}" for i in range(n)]
        self.nodes = [FakeNode() for _ in range(n)]
        self.remembers = [None] * n
        if history is not None:
            for i, node in enumerate(self.nodes):
                node.set(NODE_FLOOR, history, self.ms, px=RETENTION_MS)
                self.remembers[i] = (history, self.ms + RETENTION_MS)
            for name in range(self.NAMES_USED_BEFORE):
                self._used_before(name, history)
        self.replicas = [node.replicate() for node in self.nodes]  # in step at the start
        self.epochs = [0] * n
        self.losses = [0] * n
        self.down_until = [0] * n
        self.clients = []
        for c, skew in enumerate(skews):
            flows = ModelFlows(config, self.names, self.rng, self._clock, self._clock_us)
            flows.acquisition_type = self.ACQUISITION
            flows.wall_us = functools.partial(self._wall_us, c)
            self.clients.append(ModelClient(skew, flows))
        self.bus = Bus()  # nobody listens: no notification is ever published

    def _used_before(self, name: int, token: int) -> None:
        """A grant of ``name`` with ``token`` before the run, for (b) and (c)."""
        self.grants.append(Grant(-1, name, token, 0, 0, 0, token))

    # --- what tests with a broken scheme override ----------------------------------------

    def break_spec(self, spec: LockSpec) -> LockSpec:
        return spec

    def node_acquire(self, node: FakeNode, keys: LockKeys, m: Message) -> list[int | str] | int:
        answer = eval_packed(node, m.packed, self.ms, self.bus)
        assert isinstance(answer, (list, int))
        return answer

    def node_seed(self, node: FakeNode, m: Message) -> int:
        answer = eval_packed(node, m.packed, self.ms, self.bus)
        assert isinstance(answer, int)
        return answer

    # --- helpers ------------------------------------------------------------------------

    def _event(self) -> int:
        self.events += 1
        return self.events

    def _log(self, text: str) -> None:
        self.story.append(f"{self.ms:>6} ms  {text}")

    def _clock(self) -> float:
        return self.now

    def _clock_us(self) -> int:
        return BASE_US + self.ms * 1000

    def _wall_us(self, c: int) -> int:
        return BASE_US + self.ms * 1000 + self.clients[c].skew_us

    def _new_token(self, client: int) -> str:
        self.tokens += 1
        return f"c{client}-t{self.tokens}"

    def _up(self, node: int) -> bool:
        return self.ms >= self.down_until[node]

    def _keys(self, name: int) -> LockKeys:
        return self.specs[name].keys

    def _message(self, c: int, node: int, command: commands.Command) -> Message:
        """``command`` as client ``c`` writes it on its connection to ``node`` now."""
        script, keys, args = decode(command.packed)
        self.written += 1
        m = Message(node, self.epochs[node], script, command.packed, c, self.written)  # type: ignore[arg-type]
        if script == "seed":
            m.floor, m.warm_ms = int(args[0]), int(args[1])
            m.marks = frozenset(int(x) for x in args[3:])
            return m
        m.name = next(k for k, spec in enumerate(self.specs) if spec.keys.lock == keys[0])
        m.token = args[0]
        if script == "acquire":
            m.proposal, m.mark = int(args[2]), int(args[3])
        return m

    def _execute(self, m: Message) -> object:
        """Run ``m`` on its node now; None if it cannot reach it (down or restarted).

        A connection delivers in order: what the same client wrote to the same node
        before ``m`` and is still on the wire (``loose``) runs first."""
        earlier = [
            x for x in self.loose if x.client == m.client and x.node == m.node and x.seq < m.seq
        ]
        for x in sorted(earlier, key=lambda x: x.seq):
            self.loose.remove(x)
            self._execute(x)
        if not self._up(m.node) or self.epochs[m.node] != m.epoch:
            return None
        self._watch_history()
        node, keys = self.nodes[m.node], self._keys(m.name)
        if m.kind == "acquire":
            answer = self.node_acquire(node, keys, m)
            status, number = acquire_listed(answer)[:2]
            if status == GRANTED:
                self._remember(m.node, int(number))
            return answer
        if m.kind == "extend":
            extended = eval_packed(node, m.packed, self.ms, self.bus)
            if extended == 1:
                self._remember(m.node, None)
            return extended
        if m.kind == "release":
            return eval_packed(node, m.packed, self.ms, self.bus)
        seeded = self.node_seed(node, m)
        if seeded == 1:
            self._remember(m.node, m.floor)
        return seeded

    # --- the model's account of the history ---------------------------------------------

    def _remembered(self, node: int) -> int | None:
        kept = self.remembers[node]
        return kept[0] if kept is not None and self.ms <= kept[1] else None

    def _remember(self, node: int, token: int | None) -> None:
        """``node`` committed ``token`` (None: an extension), or was seeded with it; either
        way it keeps what it remembers for another retention (as the floor's PX)."""
        old = self._remembered(node)
        if token is None and old is None:
            return
        top = max(t for t in (old, token) if t is not None)
        self.remembers[node] = (top, self.ms + RETENTION_MS)

    def _watch_history(self) -> None:
        """Mark the grants no node remembers any more. Called before every script runs
        and after every rule (what nodes remember only shrinks in between: keys expire,
        nodes lose their data), so no instant with less is missed."""
        kept = max((t for i in range(len(self.nodes)) if (t := self._remembered(i)) is not None),
                   default=-1)  # fmt: skip
        for k, g in enumerate(self.grants):
            if k not in self.forgotten and g.token > kept:
                self.forgotten.add(k)
                self._log(f"no node remembers token {g.token} of {NAMES[g.name]!r} any more")

    def _stop_holding(self, client: int) -> None:
        for h in self.holdings:
            if h.client == client and h.end > self.now:
                h.end = self.now

    def _start_holding(self, client: int, lease: LeaseState, how: str) -> None:
        name = self.clients[client].name
        facts = [f"{how} at {self.now}: {lease}"]
        new = Holding(client, name, self.now, lease.valid_until, facts)
        assert new.start < new.end
        for h in self.holdings:
            if h.name == name and h.client != client and h.start < new.end and new.start < h.end:
                self._fail(
                    f"(a) mutual exclusion: two clients hold lock {NAMES[name]!r} at once: "
                    f"client {h.client} during [{h.start}, {h.end}) {h.facts} and "
                    f"client {client} during [{new.start}, {new.end}) {new.facts}"
                )
        self.holdings.append(new)

    def _fail(self, message: str) -> NoReturn:
        raise Violation(message + "\n" + "\n".join(self.story[-60:]))

    def _eligible_to_start(self) -> list[int]:
        """Clients with no call, or whose acquire call sleeps (a back-off)."""
        return [c for c, s in enumerate(self.clients) if s.op is None and s.held is None]

    def _holders(self) -> list[int]:
        return [c for c, s in enumerate(self.clients) if s.flow is None and s.held is not None]

    def _lost_since(self, node: int, losses: int) -> bool:
        return self.losses[node] != losses

    # --- rules: clients -----------------------------------------------------------------

    # --- carrying out what a flow yields ------------------------------------------------

    def _carry(self, c: int, op: Op | None) -> None:
        """Carry out what client ``c``'s flow yields, from ``op`` on, until it waits for a
        rule (an acquire or extend round, a back-off) or its call ends.

        Rounds of attempts and extensions are driven request by request by the rules.
        A lease's own release (also after a failed extension) is sent and answered at
        once (nothing rides on its delay). Cleanup releases and seeds of an attempt are
        put on the wire (``loose``: they arrive later, or never) and the flow goes on at
        once, as if the nodes stayed silent; inside ``acquire_at_once`` they arrive at
        once instead, but for the nodes in its ``lost`` mask.
        """
        state = self.clients[c]
        flow = state.flow
        assert flow is not None
        while op is not None:
            if isinstance(op, Sleep):
                state.wake_at = self.now + op.seconds
                return
            if isinstance(op, Later):
                self.later.append((op.at, c, op.flow))
                op = flow.send(None)
                continue
            assert isinstance(op, Run), f"no {op!r} without notifications"
            targets = range(len(self.nodes)) if op.targets is None else op.targets
            messages = [self._message(c, i, op.command) for i in targets]
            kind = messages[0].kind
            if kind in ("acquire", "extend"):
                wall = self._wall_us(c)
                state.op = InFlight(
                    kind,
                    op.rnd,
                    op.command,
                    messages[0].token,
                    messages[0].proposal,
                    self._event(),
                    {m.node: m for m in messages},
                    wall,
                    dict(enumerate(self.losses)),
                )
                if kind == "acquire":
                    state.last = state.op
                    self._log(
                        f"client {c} proposes {messages[0].proposal} for "
                        f"{NAMES[messages[0].name]!r} ({messages[0].token})"
                    )
                return
            if kind == "release" and decode(op.command.packed)[1][1:]:
                # release.lua with the queue keys: the lease's release, at once.
                self._release_at_once(op, messages)
            else:
                if kind == "seed":
                    self._log(
                        f"client {c} seeds {[m.node for m in messages]}: "
                        f"{messages[0].floor}, {messages[0].warm_ms} ms"
                    )
                for m in messages:
                    if self._at_once is None or self._at_once >> m.node & 1:
                        self.loose.append(m)
                    else:
                        self._execute(m)
            op.rnd.stop_hearing()
            if not op.rnd.decided:
                op.rnd.time_out()
            op = flow.send(None)
        self._ended(c)

    def _release_at_once(self, op: Run, messages: list[Message]) -> None:
        """A lease's release: sent and answered at once (nothing rides on its delay)."""
        for m in messages:
            answer = self._execute(m)
            if answer is None:
                op.rnd.fail(m.node, Failure.UNREACHABLE, "down")
            else:
                op.rnd.record(m.node, *op.command.parse(answer))

    @precondition(lambda self: any(at <= self.now for at, _, _ in self.later))
    @rule(pick=PICK)
    def run_later(self, pick: int) -> None:
        """A flow a client left to run from a time on (``Later``) runs, that time come."""
        due = [item for item in self.later if item[0] <= self.now]
        item = due[pick % len(due)]
        self.later.remove(item)
        _, c, flow = item
        self._log(f"client {c} runs a flow it left for {item[0]}")
        try:
            op = next(flow)
            while True:
                assert isinstance(op, Run), f"no {op!r} in a flow left for later"
                targets = range(len(self.nodes)) if op.targets is None else op.targets
                self._release_at_once(op, [self._message(c, i, op.command) for i in targets])
                op = flow.send(None)
        except StopIteration:
            pass

    def _ended(self, c: int) -> None:
        """Client ``c``'s call returned or raised."""
        state = self.clients[c]
        flow = state.flow
        assert flow is not None
        assert flow.done
        state.flow, state.op, call, state.call = None, None, state.call, ""
        error = flow.error
        if error is not None and not isinstance(error, TenureError):
            raise error
        if call == "acquire":
            if isinstance(flow.result, LeaseState):  # else Refused, or None: it raised
                self._granted(c, flow.result)
            return
        held = state.held
        assert held is not None
        if call == "extend" and error is None:
            lease = held._state
            op = state.last_extend
            assert op is not None
            assert lease.valid_until > self.now
            state.lease_losses = {i: op.losses[i] for i in lease.granted}
            self._log(f"client {c} extended by {sorted(lease.granted)}")
            self._start_holding(c, lease, "extended")
            return
        if call == "extend" and isinstance(error, LeaseExpired) and not held.released:
            assert self.now >= held._state.valid_until
            self._release(c)  # nothing was sent: the holder releases
            return
        if call == "release":
            lease = held._state
            intact = all(
                self._up(i) and not self._lost_since(i, n) for i, n in state.lease_losses.items()
            )
            if self.now < lease.valid_until and intact and error is not None:
                # Nobody can have removed our token from a granting node while it was valid.
                self._fail(f"(a) the release of a valid lease found it lost: {error}")
        elif call == "extend":
            # Its holder learns of the loss only now, and may be at work under the lease
            # until its validity ends: it relies on the lease until then.
            self._log(f"client {c} failed to extend its lease: {error}")
        else:
            self._log(f"client {c} lost its lease: {error}")
            self._stop_holding(c)
        state.held = None

    def _granted(self, c: int, lease: LeaseState) -> None:
        state = self.clients[c]
        op = state.last
        assert op is not None
        assert lease.token == op.token
        assert len(lease.granted) >= self.spec.quorum
        assert lease.valid_until > self.now
        if self.TOKEN_IS_PROPOSAL:
            assert lease.fencing_token == op.proposal
        token = lease.fencing_token
        state.held = ModelLease(lease, self.specs[state.name])
        state.lease_losses = {i: op.losses[i] for i in lease.granted}
        self._log(
            f"client {c} GRANTED {NAMES[state.name]!r} token {token} by {sorted(lease.granted)}"
        )
        grant = Grant(c, state.name, token, op.began, self._event(), self.ms, op.wall_us)
        self._check_token(grant)
        self._start_holding(c, lease, "acquired")

    # --- rules: clients -----------------------------------------------------------------

    @precondition(lambda self: self.STEPWISE and self.nodes and self._eligible_to_start())
    @rule(pick=PICK, name=NAME, blocking=st.booleans(), timeout=st.none() | st.integers(0, 3000))
    def start_acquire(self, pick: int, name: int, blocking: bool, timeout: int | None) -> None:
        eligible = self._eligible_to_start()
        self._begin_acquire(eligible[pick % len(eligible)], name, blocking, timeout)

    @precondition(lambda self: self.nodes and self._eligible_to_start())
    @rule(
        pick=PICK,
        name=NAME,
        blocking=st.booleans(),
        order=st.randoms(use_true_random=False),
        lost=LOST,
        batch=st.booleans(),
    )
    def acquire_at_once(
        self, pick: int, name: int, blocking: bool, order: random.Random, lost: int, batch: bool
    ) -> None:
        """An acquire call with nothing in between, as a driver makes it: every request
        reaches its node at once, in some order, except those to the nodes in the bit
        mask ``lost``; the cleanup and seeds the flow writes then arrive the same way,
        and its next attempts likewise, until it returns or sleeps (a back-off).
        ``name``: the lock, unless the client is in the middle of an acquisition already."""
        eligible = self._eligible_to_start()
        c = eligible[pick % len(eligible)]
        state = self.clients[c]
        op: InFlight | None = self._begin_acquire(c, name, blocking, None)
        while op is not None:
            nodes = list(op.pending)
            order.shuffle(nodes)
            for node in nodes:
                self._deliver_to(op, node, 1 if lost >> node & 1 else 0, batch)
            self._at_once = lost
            try:
                self._conclude(c)
            finally:
                self._at_once = None
            op = state.op

    def _begin_acquire(
        self, c: int, name: int, blocking: bool, timeout: int | None
    ) -> InFlight | None:
        """Start an acquire call (``Flows.acquire``), or wake one from its back-off: the
        round of its next attempt (None if it returned at once)."""
        state = self.clients[c]
        # A client backing off sleeps until it wakes up: the clock moves on meanwhile.
        self.ms = max(self.ms, math.floor(state.wake_at * 1000))
        while self.now < state.wake_at:
            self.ms += 1
        if state.flow is None:
            state.name = name % self.NAMES_IN_USE
            state.call = "acquire"
            flow = state.flows.acquire(
                self.specs[state.name],
                blocking,
                None if timeout is None else timeout / 1000,
                waiter=self._new_token(c),  # the call's waiter id: its owner token
                channel="tenure:wake:model",
                listening=False,
            )
            state.flow = Stepper(flow)
            self._carry(c, state.flow.start())
        else:
            assert isinstance(state.flow.op, Sleep)
            self._carry(c, state.flow.send(None))
        return state.op

    @precondition(lambda self: self.EXTENDS and self._holders())
    @rule(pick=PICK)
    def start_extend(self, pick: int) -> None:
        holders = self._holders()
        c = holders[pick % len(holders)]
        state = self.clients[c]
        assert state.held is not None
        state.call = "extend"
        state.flow = Stepper(state.flows.extend(state.held, None))
        self._carry(c, state.flow.start())
        state.last_extend = state.op

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

    def _deliver_one(self, op: InFlight, node_pick: int, fate: int = 0) -> None:
        self._deliver_to(op, sorted(op.pending)[node_pick % len(op.pending)], fate)

    def _deliver_to(self, op: InFlight, node: int, fate: int = 0, batch: bool = False) -> None:
        """Deliver ``op``'s request to ``node``; ``fate`` 1: lost before it runs, 2: reply
        lost (the node ran it). ``batch``: the reply arrives together with the others, and
        is read even if an earlier one decided the round (the sync driver reads every
        ready socket); otherwise the driver has stopped reading once the round was
        decided (the asyncio driver)."""
        message = op.pending.pop(node)
        if fate == 1:
            return
        answer = self._execute(message)
        if fate == 2 or (op.rnd.decided and not batch):
            return
        if answer is None:
            op.rnd.fail(node, Failure.UNREACHABLE, "connection refused or reset")
        else:
            op.rnd.record(node, *op.command.parse(answer))

    @precondition(lambda self: self._undelivered())
    @rule(
        pick=PICK,
        node_pick=PICK,
        latency=st.integers(0, 40),
        fate=st.sampled_from([0, 0, 0, 1, 2]),
    )
    def deliver(self, pick: int, node_pick: int, latency: int, fate: int) -> None:
        """After ``latency`` ms, one request reaches its node (or is lost)."""
        self.ms += latency
        waiting = self._undelivered()
        _, op = waiting[pick % len(waiting)]
        self._deliver_one(op, node_pick, fate)

    @precondition(lambda self: self._undelivered())
    @rule(pick=PICK, order=st.randoms(use_true_random=False), lost=LOST)
    def deliver_all(self, pick: int, order: random.Random, lost: int) -> None:
        """Every request of one round arrives in some order (bits of ``lost``: dropped)."""
        waiting = self._undelivered()
        _, op = waiting[pick % len(waiting)]
        k = 0
        while op.pending:
            self._deliver_one(op, order.randrange(2**16), 1 if lost >> k & 1 else 0)
            k += 1

    @precondition(lambda self: self._ready())
    @rule(pick=PICK)
    def conclude(self, pick: int) -> None:
        """A round returns to its flow: decided, or at its deadline (the silent nodes
        failed, as the drivers do). Its requests still on the wire may arrive later."""
        ready = self._ready()
        self._conclude(ready[pick % len(ready)][0])

    def _conclude(self, c: int) -> None:
        state = self.clients[c]
        op = state.op
        assert op is not None
        assert state.flow is not None
        state.op = None
        op.rnd.stop_hearing()
        if not op.rnd.decided:
            op.rnd.time_out()
        # Requests still on the wire may reach their node later.
        self.loose.extend(op.pending[i] for i in sorted(op.pending))
        self._carry(c, state.flow.send(None))

    def _check_token(self, new: Grant) -> None:
        self._watch_history()
        for k, old in enumerate(self.grants):
            if old.name != new.name or old.granted >= new.requested:
                continue
            kept = k not in self.forgotten
            if kept and old.token == new.token:
                self._fail(f"(c) token {new.token} granted twice: {old} and {new}")
            # Across a loss of the history, only the proposer's clock speaks for order.
            if (kept or new.wall_us > old.token) and not new.token > old.token:
                self._fail(
                    f"(b) token order: {new} was requested after {old} was granted, "
                    f"but its token is not higher"
                    + ("" if kept else " (history lost, but the proposer's clock was past it)")
                )
        self.grants.append(new)
        self._watch_history()

    def _release(self, c: int) -> None:
        """The holder releases (``Flows.release``), sent and answered at once."""
        state = self.clients[c]
        held = state.held
        assert held is not None
        self._stop_holding(c)
        self._log(f"client {c} releases {NAMES[state.name]!r} token {held._state.fencing_token}")
        state.call = "release"
        state.flow = Stepper(state.flows.release(held))
        self._carry(c, state.flow.start())

    @precondition(lambda self: self._holders())
    @rule(pick=PICK)
    def release(self, pick: int) -> None:
        holders = self._holders()
        self._release(holders[pick % len(holders)])

    # --- rules: the network, time, nodes ------------------------------------------------

    @precondition(lambda self: self.loose)
    @rule(pick=PICK, lost=st.booleans())
    def deliver_loose(self, pick: int, lost: bool) -> None:
        """A late request (orphan, seed, cleanup release) arrives, or is lost for good."""
        message = self.loose.pop(pick % len(self.loose))
        if not lost:
            self._execute(message)

    @rule(step=st.integers(0, 100) | st.integers(0, 2 * MAX_TTL_MS))
    def advance_time(self, step: int) -> None:
        self.ms += step

    @precondition(lambda self: self.IDLES and self.nodes)
    @rule(extra=st.sampled_from([1, 1, 50]) | st.integers(1, RETENTION_MS))
    def idle_past_retention(self, extra: int) -> None:
        """Nothing happens for longer than the retention: every floor that
        nothing renewed meanwhile expires (if nothing is in flight, all of them)."""
        self.ms += RETENTION_MS + extra
        self._log(f"time passes beyond the retention (+{RETENTION_MS + extra} ms)")

    def _may_lose(self, node: int) -> bool:
        """The assumption: at most a minority lose their data within any ``max_ttl``."""
        recent = {i for t, i in self.lost_at if t >= self.ms - self.max_ttl_ms} | {node}
        return len(recent) <= len(self.nodes) - self.spec.quorum

    def _pick_to_lose(self, pick: int, holder: bool) -> int | None:
        """A node that may lose its data now. ``holder``: the adversary picks a node that
        granted a lease still valid (None if none did, or the assumption forbids it)."""
        candidates = list(range(len(self.nodes)))
        if holder:
            candidates = sorted(
                i
                for s in self.clients
                if s.lease is not None and s.lease.valid_until > self.now
                for i in s.lease.granted
            )
            if not candidates:
                return None
        node = candidates[pick % len(candidates)]
        return node if self._may_lose(node) else None

    def _lose(self, node: int) -> None:
        self.losses[node] += 1
        self.lost_at.append((self.ms, node))
        self.remembers[node] = None
        self._watch_history()

    @precondition(lambda self: self.WIPES and self.nodes and len(self.nodes) > 1)
    @rule(
        pick=PICK,
        down_ms=st.sampled_from([0, 0, 50]) | st.integers(0, 2000),
        holder=st.booleans(),
    )
    def restart_without_data(self, pick: int, down_ms: int, holder: bool) -> None:
        """A node crashes, loses every key and its connections, and restarts later."""
        node = self._pick_to_lose(pick, holder)
        if node is None:
            return
        self.nodes[node].wipe()
        self.epochs[node] += 1
        self.down_until[node] = max(self.down_until[node], self.ms + down_ms)
        self._lose(node)
        self._log(f"node {node} restarts without data (down {down_ms} ms)")

    @precondition(lambda self: self.FAILOVERS and self.nodes)
    @rule(pick=PICK)
    def replica_catches_up(self, pick: int) -> None:
        """A node's replica receives everything the node has now."""
        node = pick % len(self.nodes)
        self.replicas[node] = self.nodes[node].replicate()

    @precondition(lambda self: self.FAILOVERS and self.nodes)
    @rule(
        pick=PICK,
        down_ms=st.sampled_from([0, 0, 50]) | st.integers(0, 2000),
        holder=st.booleans(),
    )
    def fail_over(self, pick: int, down_ms: int, holder: bool) -> None:
        """The node dies; its replica, holding what it last caught up with, is promoted
        and takes the node's address ``down_ms`` later. The writes it missed are lost, and
        the connections with the old master."""
        if len(self.nodes) == 1:
            node: int | None = 0  # the case the warm-up alone must cover
        else:
            node = self._pick_to_lose(pick, holder)
        if node is None:
            return
        self.nodes[node].promote(self.replicas[node])
        self.replicas[node] = self.nodes[node].replicate()  # a new replica, in step
        self.epochs[node] += 1
        self.down_until[node] = max(self.down_until[node], self.ms + down_ms)
        self._lose(node)
        self._log(f"node {node} fails over to a replica that lost the last writes")

    @precondition(lambda self: self.WIPES and self.nodes and len(self.nodes) > 1)
    @rule(pick=PICK, holder=st.booleans())
    def flush(self, pick: int, holder: bool) -> None:
        """FLUSHALL on a node: every key is gone; it stays up, its connections too (what
        was sent to it before still arrives)."""
        node = self._pick_to_lose(pick, holder)
        if node is None:
            return
        self.nodes[node].flush()
        self._lose(node)
        self._log(f"node {node} is flushed")

    @precondition(lambda self: self.DELETES and self.nodes and len(self.nodes) > 1)
    @rule(pick=PICK, holder=st.booleans())
    def delete_floor(self, pick: int, holder: bool) -> None:
        """An operator deletes one node's floor by hand: its fencing history is gone (a
        data loss, as far as tokens go), while its locks stay."""
        node = self._pick_to_lose(pick, holder)
        if node is None or not self.nodes[node].delete(NODE_FLOOR, self.ms):
            return
        self._lose(node)
        self._log(f"node {node}: its floor is deleted")

    @precondition(
        lambda self: (
            self.PARTITIONS
            and self.nodes
            and sum(not self._up(i) for i in range(len(self.nodes)))
            <= len(self.nodes) - self.spec.quorum
        )
    )
    @rule(pick=PICK, duration=st.integers(0, 2500))
    def node_goes_down(self, pick: int, duration: int) -> None:
        """A node is cut off (or paused) and comes back with its data ``duration`` ms later."""
        node = pick % len(self.nodes)
        self.down_until[node] = max(self.down_until[node], self.ms + duration)

    def teardown(self) -> None:
        self.unwind()

    def unwind(self) -> None:
        """Unwind every flow still suspended (its cleanup is dropped), so that none is
        left for the garbage collector to close."""
        for state in self.clients:
            if state.flow is not None:
                state.flow.abandon()
                state.flow = None

    # --- invariants ---------------------------------------------------------------------

    @invariant()
    def history_watched(self) -> None:
        self._watch_history()

    @invariant()
    def at_most_one_valid_lease(self) -> None:
        for name in range(len(NAMES)):
            valid = [
                (c, s.lease)
                for c, s in enumerate(self.clients)
                if s.name == name and s.lease is not None and s.lease.valid_until > self.now
            ]
            if len(valid) > 1:
                self._fail(f"(a) mutual exclusion of {NAMES[name]!r}: at {self.now}: {valid}")

    @invariant()
    def granting_nodes_keep_the_token_while_valid(self) -> None:
        for s in self.clients:
            lease = s.lease
            if lease is None or lease.valid_until <= self.now:
                continue
            for i, losses in s.lease_losses.items():
                if self._lost_since(i, losses):
                    continue  # the documented exception: a node that lost its data
                holder = self.nodes[i].get(self._keys(s.name).lock, self.ms)
                if holder != lease.token:
                    self._fail(
                        f"(a) a granting node lost the lock while the lease is valid: node {i} "
                        f"holds {holder!r} at {self.now}, lease {lease}"
                    )


MODEL_SETTINGS = model_settings(max_examples=600, stateful_step_count=60)


def test_model_mutual_exclusion_and_fencing() -> None:
    run_state_machine_as_test(LockModel, settings=MODEL_SETTINGS)


@pytest.mark.soak
@pytest.mark.timeout(3600)  # 20,000 examples outlast the suite's 300 s limit
def test_model_mutual_exclusion_and_fencing_soak() -> None:
    run_state_machine_as_test(
        LockModel, settings=settings(MODEL_SETTINGS, max_examples=20_000, stateful_step_count=100)
    )


# --- the model has teeth ----------------------------------------------------------------

# Examples each broken scheme takes to be found, measured over unseeded runs (seven
# each, before the floor became a node's whole history): QuorumOfOne, ValidityTooLong,
# Incr and NoWarmUp 4-160, SeedWithoutWarmUp 4-540, FloorNotRaised 20-800. The bounds
# only matter if the search got much weaker.
FIND_SETTINGS = find_settings(MODEL_SETTINGS, max_examples=2000)


class QuorumOfOneScheme(LockModel):
    """A core that counted one yes as enough would let two clients win."""

    WIPES = False
    FAILOVERS = False  # a failover is a data loss too

    def break_spec(self, spec: LockSpec) -> LockSpec:
        return replace(spec, quorum=1)

    @initialize(n=st.just(3), skews=st.just([0] * K), history=HISTORY)
    def setup(self, n: int, skews: list[int], history: int | None) -> None:
        self._setup(n, skews, history)  # with one node, a quorum of one is right


class ValidityTooLongScheme(LockModel):
    """A core that promised validity beyond the key's TTL would overlap holders."""

    WIPES = False
    FAILOVERS = False  # a failover is a data loss too

    def break_spec(self, spec: LockSpec) -> LockSpec:
        return replace(spec, drift=-0.3)


class IncrAcquisition(Acquisition):
    """The token of a grant: the highest counter among the granting nodes."""

    def conclude(self, rnd: Round, token: str, now: float) -> Step:
        step = super().conclude(rnd, token, now)
        if not isinstance(step, Granted):
            return step
        top = max(r.info[1] for r in rnd.results if r is not None and r.ok and r.info)
        return replace(step, lease=replace(step.lease, fencing_token=top))


class IncrScheme(LockModel):
    """The naive fencing scheme: each node INCRs its own counter on a grant, and the token
    is the highest counter among the granting majority. Not monotonic: nodes A, B, C;
    {A, B} give 1; {A, C} give max(2, 1) = 2; {B, C} give max(2, 2) = 2 again.

    No node ever loses its data here: the scheme fails without any fault but message loss.
    """

    WIPES = False
    FAILOVERS = False  # a failover is a data loss too

    def node_acquire(self, node: FakeNode, keys: LockKeys, m: Message) -> list[int | str] | int:
        counter_key = f"{keys.lock}:incr"  # the scheme's own per-lock counter
        counter = int(node.get(counter_key, self.ms) or 0)
        if node.exists(keys.lock, self.ms):
            return [HELD, counter, 0]
        node.set(keys.lock, m.token, self.ms, px=self.spec.ttl_ms)
        minted = node.incr(counter_key, self.ms)
        return [GRANTED, minted, minted]

    ACQUISITION = IncrAcquisition
    TOKEN_IS_PROPOSAL = False

    @initialize(n=st.just(3), skews=st.just([0] * K), history=st.just(None))
    def setup(self, n: int, skews: list[int], history: int | None) -> None:
        self._setup(n, skews, history)


class RestartFocus(LockModel):
    """The model with three nodes that have history, and only the rules a restart attack
    needs: whole acquisitions, releases, late messages, time, restarts and flushes."""

    PARTITIONS = False
    STEPWISE = False
    EXTENDS = False
    DELETES = False
    IDLES = False
    FAILOVERS = False

    @initialize(
        n=st.just(3),
        skews=st.lists(SKEWS, min_size=K, max_size=K),
        history=st.sampled_from([1, BASE_US - 10**9]),
    )
    def setup(self, n: int, skews: list[int], history: int | None) -> None:
        self._setup(n, skews, history)


class NoWarmUpScheme(RestartFocus):
    """A blank node votes at once, as if its floor were 0 (no seeding, no warm-up). After
    a restart it has forgotten the locks it granted, and every token."""

    def node_acquire(self, node: FakeNode, keys: LockKeys, m: Message) -> list[int | str] | int:
        if node.floor_of(keys, self.ms) is None:
            node.set(keys.floor, 0, self.ms, px=RETENTION_MS)
        return super().node_acquire(node, keys, m)


class SeedWithoutWarmUpScheme(RestartFocus):
    """Blank nodes are seeded with the right floor but vote at once (no warm-up), even when
    not every node was blank: the lease a node granted before losing its data may still
    be valid."""

    def node_seed(self, node: FakeNode, m: Message) -> int:
        seeded = super().node_seed(node, m)
        if seeded == 1:
            node.delete(self.spec.keys.warm, self.ms)  # as a seed with no warm-up leaves it
        return seeded


class LowestFloorAcquisition(Acquisition):
    """Seeds from the lowest floor a majority answered."""

    def conclude(self, rnd: Round, token: str, now: float) -> Step:
        step = super().conclude(rnd, token, now)
        if not isinstance(step, (Granted, Retry)) or step.seed is None:
            return step
        floors = [
            r.info[2]
            for r in rnd.results
            if r is not None and r.info is not None and r.info[0] in (GRANTED, HELD, TOO_LOW)
        ]
        return replace(step, seed=replace(step.seed, floor=min(floors, default=0)))


class SeedFromLowestFloorScheme(LockModel):
    """A core that seeds a blank node from the *lowest* floor a majority answered, not
    the highest: a node that missed the last grant vouches for less than was committed
    (``test_a_blank_node_is_seeded_from_the_highest_floor`` replays the attack; the
    random search rarely builds it, since any grant that reaches the low node raises it).
    """

    ACQUISITION = LowestFloorAcquisition


class TokenFocus(LockModel):
    """Three nodes with history and no faults but lost messages and floors expiring
    while other locks are in use: what is left to break is how a node compares and
    records tokens."""

    WIPES = False
    FAILOVERS = False  # a failover is a data loss too
    DELETES = False
    PARTITIONS = False
    STEPWISE = False
    EXTENDS = False

    @initialize(
        n=st.just(3),
        skews=st.lists(SKEWS, min_size=K, max_size=K),
        history=st.sampled_from([1, BASE_US - 10**9]),
    )
    def setup(self, n: int, skews: list[int], history: int | None) -> None:
        self._setup(n, skews, history)


class GrantAtFloorScheme(TokenFocus):
    """A node that grants a proposal *equal* to its floor (>= instead of >): two clients
    whose clocks read the same can be granted one token, one after the other."""

    def node_acquire(self, node: FakeNode, keys: LockKeys, m: Message) -> list[int | str] | int:
        floor = node.floor_of(keys, self.ms)
        if floor is not None and floor == m.proposal and floor > 0:
            node.set(keys.floor, floor - 1, self.ms, px=RETENTION_MS)
            answer = super().node_acquire(node, keys, m)
            if acquire_listed(answer)[0] != GRANTED:
                node.set(keys.floor, floor, self.ms, px=RETENTION_MS)  # as it was
            return answer
        return super().node_acquire(node, keys, m)


class FloorNotRaisedScheme(TokenFocus):
    """A grant that does not raise the node's floor (it only renews it): the floor is a
    node's whole fencing history, so the next grant may reuse a lower token."""

    def node_acquire(self, node: FakeNode, keys: LockKeys, m: Message) -> list[int | str] | int:
        before = node.floor_of(keys, self.ms)
        answer = super().node_acquire(node, keys, m)
        if acquire_listed(answer)[0] == GRANTED and before is not None:
            node.set(keys.floor, before, self.ms, px=RETENTION_MS)
        return answer


class FailoverFocus(LockModel):
    """One or three nodes with history, and only the rules a failover attack needs:
    whole acquisitions, releases, late messages, time, replicas and failovers."""

    WIPES = False
    PARTITIONS = False
    STEPWISE = False
    EXTENDS = False
    DELETES = False
    IDLES = False

    @initialize(
        n=st.sampled_from([1, 3]),
        skews=st.lists(SKEWS, min_size=K, max_size=K),
        history=st.sampled_from([None, 1, BASE_US - 10**9]),
    )
    def setup(self, n: int, skews: list[int], history: int | None) -> None:
        self._setup(n, skews, history)


class HistoryIgnoredScheme(FailoverFocus):
    """Scripts that do not compare replication IDs (tenure before this check): a
    promoted replica votes with the floor and locks it received, and a grant it never
    received may still be valid."""

    def _forget_history(self, node: FakeNode) -> None:
        node.replid2 = "0" * 40
        if node.get(NODE_REPLID, self.ms) is not None:
            node.set(NODE_REPLID, node.replid, self.ms, px=RETENTION_MS)

    def node_acquire(self, node: FakeNode, keys: LockKeys, m: Message) -> list[int | str] | int:
        self._forget_history(node)
        return super().node_acquire(node, keys, m)

    def node_seed(self, node: FakeNode, m: Message) -> int:
        self._forget_history(node)
        return super().node_seed(node, m)


class NoWarmUpWithoutRestartsScheme(NoWarmUpScheme):
    """The control for ``NoWarmUpScheme``: without data loss (restarts, flushes, a floor
    deleted by hand), or floors expiring, counting a missing floor as 0 is harmless (it
    only happens on a new node set), so what the model catches there is the loss."""

    WIPES = DELETES = FAILOVERS = False
    PARTITIONS = STEPWISE = EXTENDS = True
    IDLES = False


def test_no_warm_up_is_harmless_without_restarts() -> None:
    run_state_machine_as_test(
        NoWarmUpWithoutRestartsScheme, settings=settings(MODEL_SETTINGS, max_examples=60)
    )


@pytest.mark.parametrize(
    ("machine", "violated", "find"),
    [
        pytest.param(
            machine,
            violated,
            find,
            id=machine.__name__,
            # Their searches take minutes (below) and 17 s; the default run replays
            # each attack (``test_a_blank_node_seeded_beside_others_warms_up_before_it_votes``,
            # ``test_a_node_grants_only_above_its_floor``).
            marks=(
                [pytest.mark.slow]
                if machine in (SeedWithoutWarmUpScheme, GrantAtFloorScheme)
                else []
            ),
        )
        for machine, violated, find in [
            (QuorumOfOneScheme, r"\((a|c)\) ", FIND_SETTINGS),
            (ValidityTooLongScheme, r"\(a\) ", FIND_SETTINGS),
            (IncrScheme, r"\((b|c)\) token", FIND_SETTINGS),
            (NoWarmUpScheme, r"\((a|b|c)\) ", FIND_SETTINGS),
            (SeedWithoutWarmUpScheme, r"\(a\) mutual exclusion", FIND_SETTINGS),
            (HistoryIgnoredScheme, r"\((a|b|c)\) ", FIND_SETTINGS),
            (GrantAtFloorScheme, r"\((b|c)\) token", FIND_SETTINGS),
            (FloorNotRaisedScheme, r"\((b|c)\) token", FIND_SETTINGS),
        ]
    ],
)
# The search for SeedWithoutWarmUpScheme's bug takes about 130 s alone on a machine slow
# at Python (derandomized: the same examples every run), 240 s in a full run; beside the
# rest of the suite on a loaded CI machine it once ran past the suite's 300 s limit.
@pytest.mark.timeout(1200)
def test_model_catches_a_broken_scheme(
    machine: type[LockModel], violated: str, find: settings
) -> None:
    with pytest.raises(Violation, match=violated):
        run_state_machine_as_test(machine, settings=find)


# --- histories the random search is unlikely to reach in CI time, replayed step by step ---


_REPLAYED: list[LockModel] = []


@pytest.fixture(autouse=True)
def _unwind_replayed() -> Iterator[None]:
    """A replayed history ends with flows suspended: unwind them at the end of its test."""
    yield
    while _REPLAYED:
        _REPLAYED.pop().unwind()


def _made(machine: type[LockModel]) -> LockModel:
    model = machine()
    _REPLAYED.append(model)
    return model


def _model(n: int, skews: list[int], history: int | None) -> LockModel:
    model = _made(LockModel)
    model._setup(n, skews, history)
    return model


def _granted(model: LockModel) -> list[tuple[int, Grant]]:
    """The grants of the run (not the history the nodes started with), by index."""
    return [(k, g) for k, g in enumerate(model.grants) if g.client >= 0]


@pytest.mark.parametrize("machine", [LockModel, SeedFromLowestFloorScheme])
def test_a_blank_node_is_seeded_from_the_highest_floor(machine: type[LockModel]) -> None:
    """A node that lost its data is seeded from the highest floor a majority answered:
    any lower, and a majority that includes it and a node that missed the last grant
    could grant a lower token later. (The planted ``SeedFromLowestFloorScheme`` must
    fail here; the real core must not.)

        before: "a" granted T on nodes 0 and 1; node 2 (floor t < T) missed it and
                holds "b" for a client gone; node 0 then loses its data
        client 0 (clock far behind): "b": node 0 blank, node 1 too low (T), node 2 held
                (t) -> node 0 seeded (with T; the broken core: t) and warming; the
                immediate retry is refused by node 2 (held): the attempt gives up
        node 1 is cut off; max_ttl passes ("b" expires, node 0 is warm)
        client 1 (clock far behind): "a" on nodes 0 and 2: above T (broken: t + 1 < T)
    """
    same = random.Random(0)  # the order requests reach the nodes in (any will do)
    model = _made(machine)
    model._setup(3, [-2 * BASE_US] * K, None)
    big, small = BASE_US - 10**9, BASE_US - 2 * 10**9
    for i, top in enumerate((big, big, small)):
        model.nodes[i].set(NODE_FLOOR, top, model.ms, px=RETENTION_MS)
        model.remembers[i] = (top, model.ms + RETENTION_MS)
    model._used_before(0, big)
    model.nodes[2].set(model.specs[1].keys.lock, "gone", model.ms, px=TTL_MS)
    model.nodes[0].wipe()
    model._lose(0)
    model.acquire_at_once(pick=0, name=1, blocking=False, order=same, lost=0, batch=True)
    # Seeded once it has been seen blank for the patience: by the next attempt then.
    model.advance_time(step=PATIENCE_MS + 1)
    model.acquire_at_once(pick=0, name=1, blocking=False, order=same, lost=0, batch=True)
    assert model.clients[0].lease is None
    assert model.nodes[0].floor_of(model.spec.keys, model.ms) is not None  # seeded
    model.node_goes_down(pick=1, duration=10 * MAX_TTL_MS)
    model.advance_time(step=MAX_TTL_MS + 1)
    if machine is LockModel:
        model.acquire_at_once(pick=1, name=0, blocking=True, order=same, lost=0, batch=True)
        assert model.grants[-1].client == 1
        assert model.grants[-1].token > big
    else:
        with pytest.raises(Violation, match=r"\(b\) token"):
            model.acquire_at_once(pick=1, name=0, blocking=True, order=same, lost=0, batch=True)


@pytest.mark.parametrize("machine", [LockModel, SeedWithoutWarmUpScheme])
def test_a_blank_node_seeded_beside_others_warms_up_before_it_votes(
    machine: type[LockModel],
) -> None:
    """A node that lost its data while a lease it granted is still valid is seeded with
    the floor the others answered, and warms up before it votes again: voting at once,
    it and a node that missed the grant make a second majority. (The planted
    ``SeedWithoutWarmUpScheme`` must fail here; the real core must not. The random
    search finds that scheme's bug too, but slowly: ``--slow``.)

        client 0: "a" granted on nodes 0 and 1 (node 2 missed the request)
        node 0:   restarts without its data (client 0's lease still valid)
        client 1: "a": node 0 blank, node 1 held, node 2 free -> refused
        client 1, after the patience: node 0 still blank -> seeded (with a warm-up; the
                  broken core: none), and asked again at once with the others: granted
                  by nodes 0 and 2 only by the broken core
    """
    same = random.Random(0)  # the order requests reach the nodes in (any will do)
    model = _made(machine)
    model._setup(3, [0] * K, BASE_US - 10**9)
    model.acquire_at_once(pick=0, name=0, blocking=False, order=same, lost=0b100, batch=True)
    holder = model.clients[0].lease
    assert holder is not None
    assert holder.granted == frozenset({0, 1})
    model.restart_without_data(pick=0, down_ms=0, holder=False)
    # pick 0 of the clients free to start: client 1
    model.acquire_at_once(pick=0, name=0, blocking=False, order=same, lost=0, batch=True)
    assert model.clients[1].lease is None
    assert model.nodes[0].floor_of(model.spec.keys, model.ms) is None  # not seeded yet
    # Seeded once it has been seen blank for the patience: by the next attempt then.
    model.advance_time(step=PATIENCE_MS + 1)
    assert model.now < holder.valid_until
    if machine is LockModel:
        model.acquire_at_once(pick=0, name=0, blocking=False, order=same, lost=0, batch=True)
        assert model.nodes[0].floor_of(model.spec.keys, model.ms) is not None  # seeded
        assert model.clients[1].lease is None  # node 0 warms up: no majority without node 1
        model.at_most_one_valid_lease()
    else:
        with pytest.raises(Violation, match=r"\(a\) mutual exclusion"):
            model.acquire_at_once(pick=0, name=0, blocking=False, order=same, lost=0, batch=True)


@pytest.mark.parametrize("machine", [LockModel, GrantAtFloorScheme])
def test_a_node_grants_only_above_its_floor(machine: type[LockModel]) -> None:
    """A node grants a proposal only above its floor, not equal to it: two clients whose
    clocks read the same would otherwise be granted one token, one after the other. (The
    planted ``GrantAtFloorScheme`` must fail here; the real core must not. The random
    search finds that bug too, in 17 s: ``--slow``.)

        0 ms  client 0 proposes its clock's reading W for "a": granted, token W (every
              node's floor is now W); it releases
        1 ms  client 1, its clock 1 ms behind, proposes W for "a": too low everywhere,
              then W + 1 (the broken nodes grant W again)
    """
    same = random.Random(0)  # the order requests reach the nodes in (any will do)
    model = _made(machine)
    model._setup(3, [0, -1000] + [0] * (K - 2), BASE_US - 10**9)
    model.acquire_at_once(pick=0, name=0, blocking=False, order=same, lost=0, batch=True)
    first = model.grants[-1]
    assert (first.client, first.token) == (0, first.wall_us)
    model.release(pick=0)
    model.advance_time(step=1)
    # pick 1 of the clients free to start: client 1
    if machine is LockModel:
        model.acquire_at_once(pick=1, name=0, blocking=False, order=same, lost=0, batch=True)
        second = model.grants[-1]
        assert second.wall_us == first.token  # the same reading, so the same proposal
        assert (second.client, second.token) == (1, first.token + 1)
    else:
        with pytest.raises(Violation, match=r"\(c\) token \d+ granted twice"):
            model.acquire_at_once(pick=1, name=0, blocking=False, order=same, lost=0, batch=True)


def test_stale_seed_of_a_new_node_set_after_a_restart() -> None:
    """A client that saw every node blank seeds them all at 0 without a warm-up ("a new
    node set"). If its seed reached a node that meanwhile *restarted*, after a lock had
    been granted with that node's vote, the node would vote again at once: mutual
    exclusion would break with a single restart (nothing bounds how old the observation
    behind a seed may be: a client paused between reading the replies and sending the
    seeds). The seed quotes the observation mark the node answered with, and a restarted
    node no longer holds it: the seed is refused, and this history is safe.

        client 2: round 1, all three nodes answer "blank" (decided after two), so
                  round 2 asks every node: all three answer "blank"; client 2 pauses
        client 0: seeds every node at 0, is granted (token T1) by all three, releases
        client 0: is granted T2 by nodes 0 and 1 (node 2 cut off)
        node 0:   restarts without its data (the lease T2 is still valid)
        client 2: resumes, concludes round 2: Seed({0,1,2}, 0, warm 0) reaches node 0
        client 1: nodes 0 and 2 grant it while T2 is valid (without the marks)
    """
    same = random.Random(0)  # the order requests reach the nodes in (any will do)
    model = _model(3, [0, 0, 0], None)
    model.start_acquire(pick=2, name=0, blocking=True, timeout=None)
    model.deliver_all(pick=0, order=same, lost=0)
    model.conclude(pick=0)  # the flow asks again at once: round 2
    model.deliver_all(pick=0, order=same, lost=0)  # every node heard: all blank
    model.acquire_at_once(pick=0, name=0, blocking=True, order=same, lost=0, batch=True)
    model.release(pick=0)
    model.acquire_at_once(pick=0, name=0, blocking=True, order=same, lost=0b100, batch=True)
    holder = model.clients[0].lease
    assert holder is not None
    assert holder.granted == frozenset({0, 1})
    model.restart_without_data(pick=0, down_ms=20, holder=False)
    model.advance_time(step=20)
    model.conclude(pick=0)  # client 2's old round: seeds every node at 0
    seeds = [i for i, m in enumerate(model.loose) if m.kind == "seed" and m.node == 0]
    model.deliver_loose(pick=seeds[0], lost=False)
    assert model.nodes[0].floor_of(model.spec.keys, model.ms) is None  # refused: stale
    assert model.now < holder.valid_until
    model.acquire_at_once(pick=0, name=0, blocking=True, order=same, lost=0, batch=True)
    model.at_most_one_valid_lease()


def test_history_lost_on_every_node_restarts_tokens_from_the_clock() -> None:
    """The documented limit of the token order (docs/fencing.md): restarts one max_ttl
    apart (within the assumption) of an idle node set erase its history from every node
    in turn, since nothing re-seeds a node until someone acquires. Then every node is
    blank, the set is taken for new and seeded at 0, and the next token comes from the
    proposer's wall clock: from a clock that is behind, it is lower than tokens already
    handed out. The model counts that history as lost, and asserts only what the clock
    gives (here: nothing, the clock is far behind). Mutual exclusion is unaffected.

        client 0: granted token T (its wall clock), releases
        node 0 restarts without data; 1.5 s later node 1; 1.5 s later node 2
        client 2 (wall clock behind): every node blank -> Seed(all, 0, 0) -> token 1 < T
    """
    same = random.Random(0)  # the order requests reach the nodes in (any will do)
    model = _model(3, [0, 0, -2 * BASE_US], 1)
    model.acquire_at_once(pick=0, name=0, blocking=True, order=same, lost=0, batch=True)
    model.release(pick=0)
    for node in range(3):
        model.restart_without_data(pick=node, down_ms=0, holder=False)
        model.advance_time(step=MAX_TTL_MS + 1)
    model.acquire_at_once(pick=2, name=0, blocking=True, order=same, lost=0, batch=True)
    (k, first), (_, last) = _granted(model)
    assert last.client == 2
    assert last.token < first.token
    assert k in model.forgotten
    model.at_most_one_valid_lease()


@pytest.mark.parametrize(
    ("skew", "higher"),
    [
        pytest.param(-3_000_000, True, id="clock 3 s behind, idle 4.5 s: still higher"),
        pytest.param(-2 * BASE_US, False, id="clock far behind: lower"),
    ],
)
def test_history_expired_on_every_node_restarts_tokens_from_the_clock(
    skew: int, higher: bool
) -> None:
    """The whole node set sits idle past the retention: every floor expires,
    the set is taken for new (seeded at 0, no warm-up: no lease can be valid, since a
    floor outlives every lease its node granted), and the next token is the proposer's
    wall clock. It is above the old one exactly when that clock is past it: when the
    clocks disagree by less than the idle time. The model asserts that, and nothing
    more, across such a gap; mutual exclusion is unaffected.

        client 0 (clock right): granted token T on every node, releases
        nothing happens for the retention + 1 ms: every key expires
        client 1 (clock behind by ``skew``): every node blank -> seeded at 0 -> its clock
    """
    same = random.Random(0)  # the order requests reach the nodes in (any will do)
    model = _model(3, [0, skew, 0], 1)
    model.acquire_at_once(pick=0, name=0, blocking=True, order=same, lost=0, batch=True)
    model.release(pick=0)
    model.idle_past_retention(extra=1)
    keys = model.spec.keys
    assert all(n.floor_of(keys, model.ms) is None for n in model.nodes)
    model.acquire_at_once(pick=1, name=0, blocking=True, order=same, lost=0, batch=True)
    (k, first), (_, last) = _granted(model)
    assert last.client == 1
    assert k in model.forgotten
    assert (last.token > first.token) is higher
    assert last.token == max(last.wall_us, 1)
    model.at_most_one_valid_lease()


def test_history_expired_but_on_one_node_keeps_tokens_increasing() -> None:
    """Floors expire, but one node kept its floor (a grant there since, from an attempt
    that failed elsewhere): the blank nodes are seeded from it, with the warm-up; a
    client whose clock is far behind proposes, is told "too low" with that floor, and
    proposes above it. The order holds: the node still remembers the old token.

        client 0: granted T for "a" on every node, releases
        client 1 (clock far behind): for "b", only node 0 answers: too low (T), then
                  granted T + 1 there alone; the attempt fails (and backs off)
        retention passes for nodes 1 and 2 (not for node 0)
        client 2 (clock far behind): for "a": nodes 1, 2 blank, node 0 too low ->
                  seeds 1, 2 with its floor and a warm-up; after it, granted above T
    """
    same = random.Random(0)  # the order requests reach the nodes in (any will do)
    model = _model(3, [0, -2 * BASE_US, -2 * BASE_US], 1)
    model.acquire_at_once(pick=0, name=0, blocking=True, order=same, lost=0, batch=True)
    model.release(pick=0)
    [(k, first)] = _granted(model)
    model.advance_time(step=RETENTION_MS - 200)
    model.acquire_at_once(pick=1, name=1, blocking=True, order=same, lost=0b110, batch=True)
    assert model.nodes[0].floor_of(model.spec.keys, model.ms) == first.token + 1
    assert len(_granted(model)) == 1
    model.advance_time(step=300)  # nodes 1 and 2 forget; node 0 does not
    assert [n.floor_of(model.spec.keys, model.ms) for n in model.nodes[1:]] == [None, None]
    model.acquire_at_once(pick=2, name=0, blocking=True, order=same, lost=0, batch=True)
    model.advance_time(step=PATIENCE_MS + 1)  # seen blank for the patience: seeded next
    model.acquire_at_once(pick=2, name=0, blocking=True, order=same, lost=0, batch=True)
    state = model.clients[2]
    assert state.lease is None  # nodes 1 and 2 warm up
    model.advance_time(step=MAX_TTL_MS + 1)
    model.acquire_at_once(pick=2, name=0, blocking=True, order=same, lost=0, batch=True)
    last = model.grants[-1]
    assert last.client == 2
    assert last.token > first.token + 1
    assert k not in model.forgotten


def test_a_lease_extended_past_the_retention_keeps_its_nodes_floors() -> None:
    """Extensions keep the floor of every node that extends: a lease held for longer
    than the retention leaves no blank node behind it (which would sit out a warm-up),
    and the next holder's token is above it, even from a clock far behind."""
    same = random.Random(0)  # the order requests reach the nodes in (any will do)
    model = _model(3, [0, -2 * BASE_US, 0], 1)
    model.acquire_at_once(pick=0, name=0, blocking=True, order=same, lost=0, batch=True)
    [(_, first)] = _granted(model)
    for _ in range(2 * RETENTION_MS // (TTL_MS // 2)):
        model.advance_time(step=TTL_MS // 2)
        model.start_extend(pick=0)
        model.deliver_all(pick=0, order=same, lost=0)
        model.conclude(pick=0)
    assert model.clients[0].lease is not None
    assert all(n.floor_of(model.spec.keys, model.ms) is not None for n in model.nodes)
    model.release(pick=0)
    model.acquire_at_once(pick=1, name=0, blocking=True, order=same, lost=0, batch=True)
    last = model.grants[-1]
    assert last.client == 1
    assert last.token > first.token
    assert not model.forgotten


@pytest.mark.xfail(strict=True, raises=Violation, reason="a documented limit of the core")
def test_one_restart_and_one_node_down_keep_the_token_order() -> None:
    """The documented limit of seeding without a majority of floors (docs/fencing.md): a
    single restart (the assumption allows one per max_ttl) while another node is cut
    off. The node that is down still remembers the last token, but the core does not
    wait for it: once a majority answered and fewer than a majority have a floor, it
    seeds the restarted node from what the nodes that answer have (here a stale floor),
    with the warm-up, and a client whose clock is far behind is then granted a token
    below one already handed out. The model asserts the token order while any node
    remembers, so this fails; it is a strict xfail so that a change of the core here
    (waiting for every node, as that seeding once did) shows up. Mutual exclusion holds.

        client 0: granted T0 on every node; later, node 2 cut off, T1 > T0 on nodes 0, 1
        node 2 is back (its floor is T0); node 0 restarts without data; node 1 cut off
        client 2 (clock far behind): node 0 blank, node 2 too low (T0) -> node 0 seeded
                  with T0 and a warm-up; after it, nodes 0 and 2 grant T0 + 1 < T1
    """
    same = random.Random(0)  # the order requests reach the nodes in (any will do)
    model = _model(3, [0, 0, -2 * BASE_US], 1)
    model.acquire_at_once(pick=0, name=0, blocking=True, order=same, lost=0, batch=True)
    model.release(pick=0)
    model.node_goes_down(pick=2, duration=100)
    model.advance_time(step=10)
    model.acquire_at_once(pick=0, name=0, blocking=True, order=same, lost=0, batch=True)
    model.release(pick=0)
    (_, t0), (_, t1) = _granted(model)
    assert t1.token > t0.token
    model.advance_time(step=100)  # node 2 is back
    model.restart_without_data(pick=0, down_ms=0, holder=False)
    model.node_goes_down(pick=1, duration=2 * MAX_TTL_MS)
    # It asks every node again a few times (each after a back-off) before it seeds.
    for _ in range(SILENT_ASKS + 1):
        model.acquire_at_once(pick=2, name=0, blocking=True, order=same, lost=0, batch=True)
    model.advance_time(step=PATIENCE_MS + 1)  # seen blank for the patience: seeded next
    model.acquire_at_once(pick=2, name=0, blocking=True, order=same, lost=0, batch=True)
    model.advance_time(step=MAX_TTL_MS + 1)
    model.acquire_at_once(pick=2, name=0, blocking=True, order=same, lost=0, batch=True)


@pytest.mark.parametrize("machine", [LockModel, HistoryIgnoredScheme])
@pytest.mark.parametrize("history", [None, 1], ids=["new", "used"])
def test_one_node_that_fails_over_sits_out_the_warm_up(
    machine: type[LockModel], history: int | None
) -> None:
    """A single node (a Sentinel service) fails over to a replica that never received
    the lease it just granted. The promoted node has an older floor (a set used before)
    or none at all (a new one: its first grant was lost with the floor it wrote): either
    way its history changed, so it is seeded with a warm-up and grants nothing until
    every lease the old master may have granted has expired. (The planted
    ``HistoryIgnoredScheme``, scripts that compare no replication ID, grants at once.)

        the replica catches up; client 0: granted by the node, then it fails over
        client 1: the node answers "history changed": seeded, warming up; not granted
        max_ttl later: client 1 granted, above client 0's token
    """
    same = random.Random(0)
    model = _made(machine)
    model._setup(1, [0, 0, 0], history)
    model.replica_catches_up(pick=0)
    model.acquire_at_once(pick=0, name=0, blocking=True, order=same, lost=0, batch=True)
    holder = model.clients[0].lease
    assert holder is not None
    model.fail_over(pick=0, down_ms=0, holder=True)
    if machine is HistoryIgnoredScheme:
        with pytest.raises(Violation, match=r"\(a\) "):
            model.acquire_at_once(pick=1, name=0, blocking=False, order=same, lost=0, batch=True)
        return
    model.acquire_at_once(pick=1, name=0, blocking=False, order=same, lost=0, batch=True)
    assert model.clients[1].lease is None
    keys = model.spec.keys
    assert model.nodes[0].pttl(keys.warm, model.ms) == MAX_TTL_MS
    assert model.nodes[0].get(NODE_REPLID, model.ms) == model.nodes[0].replid
    model.advance_time(step=MAX_TTL_MS + 1)
    assert model.now > holder.valid_until
    model.acquire_at_once(pick=1, name=0, blocking=False, order=same, lost=0, batch=True)
    (_, first), (_, last) = _granted(model)
    assert last.client != 0
    assert last.token > first.token  # by the clocks: the node's own floor is older


def test_a_failover_of_one_node_of_three_is_seeded_from_the_others() -> None:
    """Three nodes; node 0 fails over to a replica that missed the last grant. Its own
    floor is older than that grant, so it must not vouch for anything: it is seeded from
    the two others' floors, with the warm-up, and the next token is above the grant.

        client 0: granted T1 by all three, releases; node 0's replica catches up
        client 0: granted T2 by all three, releases; node 0 fails over (floor T1)
        client 1 (clock far behind): nodes 1, 2 too low (T2), node 0 changed -> seeded
                  with T2 and a warm-up; then granted by nodes 1 and 2 above T2
    """
    same = random.Random(0)
    model = _model(3, [0, -2 * BASE_US, 0], 1)
    model.acquire_at_once(pick=0, name=0, blocking=True, order=same, lost=0, batch=True)
    model.release(pick=0)
    model.replica_catches_up(pick=0)
    model.acquire_at_once(pick=0, name=0, blocking=True, order=same, lost=0, batch=True)
    model.release(pick=0)
    (_, t1), (_, t2) = _granted(model)
    model.fail_over(pick=0, down_ms=0, holder=False)
    keys = model.spec.keys
    assert model.nodes[0].floor_of(keys, model.ms) == t1.token
    model.acquire_at_once(pick=1, name=0, blocking=True, order=same, lost=0, batch=True)
    assert model.nodes[0].floor_of(keys, model.ms) == t2.token
    assert model.nodes[0].pttl(keys.warm, model.ms) > 0
    last = model.grants[-1]
    assert last.client == 1
    assert last.token > t2.token
