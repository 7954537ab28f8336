"""Acquire, extend, release, ``locked()`` and the watchdog, each written once, as a flow.

Theory of operation
-------------------
A flow is a generator that holds the whole sequence of one operation, every decision in
it included, and does no I/O: to reach the nodes, sleep or wait for a notification it
*yields* an operation (``Run``, ``Send``, ``Sleep``, ``Listen``, ``AwaitWake``, ...)
and is resumed with its result, the pattern of httpx's authentication flows. Each driver
carries operations out with its own I/O (the blocking driver with ``select()`` in the
caller's thread, the asyncio driver with its pipelined protocol) in one short loop,
``drive``, and the model tests carry them out against fake nodes, so all three run the
same sequencing.

An exception raised while carrying out an operation (``KeyboardInterrupt``, asyncio's
``CancelledError``, a closed client) is thrown into the flow at its ``yield``. The flow
answers with the cleanup to write and lets the exception go on. While an exception
propagates, a flow yields only operations that complete without waiting (``Send``,
``Depart``, ``Unlisten``: ``INSTANT``): so an asyncio task that is being cancelled
has its cleanup *written* before ``CancelledError`` leaves it, with nothing to shield,
and the blocking driver does the same under Ctrl-C. ``drive`` checks that rule.

A driver writes the rounds of one flow to each node on one connection, in order (the
blocking driver holds one link set for the whole flow; the asyncio driver has one
connection per node). The acquire flow relies on it: a failed attempt's cleanup is not
awaited before the next attempt, whose owner token is the same (``cleanup_to_await``).

The clocks are injected (``Flows.clock``, monotonic seconds; ``Flows.wall_us``, wall
microseconds for token proposals), so the flows stay pure.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from .._errors import ClientClosed, LeaseExpired, LeaseLost, NotHeld
from . import commands, waiting
from .acquire import (
    Acquisition,
    GiveUp,
    Granted,
    LeaseState,
    Refused,
    Retry,
    Seed,
    Wait,
    cleanup_to_await,
)
from .commands import Command
from .config import ClientConfig, LockSpec, WaitMode, check_acquire_args
from .lease import (
    begin_extend,
    conclude_extend,
    conclude_locked,
    conclude_release,
    worth_another_try,
)
from .quorum import Failure, Round
from .waiting import Wake
from .watchdog import Extend, KeepAlive, Lost

__all__ = [
    "INSTANT",
    "RELEASE_PATIENCE",
    "SEED_PATIENCE",
    "AwaitWake",
    "Depart",
    "ExtendLease",
    "Flow",
    "Flows",
    "Inbox",
    "Later",
    "Listen",
    "Op",
    "Pause",
    "Run",
    "Send",
    "Sleep",
    "Unlisten",
    "WatchedLease",
    "check_instant",
    "closed_under",
    "drive",
    "unreached",
]

T = TypeVar("T")


class Run:
    """Send ``command`` to ``targets`` (every node by default) and tally the replies
    into ``rnd`` until it is decided or ``deadline`` (monotonic) passes; result None.

    ``hopeless_unsent``: send nothing if the nodes known to be down (reconnect back-off,
    a failed set-up) already make the round impossible (``quorum.rule_out``).
    ``begin_by``: send nothing if connections still being set up hold the round's
    beginning back until then (monotonic): the nodes not asked are recorded still
    connecting. An extension never begins after the validity it extends.
    """

    __slots__ = ("begin_by", "command", "deadline", "hopeless_unsent", "rnd", "targets")

    def __init__(
        self,
        command: Command,
        rnd: Round,
        deadline: float,
        targets: Sequence[int] | None = None,
        *,
        hopeless_unsent: bool = False,
        begin_by: float | None = None,
    ) -> None:
        self.command = command
        self.rnd = rnd
        self.deadline = deadline
        self.targets = targets
        self.hopeless_unsent = hopeless_unsent
        self.begin_by = begin_by


class Send:
    """Write ``command`` to ``targets`` now and wait for nothing; result None.

    ``rnd`` (a cleanup round) records nodes it could not even be written to. The replies
    are read and dropped later, in order, so the connections stay in step. (A decline,
    ``Flows.decline``, is the one ``Send`` whose round waits for its node: the drivers
    carry it out apart, with ``_deliver``, to learn whether it reached the node.)
    """

    __slots__ = ("command", "rnd", "targets")

    def __init__(self, command: Command, rnd: Round, targets: Sequence[int]) -> None:
        self.command = command
        self.rnd = rnd
        self.targets = targets


class Sleep:
    """Sleep ``seconds``; result None."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


class Inbox(Protocol):
    """What a driver's notification slot gives a flow: the wake-ups so far."""

    def take(self) -> list[tuple[int, Wake]]:
        """The notifications (node, wake) received since the last call, oldest first."""
        ...


class Listen:
    """Subscribe ``waiter`` to release notifications (``need``: how many nodes' wake-ups
    make one); result its ``Inbox``. ``timeout``: how long to wait for the subscription
    to be confirmed (0: not at all, the process's listener already runs). ``key``: the
    lock's key (a Cluster node subscribes per slot, ``waiting.ShardSubs``)."""

    __slots__ = ("key", "need", "timeout", "waiter")

    def __init__(self, waiter: str, timeout: float, need: int, key: str = "") -> None:
        self.waiter = waiter
        self.timeout = timeout
        self.need = need
        self.key = key


