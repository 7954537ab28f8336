"""Majorities, validity and drift, and the tally of one fan-out round.

Theory of operation
-------------------
A round sends one command (acquire, extend or release) to every node at time ``started``
and reads the replies under one deadline. Each node answers *yes* (it holds our token
now), *no* (it proved it does not), or fails (error, refused connection, or no reply in
time: an unknown outcome, so the node may still have executed the command).

The round is decided the moment the outcome cannot change: ``needed`` yeses arrived, or
so many nos and failures arrived that ``needed`` yeses are impossible. The driver stops
reading then; it never waits for a slow node once the answer is known.

Validity. A node that said yes set the key at some instant after ``started`` on its own
clock, so on that node the key lives until at least ``started + ttl``, give or take the
rate difference between that node's clock and ours. We allow ``drift`` for that, so the
lease is valid until ``started + ttl - drift`` on our monotonic clock. It is usable only
if that instant is still in the future when the round is decided. Safety assumes the
holder stops using the lease by then, and that no node's clock jumps (see docs/safety.md).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass


def majority(n: int) -> int:
    """The smallest number of nodes that is more than half of ``n``."""
    return n // 2 + 1


def drift_allowance(ttl: float, factor: float, floor: float) -> float:
    """Clock-drift allowance in seconds for a lease of ``ttl`` seconds (factor x ttl + floor)."""
    return ttl * factor + floor


class Failure(enum.Enum):
    """Why a node gave no usable answer."""

    UNREACHABLE = "unreachable"  # refused connection, reset, or no reply before the deadline
    # Not even tried: the node failed recently and its reconnect back-off has not ended.
    BACKING_OFF = "backing off"
    # Not asked (nothing was sent): its connection was still being set up when the round
    # began (see ``Round.set_up_wait``); the set-up goes on for the rounds after.
    CONNECTING = "still connecting"
    # Its TLS certificate failed verification: a configuration failure like the next two
    # (no connection until the certificate, the URL or the trusted CAs are fixed).
    CERTIFICATE = "certificate rejected"
    UNSUPPORTED = "unsupported"  # the node refused the command: ACL, unknown command
    # The node's setup, not an outage: a read-only replica, a wrong or missing password,
    # not a Redis server at that address. It fails every round until someone fixes it.
    MISCONFIGURED = "misconfigured"
    ERROR = "error"  # any other error reply

    @property
    def configuration(self) -> bool:
        """Whether this failure is the node's configuration (it will not recover by itself)."""
        return self in (Failure.UNSUPPORTED, Failure.MISCONFIGURED, Failure.CERTIFICATE)


@dataclass(slots=True)  # one per node and round
class NodeResult:
    """What one node answered in a round; ``ok`` is None when it failed. Never changed
    once made (``Round.record`` shares one for every plain yes).

    ``info`` carries what an acquire reply says beyond yes/no: (status, number, floor)
    and, when the lock is held and the caller waits, its PTTL; see ``_lua/acquire.lua``.
    """

    ok: bool | None = None
    failure: Failure | None = None
    detail: str = ""
    info: tuple[int, ...] | None = None


_YES = NodeResult(ok=True)


@dataclass(slots=True)
class SilentConnecting(NodeResult):
    """A node silent at the deadline whose request was queued while its connection was
    being set up, to go out once it is (the asyncio driver): unreachable, like any
    silence, but nothing is known of the node yet (``Round.set_ups_could_decide``)."""


# The ``answered_at`` of a node that never answered a request its round no longer
# waited for (``Round.time_out``).
NEVER = -math.inf

# What is said of a node silent at the deadline that answered an earlier request late
# (``Round.time_out``).
BEHIND = (
    "no reply before the deadline, though it answers: an earlier request's reply came "
    "late (the node or this client is overloaded, or node_timeout is shorter than the "
    "node's round trip)"
)


