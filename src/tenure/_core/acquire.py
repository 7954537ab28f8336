"""Acquisition as a state machine: the driver asks what to do next and reports back.

A driver runs::

    acq = Acquisition(spec, retry, rng, blocking=..., timeout=..., now=clock(), ...)
    while True:
        rnd = acq.begin(clock())
        send commands.acquire(spec, token, acq.proposal(wall_us), acq.mark, max_ttl_ms)
        ...feed replies into rnd until rnd.decided or acq.deadline(rnd), then rnd.time_out()
        step = acq.conclude(rnd, token, clock())
        Granted -> hand out step.lease (its fencing token is the proposal)
        Retry   -> release on step.cleanup, seed step.seed (if any), sleep step.sleep, loop
        Wait    -> release on step.cleanup, wait up to step.timeout for a release
                   notification (fair: a hand-off, see ``transferred``), loop
        GiveUp  -> release on step.cleanup, then return False or raise step.error

Waiting (docs/waiting.md): with notifications on (``recheck > 0``), an attempt refused
because another client holds the lock on a majority does not sleep a back-off: the
attempt queued the caller on the nodes, and the driver waits for the release
notification, or at most a random ``[recheck/2, recheck]`` (the fallback bound), or until
the holder's key expires by its TTL, whichever is first. Split votes (nobody holds a
majority) still back off at random: waking on a release would only collide again.

The machine never sleeps past the caller's timeout, raises ``QuorumUnreachable`` once
failures alone have made a majority impossible in a few consecutive attempts (for a
non-blocking acquire at once, or after one attempt more when nodes merely silent past the
node timeout made the difference), and draws every retry delay at random so that
colliding clients drift apart.

Fencing tokens, one round trip
------------------------------------
Each node keeps one number, its *floor*: the highest token it has committed, for any
lock. The client *proposes* the token F; a node grants only if the lock is free there and
F is above its floor, and then raises its floor to F in the same script. So a majority
that granted has committed F, and any later majority overlaps it in a node whose floor is
already >= F: it can only grant a larger token. No second round is needed to write F
back. Tokens strictly increase in the order leases are granted, for every lock (the
floor is shared by all the locks of a node, so nothing is kept per name: a new name is
granted in the same round as an old one, and an idle name leaves no key behind).

The proposal is ``max(wall-clock microseconds, highest floor seen + 1)``. The clock
only makes the first guess usually high enough; correctness never depends on it. A node
that answers "too low" returns its floor, and the next attempt (immediate, not a
back-off: nobody holds the lock) proposes above it.

A node without a floor is *blank*: it has never been used, or it lost its data (restart
without persistence, flush). It grants nothing until seeded, per node:

* if every node is blank, the node set is new (or was idle for longer than the retention)
  and all are seeded with floor 0, at once;
* otherwise, once a majority of nodes with a floor has answered, the blank ones are seeded
  with the highest floor among them (which covers every token a past majority committed,
  since that majority overlaps this one) and kept out for ``max_ttl``, so every lease
  they might have granted before losing their data has expired first; but only once
  seen blank for ``seed_patience`` (``_ripe``: another client may be seeding a new set);
* if, having heard every node that answers, a majority answered but fewer than a majority
  have a floor, the blank ones are seeded from what is there, with the warm-up (rather
  than never: the set would otherwise stay unusable while any node is down); a blocking
  acquire first asks every node again ``SILENT_ASKS`` times, after back-offs, in case the
  silent ones are only slow.

A node whose *replication history changed* (``HISTORY_CHANGED``: a replica promoted in a
failover, or a restart; acquire.lua compares the node's replication ID with the one its
floor was written under) may have lost the last grants while keeping an older floor. It
is seeded like a node that lost its data, always with the warm-up, from the highest floor
of the others and its own (its own floor counts toward the seed's value, never toward the
majority of floors that vouches for it). It never counts as blank in "every node blank:
a new node set": after a failover that would skip the warm-up exactly when leases the
node forgot may still be valid. Its warm-up counts from when the client first heard its
new history (``_warm_ms``): every lease of the old one was granted before that.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from .._errors import LockError, NodeMisconfigured, QuorumUnreachable
from .commands import HISTORY_CHANGED, NO_HISTORY
from .config import DEFAULT_KEY_PREFIX, LockSpec, WaitMode, retry_delay
from .diagnosis import configuration_error, for_prefix
from .policy import RetryPolicy
from .quorum import Failure, Round, RoundAgain

__all__ = [
    "Acquisition",
    "GiveUp",
    "Granted",
    "LeaseState",
    "Refused",
    "Retry",
    "RetryNow",
    "Seed",
    "Wait",
    "cleanup_to_await",
    "refusal",
    "refused_by",
    "round_errors",
]

# Statuses of acquire.lua (NO_HISTORY, -2, and HISTORY_CHANGED, -4, too: their replies
# may carry the server's replication ID, which the parser reads).
GRANTED, HELD, TOO_LOW, WARMING = 1, 0, -1, -3
# The nodes that need a seed: blank, or under another history than their floor's.
LOST = (NO_HISTORY, HISTORY_CHANGED)
COUNTED = (GRANTED, HELD, TOO_LOW)  # statuses whose number is a fencing counter of the node
# Immediate re-tries for a low proposal or a seeding, per acquire call, before falling
# back to the random back-off (other clients may keep raising the floors meanwhile).
# A low proposal is retried only when no node said "held": the lock is free, and its
# floors were raised by grants of other locks (the floor is per node). Each retry
# proposes the wall clock of its own moment, above every proposal made before it, so it
# fails again only if a grant proposed later overtook it on its way; threads of a busy
# process, each on its own connection, overtake one another now and then. 8 threads
# beside a CPU hog saw about 1 non-blocking acquire of a free lock in 700 refused after
# 4 retries, and none in 30,000 with 12.
MAX_FIXES = 12
# Consecutive attempts in which failures alone ruled out a majority before a blocking
# acquire gives up with QuorumUnreachable. One is not enough: on a loaded machine our own
# process can be descheduled past the node timeout, and every node then looks silent.
UNREACHABLE_STRIKES = 3
# Seconds for which failures alone may rule out a majority in every attempt of a
# blocking acquire, nodes in their reconnect back-off included, before it gives up with
# QuorumUnreachable. Strikes need nodes actually tried, and a node down for a while is
# tried once a second (its back-off has grown to BACKOFF_MAX): without this, every
# acquire after the first in an outage took three seconds to say so (or ran out its
# timeout, a LockTimeout). A blip that reset the connections ends sooner: their back-off
# starts at 25 ms. Nodes still connecting never count (``_waited_for_set_ups``).
UNREACHABLE_SPAN = 0.5
# Seconds for which nodes that are up but behind (silent at the deadline, though they
# answered earlier requests meanwhile: ``Round.behind_blocks_quorum``) may rule out a
# majority in every attempt of a blocking acquire, before it gives up with
# QuorumUnreachable. Such attempts are no strikes: an overloaded machine (starved
# servers, a client with hundreds of tasks on a connection) is not an outage, and its
# backlog passes. Bounded, because a node_timeout shorter than the nodes' round trip
# looks the same from here and does not pass: the error then says so.
BEHIND_SPAN = 5.0
# Attempts a blocking acquire makes, each after a back-off, while nodes stay silent and
# most of those that answer are blank or changed, before it seeds them with the warm-up.
# About a second in all with the default back-off (node timeouts and jittered delays of
# up to 0.1 s): a node set that idled past the retention, first used again on a loaded
# machine whose scheduler keeps one server waiting for a few hundred milliseconds, would
# otherwise grant nothing for max_ttl (seen with four, about a quarter of a second, on 2
# busy cores). A node really down costs the first acquire that second, once.
SILENT_ASKS = 10
# How long a fair waiter on a quorum goes on reading a failed attempt's replies (seconds):
# long enough for the nodes that are up, even on a busy machine; short enough that a
# node cut off barely delays the wait (``Acquisition.begin``).
HEAR_OUT = 0.002
# Replication histories a client remembers when it first heard (``_judged``): one per
# failover or restart it saw; forgetting one costs a warm-up, never safety.
HISTORIES_KEPT = 1024
# The warm-up of a changed node whose history the client heard ``max_ttl`` ago: served.
# Not 0, which seed.lua refuses for a changed node (0 seeds a new node set, and a
# changed node is never new); seed.lua keeps no marker for it.
SERVED_WARM_MS = 1


@dataclass(frozen=True)
class LeaseState:
    """The facts of one successful acquisition or extension (times are monotonic seconds)."""

    name: str
    key: str
    token: str
    ttl: float
    started: float
    valid_until: float
    granted: frozenset[int]
    fencing_token: int = 0
    # Whether a node may still queue the call's waiter id (its owner token) after the
    # lease is released: an attempt that carried a place went unanswered by some node,
    # or a cleanup that put it back in line was not awaited (``Flows._lease_of``).
    # ``Flows._departure`` declines what reaches it then.
    lingers: bool = False
    # The highest proposal of an attempt of its call that some node may still run after
    # its release, where that attempt could grant (``Flows._lease_of``): the release
    # raises every node's floor to it, so it is refused. 0: none.
    late: int = 0
    # The round that granted it, None for a fair hand-off: which nodes may hold its key
    # (``Round.maybe_holding``: the granting ones, and those not heard from when the
    # round was decided), asked only when a release could not reach every node.
    acquired_in: Round | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Seed:
    """Blank nodes (or nodes whose history changed) to seed (seed.lua): their floor,
    and warm-up in ms.

    ``marks`` are the observation marks those nodes answered with; a node seeds only if
    its mark is still one of them (it has not restarted since the observation).
    """

    nodes: frozenset[int]
    floor: int
    warm_ms: int
    marks: frozenset[int] = field(default=frozenset(), compare=False)


@dataclass(frozen=True)
class Granted:
    """Acquired. ``seed``: blank nodes seen, to seed before handing it out."""

    lease: LeaseState
    seed: Seed | None = None


@dataclass(frozen=True)
class Retry:
    """Try again after ``sleep`` seconds; first release on ``cleanup``, then ``seed``."""

    sleep: float
    cleanup: frozenset[int]
    seed: Seed | None = None


@dataclass(frozen=True)
class GiveUp:
    """Stop trying. ``error`` is None for an ordinary timeout (acquire returns False)."""

    cleanup: frozenset[int]
    error: LockError | NodeMisconfigured | None


@dataclass(frozen=True)
class Wait:
    """Held by another client: release ``cleanup``, then wait for a release notification
    for at most ``timeout`` seconds, then try again."""

    timeout: float
    cleanup: frozenset[int]


Step = Granted | Retry | Wait | GiveUp


@dataclass(frozen=True)
class Refused:
    """What an acquire call that gave up without an error returns: why its last attempt
    was refused, in words for ``LockTimeout`` ("held by another client", or the nodes
    that are warming up or did not answer)."""

    reason: str


HELD_ELSEWHERE = "held by another client"


def refusal(
    rnd: Round,
    statuses: dict[int, tuple[int, int]],
    quorum: int,
    *,
    seeding_in: float | None = None,
    patience: float = 0.0,
    max_ttl: float | None = None,
) -> str:
    """Why a round that granted nothing was refused. Held on a majority is the plain
    "held by another client"; otherwise each cause of the missing majority is counted,
    so that a caller refused only because nodes sit out their warm-up (after a restart,
    a loss of data or a failover) is not told that someone holds the lock.

    Blank nodes are either not judged yet (the client has not heard enough nodes to
    tell a new node set from nodes that lost their data) or judged and waiting out
    ``patience`` before their seed, ``seeding_in`` seconds from now (``_ripe``); a
    warming node's answer says how long its warm-up has left."""
    n = len(rnd.results)
    held = sum(1 for s, _ in statuses.values() if s == HELD)
    if held >= quorum:
        return HELD_ELSEWHERE
    if rnd.succeeded:
        return (
            f"granted by {rnd.yes} of {n} nodes, but the round left no validity "
            "(it took longer than the TTL minus the clock drift allowance)"
        )
    parts = []
    if held:
        parts.append(f"held by another client on {held} of {n} nodes")
    limit = "max_ttl" if max_ttl is None else f"max_ttl ({max_ttl:g} s)"
    warming = sum(1 for s, _ in statuses.values() if s in (WARMING, HISTORY_CHANGED))
    if warming:
        # A warming node answers the rest of its warm-up in ms; a changed one is not
        # seeded yet, so its warm-up has not begun.
        left = [v for s, v in statuses.values() if s == WARMING]
        until = f"; the longest has {max(left) / 1000:.2f} s left" if len(left) == warming else ""
        parts.append(
            f"{warming} of {n} nodes warming up after a restart, a loss of data or a "
            "failover (they grant nothing until every lease they may have forgotten has "
            f"expired, at most {limit}{until})"
        )
    blank = sum(1 for s, _ in statuses.values() if s == NO_HISTORY)
    if blank and seeding_in is None:
        parts.append(
            f"{blank} of {n} nodes blank (never used, or they lost their data) and not yet "
            "set up: telling a new node set from nodes that lost their data takes hearing "
            f"every node or a majority that kept its data (lost data costs a warm-up of {limit})"
        )
    elif blank and seeding_in is not None:
        parts.append(
            f"{blank} of {n} nodes blank: they lost their data (a restart without "
            "persistence, a flush) or are new; the client sets them up from the other "
            f"nodes once they have been blank for {patience:.2f} s (another client may be "
            f"setting up a new node set meanwhile), in {max(seeding_in, 0.0):.2f} s, and "
            f"they then sit out a warm-up of {limit} before they grant"
        )
    too_low = sum(1 for s, _ in statuses.values() if s == TOO_LOW)
    if too_low:
        # Other grants (of any lock: the floor is the node's) raised the floor above our
        # proposal, again after each immediate retry: busy nodes, not a holder.
        parts.append(f"{too_low} of {n} nodes had granted a higher fencing token meanwhile")
    # A grant that is not a vote (``ok`` None, not a failure): the node granted, but
    # fewer replicas than ``wait_replicas`` acknowledged it (``commands.acked_by_replicas``).
    # Said, or a master without its replicas reads as contention at every acquire.
    unacked = sum(1 for r in rnd.results if r is not None and r.ok is None and r.failure is None)
    if unacked:
        parts.append(
            f"{unacked} of {n} nodes granted, but fewer of their replicas than "
            "wait_replicas acknowledged it in time (check each master's connected "
            "replicas, or lower wait_replicas)"
        )
    silent = len(rnd.failures())
    if silent:
        parts.append(f"{silent} of {n} nodes failed or did not answer")
    if not parts:
        # Nothing else explains it: a split vote among contenders, or a proposal below
        # a node's floor that the immediate retries did not get past.
        parts.append(f"granted by {rnd.yes} of {n} nodes, {quorum} needed")
    elif rnd.yes:
        # The grants that fell short, as the outcome of the causes above: put as a cause
        # of its own, "granted by 1 of 3 nodes" after a warm-up read as contention.
        parts.append(f"so only {rnd.yes} of {n} nodes granted, {quorum} needed")
    return "; ".join(parts)