class AwaitWake:
    """Wait up to ``timeout`` seconds for a notification to ``waiter`` in ``inbox``;
    result True if one came (or is overdue), False at the timeout."""

    __slots__ = ("inbox", "timeout", "waiter")

    def __init__(self, waiter: str, inbox: Inbox, timeout: float) -> None:
        self.waiter = waiter
        self.inbox = inbox
        self.timeout = timeout


class Unlisten:
    """``waiter`` no longer takes notifications; result None."""

    __slots__ = ("waiter",)

    def __init__(self, waiter: str) -> None:
        self.waiter = waiter


class Depart:
    """``waiter`` gave up waiting for ``spec``: until ``until`` (monotonic), answer a
    notification that still reaches it by sending ``Flows.dequeue`` to that node
    (``waiting.Departed``); result None. ``hold``: not yet; those that come are answered
    once ``waiter`` departs again without ``hold``."""

    __slots__ = ("hold", "spec", "until", "waiter")

    def __init__(self, spec: LockSpec, waiter: str, until: float, *, hold: bool = False) -> None:
        self.spec = spec
        self.waiter = waiter
        self.until = until
        self.hold = hold


class Later:
    """Drive ``flow`` in the background from ``at`` (monotonic) on, on the client's own
    connections; result None at once. Best effort: what ``flow`` raises is dropped, and
    a client closed by then runs nothing."""

    __slots__ = ("at", "flow")

    def __init__(self, at: float, flow: Flow[Any]) -> None:
        self.at = at
        self.flow = flow


class Pause:
    """The watchdog sleeps until ``until`` (monotonic), or until its lease is extended by
    hand (the drivers' ``Watchdog.replan``); result True if it was told to stop
    meanwhile (the blocking driver's stop event; asyncio cancels its task)."""

    __slots__ = ("until",)

    def __init__(self, until: float) -> None:
        self.until = until


class ExtendLease:
    """The watchdog extends its lease through the lease's own extension (which
    serialises with a release): ``Flows.extend(lease, None, retry=policy)``. Its result
    (the sub-flow's: None, or the failure of a try worth another) or the exception
    thrown in goes back to the watchdog."""

    __slots__ = ("policy",)

    def __init__(self, policy: KeepAlive) -> None:
        self.policy = policy


Op = Run | Send | Sleep | Listen | AwaitWake | Unlisten | Depart | Later | Pause | ExtendLease
Flow = Generator[Op, Any, T]

# What a flow may yield while an interrupt (KeyboardInterrupt, CancelledError) propagates
# through it: done without waiting.
INSTANT = (Send, Unlisten, Depart, Later)

# A release waits this many node timeouts for a majority's confirmation. The round is
# decided at the first majority, so healthy nodes never make it wait; only when a majority
# is silent does it wait longer than an acquire would. A release left unconfirmed raises
# LeaseLost ("cannot be shown that the lease held to the end"), which nodes that are only
# slow (a loaded machine, a server descheduled for a moment) should not cause: a wait of
# one node timeout would call them failed. Four were not enough beside two CPU hogs on 2
# cores (5 nodes, 8 threads: a holder silent past 0.2 s in half of ten 10 s runs); with
# ten, one run of eight. Only a release whose holders' majority is silent waits that
# long: nodes that are down answer at once (refused, reset).
RELEASE_PATIENCE = 10

# A node seen blank beside nodes with a floor is seeded with a warm-up once it has been
# blank this many node timeouts (``Acquisition._ripe``): long enough for the seeds of
# another client that is setting up a new node set to land, even on a busy machine.
SEED_PATIENCE = 4


def drive(flow: Flow[T], perform: Callable[[Op], Any], kept: list[Any] | None = None) -> T:
    """Run ``flow`` to its end, carrying out each operation with ``perform``.

    ``kept``: the flow's result is appended to it before ``drive`` returns, so that a
    caller up the stack whose handler an interrupt (Ctrl-C) reaches as the result is
    handed up (a blocking acquire's grant) still finds it. CPython raises a signal
    handler's exception after any call returns, before its value is stored.

    The asyncio driver has the same loop with ``await`` (a loop is all a driver keeps).
    """
    unwinding = False
    op: Op | None = None
    result: Any = None
    thrown: BaseException | None = None
    while True:
        try:
            # The loop inside the ``try``, its back-edge too: CPython may raise an
            # interrupt at a backward jump, and one raised there is thrown into the flow
            # as any other is, rather than leaving with the flow's cleanup unwritten.
            while True:
                if thrown is not None:
                    exc, thrown = thrown, None
                    op = flow.throw(exc)
                else:
                    op = flow.send(result) if op is not None else next(flow)
                if unwinding:
                    check_instant(flow, op)
                result = perform(op)
        except StopIteration as done:
            if kept is not None:
                kept.append(done.value)
            return done.value  # type: ignore[no-any-return]
        except BaseException as exc:
            # Raised by an operation, or an interrupt (Ctrl-C) handled just after the
            # flow yielded one: thrown into the flow, which answers with its cleanup.
            # One the flow raised itself ended it: it goes on out.
            if getattr(flow, "gi_frame", None) is None:
                raise
            unwinding = unwinding or not isinstance(exc, Exception)
            thrown = exc


def check_instant(flow: Flow[Any], op: Op) -> None:
    """Refuse an operation that would wait, yielded while a ``KeyboardInterrupt`` or a
    ``CancelledError`` propagates (the cleanup must be written before it leaves)."""
    if not isinstance(op, INSTANT):
        flow.close()
        raise RuntimeError(f"a flow yielded {type(op).__name__} while being interrupted")