class Round:
    """The tally of one command sent to ``n`` nodes, decided as early as possible.

    Args:
        n: number of nodes the command was sent to (its index space).
        needed: yeses required for success (a majority of all nodes).
        started: monotonic time the first request was sent.
        refusals_decide: a failure is decided by refusals alone (more than a majority
            can spare), or once every node answered or failed. For ``Lock.locked()``,
            whose failure is an answer ("free") that failed nodes cannot give: with one
            node of three down, the two others must both be heard.
    """

    __slots__ = (
        "_answered",
        "_could_begin",
        "_no",
        "_refusals_decide",
        "_wait_all",
        "_yes",
        "behind",
        "failed",
        "hear_out",
        "heard_from",
        "needed",
        "results",
        "silent",
        "started",
    )

    def __init__(
        self,
        n: int,
        needed: int,
        started: float,
        *,
        wait_all: bool = False,
        hear_out: float = 0.0,
        refusals_decide: bool = False,
        heard_from: float | None = None,
    ) -> None:
        self.needed = needed
        self.started = started
        # From when a node's answer to a request no round waited for any more shows it
        # up, though silent in this round (``time_out``): the round's start, or earlier
        # for an attempt after another (its late replies may come between the two).
        self.heard_from = started if heard_from is None else heard_from
        self.results: list[NodeResult | None] = [None] * n
        self._yes = 0
        self._no = 0  # refusals and failures: both mean "not a yes"
        self._answered = 0
        self.failed = 0  # nodes that gave no usable answer (``fail``)
        self.silent = 0  # of them, asked but silent until the deadline (``went_silent``)
        self.behind = 0  # of those, nodes that answered an earlier request meanwhile
        self._could_begin: float | None = None  # when the ready nodes could first decide it
        self._wait_all = wait_all  # decided only when every node answered (or the deadline)
        self._refusals_decide = refusals_decide
        # Seconds to go on reading once the round became impossible: a failure is then
        # decided when every node answered or that time passed (``stop_hearing``), a
        # success still at once. For a waiter, whose wait is judged against what the
        # nodes said (acquire.py); a node cut off costs that long, not a node timeout.
        self.hear_out = hear_out

    @classmethod
    def cleanup(cls, n: int, targets: frozenset[int], started: float) -> Round:
        """A release round after a failed attempt: done when *every* target answered.

        Cleanup is off the fast path, and the caller wants the keys gone when it returns,
        so it waits for all targets (or the deadline), not for a majority. Nodes outside
        ``targets`` count as done.
        """
        rnd = cls(n, n, started, wait_all=True)
        for i in range(n):
            if i not in targets:
                rnd.record(i, True)
        return rnd

    def enough_ready(self, ready: int) -> bool:
        """Whether ``ready`` more nodes (connected, not yet asked) could decide the round.

        A round already impossible waits for nothing; a round that must hear every node
        (``wait_all``: a cleanup, or an attempt that asks every node whether the node set
        is new) is never decided by some of them.
        """
        if self._wait_all:
            return False
        return self._yes + ready >= self.needed or self._failed_for_good

    def set_up_wait(
        self, ready: int, connecting: int, fresh: int, now: float, grace: float
    ) -> float | None:
        """How much longer the round waits for connections being set up before it begins:
        0.0 to begin now, else at most that many seconds, or None for as long as it takes
        a set-up to end (each ends within the connect timeout).

        Connecting to a node (TCP, TLS handshake, AUTH) is not part of a round: the
        round begins once connections are set up (``begin_at``), so a slow handshake is
        not charged to ``node_timeout``. ``ready`` nodes are connected, ``connecting``
        are still being set up, ``fresh`` of them by this round. The round waits for
        every set-up while the ready nodes could not decide it (``enough_ready``), and
        once they could, for the set-ups it started itself for ``grace`` seconds more
        (the node timeout): a healthy node connected a little later than the others is
        still asked, as it would be on a warm connection, but a node whose set-up hangs
        delays a round the others can decide by at most ``grace``, and only the round
        that started that set-up. Nodes still connecting when it begins sit it out.
        """
        if not connecting or self.impossible:
            return 0.0
        if not self.enough_ready(ready):
            return None
        if not fresh:
            return 0.0
        if self._could_begin is None:
            self._could_begin = now
        return max(self._could_begin + grace - now, 0.0)

    def begin_at(self, now: float) -> float:
        """The requests go out at ``now``, after connections were set up: validity and
        the deadline count from here, not from the earlier ``started``. Returns the
        shift. (A node can only have executed a request after it was sent.)"""
        shift = max(now - self.started, 0.0)
        self.started += shift
        return shift

    def answered_or_silent(self, nodes: frozenset[int]) -> frozenset[int]:
        """Those of ``nodes`` that did not fail in this round.

        A cleanup is sent to every node that may hold our token, but waiting for one that
        just failed (timed out, refused the connection) is pointless: its release is
        queued behind the unanswered request on the same connection, or it has no
        connection at all.
        """
        results = self.results
        return frozenset(i for i in nodes if (r := results[i]) is None or r.failure is None)

    def record(self, node: int, ok: bool | None, info: tuple[int, ...] | None = None) -> None:
        """Record a definite answer from ``node``.

        ``ok`` None is a "no" after which our key may still be on the node (it granted,
        but a replica did not acknowledge): not a vote, but cleaned up like a yes.
        """
        if self.results[node] is not None:
            return
        # A yes without more to say (a release's, an extension's) is one shared value:
        # a NodeResult is never changed once recorded.
        self.results[node] = _YES if ok is True and info is None else NodeResult(ok, None, "", info)
        self._answered += 1
        if ok:
            self._yes += 1
        else:
            self._no += 1

    def fail(
        self, node: int, failure: Failure, detail: str, kind: type[NodeResult] = NodeResult
    ) -> None:
        """Record that ``node`` gave no usable answer (its outcome is unknown)."""
        if self.results[node] is not None:
            return
        self.results[node] = kind(failure=failure, detail=detail)
        self._answered += 1
        self._no += 1
        self.failed += 1

    def stop_hearing(self) -> None:
        """Stop waiting for more answers to a failed round (its ``hear_out`` is over):
        nodes not heard from stay unknown, not failed."""
        self.hear_out = 0.0

    def time_out(self, answered_at: Sequence[float] = ()) -> None:
        """Mark every node that has not answered as unreachable (the deadline passed).

        ``answered_at[i]``: when node ``i`` last answered a request the driver no
        longer waited for (an earlier round's, given up at its deadline or decided
        without it). One since ``heard_from`` shows the node up and working through what
        was sent before, which it answers in order: behind, not down
        (``behind_blocks_quorum``). A node frozen or cut off answers nothing.
        """
        since = self.heard_from
        for i, r in enumerate(self.results):
            if r is None:
                if i < len(answered_at) and answered_at[i] >= since:
                    self.went_silent(i, BEHIND)
                    self.behind += 1
                else:
                    self.went_silent(i, "no reply before the deadline")

    def went_silent(self, node: int, detail: str, *, connecting: bool = False) -> None:
        """Record that ``node`` was asked (or, ``connecting``, its request queued while
        its connection is set up) and had not answered by the deadline: unreachable, and
        possibly only slow (``silence_blocks_quorum``)."""
        if self.results[node] is None:
            kind = SilentConnecting if connecting else NodeResult
            self.fail(node, Failure.UNREACHABLE, detail, kind)
            self.silent += 1

    @property
    def unheard(self) -> int:
        """Nodes with nothing recorded yet: neither an answer nor a failure."""
        return len(self.results) - self._answered

    @property
    def yes(self) -> int:
        return self._yes

    @property
    def succeeded(self) -> bool:
        return self._yes >= self.needed

    @property
    def refused(self) -> int:
        """Answers that were not a yes: refusals, never failures."""
        return self._no - self.failed

    @property
    def impossible(self) -> bool:
        return self._no > len(self.results) - self.needed

    @property
    def decided(self) -> bool:
        if self._wait_all:
            return self._answered == len(self.results)
        if self._yes >= self.needed:
            return True
        if self._no > len(self.results) - self.needed:
            if self._answered == len(self.results):
                return True
            return not self.hear_out and self._failed_for_good
        return False

    @property
    def _failed_for_good(self) -> bool:
        """Failed, and no answer still to come can change that (for a round that
        refusals decide, only they count)."""
        spare = len(self.results) - self.needed
        return self._no - self.failed > spare if self._refusals_decide else self._no > spare

    def granted(self) -> frozenset[int]:
        """Nodes that answered yes."""
        return frozenset(i for i, r in enumerate(self.results) if r is not None and r.ok)

    def unanswered(self) -> frozenset[int]:
        """Nodes that gave no answer: not heard from yet, or failed."""
        return frozenset(i for i, r in enumerate(self.results) if r is None or r.failure)

    def maybe_holding(self) -> frozenset[int]:
        """Nodes that may hold our token: yes, failed, or not heard from yet.

        A definite "no" proves the node did not store the token (tokens are unique per
        acquisition, so no later command can store it), so cleanup can skip it; so can a
        node never asked because it was still connecting.
        """
        return frozenset(
            i
            for i, r in enumerate(self.results)
            if r is None or (r.ok is not False and r.failure is not Failure.CONNECTING)
        )

    def failures(self) -> dict[int, NodeResult]:
        """Nodes that failed, with why."""
        return {i: r for i, r in enumerate(self.results) if r is not None and r.failure}

    def unreachable_blocks_quorum(self) -> bool:
        """True when failures alone (not refusals) leave too few nodes for a majority."""
        return self.failed > len(self.results) - self.needed

    def silence_blocks_quorum(self) -> bool:
        """True when failures leave too few nodes for a majority, and would not without
        the nodes that were only silent until the deadline (``went_silent``): nodes that
        may be up and slow, or whose replies this process was too busy to read in time."""
        spare = len(self.results) - self.needed
        return self.failed > spare >= self.failed - self.silent

    def behind_blocks_quorum(self) -> bool:
        """True when failures leave too few nodes for a majority, and would not without
        the nodes that were silent though they answered earlier requests meanwhile
        (``time_out``): nodes up, and behind."""
        spare = len(self.results) - self.needed
        return self.failed > spare >= self.failed - self.behind

    def misconfigured_blocks_quorum(self) -> bool:
        """True when nodes failing for their configuration alone leave too few for a majority.

        Unlike an outage this does not pass: retrying cannot help, so an acquire gives up
        at once (``Acquisition.conclude``).
        """
        misconfigured = sum(
            1 for r in self.results if r is not None and r.failure and r.failure.configuration
        )
        return misconfigured > len(self.results) - self.needed

    def failed_untried(self) -> bool:
        """True when every failure was a node not even tried (still in its back-off, or
        still connecting).

        Such a round is no new evidence that the nodes are down: it repeats what an
        earlier round found, until the back-off ends.
        """
        untried = (Failure.BACKING_OFF, Failure.CONNECTING)
        return all(r.failure in untried for r in self.failures().values())

    def failed_connecting(self) -> bool:
        """True when the round failed, and only for nodes still connecting: their
        connections were being set up, so nothing is known of them yet."""
        failures = self.failures().values()
        return bool(failures) and all(r.failure is Failure.CONNECTING for r in failures)

    def set_ups_could_decide(self) -> bool:
        """Whether the nodes still connecting when the round began (not asked, or their
        request queued and unanswered: ``SilentConnecting``) could have made the
        majority, had they said yes, with the nodes not heard from yet (a round decided
        impossible at its failures before a node's yes was read): a round worth one more
        once their set-ups ended (``RoundAgain``), since nothing is known of them yet."""
        if self.succeeded:
            return False
        connecting = sum(
            1
            for r in self.results
            if r is not None
            and (r.failure is Failure.CONNECTING or isinstance(r, SilentConnecting))
        )
        possible = len(self.results) - self.refused - (self.failed - connecting)
        return connecting > 0 and possible >= self.needed

    def connecting(self) -> list[int]:
        """The nodes not asked in this round because they were still connecting."""
        connecting = Failure.CONNECTING
        return [i for i, r in enumerate(self.results) if r is not None and r.failure is connecting]

    def again(self, now: float, targets: Collection[int]) -> Round:
        """A round at ``now`` for ``targets``, nodes of this one that were still
        connecting (``connecting``: nothing was sent to them), the other nodes' answers
        carried over as they are: a command that must not reach a node twice (a
        release) is sent to those nodes only, and the two rounds tallied as one.

        It begins once their set-ups ended (``RoundAgain``), even when the answers
        carried over decide it already: it exists to reach them."""
        rnd = RoundAgain(len(self.results), self.needed, now)
        for i, r in enumerate(self.results):
            if r is None or i in targets:
                continue  # asked now, or unheard: not asked again (its request may be on its way)
            if r.failure is None:
                rnd.record(i, r.ok, r.info)
            else:
                rnd.fail(i, r.failure, r.detail)
        return rnd

    def began_too_late(self, begin_by: float | None, targets: Iterable[int]) -> bool:
        """Whether this round, begun once its connections were set up (``begin_at``),
        began at or after ``begin_by`` (``flows.Run``): then nothing is to be sent, and
        the nodes of ``targets`` are recorded not asked (still connecting)."""
        if begin_by is None or self.started < begin_by:
            return False
        for i in targets:
            self.fail(i, Failure.CONNECTING, "connected only after the round had to begin")
        return True

    def validity(self, now: float, ttl: float, drift: float) -> float:
        """Seconds of validity left at ``now`` for a lease whose round began at ``started``."""
        return self.started + ttl - drift - now


class RoundAgain(Round):
    """A round after one that could not ask some nodes, their connections still being
    set up, and was undecided without them (``Round.set_ups_could_decide``). It waits
    for their set-ups whatever the ready nodes could decide: begun at once, it would
    find the nodes still connecting and leave them out again. Two kinds: a release sent
    only to those nodes, the other nodes' answers carried over (``Round.again``: a
    release that a node holding the lease never got holds the lock there for nobody
    until its TTL); and an acquire's next attempt (``Acquisition.begin``), whose ready
    nodes include one that failed the attempt before (a BUSY node answers at once, and
    would count as ready to decide it). Once sent, it is decided as any round."""

    __slots__ = ()

    def enough_ready(self, ready: int) -> bool:
        return False