@dataclass(frozen=True)
class RetryNow:
    """An attempt failed for a reason of ours (a proposal below a floor, blank nodes),
    not because someone holds the lock: try again at once, after seeding ``seed``."""

    seed: Seed | None = None


def cleanup_to_await(step: Retry | Wait | GiveUp, rnd: Round) -> frozenset[int]:
    """The nodes whose cleanup replies to await after a failed attempt.

    Before another attempt, none: the release is written on the same connections ahead
    of the next command, and each node runs one connection's commands in order, so the
    next attempt cannot overtake it. Before returning to the caller, those of the nodes
    that did not just fail, so that no key of ours is left when ``acquire`` returns.
    """
    if isinstance(step, (Retry, Wait)):
        return frozenset()
    return rnd.answered_or_silent(step.cleanup)


def refused_by(
    rnd: Round, names: list[str], prefix: str = DEFAULT_KEY_PREFIX
) -> NodeMisconfigured | None:
    """The error to raise if a node failed for its configuration (ACL, read-only replica,
    credentials, not Redis; see ``diagnosis``), said to a client with key ``prefix``."""
    return configuration_error(rnd, names, prefix)


def unreachable(
    rnd: Round, name: str, names: list[str], prefix: str = DEFAULT_KEY_PREFIX, why: str = ""
) -> LockError | NodeMisconfigured:
    """The error for a round on lock ``name`` whose failures alone leave no majority:
    the configuration failure among them if any (it will not pass), else
    ``QuorumUnreachable`` (its message ending with ``why``)."""
    refused = refused_by(rnd, names, prefix)
    if refused is not None:
        return refused
    n = len(rnd.results)
    return QuorumUnreachable(
        name,
        f"{len(rnd.failures())} of {n} nodes failed; a majority of {rnd.needed} "
        f"is impossible until they recover{why}",
        round_errors(rnd, names, prefix),
    )