class WatchedLease(Protocol):
    """What the flows read and change on a lease (``_driver.lease.LeaseView``)."""

    _state: LeaseState
    _spec: LockSpec
    _first_started: float

    @property
    def released(self) -> bool: ...

    @property
    def token(self) -> str: ...

    @property
    def lost_error(self) -> LeaseLost | None: ...

    def _set_released(self) -> None: ...

    def _mark_lost(self, error: LeaseLost) -> None: ...

    def _stop_watching(self) -> None: ...


class _Call:
    """What one acquire call has done that its end must undo."""

    __slots__ = ("attempts", "inbox", "late", "queued", "strays")

    def __init__(self) -> None:
        self.inbox: Inbox | None = None
        self.queued = False
        self.attempts = 0
        # The highest proposal of an attempt some node had not answered when its round
        # ended: that node may still run it, even after the lease's release, and grant it
        # (``LeaseState.late``). 0: none.
        self.late = 0
        # An attempt that carried a place was not heard from some node when its round
        # ended, or a failed attempt's cleanup that puts the waiter back in line was not
        # awaited: that node may still run it (even on a connection given up since),
        # and queue the waiter id again (``LeaseState.lingers``).
        self.strays = False


class Flows:
    """The flows of one client, and the state they share across its calls.

    Args:
        config: the client's validated settings.
        node_names: for error messages.
        rng: the client's random source (retry delays, observation marks).
        clock: monotonic seconds.
        wall_us: wall-clock microseconds (token proposals, queue tickets).
    """

    def __init__(
        self,
        config: ClientConfig,
        node_names: list[str],
        rng: random.Random,
        clock: Callable[[], float],
        wall_us: Callable[[], int],
    ) -> None:
        self.config = config
        self.names = node_names
        self.rng = rng
        self.clock = clock
        self.wall_us = wall_us
        self.n = len(config.nodes)
        # Every round reads every node's reply before it ends (or the node timed out,
        # and the operation is reported as failed there): one node is the whole
        # majority. Only then may an extension go by EVALSHA: a NOSCRIPT is always read,
        # and answered by EVAL within the round (``commands._by_sha``). A release goes
        # by EVALSHA on any number of nodes: both drivers send a release that a node
        # answered NOSCRIPT after its round again by EVAL (``Command.resend_late``).
        self.reads_all = self.n == 1
        self.closed = False
        # Proposals stay above every fencing token this client saw (acquire.py).
        self.fence_floor = 1
        # When each node (and floor key: per slot on a Redis Cluster) was first seen
        # blank beside nodes with a floor (acquire.py, ``Acquisition._ripe``): shared by
        # every call, since another client's seeding of a new node set is seen by
        # whichever call comes first.
        self.blank_seen: dict[tuple[int, str], float] = {}
        # When this client first heard each replication history a changed (or a promoted
        # blank) node answered under (``Acquisition._judged``): shared by every call, for
        # the same reason.
        self.histories: dict[int, float] = {}
        self.place_ms = waiting.place_ms(config.recheck, config.node_timeout)
        self.hold_ms = waiting.hold_ms(config.node_timeout)

    # --- acquire ------------------------------------------------------------------------

    def acquire(
        self,
        spec: LockSpec,
        blocking: bool,
        timeout: float | None,
        *,
        waiter: str,
        channel: str,
        listening: bool,
    ) -> Flow[LeaseState | Refused]:
        """One acquire call: attempts until granted (the lease's state), refused (why,
        for ``LockTimeout``) or an error.

        ``waiter`` is the call's random id, also its owner token; ``channel`` where its
        process hears notifications; ``listening``: the process's listener already runs
        (so subscribing costs no wait).

        Raises:
            ClientClosed, QuorumUnreachable, NodeMisconfigured: as ``Client.acquire``.
        """
        acq = self._acquisition(spec, blocking, check_acquire_args(blocking, timeout))
        call = _Call()
        granted: LeaseState | None = None
        try:
            if blocking and listening and self.config.recheck > 0:
                call.inbox = yield Listen(waiter, 0.0, spec.quorum, spec.key)
            granted = yield from self._attempts(acq, spec, call, waiter, channel)
        except GeneratorExit:
            raise
        except BaseException:
            if call.inbox is not None or call.queued:
                yield from self._end_call(spec, call, waiter, granted=None, unwinding=True)
            raise
        if call.inbox is not None or call.queued:
            yield from self._end_call(spec, call, waiter, granted=granted, unwinding=False)
        return acq.refused if granted is None else granted

    # The retry loop's class (the model tests plant broken ones here).
    acquisition_type: type[Acquisition] = Acquisition

    def _acquisition(self, spec: LockSpec, blocking: bool, timeout: float | None) -> Acquisition:
        """The retry loop of a new acquire call."""
        return self.acquisition_type(
            spec,
            self.config.retry,
            self.rng,
            blocking=blocking,
            timeout=timeout,
            now=self.clock(),
            node_names=self.names,
            max_ttl_ms=self.config.max_ttl_ms,
            floor=self.fence_floor,
            recheck=self.config.recheck,
            key_prefix=self.config.key_prefix,
            blank_seen=self.blank_seen,
            seed_patience=SEED_PATIENCE * self.config.node_timeout,
            histories=self.histories,
        )

    def _attempts(
        self, acq: Acquisition, spec: LockSpec, call: _Call, waiter: str, channel: str
    ) -> Flow[LeaseState | None]:
        # One token per acquire call (its waiter id): release.lua then also takes the
        # holder out of queues it joined on nodes that said "held".
        token = waiter
        ticket = self.wall_us()  # its place in a quorum's queues ("q"), the same everywhere
        while True:
            # Closed by another thread or task while this one waited: stop, don't reconnect.
            self.check_open("acquire", spec.name)
            # Always the waiting form: even an attempt that will not queue must see the
            # queue (fair) and a reservation for a woken waiter.
            place = self.place_ms if call.inbox is not None else 0
            # The process channel, or the lock's slot's where the listener has it (sharded).
            via, sharded = waiting.route_of(call.inbox, channel)
            wait_args = commands.WaitArgs(spec.mode, waiter, via, place, ticket, sharded)
            if call.inbox is not None:
                call.queued = True
                call.inbox.take()  # this attempt sees every release notified so far
            rnd = acq.begin(self.clock())
            proposal = acq.proposal(self.wall_us())
            command = self.replicated(
                commands.acquire(spec, token, proposal, acq.mark, self.config.max_ttl_ms, wait_args)
            )
            call.attempts += 1
            try:
                yield Run(command, rnd, acq.deadline(rnd), hopeless_unsent=True)
                if rnd.unheard or rnd.failed:
                    call.late = max(call.late, proposal)
                    if place:
                        call.strays = True
                step = acq.conclude(rnd, token, self.clock())
                self.fence_floor = max(self.fence_floor, acq.floor)
                if isinstance(step, Granted):
                    if step.seed is not None:
                        yield self._seed(spec, step.seed)
                    return self._lease_of(call, step.lease)
            except GeneratorExit:
                raise  # closed unfinished (its task destroyed): nobody is left to write
            except BaseException:
                # Interrupted mid-round, or after it (Ctrl-C as the round is read, as
                # blank nodes are seeded, as the grant is returned): the grant may have
                # landed, and nobody else knows of it. Written behind it.
                yield self._send(commands.release(spec.key, token), rnd.maybe_holding())
                raise
            if step.cleanup:
                release = self._cleanup_release(spec, token, wait_args)
                awaited = cleanup_to_await(step, rnd)
                # Fair on a quorum, it puts the waiter back in line, a place again: a
                # node that runs it only after the lease's release, which goes on
                # another connection (the blocking client's calls borrow theirs from a
                # pool), queues the id again as a late attempt would.
                if place and spec.wait_mode is WaitMode.FAIR_QUORUM and step.cleanup - awaited:
                    call.strays = True
                yield self._cleanup_round(release, step.cleanup, awaited)
            if isinstance(step, GiveUp):
                if step.error is not None:
                    raise step.error
                return None
            if isinstance(step, Retry) and step.seed is not None:
                yield self._seed(spec, step.seed)
            if isinstance(step, Wait):
                if call.inbox is None:
                    # First wait of this process: subscribe, then queue at once.
                    call.inbox = yield Listen(
                        waiter, self.config.node_timeout, spec.quorum, spec.key
                    )
                    continue
                if (yield AwaitWake(waiter, call.inbox, step.timeout)):
                    handed = self._transferred(call.inbox.take(), acq, waiter)
                    if handed is not None:
                        return self._lease_of(call, handed.lease)
            elif step.sleep:
                yield Sleep(step.sleep)

    def _lease_of(self, call: _Call, lease: LeaseState) -> LeaseState:
        """``lease``, marked if its waiter id may be queued again after its release: an
        attempt of its call that carried a place went unanswered by some node, or a
        failed attempt's cleanup that put it back in line was not awaited, and that node
        may run it after the release (which goes on another connection: a new one after
        a connection was given up, or another of the blocking client's pool) and queue
        the id where another client holds the lock by then; that client's release then
        hands the lock to it. (An attempt that was answered ran before the release: on
        that node the release takes the id out of the queue.)"""
        # An attempt that may still reach a node can grant there after the release,
        # unless its proposal is not above that node's floor then: a release that finds
        # no key of the lease raises the floor to the lease's token, which covers a
        # lease the call's first attempt granted (its only attempt, proposing that
        # token). After other attempts or a hand-off, the node may hold the key from
        # those, with a lower token, and the late proposal may be above the lease's:
        # its release raises every floor to it (``release_waking``'s ``late``).
        late = call.late if call.attempts > 1 or lease.acquired_in is None else 0
        if call.strays or late:  # (only a command that carried a place sets ``strays``)
            return replace(lease, lingers=call.strays, late=late)
        return lease

    def _end_call(
        self,
        spec: LockSpec,
        call: _Call,
        waiter: str,
        *,
        granted: LeaseState | None,
        unwinding: bool,
    ) -> Flow[None]:
        """The end of an acquire call: stop listening and, if it queued without getting
        the lock, leave every queue. It waits for the nodes' answers (so that no place is
        left behind when ``acquire`` returns) unless an exception is on its way out.
        ``granted``: the lease the call got, if it got one."""
        try:
            yield from self._leave(
                spec, call, waiter, granted=granted is not None, unwinding=unwinding
            )
        except GeneratorExit:
            raise
        except BaseException:
            # Interrupted (Ctrl-C) as it departs or stops listening, before its dequeue
            # went out: it left the call with nothing sent, still listening (a hand-off
            # then filed for nobody) or not departed, and a lease it got dropped, and
            # the lock was held by nobody for a TTL. Its way out does it all the same,
            # without waiting; a grant goes with the dequeue (its waiter id is its
            # token). Done twice where the dequeue was under way: harmless.
            if not self.closed:
                yield from self._walk_away(spec, call, waiter, granted)
            raise

    def _walk_away(
        self, spec: LockSpec, call: _Call, waiter: str, granted: LeaseState | None
    ) -> Flow[None]:
        """An acquire call interrupted as it ends: depart, stop listening, leave every
        queue and let go of what it got, in operations that do not wait."""
        until = self.clock() + self.place_ms / 1000 + waiting.UNHEARD_DEPARTURE
        yield Depart(spec, waiter, until)
        if call.inbox is not None:
            yield Unlisten(waiter)
        # A lease's release with its fencing token, as ``release`` sends it: a node where
        # its key is gone raises its floor to the token (a late attempt is refused).
        fencing, late = (0, 0) if granted is None else (granted.fencing_token, granted.late)
        dequeue = commands.dequeue(self.release_waking(spec, waiter, fencing, late=late))
        yield self._send(dequeue, frozenset(range(self.n)))

    def _leave(
        self, spec: LockSpec, call: _Call, waiter: str, *, granted: bool, unwinding: bool
    ) -> Flow[None]:
        """``_end_call``'s steps."""
        if granted or not call.queued or self.closed:
            if call.inbox is not None:
                yield Unlisten(waiter)
            return  # closed: no reconnecting for it; its places expire on the nodes
        everyone = frozenset(range(self.n))
        # A node that did not answer the dequeue may still run an attempt of this call
        # that sat unread in its socket (a frozen node, run when it wakes, on a
        # connection since given up), renewing the place for place_ms from then: no
        # bound from here covers that, so such a waiter is declined for much longer.
        hold = self.place_ms / 1000 + waiting.UNHEARD_DEPARTURE
        # Departed before the dequeue goes out, not only once it was answered: a hand-off
        # that crossed the give-up and is notified meanwhile (no longer listened for) is
        # declined, not dropped. The dequeue passes such a hand-off on too, but it may
        # go out on a connection that died unnoticed, and then the node was held by
        # nobody for a TTL. (A dequeue sent twice is harmless.)
        yield Depart(spec, waiter, self.clock() + hold)
        # Only then does it stop listening: in between, a notification (read by the
        # blocking client's listener thread at any moment) found it neither listening
        # nor departed, and was dropped; its dequeue lost too, the node was held by
        # nobody for a TTL.
        if call.inbox is not None:
            yield Unlisten(waiter)
        dequeue = self.dequeue(spec, waiter)
        try:
            if unwinding:
                yield self._send(dequeue, everyone)
            else:
                run = self._cleanup_round(dequeue, everyone, everyone)
                yield run
                if not run.rnd.unheard and not run.rnd.failed:
                    hold = self.place_ms / 1000
        except GeneratorExit:
            raise
        except Exception:
            pass  # best effort: a node it misses keeps the place until it expires
        except BaseException:
            # Cancelled (or interrupted) while it waited for the dequeue's answers: it
            # departs all the same, or a node that hands it the lock afterwards is held
            # by nobody for a TTL.
            yield Depart(spec, waiter, self.clock() + hold)
            raise
        yield Depart(spec, waiter, self.clock() + hold)

    def _transferred(
        self, wakes: list[tuple[int, Wake]], acq: Acquisition, waiter: str
    ) -> Granted | None:
        """The grant fair hand-offs gave us, if the notifications say so (else re-check)."""
        grants = [(i, w.token) for i, w in wakes if w.handed_over and w.waiter == waiter]
        granted = acq.transferred(waiter, grants, self.clock()) if grants else None
        if granted is not None:
            self.fence_floor = max(self.fence_floor, acq.floor)
        return granted

    # --- extend, release, locked --------------------------------------------------------

    def extend(
        self, lease: WatchedLease, ttl: float | None, retry: KeepAlive | None = None
    ) -> Flow[LeaseLost | None]:
        """Extend ``lease`` by ``ttl`` (default: its lock's TTL) from now. On failure it
        is lost, and released everywhere when its holder releases it or its validity
        ends, whichever comes first (so a waiter need not wait out the TTL of the keys the
        round may have extended); at once where a majority answered "not ours".

        A watchdog's try (``retry``: its policy) is the exception: a failure that left
        the lease as it was (``worth_another_try``) and ended early enough for another
        try to end before the last third of the validity (``KeepAlive.retry_by``,
        judged now, on the lease as it is now: its holder may have extended it while
        this try waited for the lease) is returned, the lease neither marked lost nor
        released, for the watchdog to try again. Otherwise the result is None.

        Raises:
            NotHeld, LeaseExpired, LeaseLost, ConfigurationError: as ``Lease.extend``.
        """
        spec = lease._spec if ttl is None else LockSpec.build(self.config, lease._spec.name, ttl)
        _check_not_released(lease)
        if lease.lost_error is not None:
            raise lease.lost_error  # (an extension failed: it is not vouched for any more)
        rnd = _begin_extend(lease, spec, self.clock())
        if spec.ttl < lease._state.ttl:
            # A shorter TTL shortens the keys as the nodes apply it, before the round
            # concludes: meanwhile the lease may not look valid for longer than that.
            bound = rnd.started + spec.ttl - spec.drift
            if bound < lease._state.valid_until:
                lease._state = replace(lease._state, valid_until=bound)
        command = self.replicated(commands.extend(spec, lease.token, by_sha=self.reads_all))
        valid_until = lease._state.valid_until
        yield Run(command, rnd, rnd.started + spec.node_timeout, begin_by=valid_until)
        if _set_ups_failed(rnd):
            # Nodes not asked, their connections still being set up (a Cluster node
            # reloading its slot map after the slot's master died): one round more,
            # which waits for those set-ups (connect_timeout) and begins before the
            # validity ends or not at all. All nodes again: its validity counts from
            # its own start.
            rnd = _begin_extend(lease, spec, self.clock())
            yield Run(command, rnd, rnd.started + spec.node_timeout, begin_by=valid_until)
        outcome = conclude_extend(lease._state, spec, rnd, self.clock(), self.names)
        if isinstance(outcome, LeaseState):
            lease._state = outcome
            return None
        if (
            retry is not None
            and self.clock() <= retry.retry_by(lease._state, spec.ttl, spec.node_timeout)
            and worth_another_try(lease._state, rnd)
        ):
            return outcome
        lease._mark_lost(outcome)
        valid_until = lease._state.valid_until
        if self.clock() < valid_until and len(rnd.maybe_holding()) >= rnd.needed:
            # Not released now. Its holder (a `with` body, a command under `tenure run`)
            # may be at work under the lease until its validity ends, told of the loss
            # only now: released at once, the lock went to a waiter while the holder
            # still wrote (one extension round that two of three nodes answered late was
            # enough). The keys keep others out until the holder says it stopped (its
            # release, its block's end) or the validity ends. (Once a majority answered
            # "not ours", nothing keeps others out any more: released at once.)
            yield Later(valid_until, self._release_when_due(lease, valid_until))
        else:
            lease._set_released()
            yield from self._release_rounds(lease, mark=False)
        raise outcome

    def _release_when_due(self, lease: WatchedLease, valid_until: float) -> Flow[None]:
        """The release of a lease whose extension failed, at its validity's end
        (``valid_until``): unless its holder released it first."""
        early = valid_until - self.clock()
        if early > 0:  # a loop's timer may run early by its clock's resolution (uvloop's)
            yield Sleep(early)
        if not lease.released:
            yield from self._release_rounds(lease, mark=True)

    def release(self, lease: WatchedLease) -> Flow[None]:
        """Release ``lease`` on every node, waking (fair: handing over to) the next waiter.

        Its watchdog is told to stop first; the driver waits for it to end afterwards
        (a watchdog in the middle of an extension finishes it, and then finds the lease
        released).

        Raises:
            NotHeld, LeaseLost, LeaseExpired, ServerUnsupported: as ``Lease.release``.
        """
        lease._stop_watching()
        _check_not_released(lease)
        rnd = yield from self._release_rounds(lease, mark=True)
        error = conclude_release(
            lease._state, self.n, self.config.quorum, rnd, self.clock(), self.names
        )
        if isinstance(error, LeaseLost):
            lease._mark_lost(error)
        if error is not None:
            raise error  # LeaseLost, or ServerUnsupported: a node refused the release (ACL)

    def _release_round(self, lease: WatchedLease) -> Run:
        """Compare-and-delete on every node, waking the next waiter; decided once a
        majority confirmed (or can't), within ``RELEASE_PATIENCE`` node timeouts."""
        now = self.clock()
        rnd = Round(self.n, self.config.quorum, now)
        command = self._lease_release(lease, by_sha=True)
        return Run(command, rnd, now + RELEASE_PATIENCE * self.config.node_timeout)

    def _lease_release(self, lease: WatchedLease, *, by_sha: bool = False) -> Command:
        """release.lua for ``lease``: its token, its fencing token, and its late
        proposal if it has one (``LeaseState.late``)."""
        state = lease._state
        return self.release_waking(
            lease._spec, lease.token, state.fencing_token, by_sha=by_sha, late=state.late
        )

    def _release_rounds(self, lease: WatchedLease, *, mark: bool) -> Flow[Round]:
        """The release round of ``lease`` (``mark``: marking the lease released as it
        begins), sent again if it is interrupted (``_release_again``); its tally."""
        # Made before the lease is marked released: interrupted here, it can be released
        # again; from the mark on, an interrupt sends it again.
        release = self._release_round(lease)
        lingers = lease._state.lingers
        if lingers:
            yield self._departure(lease, hold=True)
        try:
            if mark:
                lease._set_released()
            yield release
            valid_until = lease._state.valid_until
            # (``failed`` looked at first: the common release has none, and makes no call.)
            if (
                release.rnd.failed
                and self.clock() < valid_until
                and (unsent := _release_unsent(release.rnd, lease._state))
            ):
                # Nodes not sent the release, their connections still being set up:
                # sent to them once more, once the set-ups ended, and only while the
                # lease is valid; the others' answers stand (a second release would
                # find its key gone, and say so).
                rnd = release.rnd.again(self.clock(), unsent)
                release = Run(
                    release.command,
                    rnd,
                    rnd.started + RELEASE_PATIENCE * self.config.node_timeout,
                    unsent,
                    begin_by=valid_until,
                )
                yield release
        except GeneratorExit:
            raise
        except BaseException:
            if mark:
                lease._set_released()  # interrupted as it was being marked: it goes all the same
            yield self._release_again(lease, release.rnd)
            if lingers:
                yield self._departure(lease)
            raise
        if lingers:
            yield self._departure(lease)
        return release.rnd

    def _release_again(self, lease: WatchedLease, rnd: Round) -> Send:
        """The release of ``lease`` once more, to the nodes that did not answer ``rnd``:
        its round was interrupted (Ctrl-C in the blocking driver, a cancellation),
        maybe before the release was written at all. The lease is marked released
        already, so neither the caller nor its watchdog would release it again, and its
        keys would hold the lock for nobody until the TTL. Sent again by EVAL, behind
        whatever went out (a node that ran the first one finds no key of the lease)."""
        return self._send(self._lease_release(lease), rnd.unanswered())

    def _departure(self, lease: WatchedLease, *, hold: bool = False) -> Depart:
        """A lease whose waiter id may be queued again where its release has run (an
        attempt a node runs late, ``LeaseState.lingers``) departs as it is released, as
        a waiter that gave up does: a node that hands it the lock afterwards would
        otherwise be held by nobody for a whole TTL, as its process ignores the
        notification.

        It departs before the release round, with ``hold``: a notification that comes
        during the round is kept, not dropped, and declined once the round ended (the
        departure again, without ``hold``). Declined at once, its dequeue (a compare-and-
        delete of the waiter id, which is the lease's token) could run on a node ahead of
        the release, and the release would find the lease's key gone there and report a
        valid lease lost."""
        until = self.clock() + self.place_ms / 1000 + waiting.UNHEARD_DEPARTURE
        return Depart(lease._spec, lease.token, until, hold=hold)

    def locked(self, spec: LockSpec) -> Flow[bool]:
        """Whether a majority of nodes hold ``spec``'s lock now (for anyone).

        Raises:
            ClientClosed, NodeMisconfigured, QuorumUnreachable: as ``Lock.locked``.
        """
        self.check_open("ask whether it is locked", spec.name)
        now = self.clock()
        rnd = Round(self.n, self.config.quorum, now, refusals_decide=True)
        yield Run(commands.exists(spec.key), rnd, now + self.config.node_timeout)
        if _set_ups_failed(rnd):
            # Nodes not asked, still connecting: once more when their set-ups ended.
            now = self.clock()
            rnd = Round(self.n, self.config.quorum, now, refusals_decide=True)
            yield Run(commands.exists(spec.key), rnd, now + self.config.node_timeout)
        return conclude_locked(rnd, spec.name, self.names, self.config.key_prefix)

    # --- the watchdog -------------------------------------------------------------------

    def watchdog(self, lease: WatchedLease, policy: KeepAlive) -> Flow[None]:
        """Keep ``lease`` alive (or only watch its expiry) until it is released, lost or
        capped (``_core.watchdog``), marking it lost when it is."""
        wake = policy.next_wake(lease._state)
        while True:
            if (yield Pause(wake)) or lease.released:
                return
            # A pause also ends when the holder extended the lease by hand (the drivers'
            # ``replan``): by a TTL shorter than the lock's, its validity may now end
            # before the wake planned. Plan again from the lease as it is now.
            now = self.clock()
            planned = policy.next_wake(lease._state)
            if now < planned:
                wake = planned
                continue
            # Judged by what the extension gives, the lock's TTL, whatever TTL the holder
            # last extended it by itself.
            action = policy.decide(now, lease._state, lease._first_started, lease._spec.ttl)
            if isinstance(action, Extend) and policy.busy_since is not None:
                action = policy.unless_stuck(now, lease._state, policy.busy_since())
            if isinstance(action, Lost):
                lease._mark_lost(action.error)
                return
            if not isinstance(action, Extend):  # give up: wait for the validity's end
                while True:
                    if (yield Pause(action.at)) or lease.released:
                        return
                    if lease._state.valid_until != action.at:
                        break
                    if self.clock() >= action.at:
                        lease._mark_lost(action.error)
                        return
                    # Woken early: a loop's timer may run up to its clock's resolution
                    # before its time (uvloop's, a millisecond). Deciding again now
                    # could find the validity over by then and report the lease lost
                    # as paused, not for the reason it was given up.
                # The holder extended by hand while we waited: decide again on the new
                # validity, never report a valid lease lost.
                wake = policy.next_wake(lease._state)
                continue
            try:
                failed = yield ExtendLease(policy)
            except (NotHeld, LeaseLost):
                return  # released meanwhile, or extend() marked it lost
            except ClientClosed:
                lease._mark_lost(closed_under(lease._spec.name))
                return
            except Exception as exc:  # anything unexpected: the lease can't be vouched for
                lease._mark_lost(LeaseLost(lease._spec.name, f"the watchdog failed: {exc!r}"))
                return
            if failed is not None:
                # Nodes did not answer in time (a failover, a busy server): the lease
                # stands as it was, and the next try may find them back.
                spec = lease._spec
                wake = policy.retry_at(self.clock(), lease._state, spec.ttl, spec.node_timeout)
                continue
            wake = policy.next_wake(lease._state)

    # --- commands and small rounds ------------------------------------------------------

    def check_open(self, operation: str, name: str | None = None) -> None:
        """Raise ``ClientClosed`` if the client was closed (it must not reconnect)."""
        if self.closed:
            raise ClientClosed(operation, name)

    def replicated(self, command: Command) -> Command:
        """``command`` as it must be sent when grants count only once replicated."""
        config = self.config
        if not config.wait_replicas:
            return command
        return commands.acked_by_replicas(command, config.wait_replicas, config.wait_timeout_ms)

    def release_waking(
        self,
        spec: LockSpec,
        token: str,
        fencing: int = 0,
        *,
        cleanup: bool = False,
        by_sha: bool = False,
        place: commands.WaitArgs | None = None,
        late: int = 0,
    ) -> Command:
        """release.lua for a lease (or, with a waiter id, a waiter giving up): delete our
        key, leave the queue (``cleanup``: stay, at ``place``'s ticket), pass the lock on
        to the next waiter. ``by_sha``: by EVALSHA (a lease's release, ``_release_round``).
        ``late``: the lease's ``LeaseState.late``: every node raises its floor to it (or
        to ``fencing``, if higher), whether or not it holds the key."""
        if late > fencing:
            fencing = late  # the hand-off's token is then above it too
        if spec.wait_mode is WaitMode.FAIR_QUORUM:
            arg = waiting.handoff_token(self.wall_us(), fencing, self.fence_floor)
        else:
            arg = self.hold_ms
        return commands.release_waking(
            spec,
            token,
            spec.mode,
            arg,
            fencing,
            cleanup=cleanup,
            by_sha=by_sha,
            place=place,
            late=late > 0,
        )

    def dequeue(self, spec: LockSpec, waiter: str) -> Command:
        """What ``waiter`` sends to leave its queues, passing on a lock handed to it
        meanwhile."""
        return commands.dequeue(self.release_waking(spec, waiter))

    def _cleanup_release(self, spec: LockSpec, token: str, wait_args: commands.WaitArgs) -> Command:
        """What releases the grants of a failed attempt. Fair on a quorum, they are
        passed on to the next in line, the caller put back in line first at its ticket
        (a node that granted it took it out): a waiter that needs them is told, rather
        than left waiting for its fallback re-check, and two waiters each granted a
        minority pass their nodes to the same one (docs/waiting.md)."""
        if spec.wait_mode is WaitMode.FAIR_QUORUM:
            return self.release_waking(spec, token, cleanup=True, place=wait_args)
        return commands.release(spec.key, token)

    def _seed(self, spec: LockSpec, seed: Seed) -> Run:
        command = commands.seed(spec, seed.floor, seed.warm_ms, seed.marks)
        return self._cleanup_round(command, seed.nodes, seed.nodes)

    def _cleanup_round(
        self, command: Command, targets: frozenset[int], wait_for: frozenset[int]
    ) -> Run:
        """``command`` on ``targets``, waiting for every one of ``wait_for`` (up to the
        node timeout). Best effort, never an error of its own: a node that refuses it is
        reported as misconfigured; what that means for the lock is decided by the
        rounds that need a majority."""
        now = self.clock()
        rnd = Round.cleanup(self.n, wait_for, now)
        return Run(command, rnd, now + self.config.node_timeout, sorted(targets))

    def _send(self, command: Command, targets: frozenset[int]) -> Send:
        return Send(command, Round.cleanup(self.n, frozenset(), self.clock()), sorted(targets))

    def decline(self, spec: LockSpec, waiter: str, node: int) -> Send | None:
        """What answers a notification that reached ``waiter`` after it departed: its
        dequeue again, to that node (None once the client is closed). Its round waits for
        the node's answer (the drivers' ``_deliver``): a dequeue that did not reach the
        node is sent again (``waiting.decline_again``)."""
        if self.closed:
            return None
        rnd = Round.cleanup(self.n, frozenset({node}), self.clock())
        return Send(self.dequeue(spec, waiter), rnd, [node])


def unreached(send: Send) -> bool:
    """Whether some target of ``send`` (its round waiting for them) did not answer: not
    written, or no answer by the deadline. An error reply reached the node, and one for
    its configuration would come again: neither is worth sending again."""
    results = send.rnd.results
    for i in send.targets:
        result = results[i]
        if result is None or result.failure in _UNREACHED:
            return True
    return False


_UNREACHED = (Failure.UNREACHABLE, Failure.BACKING_OFF, Failure.CONNECTING)


def _release_unsent(rnd: Round, lease: LeaseState) -> list[int]:
    """The nodes a release round did not ask, their connections still being set up,
    that the release must reach once those set-ups ended (while the lease is valid):

    - all of them when their yes would make a failed release succeed (a Cluster node
      reloading its slot map after the slot's master died);
    - else those that may hold the lease's key: that granted it, or had not answered
      when its round was decided at the first majority (the third of three nodes,
      often). The blocking client's threads share a pool of link sets, so a lease may
      be released on another link set than the one that acquired it, whose connection
      to such a node may be new: without the release, the node would hold the lock for
      nobody until the TTL, and the next holder would need every other node. A node the
      acquire did not ask (its own set-up hanging: a host that drops packets) is not
      waited for.
    """
    if _set_ups_failed(rnd):
        return rnd.connecting()
    acquired_in = lease.acquired_in
    if acquired_in is None:  # handed over: the nodes that hold it are not all known
        return rnd.connecting()
    maybe = acquired_in.maybe_holding()
    return [i for i in rnd.connecting() if i in maybe]