def round_errors(
    rnd: Round, names: list[str] | None = None, prefix: str = DEFAULT_KEY_PREFIX
) -> dict[str, str]:
    """Per-node failure messages of a round, keyed by node name (or index), as said to a
    client whose key prefix is ``prefix`` (an ACL fix names that prefix's keys)."""
    return {
        (names[i] if names else str(i)): for_prefix(
            f"{r.failure.value}: {r.detail}" if r.failure else r.detail, prefix
        )
        for i, r in rnd.failures().items()
    }


def _being_seeded(statuses: dict[int, tuple[int, int]]) -> bool:
    """Blank nodes answered beside nodes with a floor, and none of them holds the lock."""
    kinds = {status for status, _ in statuses.values()}
    return NO_HISTORY in kinds and HELD not in kinds and not kinds.isdisjoint(COUNTED)


def _floors(infos: dict[int, tuple[int, ...]]) -> dict[int, int]:
    """Each node's floor, from the nodes whose floor vouches for their past: not the
    blank ones (they answer 0), nor those whose history changed (an old floor)."""
    return {i: info[2] for i, info in infos.items() if info[0] not in LOST}


class Acquisition:
    """The retry loop of one ``acquire`` call.

    Args:
        spec: the lock being acquired.
        retry: back-off policy between attempts.
        rng: source of the random delays.
        blocking: False makes one attempt (plus immediate fixes of a low proposal).
        timeout: for a blocking acquire, seconds after ``now`` to give up; None waits forever.
        now: monotonic time of the call.
        node_names: for error messages.
        max_ttl_ms: how long a node that lost its data is kept out.
        floor: the lowest token the client may propose (above any it has seen).
        recheck: the fallback bound of a notified wait (0: no notifications, back off).
        key_prefix: the client's, for the fixes its errors suggest (an ACL's key pattern).
    """

    def __init__(
        self,
        spec: LockSpec,
        retry: RetryPolicy,
        rng: random.Random,
        *,
        blocking: bool,
        timeout: float | None,
        now: float,
        node_names: list[str],
        max_ttl_ms: int,
        floor: int = 1,
        recheck: float = 0.0,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        blank_seen: dict[tuple[int, str], float] | None = None,
        seed_patience: float = 0.0,
        histories: dict[int, float] | None = None,
    ) -> None:
        self.spec = spec
        self._key_prefix = key_prefix
        self._retry = retry
        self._rng = rng
        self._blocking = blocking
        self._give_up_at = None if timeout is None or not blocking else now + timeout
        self._names = node_names
        self._max_ttl_ms = max_ttl_ms
        self.floor = floor
        self.attempts = 0
        self._fixes = 0
        self._proposal = 0
        self._hear_all = False
        self._strikes = 0
        # When failures alone first ruled out a majority, in an unbroken run of attempts.
        self._unreachable_since: float | None = None
        # When nodes behind first ruled out a majority, in a run of attempts that failures
        # ruled out (``BEHIND_SPAN``).
        self._behind_since: float | None = None
        self._began = now  # when the latest attempt began (``begin``)
        self._waited_for_set_ups = False  # one attempt more once, for nodes still connecting
        self._await_set_ups = False  # that attempt, not yet begun
        self._waited_for_seeds = False  # one attempt more once, for a new set being seeded
        self._heard_silence_out = False  # one attempt more once, after nodes were silent
        self._silent_asks = 0  # attempts that heard every node but the silent ones again
        self._refusal: tuple[Round, dict[int, tuple[int, int]], float] | None = None
        self.mark = 1
        self._recheck = recheck
        # Fair on a quorum, a waiter hears out a failed attempt: a hand-off counts only
        # from a node that attempt saw held (``transferred``), and the first majority of
        # hand-offs comes from any nodes, so a round decided at the first majority of
        # "held" would turn many hand-offs into one more round. The rest answer within
        # microseconds; a node cut off or frozen costs HEAR_OUT, and a success is still
        # decided at once.
        fair_quorum = spec.wait_mode is WaitMode.FAIR_QUORUM
        self._hear_out = HEAR_OUT if blocking and recheck > 0 and fair_quorum else 0.0
        self._backoffs = 0
        # The latest round that found the lock held by another: when it began (the base
        # of a transferred lease's validity) and each holding node's floor then (what
        # a hand-off notification is judged against; see ``transferred``).
        self._observed: tuple[float, dict[int, int]] | None = None
        # When each node was first seen blank next to nodes with a floor, shared by the
        # client's calls: such a node is seeded with a warm-up only once it has been
        # blank for ``seed_patience`` seconds (``_ripe``). By node and floor key: a
        # Redis Cluster node keeps a floor per slot.
        self._blank_seen = {} if blank_seen is None else blank_seen
        self._seed_patience = seed_patience
        # When the client first heard each replication history a changed (or a promoted
        # blank) node answered under, by its ID, shared by the client's calls: a warm-up
        # counts from then (``_judged``, ``_warm_ms``).
        self._histories = {} if histories is None else histories

    @property
    def refused(self) -> Refused:
        """Why the latest attempt was refused."""
        if self._refusal is None:
            return Refused(HELD_ELSEWHERE)
        rnd, statuses, now = self._refusal
        # Blank nodes the client has judged (seen next to enough nodes with a floor)
        # wait out the patience before their seed (``_ripe``): when the last is due.
        floor_key = self.spec.keys.floor
        due: list[float] = []
        for i, (status, _) in statuses.items():
            first = self._blank_seen.get((i, floor_key)) if status == NO_HISTORY else None
            if first is not None:
                due.append(first + self._seed_patience)
        return Refused(
            refusal(
                rnd,
                statuses,
                self.spec.quorum,
                seeding_in=max(due) - now if due else None,
                patience=self._seed_patience,
                max_ttl=self._max_ttl_ms / 1000,
            )
        )

    def begin(self, now: float) -> Round:
        """Start an attempt at ``now``."""
        self.attempts += 1
        # Marks a blank node (no floor) answers with (see acquire.lua); never 0.
        self.mark = self._rng.getrandbits(52) | 1
        # After an attempt that nodes still connecting could have decided, the next
        # waits for their set-ups, even if the nodes connected could decide it by number.
        kind, self._await_set_ups = (RoundAgain if self._await_set_ups else Round), False
        # A node's late answer to the attempt before, come during the back-off between
        # the two, shows it up and behind as much as one come during this attempt.
        heard_from, self._began = self._began, now
        return kind(
            self.spec.n_nodes,
            self.spec.quorum,
            now,
            heard_from=min(heard_from, now),
            wait_all=self._hear_all,
            # A round that asks every node whether the node set is new waits for each
            # of them up to the node timeout: cut short, a node a few milliseconds
            # slower than the others would count as silent, and the blank ones would
            # be seeded with a warm-up (``_fix``), a new set then granting nothing for
            # max_ttl.
            hear_out=0.0 if self._hear_all else self._hear_out,
        )

    def proposal(self, wall_us: int) -> int:
        """The fencing token to propose in this attempt, given the wall clock in µs."""
        self._proposal = max(wall_us, self.floor)
        return self._proposal

    def deadline(self, rnd: Round) -> float:
        """When the driver stops waiting for replies of this attempt."""
        return rnd.started + self.spec.node_timeout

    def conclude(self, rnd: Round, token: str, now: float) -> Step:
        """Decide the attempt once ``rnd`` is decided or its deadline passed."""
        spec = self.spec
        infos = {i: r.info for i, r in enumerate(rnd.results) if r is not None and r.info}
        # One pass over the answers for what every outcome needs (this runs once per
        # attempt, on the hot path): the highest number seen, the tokens granted, and
        # the nodes that lost their data.
        top: int | None = None
        minted: set[int] = set()
        lost_nodes: list[int] = []
        blank_seen = self._blank_seen
        for i, info in infos.items():
            status = info[0]
            if status == GRANTED:
                minted.add(info[1])
            if status in COUNTED:
                top = info[1] if top is None else max(top, info[1])
            elif status in LOST:
                lost_nodes.append(i)
                if len(info) == 4:
                    infos[i] = self._judged(info, now)
                continue
            if blank_seen:
                blank_seen.pop((i, spec.keys.floor), None)  # it has a floor now
        if top is not None:
            self.floor = max(self.floor, top + 1)
        validity = rnd.validity(now, spec.ttl, spec.drift)
        if rnd.succeeded and validity > 0:
            # The token is our proposal, except in fair mode on one node when the lock had
            # already been handed to us: the node then answers the token the hand-off
            # minted. (Fair on a quorum, such a node takes our proposal like the others.)
            one_node_fair = spec.wait_mode is WaitMode.FAIR_ONE_NODE and len(minted) == 1
            fencing = minted.pop() if one_node_fair else self._proposal
            self.floor = max(self.floor, fencing + 1, self._proposal + 1)
            lost = frozenset(lost_nodes)
            # Nodes that lost their data (a majority answered with a floor): seed them now,
            # or they would sit out every round until a failed one noticed them.
            seed = self._warm_seed(lost, infos, _floors(infos), now) if lost else None
            return Granted(
                LeaseState(
                    name=spec.name,
                    key=spec.key,
                    token=token,
                    ttl=spec.ttl,
                    started=rnd.started,
                    valid_until=rnd.started + spec.ttl - spec.drift,
                    granted=rnd.granted(),
                    fencing_token=fencing,
                    acquired_in=rnd,
                ),
                seed,
            )
        statuses = {i: (info[0], info[1]) for i, info in infos.items()}
        floors = _floors(infos)
        cleanup = rnd.maybe_holding()
        self._refusal = (rnd, statuses, now)  # put in words only if the call gives up
        if rnd.misconfigured_blocks_quorum():
            # Misconfigured nodes alone leave no majority: retrying cannot help.
            return GiveUp(cleanup, self._unreachable(rnd))
        if rnd.unreachable_blocks_quorum():
            behind = rnd.behind_blocks_quorum()
            if behind:
                # Nodes up and behind made the difference: no outage, so no strike, and
                # the count of strikes starts again (they answered since).
                self._strikes = 0
                self._unreachable_since = None
                if self._behind_since is None:
                    self._behind_since = now
            elif not rnd.failed_untried():
                # Only nodes actually tried count against them: a round that found them
                # all still in their reconnect back-off (say, right after a network blip
                # reset every connection) proves nothing new, and a blocking acquire
                # waits it out.
                self._strikes += 1
            if rnd.set_ups_could_decide() and not self._waited_for_set_ups:
                # Nodes whose connections were still being set up (say, the new owner of
                # a Cluster slot that a redirection pointed to, or a new client's node a
                # little slower to connect than the others, one of which then failed)
                # are no outage: once, even for a caller that does not block, one
                # attempt more, which waits for their set-ups (bounded by
                # connect_timeout) before it begins (``begin``: a ``RoundAgain``).
                self._waited_for_set_ups = self._await_set_ups = True
                return Retry(0.0, cleanup)
            if not self._blocking and not self._heard_silence_out and rnd.silence_blocks_quorum():
                # Nodes silent past the node timeout made the difference: on an
                # overloaded machine (starved servers, or this process descheduled) nodes
                # that are up look exactly like that. Once, even for a caller that does
                # not block, one attempt more at once (a blocking acquire has
                # UNREACHABLE_STRIKES); nodes really gone cost it a second node timeout.
                self._heard_silence_out = True
                return Retry(0.0, cleanup)
            if (
                not behind
                and self._unreachable_since is None
                and not any(r.failure is Failure.CONNECTING for r in rnd.failures().values())
            ):
                self._unreachable_since = now
            if (
                not self._blocking
                or self._strikes >= UNREACHABLE_STRIKES
                or (
                    self._unreachable_since is not None
                    and now - self._unreachable_since >= UNREACHABLE_SPAN
                )
            ):
                return GiveUp(cleanup, self._unreachable(rnd))
            if (
                behind
                and self._behind_since is not None
                and now - self._behind_since >= BEHIND_SPAN
            ):
                return GiveUp(cleanup, self._unreachable(rnd, behind_for=now - self._behind_since))
        else:
            self._strikes = 0
            self._unreachable_since = None
            self._behind_since = None
        fix = self._fix(infos, floors, now)
        if fix is not None:
            return Retry(0.0, cleanup, fix.seed)
        if not self._blocking:
            if not self._waited_for_seeds and _being_seeded(statuses):
                # Blank nodes beside nodes with a floor, and nobody holding the lock: most
                # often a new node set that another client is seeding at this moment (it
                # found every node blank; its seeds land one node at a time). A free lock
                # is not refused for that: once, even for a caller that does not block,
                # one attempt more after a node timeout, within which that client's seed
                # round ends. Nodes that really lost their data are still blank then, and
                # the refusal stands (``_ripe`` seeds them once the patience is over).
                self._waited_for_seeds = True
                return Retry(spec.node_timeout, cleanup)
            return GiveUp(cleanup, None)
        held = [i for i, (s, _) in statuses.items() if s == HELD]
        # Wait for a notification only when nodes held by others make a majority and
        # none granted us: with a partial grant of ours, "held" may mean another
        # waiter's partial grant or a reservation for it (a split vote, not a holder
        # who will release), so back off at random instead. Fair on a quorum
        # ("q") waits either way: there are no reservations, a waiter's partial grants
        # are released with a hand-off to the next in line (so "held" by one is
        # followed by a notification), and a grant of ours next to nodes held by others
        # is most often a release that reached that node before our attempt did and
        # the others after it: their hand-offs to us are on their way.
        partial_ok = rnd.yes == 0 or spec.wait_mode is WaitMode.FAIR_QUORUM
        if self._recheck > 0 and len(held) >= spec.quorum and partial_ok:
            self._backoffs = 0
            return self._wait(rnd, infos, held, cleanup, now)
        # The back-off grows with consecutive contended attempts, not with waits: a split
        # vote after a long notified wait starts again from the shortest delay.
        self._backoffs += 1
        sleep = retry_delay(self._retry, self._backoffs, self._rng)
        if 0 < rnd.yes < spec.quorum:
            # A split vote with grants of ours. We held them for the whole round (a node
            # silent until the deadline makes that a node timeout), and the contender
            # holding the rest held its own through a round that overlapped ours. Each
            # re-grants its nodes a jitter after its cleanup, so a jitter much shorter
            # than the round leaves them free for too little of it: two such
            # contenders keep their nodes round after round. So sit out part of the
            # round, at random (mostly enough: their rounds end within a few ms of each
            # other when one release woke both), and from the second split in a row all
            # of it: that outlasts the rest of the other's round (which ends by its
            # deadline, a node timeout after it began), so whichever of the two next
            # attempts comes first finds the other's nodes free, and its own. Bounded:
            # a round our process was descheduled in says nothing of theirs.
            elapsed = min(max(now - rnd.started, 0.0), 2 * spec.node_timeout)
            sleep += elapsed if self._backoffs > 1 else self._rng.uniform(0.0, elapsed)
        if self._give_up_at is not None:
            left = self._give_up_at - now
            if left <= 0:
                return GiveUp(cleanup, None)
            sleep = min(sleep, left)
        return Retry(sleep, cleanup)

    def _wait(
        self,
        rnd: Round,
        infos: dict[int, tuple[int, ...]],
        held: list[int],
        cleanup: frozenset[int],
        now: float,
    ) -> Wait | GiveUp:
        """Held on a majority: wait for the release notification, within the bounds."""
        self._observed = (rnd.started, {i: infos[i][1] for i in held})
        wait = self._recheck * self._rng.uniform(0.5, 1.0)
        # Do not sleep past the holder's expiry (a crashed holder sends no notification):
        # the lock is free on a majority once k more of the holding nodes let it go.
        k = len(held) - (self.spec.n_nodes - self.spec.quorum)
        ttls = sorted(p for i in held if len(infos[i]) > 3 and (p := infos[i][3]) >= 0)
        if len(ttls) >= k:
            wait = min(wait, ttls[k - 1] / 1000 + 0.001)
        if self._give_up_at is not None:
            left = self._give_up_at - now
            if left <= 0:
                return GiveUp(cleanup, None)
            wait = min(wait, left)
        return Wait(wait, cleanup)

    def transferred(self, token: str, grants: list[tuple[int, int]], now: float) -> Granted | None:
        """Fair hand-off notifications ("the lock is yours, token F", from node i, as
        ``(i, F)`` pairs): the lease, or None.

        A hand-off set the key's TTL at an instant the client never sees. What it knows
        is that on node i the instant came *after* the latest round that found the lock
        held there by another client with a floor below F (the hand-off raised the
        floor to F; a floor never goes down), and that round executed after it
        began. So the key lives until at least that round's start + ttl on the node.
        With a majority of such nodes handing over one token F (on a quorum every node
        of one release is given the same F, so F is committed by that majority, as any
        granted token is), the lease is valid until ``started + ttl - drift`` on our
        clock, exactly like an acquisition whose round began then. None when no token
        has such a majority (a stale notification from before that round, or a split:
        the queues' heads differed), or when less than half the TTL would be left: the
        driver then re-checks at once, and the re-check takes the lock with an ordinary
        round (on nodes already handed to us, it renews the TTL from its own start).
        """
        if self._observed is None:
            return None
        started, counters = self._observed
        spec = self.spec
        by_token: dict[int, set[int]] = {}
        for node, fencing in grants:
            if node in counters and fencing > counters[node]:
                by_token.setdefault(fencing, set()).add(node)
        won = [(f, nodes) for f, nodes in by_token.items() if len(nodes) >= spec.quorum]
        if not won:
            return None
        fencing_token, nodes = max(won)
        valid_until = started + spec.ttl - spec.drift
        if valid_until - now < spec.ttl / 2:
            return None
        self.floor = max(self.floor, fencing_token + 1)
        return Granted(
            LeaseState(
                name=spec.name,
                key=spec.key,
                token=token,
                ttl=spec.ttl,
                started=started,
                valid_until=valid_until,
                granted=frozenset(nodes),
                fencing_token=fencing_token,
            )
        )

    def _fix(
        self, infos: dict[int, tuple[int, ...]], floors: dict[int, int], now: float
    ) -> RetryNow | None:
        """How to retry at once, if that can succeed; else None.

        Retrying at once is right when the attempt failed for a reason of ours, not
        because someone holds the lock: the proposal was too low, or nodes need seeding.
        """
        if self._fixes >= MAX_FIXES:
            return None
        kinds = [info[0] for info in infos.values()]
        blank = frozenset(i for i, info in infos.items() if info[0] == NO_HISTORY)
        # Blank, or under a new history: both are seeded; only the blank ones can be new.
        lost = frozenset(i for i, info in infos.items() if info[0] in LOST)
        seed: Seed | None = None
        if blank and len(blank) == self.spec.n_nodes:
            # A new node set: no node has a past. A promoted server's (``_judged``) is
            # seeded with the warm-up served, which seed.lua takes for it; 0 it refuses.
            promoted = any(len(infos[i]) == 4 for i in blank)
            seed = self._seed(blank, infos, floors, SERVED_WARM_MS if promoted else 0)
        elif lost and len(floors) >= self.spec.quorum:
            seed = self._warm_seed(lost, infos, floors, now)
        elif lost and not self._hear_all and len(infos) < self.spec.n_nodes:
            # The round was decided before every node answered. Whether the node set is
            # new (seed at once) or some node lost its data (seed with a warm-up) takes
            # every node's answer: ask again and wait for all of them.
            self._hear_all = True
            self._fixes += 1
            return RetryNow()
        elif (
            lost
            and self._blocking
            and len(infos) < self.spec.n_nodes
            and self._silent_asks < SILENT_ASKS
        ):
            # Some nodes stayed silent again while most of those that answered are blank
            # or changed. A new node set whose first rounds met a slow node (a loaded
            # machine, connections still being set up) would otherwise settle for the
            # warm-up below and grant nothing for max_ttl: a blocking acquire asks every
            # node again after a back-off (the contention back-off, below) a few times
            # first. Asking again never grants from a blank node, so it costs time only.
            self._silent_asks += 1
            return None
        elif lost and len(infos) >= self.spec.quorum:
            # Every node that answers has answered, but most are blank or changed (nodes
            # lost their data one at a time while idle, the set idled past the retention
            # while a node is down, or a single node failed over). No answer can vouch
            # for the last token a majority committed; seed from what is there, the
            # changed nodes' own floors included, rather than never (docs/fencing.md says
            # what this costs the token guarantee). The warm-up still protects the lock.
            seed = self._warm_seed(lost, infos, floors, now)
        if seed is None and (TOO_LOW not in kinds or HELD in kinds):
            return None  # nothing of ours to fix, or held elsewhere: a contention back-off
        self._fixes += 1
        self._hear_all = False
        return RetryNow(seed)

    def _warm_seed(
        self,
        lost: frozenset[int],
        infos: dict[int, tuple[int, ...]],
        floors: dict[int, int],
        now: float,
    ) -> Seed | None:
        """The seed with a warm-up for those of ``lost`` that are ripe for it (``_ripe``),
        or None while none is."""
        ripe = self._ripe(lost, infos, now)
        if not ripe:
            return None
        warm_ms = max(self._warm_ms(infos[i], now) for i in ripe)
        return self._seed(ripe, infos, floors, warm_ms)

    def _judged(self, info: tuple[int, ...], now: float) -> tuple[int, ...]:
        """A blank or changed node's answer that names the server's replication
        history, noted (``_warm_ms``), and as the rules below take it.

        Blank on a promoted server: its master may have had a floor here that never
        reached it, with leases that may be valid, so the node counts as changed (never
        part of a new node set; the full warm-up), until the client has known that
        history for ``max_ttl``: every lease of the old one has expired then, and the
        node is as blank as a node never promoted (say, a Cluster slot first used on a
        master promoted hours ago). As changed, it keeps no ID: the warm-up of a blank
        node counts from its answer, since a flush may have lost grants of this very
        history.
        """
        histories = self._histories
        replid = info[3]
        heard = histories.get(replid)
        if heard is None:
            if len(histories) >= HISTORIES_KEPT:
                del histories[next(iter(histories))]  # the oldest: it warms up again
            # Heard now, or before: a reply is read after it was written.
            heard = histories[replid] = now
        if info[0] == NO_HISTORY and (now - heard) * 1000 < self._max_ttl_ms:
            return (HISTORY_CHANGED, info[1], 0)
        return info

    def _warm_ms(self, info: tuple[int, ...], now: float) -> int:
        """The warm-up a node that answered ``info`` is seeded with, in ms.

        ``max_ttl`` for a node that lost its data: it may have granted leases until the
        moment it answered blank (a promoted one too: ``_judged``). A node whose
        floor was written under another history than the server's (a promoted replica,
        a restart with its data, a slot migrated in) lacks only grants made before the
        server's history began, which was before the client first heard it
        (``_judged``), so each of their leases has expired ``max_ttl`` after that first
        answer: the warm-up is what is left of that, at least ``SERVED_WARM_MS`` (say,
        the first use of a Cluster slot on a master promoted hours ago).
        """
        if info[0] != HISTORY_CHANGED or len(info) < 4:
            return self._max_ttl_ms
        heard = self._histories.get(info[3], now)
        return max(SERVED_WARM_MS, math.ceil(self._max_ttl_ms - (now - heard) * 1000))

    def _ripe(
        self, lost: frozenset[int], infos: dict[int, tuple[int, ...]], now: float
    ) -> frozenset[int]:
        """Those of ``lost`` to seed with a warm-up now.

        A node whose history changed, at once (it is never a node of a new set). A
        blank one only once it has been seen blank for ``seed_patience``: blank next to
        nodes with a floor may be a node that lost its data, or a node of a new set
        that another client is seeding at this very moment (it found every node blank;
        its seeds land one node at a time, and ours would overtake one). A warm-up seed
        that overtook it would keep a node that never granted anything out for
        ``max_ttl``, and several such nodes would leave a new node set without a
        majority. Waiting is always safe: a blank node grants nothing until seeded.
        """
        seen = self._blank_seen
        ripe = []
        for i in lost:
            if infos[i][0] == NO_HISTORY:
                first = seen.setdefault((i, self.spec.keys.floor), now)
                if now - first < self._seed_patience:
                    continue
            ripe.append(i)
        return frozenset(ripe)

    @staticmethod
    def _seed(
        lost: frozenset[int],
        infos: dict[int, tuple[int, ...]],
        floors: dict[int, int],
        warm_ms: int,
    ) -> Seed:
        marks = frozenset(infos[i][1] for i in lost)
        # Every number seen, not only the floors that vouch for a majority: a seed must
        # not land below any of them, a changed node's own floor included.
        counters = [info[1] for info in infos.values() if info[0] in COUNTED]
        changed = [info[2] for info in infos.values() if info[0] == HISTORY_CHANGED]
        start = max([*floors.values(), *counters, *changed], default=0)
        return Seed(lost, start, warm_ms, marks)

    def _unreachable(self, rnd: Round, behind_for: float = 0.0) -> LockError | NodeMisconfigured:
        why = ""
        if behind_for:
            why = (
                f"; nodes that answer, but only after the node timeout "
                f"({self.spec.node_timeout:g} s), ruled it out for {behind_for:.1f} s: if "
                "they are this slow, give the client a longer node_timeout; if they are "
                "overloaded, less load"
            )
        return unreachable(rnd, self.spec.name, self._names, self._key_prefix, why)