def _set_ups_failed(rnd: Round) -> bool:
    """Whether a round failed only for nodes not asked while their connections were
    being set up, and would have succeeded had they said yes: worth one round more
    once the set-ups ended (as an acquire makes, ``Acquisition.conclude``)."""
    return (
        rnd.failed > 0  # (first: nothing more to look at in a round without failures)
        and rnd.failed_connecting()
        and rnd.set_ups_could_decide()
    )


def _begin_extend(lease: WatchedLease, spec: LockSpec, now: float) -> Round:
    """An extend round of ``lease`` at ``now``.

    Raises:
        LeaseExpired: its validity ended (the lease is marked lost).
    """
    try:
        return begin_extend(lease._state, spec, now)
    except LeaseExpired as expired:
        # Too late to extend is the lease lost, for whoever watches it too (a watchdog
        # paused between deciding to extend and extending ends here).
        lease._mark_lost(expired)
        raise


def _check_not_released(lease: WatchedLease) -> None:
    if lease.released:
        # A lease found lost may be released by tenure, not by its holder (once a
        # majority answered "not ours", nothing is left to keep others out): the
        # holder is told of the loss, as ``check()`` tells it, not that it released.
        loss = lease.lost_error
        if loss is not None:
            raise loss
        raise NotHeld(lease._spec.name, "this lease was already released")


def closed_under(name: str) -> LeaseLost:
    """Why a kept-alive lease is lost once its client was closed."""
    return LeaseLost(
        name,
        "its client was closed, so its watchdog can no longer extend it; its keys expire "
        "by their TTL",
    )
